"""The three behaviours of the code behind the paper's numbers (docs/spec.md §11), each pinned by hand in both
settings, and the project's loss under `algorithm=hacpo_paper_main` against a plain re-derivation of that
code's formulas (written here from the formulas: token-level advantages masked past the source's length, a
token-mean KL over each micro-batch's own tokens), for a same-tokenizer pair and for lengths of a
Qwen3 / Llama 3.2 pair."""

from __future__ import annotations

import math

import pytest
import torch

import hacrl_lightning.module as module_mod
from hacrl_lightning.algorithms import hacpo_loss
from hacrl_lightning.cli import compose_config
from hacrl_lightning.config import AlgorithmConfig
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.plan import learner_order
from hacrl_lightning.presets import get_preset
from hacrl_lightning.update import source_span

D = torch.float64
MAIN = get_preset("hacpo_paper_main").loss_settings()
OURS = AlgorithmConfig().loss_settings()


# --- 1. the second learner's mini-batch order ------------------------------------------------------


def test_the_second_learner_trains_its_partners_rows_first_and_the_first_its_own():
    is_own = torch.tensor([False, True, False, True, True, False])  # a learner's view: 3 own rows, 3 partner rows
    source = torch.where(is_own, 1, 0)
    prompt = torch.tensor([0, 0, 1, 1, 2, 2])
    for partners_first in (False, True):
        order = learner_order(is_own, source, prompt, learner=1, cross_cap=None,
                              generator=torch.Generator().manual_seed(0), partners_first=partners_first)
        first, last = set(order[:3].tolist()), set(order[3:].tolist())
        assert (first, last) == (({0, 2, 5}, {1, 3, 4}) if partners_first else ({1, 3, 4}, {0, 2, 5}))


@pytest.mark.slow
def test_under_hacpo_paper_main_the_second_learners_partner_rows_get_the_first_bounds(tmp_path, zoo_cache, monkeypatch):
    """A real step of the default pair (4 prompts, G = 2, mini-batches of 2 prompts: 4 per learner): tiny_a trains
    own, own, partner, partner (bounds 0.85, 0.875 on its partner's rows); tiny_b partner, partner, own, own (0.8,
    0.825), as the paper's code ordered them (docs/spec.md §11)."""
    from hacrl_lightning.training import train

    seen: list[tuple[str, float, bool]] = []
    real_loss, real_update = module_mod.hacpo_loss, module_mod.HACRLModule.update_learner
    current = {}

    def loss_spy(**kwargs):
        seen.append((current["name"], kwargs["cross_lower"], bool(kwargs["is_own"].all())))
        return real_loss(**kwargs)

    def update_spy(module, k, name, *args, **kwargs):
        current["name"] = name
        return real_update(module, k, name, *args, **kwargs)

    monkeypatch.setattr(module_mod, "hacpo_loss", loss_spy)
    monkeypatch.setattr(module_mod.HACRLModule, "update_learner", update_spy)
    cfg, _ = compose_config(["algorithm=hacpo_paper_main", "algorithm.kl_coef=0.001", "trainer.steps=1",
                             "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
                             "trainer.eval_every=0", "data.eval_size=4", "trainer.export_agents=false",
                             "trainer.micro_batch_size=2", "trainer.diagnostics_every=0",
                             f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    train(cfg)
    for name, own_first in (("tiny_a", True), ("tiny_b", False)):
        mine = [(lower, own) for who, lower, own in seen if who == name]
        per_mini = list(dict.fromkeys(mine))  # micro-batches of one mini-batch share (bound, own)
        assert [own for _, own in per_mini] == ([True, True, False, False] if own_first else [False, False, True, True])
        assert [lower for lower, _ in per_mini] == pytest.approx([0.8, 0.825, 0.85, 0.875])


# --- 2. the first learner's partner-row advantages ------------------------------------------------


def test_source_span_by_hand():
    loss_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    is_own = torch.tensor([True, False, False, False])
    source_len = torch.tensor([9, 2, 5, 3])  # own row: ignored; partner rows: 2 of 5, 5 of 2 (longer), 3 of 3
    assert source_span(loss_mask, is_own, source_len).tolist() == pytest.approx([1.0, 0.4, 1.0, 1.0])


def test_a_masked_partner_row_by_hand():
    """One partner row of 4 learner tokens whose source had 2, A = 1, s = 1, omega = 1: the paper's code gives
    tokens 3 and 4 advantage 0, so seq-mean-token-mean is -(1 + 1 + 0 + 0) / 4 = -0.5; the learner span, -1."""
    logp = torch.full((1, 4), -1.0, dtype=D, requires_grad=True)
    row = dict(logp_new=logp, loss_mask=torch.ones(1, 4, dtype=torch.bool), is_own=torch.tensor([False]),
               old_logp_mean=torch.tensor([-1.0], dtype=D), omega_factor=torch.ones(1, dtype=D), cross_lower=0.8)
    span = source_span(row["loss_mask"], row["is_own"], torch.tensor([2]))
    masked, _ = hacpo_loss(advantages=torch.ones(1, dtype=D) * span.double(), **row, **MAIN)
    whole, _ = hacpo_loss(advantages=torch.ones(1, dtype=D), **row, **OURS)
    assert float(masked.detach()) == pytest.approx(-0.5) and float(whole.detach()) == pytest.approx(-1.0)


# --- 3. the KL aggregation ------------------------------------------------------------------------


def _k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """verl's low_var_kl, from its formula: exp(ref - logp) - (ref - logp) - 1."""
    d = ref - logp
    return torch.exp(d) - d - 1


def test_the_kl_term_by_hand_in_both_modes():
    """Two micro-batches of one mini-batch. Micro-batch 1: an own row of 2 tokens (log p - log p_ref = 0.1, 0.3)
    and a partner row; micro-batch 2: an own row of 1 token (0.2). k3(d) = exp(-d) + d - 1."""
    k = [math.exp(-d) + d - 1 for d in (0.1, 0.3, 0.2)]
    paper = (k[0] + k[1]) / 2 / 2 + k[2] / 1 / 2                # each micro-batch's own-token mean, / 2 micro-batches
    ours = ((k[0] + k[1]) / 2 + k[2]) / 3                       # seq-mean-token-mean over the mini-batch's 3 rows
    rows = [(torch.tensor([[0.1, 0.3], [0.0, 0.0]], dtype=D), torch.tensor([True, False]),
             torch.tensor([[True, True], [True, False]])),
            (torch.tensor([[0.2, 0.0]], dtype=D), torch.tensor([True]), torch.tensor([[True, False]]))]
    for settings, expected in ((MAIN, paper), (OURS, ours)):
        total = 0.0
        for gap, is_own, mask in rows:
            logp = torch.zeros_like(gap)
            _, metrics = hacpo_loss(logp_new=logp, loss_mask=mask, advantages=torch.zeros(len(gap), dtype=D),
                                    is_own=is_own, old_logp_mean=torch.zeros(len(gap), dtype=D),
                                    omega_factor=torch.ones(len(gap), dtype=D), cross_lower=0.8,
                                    ref_logp=logp - gap, total_seqs=3.0, kl_micro_batches=2.0,
                                    **{**settings, "kl_coef": 0.001})
            total += float(metrics["loss/kl"])
        assert total == pytest.approx(expected, rel=1e-12)


# --- the whole loss against a re-derivation of the paper code's formulas ----------------------------


def _main_loss(logp, old_mean, mask, is_own, adv, omega, ref, source_len, lower, micro, alpha=1.0, beta=1e-3):
    """The paper code's loss of one learner's mini-batch, from its formulas: per row the sequence ratio
    s = exp(mean_t log p - old mean); own rows min(s·A, clip(s, 1 - 3e-4, 1 + 4e-4)·A); partner rows
    clamp(s, lower, 1)·sg(c)^alpha·omega·A_t with A_t = A for t < L_src and 0 after; seq-mean-token-mean over the
    mini-batch's rows; plus beta·(each micro-batch's mean k3 over its own tokens) / number of micro-batches."""
    length = mask.sum(-1)
    log_s = ((logp * mask).sum(-1) / length - old_mean).clamp(-10, 10)
    s = log_s.exp()
    t = torch.arange(mask.shape[1])
    a_tok = torch.where(is_own[:, None] | (t[None, :] < source_len[:, None]), adv[:, None], torch.zeros_like(logp))
    own_term = torch.minimum(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv)[:, None] * torch.ones_like(logp)
    c = s.clamp(lower, 1.0)
    cross_term = (c * c.detach() ** alpha * omega)[:, None] * a_tok
    per_token = torch.where(is_own[:, None], own_term, cross_term) * mask
    policy = -(per_token.sum(-1) / length).sum() / len(length)
    kl = 0.0
    for rows in torch.arange(len(length)).split(micro):
        own = mask[rows] & is_own[rows, None]
        kl = kl + (_k3(logp[rows], ref[rows]) * own).sum() / (own.sum() + 1e-8) / math.ceil(len(length) / micro)
    return policy + beta * kl


@pytest.mark.parametrize("pair", ["same tokenizer", "qwen3 / llama3.2 lengths"])
def test_the_loss_and_gradient_equal_the_paper_codes_formulas(pair):
    """Random mini-batches of the first learner (4 own + 4 partner rows, micro-batches of 2 rows). For a pair that
    shares a tokenizer the source's length is the learner's; for a Qwen3 / Llama 3.2 pair the ratio of token
    counts is drawn from U(0.8, 1.25) (docs/spec.md §11). The project's loss, summed over micro-batches with
    `source_span` on the advantages and `kl_agg_mode=micro-token-mean`, equals the re-derivation in float64."""
    g = torch.Generator().manual_seed(7)
    for _ in range(20):
        B, T, micro = 8, 12, 2
        length = torch.randint(3, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < length[:, None]
        is_own = torch.tensor([True] * 4 + [False] * 4)[torch.randperm(B, generator=g)]
        ratio = torch.ones(B) if pair == "same tokenizer" else 0.8 + 0.45 * torch.rand(B, generator=g)
        source_len = torch.where(is_own, length, (length * ratio).round().long().clamp(min=1))
        logp = (-torch.rand(B, T, generator=g, dtype=D) * 3) * mask
        old_mean = (logp * mask).sum(-1) / length + torch.where(is_own, 1e-4, 0.3) * torch.randn(B, generator=g,
                                                                                                dtype=D)
        ref = logp - 0.2 * torch.randn(B, T, generator=g, dtype=D) * mask
        adv, omega = torch.randn(B, generator=g, dtype=D), torch.exp(torch.randn(B, generator=g, dtype=D))
        lower = 0.8 + 0.025 * int(torch.randint(0, 4, (1,), generator=g))

        new_main = logp.clone().requires_grad_(True)
        expected = _main_loss(new_main, old_mean, mask, is_own, adv, omega, ref, source_len, lower, micro)
        (grad_main,) = torch.autograd.grad(expected, new_main)

        new = logp.clone().requires_grad_(True)
        span = source_span(mask, is_own, source_len).double()
        total = 0.0
        for rows in torch.arange(B).split(micro):
            loss, _ = hacpo_loss(logp_new=new[rows], loss_mask=mask[rows], is_own=is_own[rows], cross_lower=lower,
                                 advantages=(adv * span)[rows], old_logp_mean=old_mean[rows],
                                 omega_factor=omega[rows], ref_logp=ref[rows], total_seqs=float(B),
                                 kl_micro_batches=float(B // micro), **{**MAIN, "kl_coef": 1e-3})
            total = total + loss
        (grad,) = torch.autograd.grad(total, new)
        assert float(total) == pytest.approx(float(expected), rel=1e-10, abs=1e-12)
        torch.testing.assert_close(grad, grad_main, rtol=1e-9, atol=1e-12)  # float64: round-off only
        if pair != "same tokenizer" and bool((source_len < length).any()):
            whole = sum(hacpo_loss(logp_new=new[r].detach(), loss_mask=mask[r], is_own=is_own[r], cross_lower=lower,
                                   advantages=adv[r], old_logp_mean=old_mean[r], omega_factor=omega[r],
                                   ref_logp=ref[r], total_seqs=float(B), kl_micro_batches=float(B // micro),
                                   **{**MAIN, "kl_coef": 1e-3})[0] for r in torch.arange(B).split(micro))
            assert abs(float(whole) - float(expected)) > 1e-6  # without the span the two differ


# --- refusals ---------------------------------------------------------------------------------------


def test_paper_main_is_refused_for_other_than_two_agents_naming_why():
    with pytest.raises(ConfigError) as info:
        compose_config(["agents=[tiny_a,tiny_b,tiny_c]", "algorithm=hacpo_paper_main"])
    keys = {p.key: p for p in info.value.problems}
    assert set(keys) == {"algorithm.learner_order", "algorithm.partner_advantage_span"}
    assert "no order for a third" in keys["algorithm.learner_order"].allowed
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b,tiny_c]", "algorithm.kl_agg_mode=micro-token-mean"])
    assert cfg.algorithm.kl_agg_mode == "micro-token-mean"  # the KL's reduction is defined for any n


# --- sizes (docs/spec.md §11): python tests/test_paper_code.py --------------------------------------


def _span_size(lo: float, hi: float, *, partner_only: bool, cases: int = 200) -> tuple[float, float]:
    """(median, max) over random mini-batches of |grad(paper code) - grad(learner span)| / |grad(learner span)|,
    source/learner token-count ratios ~ U(lo, hi) on the partner rows, KL off."""
    g, rel = torch.Generator().manual_seed(1), []
    for _ in range(cases):
        B, T = 8, 32
        length = torch.randint(8, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < length[:, None]
        is_own = torch.tensor([True] * 4 + [False] * 4)
        ratio = lo + (hi - lo) * torch.rand(B, generator=g)
        source_len = torch.where(is_own, length, (length * ratio).round().long().clamp(min=1))
        logp = (-torch.rand(B, T, generator=g, dtype=D) * 3) * mask
        # partner ratios inside the clamp [0.85, 1] mostly (log s = -0.05|z|), so their rows carry a gradient
        offset = torch.where(is_own, 1e-4 * torch.randn(B, generator=g, dtype=D),
                             0.05 * torch.randn(B, generator=g, dtype=D).abs())
        old_mean = (logp * mask).sum(-1) / length + offset
        adv, omega = torch.randn(B, generator=g, dtype=D), torch.exp(torch.randn(B, generator=g, dtype=D))
        adv = torch.where(is_own, 0.0, adv) if partner_only else adv
        grads = []
        for span in (source_len, length):
            new = logp.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(_main_loss(new, old_mean, mask, is_own, adv, omega, logp, span, 0.85, 4,
                                                     beta=0.0), new)
            grads.append(grad)
        if float(grads[1].norm()) > 0:
            rel.append(float((grads[0] - grads[1]).norm() / grads[1].norm()))
    rel.sort()
    return rel[len(rel) // 2], rel[-1]


def _kl_size(cases: int = 200) -> tuple[float, float, float]:
    """(mean, min, max) over random pure-own mini-batches (8 rows of 8-32 tokens, micro-batches of 4) of the KL
    value reduced as the policy term divided by the paper code's micro-batch token-mean."""
    g, ratios = torch.Generator().manual_seed(2), []
    for _ in range(cases):
        B, T, micro = 8, 32, 4
        length = torch.randint(8, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < length[:, None]
        logp = (-torch.rand(B, T, generator=g, dtype=D) * 3) * mask
        ref = logp - 0.1 * torch.randn(B, T, generator=g, dtype=D) * mask
        values = []
        for settings in (OURS, MAIN):
            values.append(sum(float(hacpo_loss(
                logp_new=logp[r], loss_mask=mask[r], is_own=torch.ones(len(r), dtype=torch.bool),
                advantages=torch.zeros(len(r), dtype=D), old_logp_mean=torch.zeros(len(r), dtype=D),
                omega_factor=torch.ones(len(r), dtype=D), cross_lower=0.8, ref_logp=ref[r], total_seqs=float(B),
                kl_micro_batches=float(B // micro), **{**settings, "kl_coef": 1e-3})[1]["loss/kl"])
                for r in torch.arange(B).split(micro)))
        ratios.append(values[0] / values[1])
    return sum(ratios) / len(ratios), min(ratios), max(ratios)


if __name__ == "__main__":
    for lo, hi in ((0.9, 1.1), (0.8, 1.25)):
        for partner_only in (False, True):
            median, largest = _span_size(lo, hi, partner_only=partner_only)
            rows = "partner rows only" if partner_only else "4 own + 4 partner rows"
            print(f"partner advantage span, token-count ratio U({lo}, {hi}), {rows}: relative gradient difference "
                  f"median {median:.3f}, max {largest:.3f}")
    mean, low, high = _kl_size()
    print(f"KL reduction, pure own mini-batches: value as the policy term / as the paper's code: mean {mean:.3f}, "
          f"range [{low:.3f}, {high:.3f}]")
