"""The gradient-share diagnostic: how much of a learner's update comes from partners' responses
(`{agent}/diag/cross_grad_share`, docs/training.md#diagnostics).

At the weights the step starts from, the step's gradient g = Σ_m ∇ loss_m (every mini-batch, each
normalised as in the update) splits exactly into g_self (own responses' terms and the KL) and
g_cross (partners' terms); each is accumulated by its own backward passes over the same
passes (`StepPlan.passes`), its norm taken with the clip's utility (global under FSDP),
and

    cross_grad_share = ‖g_cross‖ / (‖g_self‖ + ‖g_cross‖)   in [0, 1]; 0.5: equal magnitudes
    grad_cos_self_cross = <g_self, g_cross> / (‖g_self‖·‖g_cross‖)  (from ‖g_self + g_cross‖)

The ratio of norms (not of squared norms) reads as relative magnitude; the two parts need not be
orthogonal, so neither form splits ‖g‖, and the cosine says whether they pull together. It changes
nothing: no optimizer step, no RNG drawn (dropout is off), and the gradients are cleared (set to
None) before the update starts. A part that no global mini-batch holds costs no pass (its norm is
0), so a learner without partners' responses (gspo_x2) gets a share of 0 for free.
Deliberately not here: the forward and backward passes themselves (the caller's `backward_pass`)
and when the diagnostic runs (`trainer.diagnostics_every`, the module).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from hacrl_lightning.plan import MicroBatch, StepPlan
from hacrl_lightning.update import total_grad_norm

__all__ = ["measure_grad_share"]

BackwardPass = Callable[[int, MicroBatch, str], None]
"""backward_pass(m, micro_batch, part): forward and backward of `part` ("self" or "cross") of a
micro-batch of mini-batch m, its loss scaled as in the update (weight 0: a zero-weight pass)."""


def measure_grad_share(name: str, params: list[Tensor], plan: StepPlan, is_own: Tensor, micro_batch_size: int,
               backward_pass: BackwardPass) -> dict[str, float]:
    """Learner `name`'s `{name}/diag/*` gradient metrics for this step. params: the optimizer's parameters
    (under FSDP2 the sharded ones the gradients land on); is_own: [B] over the learner's view."""
    norms, saved = {}, []
    for part in ("self", "cross"):
        holds = is_own if part == "self" else ~is_own                                        # [B]
        for p in params:
            p.grad = None
        if part == "cross" and not bool(holds.any()):
            norms[part] = 0.0
            continue
        for m, mini in enumerate(plan.mini_batches):
            if not bool(holds[mini].any()):  # the global mini-batch: every rank skips it alike
                continue
            for micro in plan.passes(m, micro_batch_size):
                backward_pass(m, micro, part)
        norms[part] = float(total_grad_norm(params))
        if part == "self":
            saved = [p.grad for p in params]
    out = {f"{name}/diag/grad_norm_self": norms["self"], f"{name}/diag/grad_norm_cross": norms["cross"]}
    if norms["self"] + norms["cross"] > 0:
        out[f"{name}/diag/cross_grad_share"] = norms["cross"] / (norms["self"] + norms["cross"])
    if norms["self"] > 0 and norms["cross"] > 0:
        for p, g in zip(params, saved):  # g_self + g_cross
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)
        both = float(total_grad_norm(params))
        cos = (both ** 2 - norms["self"] ** 2 - norms["cross"] ** 2) / (2 * norms["self"] * norms["cross"])
        out[f"{name}/diag/grad_cos_self_cross"] = max(-1.0, min(1.0, cos))
    for p in params:
        p.grad = None
    return out
