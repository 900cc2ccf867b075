"""Held-out evaluation callback: every agent on the held-out prompts before, during and after training.

Greedy accuracy per agent (and avg@k / pass@k when `samples > 1`), printed as one line per evaluation
(rank zero), logged as `{agent}/eval/acc`
etc. (through the module's `report`). The accuracy is the verifier's: the first term of the reward
(`data.reward`, or the first of `data.rewards`), never a weighted sum; a weighted reward (several terms, or a
weight other than 1) adds `reward` (the weighted sum's mean) and `reward/<term>` (each term's mean) beside it
(`held_out_figures`), so `acc` stays in [0, 1] and means "answered right" whatever the terms add. at the number of steps done (0 before training; the k-th step's
training scalars are at k too) and kept as a history of (step, rollouts generated so far, scores) that resumes with the run
and feeds `summary.json` and the comparison plots. With several agents, the group's figures from the same greedy
answers (no answer is generated for them; `collective.py`: union and majority-vote accuracy, their gains over the
best single agent, who is right where whom is wrong) join the line, TensorBoard (`collective/eval/*`) and the
history entry (`collective`). The generation itself is the evaluator's it is given (the DataModule's).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import torch
from lightning.pytorch import Callback

from hacrl_lightning.collective import collective_figures, collective_scalars, figures_line


def held_out_figures(totals: torch.Tensor, parts: Sequence[Optional[Sequence[float]]],
                     terms: Optional[Sequence[tuple[str, str, float]]]) -> tuple[torch.Tensor, dict[str, float]]:
    """What one scoring of held-out answers measures: (the verifier's score of each answer, shaped like
    `totals`; the reward's figures). `totals`: the reward of each answer (the weighted sum); `parts`: each
    answer's term values in flat order (the pool's `parts`; None where the whole item failed: 0 for every
    term); `terms`: the reward's (name, spec, weight). With one term of weight 1 (or no terms) the verifier's
    score is the total and there are no other figures; else the verifier is the first term, and the figures
    are `reward` (the mean total) and `reward/<name>` (each term's mean)."""
    if not terms or (len(terms) == 1 and float(terms[0][2]) == 1.0):
        return totals, {}
    rows = [list(p) if p is not None else [0.0] * len(terms) for p in parts]
    values = torch.tensor(rows, dtype=torch.float64).view(-1, len(terms)) if rows else torch.zeros(0, len(terms))
    mean = lambda t: float(t.mean()) if t.numel() else 0.0  # noqa: E731
    figures = {"reward": mean(totals), **{f"reward/{name}": mean(values[:, i]) for i, (name, _, _) in enumerate(terms)}}
    return values[:, 0].reshape(totals.shape), figures


class Evaluator(Protocol):
    """What generates and scores the held-out answers (`datamodule.RolloutDataModule.evaluate`); an evaluator
    with `greedy_answers` (agent -> `answers`, `correct`, per problem) also gets the group's figures."""

    def evaluate(self, *, samples: int = 1, limit: int | None = None, step: int = 0) -> dict[str, dict[str, float]]: ...


class HeldOutEvalCallback(Callback):
    """evaluator: generates and scores; every: evaluate after every every-th step (0: before and after
    training only); samples: answers per prompt (k of avg@k / pass@k)."""

    def __init__(self, evaluator: Evaluator, *, every: int, samples: int = 1):
        self.evaluator = evaluator
        self.every = every
        self.samples = samples
        self.history: list[dict[str, Any]] = []

    def _evaluate(self, trainer, pl_module) -> None:
        step = pl_module.steps_done
        if self.history and self.history[-1]["step"] == step:
            return
        with trainer.precision_plugin.forward_context():  # the training's compute dtype (bf16-mixed: bf16)
            scores = self.evaluator.evaluate(samples=self.samples, step=step)
        greedy = getattr(self.evaluator, "greedy_answers", None) or {}
        together = collective_figures({name: g["answers"] for name, g in greedy.items()},
                                      {name: g["correct"] for name, g in greedy.items()})
        self.history.append({
            "step": step,
            "rollouts_generated": {name: c["rollouts_generated"] for name, c in pl_module.counters.items()},
            "scores": scores,
            **({"collective": together} if together else {}),
        })
        if trainer.is_global_zero:
            print(f"eval step {step}: " + " | ".join(
                [f"{name} " + " ".join(f"{key} {value:.3f}" for key, value in row.items()) for name, row in scores.items()]
                + [figures_line(together)] * bool(together)))
        pl_module.report({**{f"{name}/eval/{key}": value for name, row in scores.items() for key, value in row.items()},
                          **collective_scalars(together)}, step=step)

    def on_train_start(self, trainer, pl_module) -> None:
        self._evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every and pl_module.steps_done % self.every == 0:
            self._evaluate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if not trainer.should_stop:  # a run stopped early (a signal) ends now, not after another evaluation
            self._evaluate(trainer, pl_module)

    @property
    def initial(self) -> dict[str, dict[str, float]]:
        return self.history[0]["scores"] if self.history else {}

    @property
    def final(self) -> dict[str, dict[str, float]]:
        return self.history[-1]["scores"] if self.history else {}

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict["history"])
