"""Agents that join and leave under `trainer.placement=split` on 2 gloo ranks (a subprocess of
tests/test_agent_set.py: Lightning's launcher re-executes sys.argv, so this must not run under pytest).

    python tests/agent_set_split.py ROOT ZOO_CACHE

Both trainings run in the same two processes (the second Trainer finds the ranks and the process group in place):
tiny_a + tiny_b for one step (one rank each) into ROOT/base, then that run forked into ROOT/changed with tiny_b
dropped and tiny_c added (`resume_agents=change`; tiny_c takes tiny_b's rank), to step 2. Each rank prints what it
checked: `RANK-KEPT <agent> equal=<bool>` (its agent's weights and AdamW state as the resumed run starts, against
those it ended the first run with), `RANK-FRESH <agent> state=<n>` (a new agent's optimizer state entries),
`RANK-ROWS <learner> <source>=<n>` (the rows of each source in the learner's step-2 batch) and `RANK-DONE`.
"""

import sys

import torch
from lightning.pytorch import Callback

import hacrl_lightning.module as module_mod
from hacrl_lightning.cli import compose_config
from hacrl_lightning.placement import end_process_group
from hacrl_lightning.training import train


def _local(value):
    return (value.to_local() if hasattr(value, "to_local") else value).detach().clone()


class Grab(Callback):
    """This rank's agent: (name, weights, optimizer state) at the train's start or end."""

    def __init__(self, when: str):
        self.when, self.state = when, None

    def _grab(self, trainer, pl_module):
        (name,) = pl_module.local
        opt = trainer.optimizers[0].state_dict()["state"]
        self.state = (name, {key: _local(v) for key, v in pl_module.agents[name].state_dict().items()},
                      {index: {key: _local(v) for key, v in entry.items()} for index, entry in opt.items()})

    def on_train_start(self, trainer, pl_module):
        if self.when == "start":
            self._grab(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        if self.when == "end":
            self._grab(trainer, pl_module)


def same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(same(a[k], b[k]) if isinstance(a[k], dict) else torch.equal(a[k], b[k]) for k in a)


if __name__ == "__main__":
    torch.set_num_threads(1)
    root, zoo_cache = sys.argv[1], sys.argv[2]
    common = ["trainer.strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.placement=split",
              "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2", "trainer.eval_every=0",
              "data.eval_size=4", "trainer.checkpoint_every=1", "trainer.export_agents=false", f"zoo_cache={zoo_cache}"]
    ended, started = Grab("end"), Grab("start")
    rows = []
    real = module_mod.HACRLModule.update_learner

    def spy(module, k, name, view, *args, **kwargs):
        rows.append((name, {source: int((view.source_idx == j).sum()) for j, source in enumerate(module.names)}))
        return real(module, k, name, view, *args, **kwargs)

    try:
        cfg, _ = compose_config([*common, "agents=[tiny_a,tiny_b]", "trainer.steps=1", f"run_dir={root}/base"])
        train(cfg, extra_callbacks=[ended])
        module_mod.HACRLModule.update_learner = spy
        cfg, _ = compose_config([*common, "agents=[tiny_a,tiny_c]", "resume_agents=change", "trainer.steps=2",
                                 f"resume={root}/base", f"run_dir={root}/changed"])
        summary = train(cfg, extra_callbacks=[started])
    finally:
        end_process_group()  # as scripts/train.py ends
    (name, weights, optimizer) = started.state
    if name == ended.state[0]:
        print(f"RANK-KEPT {name} equal={same(weights, ended.state[1]) and same(optimizer, ended.state[2])}")
    else:
        print(f"RANK-FRESH {name} state={len(optimizer)}")
    for learner, counts in rows:
        print(f"RANK-ROWS {learner} " + " ".join(f"{source}={n}" for source, n in counts.items()))
    print(f"RANK-DONE steps={summary['steps']} updates={[a['optimizer_updates'] for a in summary['agents'].values()]}")
