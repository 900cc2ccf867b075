"""The synthetic task: disjoint, deterministic splits; exact gold answers; difficulty as configured."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from hacrl_lightning.config import DataConfig
from hacrl_lightning.data import PromptDataset, format_answer, synthetic_dataset, synthetic_examples, task_texts
from hacrl_lightning.data.synthetic import TASK_ALPHABET, is_heldout
from hacrl_lightning.rewards import exact_match_reward

EXPRESSION = re.compile(r"^What is (.+)\? Put the answer in \\boxed\{\}\.$")


def expression_of(prompt: str) -> str:
    match = EXPRESSION.match(prompt)
    assert match, prompt
    return match.group(1)


def test_train_and_heldout_are_disjoint_for_every_seed():
    cfg = DataConfig(train_size=1500, eval_size=200)
    heldout = {ex.prompt for ex in synthetic_examples(cfg, "eval")}
    for seed in (cfg.seed, 0, 7):
        train = synthetic_examples(replace(cfg, seed=seed), "train")
        assert not heldout & {ex.prompt for ex in train}
        assert len({ex.prompt for ex in train}) == len(train) == 1500
    assert all(is_heldout(expression_of(p)) for p in heldout)


def test_splits_are_deterministic_streams():
    cfg = DataConfig()
    assert synthetic_examples(cfg, "train", 300) == synthetic_examples(cfg, "train", 300)
    assert synthetic_examples(cfg, "train", 300)[:50] == synthetic_examples(cfg, "train", 50)
    assert synthetic_examples(cfg, "eval", 64) != synthetic_examples(replace(cfg, seed=cfg.seed + 1), "eval", 64)


@pytest.mark.parametrize("ops,terms,digits", [(["+", "-"], 2, (1, 2)), (["*", "+"], 3, (1, 1)), (["-"], 2, (2, 3))])
def test_gold_is_the_exact_value_and_difficulty_is_respected(ops, terms, digits):
    cfg = DataConfig(ops=ops, terms=terms, min_digits=digits[0], max_digits=digits[1])
    for ex in synthetic_examples(cfg, "train", 200):
        expression = expression_of(ex.prompt)
        tokens = expression.split(" ")
        numbers, used_ops = tokens[::2], tokens[1::2]
        assert len(numbers) == terms and set(used_ops) <= set(ops)
        assert all(digits[0] <= len(n) <= digits[1] for n in numbers)
        assert ex.gold == str(eval(expression))  # an independent evaluator, with Python's precedence
        assert exact_match_reward(format_answer(ex.gold), ex.gold) == 1.0
        assert ex.prompt_id.startswith("syn-")


def test_too_small_a_problem_space_names_the_setting():
    cfg = DataConfig(min_digits=1, max_digits=1, ops=["+"], eval_size=64)
    with pytest.raises(ValueError, match=r"data.eval_size=64.*Fix: lower data.eval_size"):
        synthetic_examples(cfg, "eval")
    with pytest.raises(ValueError, match="split"):
        synthetic_examples(cfg, "test")


def test_dataset_is_sized_and_texts_use_the_task_alphabet():
    dataset = synthetic_dataset(DataConfig(eval_size=16), "eval")
    assert isinstance(dataset, PromptDataset) and len(dataset) == 16
    prompt_id, prompt, gold, _ = dataset[3]
    assert prompt.startswith("What is") and gold.lstrip("-").isdigit()
    texts = task_texts(n=8)
    assert any(t.startswith("\\boxed{") for t in texts)
    assert set("".join(texts)) <= set(TASK_ALPHABET)


def test_few_shot_puts_k_worked_train_examples_before_every_question_never_its_own():
    from hacrl_lightning.data.tasks import load_task

    plain_train, plain_eval = load_task(DataConfig())
    train, held_out = load_task(DataConfig(few_shot=2))
    first, second, third = (list(plain_train)[i] for i in range(3))
    expression = lambda ex: ex.prompt.removeprefix("What is ").split("?")[0]  # noqa: E731
    worked = lambda ex: f"{ex.prompt}\n{expression(ex)} = {ex.gold}. The answer is \\boxed{{{ex.gold}}}.\n\n"  # noqa: E731
    assert train[0].prompt == worked(second) + worked(third) + first.prompt  # its own never among its examples
    assert train[1].prompt == worked(first) + worked(third) + second.prompt
    for plain, shot in ((plain_train[5], train[5]), (plain_eval[0], held_out[0])):  # the same two for every other
        assert shot.prompt == worked(first) + worked(second) + plain.prompt
        assert shot._replace(prompt=plain.prompt) == plain  # id, gold and extras unchanged
    assert len(train) == len(plain_train) and len(held_out) == len(plain_eval)
    with pytest.raises(ValueError, match=r"data.few_shot=5: the train split holds 3 problems"):
        from hacrl_lightning.data.tasks import few_shot_pool

        few_shot_pool(list(plain_train)[:3], 5)


def test_the_agents_default_check_texts_are_texts_the_synthetic_task_makes():
    """`Agent.load` checks `DEFAULT_CHECK_TEXTS` when its caller names none (`agents/` does not import the task):
    they must stay texts the task makes, every digit among them."""
    from hacrl_lightning.agents.tokenizers import DEFAULT_CHECK_TEXTS

    assert set(DEFAULT_CHECK_TEXTS) <= set(task_texts())
    assert set("0123456789") <= set("".join(DEFAULT_CHECK_TEXTS))
