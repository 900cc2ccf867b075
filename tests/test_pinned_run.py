"""One short HACPO run whose numbers are pinned: a refactor that changes behaviour changes them.

Three zoo agents (three tokenizers, so every learner trains on retokenized partner responses),
a KL reference, two steps of two mini-batches each, evaluation before and after. The pinned
figures (`fixtures/pinned_run.json`) are the run's summary (counters, held-out accuracy), every
scalar it logged to TensorBoard except wall times, and a fingerprint of each agent's final weights
(sums of the absolute values and of the squares of the change from its initial weights, in float64).

The figures must hold on any CPU (`test_other_cpu.py` runs this test under other kernels),
so each comparison allows what another CPU's rounding moves: floats within 1e-4 relative, or 2e-6
absolute (scalars are pinned rounded to 6 decimals, and a last-bit difference can flip the 6th). The
weight fingerprint sums positive terms: under other kernels AdamW turns last-bit differences of
near-zero gradients into differences of up to one update in a few weights (see test_distributed.py),
which moved the *signed* sum of the change by 4.7e-3 of itself but these sums by at most 7e-6 (measured),
while one update more or less changes them by a quarter or more.

Regenerate the fixture only for an intended change of behaviour, and say so in the commit:
`python tests/test_pinned_run.py --write`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pinned_run.json"
OVERRIDES = [
    "agents=[tiny_a,tiny_b,tiny_c]", "algorithm=hacpo", "algorithm.kl_coef=0.001", "trainer.steps=2",
    "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2", "trainer.eval_every=0",
    "data.eval_size=8", "trainer.micro_batch_size=4", "trainer.export_agents=false", "seed=7",
]
SKIPPED_SCALARS = ("time/", "throughput/")
"""Wall-clock scalars differ between runs; everything else logged is deterministic."""


def _compose(overrides):
    from hacrl_lightning.cli import compose_config

    return compose_config(overrides)[0]


def _scalars(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [round(e.value, 6) for e in events.Scalars(tag)]
            for tag in sorted(events.Tags()["scalars"]) if not tag.startswith(SKIPPED_SCALARS)}


def pinned_figures(run_dir: Path, zoo_cache: Path, *, weights_to: Path | None = None) -> dict:
    """Run the pinned configuration in `run_dir` and return its figures (and save the final weights
    to `weights_to`, for a bit-exact comparison of two code versions)."""
    from hacrl_lightning.agents import Agent
    from hacrl_lightning.training import train

    captured = {}

    from lightning.pytorch import Callback

    class KeepModule(Callback):
        def on_train_end(self, trainer, pl_module):
            captured["module"] = pl_module

    cfg = _compose([*OVERRIDES, f"zoo_cache={zoo_cache}", f"run_dir={run_dir}"])
    summary = train(cfg, extra_callbacks=[KeepModule()])
    if weights_to is not None:
        torch.save({name: agent.model.state_dict() for name, agent in captured["module"].agents.items()}, weights_to)
    weights = {}
    for name, agent in captured["module"].agents.items():
        initial = Agent.load(name, cfg.agents[name], zoo_cache=zoo_cache).model.state_dict()
        final = agent.model.state_dict()
        delta = [(final[key].double() - initial[key].double()).flatten() for key in final]
        delta = torch.cat(delta)
        weights[name] = {"delta_abs": float(delta.abs().sum()), "delta_sq": float(delta.square().sum())}
    agents = {name: {key: value for key, value in row.items() if key != "export"}
              for name, row in summary["agents"].items()}
    return {"agents": agents, "eval_history": summary["eval_history"], "scalars": _scalars(run_dir),
            "weights": weights}


def _close(a, b, path: str, problems: list[str]) -> None:
    if isinstance(a, dict):
        if set(a) != set(b):
            problems.append(f"{path}: keys {sorted(set(a) ^ set(b))} differ")
        for key in set(a) & set(b):
            _close(a[key], b[key], f"{path}/{key}", problems)
    elif isinstance(a, list):
        if len(a) != len(b):
            problems.append(f"{path}: {len(a)} values, pinned {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]", problems)
    elif isinstance(a, float) or isinstance(b, float):
        if not (math.isclose(a, b, rel_tol=1e-4, abs_tol=2e-6) or (math.isnan(a) and math.isnan(b))):
            problems.append(f"{path}: {a!r}, pinned {b!r}")
    elif a != b:
        problems.append(f"{path}: {a!r}, pinned {b!r}")


@pytest.mark.slow
def test_the_pinned_run_gives_the_pinned_numbers(tmp_path, zoo_cache):
    pinned = json.loads(FIXTURE.read_text())
    got = json.loads(json.dumps(pinned_figures(tmp_path / "run", zoo_cache)))
    problems: list[str] = []
    _close(got, pinned, "", problems)
    assert not problems, "the pinned run changed:\n" + "\n".join(problems[:40])


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/test_pinned_run.py --write   (regenerates fixtures/pinned_run.json)")
    import os
    import tempfile

    cache = Path(os.environ.get("HACRL_ZOO_CACHE", Path.home() / ".cache/hacrl_lightning/zoo"))
    with tempfile.TemporaryDirectory() as tmp:
        figures = pinned_figures(Path(tmp) / "run", cache)
    FIXTURE.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
