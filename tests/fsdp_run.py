"""Run scripts/train.py's training on 2 CPU processes over gloo with per-agent FSDP2 (a subprocess of
tests/test_training.py: Lightning's launcher re-executes sys.argv, so this must not run under pytest).

    python tests/fsdp_run.py RUN_DIR ZOO_CACHE STEPS [resume | stop_after_N | foreign_export | signal_in_export | -]
                             [OVERRIDE ...]

The OVERRIDEs come after the defaults below, so they win (`trainer.placement=split`, `trainer.devices=3`).
`foreign_export`: rank zero puts a file of someone else's in exports/tiny_a before the exports (that export fails
there); `signal_in_export`: rank zero sends itself SIGTERM as it starts the export of tiny_a.
"""

import os
import signal
import sys
from pathlib import Path

import torch

from conftest import ForeignExport, StopAfter
from hacrl_lightning.agents import Agent
from hacrl_lightning.cli import compose_config
from hacrl_lightning.placement import end_process_group
from hacrl_lightning.training import train


def signal_in_export() -> None:
    """Rank zero (the launching process, LOCAL_RANK unset or 0) sends itself SIGTERM on entering tiny_a's export."""
    real = Agent.export

    def export(self, *args, **kwargs):
        if self.name == "tiny_a" and os.environ.get("LOCAL_RANK", "0") == "0":
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    Agent.export = export

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    torch.set_num_threads(1)
    run_dir, zoo_cache, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    overrides = [
        "agents=[tiny_a,tiny_b]", "trainer.strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
        f"trainer.steps={steps}", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
        "trainer.eval_every=0", "data.eval_size=4", "trainer.checkpoint_every=1", "trainer.export_agents=true",
        f"zoo_cache={zoo_cache}", f"run_dir={run_dir}",
    ]
    extra = sys.argv[4] if len(sys.argv) > 4 else ""
    overrides += sys.argv[5:]
    if extra == "resume":
        overrides.append(f"resume={run_dir}")
    callbacks = [StopAfter(int(extra.rsplit("_", 1)[1]))] if extra.startswith("stop_after_") else []
    if extra == "foreign_export":
        callbacks.append(ForeignExport(run_dir, "tiny_a"))
    if extra == "signal_in_export":
        signal_in_export()
    cfg, _ = compose_config(overrides)
    try:
        summary = train(cfg, extra_callbacks=callbacks)
    finally:
        end_process_group()  # as scripts/train.py ends
    print(f"RANK-DONE steps={summary['steps']} updates={[a['optimizer_updates'] for a in summary['agents'].values()]}")
