"""One training step on 1 rank and on 2 gloo ranks with the same global batch (tests/test_distributed.py).

    python tests/dist_equivalence.py record OUT ZOO_CACHE [CASE ...]     # 1 process, real generation
    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/dist_equivalence.py replay OUT ZOO_CACHE [CASE ...]        # 2 ranks, FSDP2 over gloo
    MASTER_ADDR=127.0.0.1 MASTER_PORT=P WORLD_SIZE=2 NODE_RANK=R \\
        python tests/dist_equivalence.py replay-nodes OUT ZOO_CACHE [CASE ...]   # node R of 2 (R = 0, 1)
    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/dist_equivalence.py replay-split OUT ZOO_CACHE [CASE ...]  # trainer.placement=split, an agent a rank
    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        tests/dist_equivalence.py replay-split4 OUT ZOO_CACHE [CASE ...] # split, two ranks (FSDP2) per agent
    python -m torch.distributed.run --standalone --nproc_per_node=3 \\
        tests/dist_equivalence.py replay-split3 OUT ZOO_CACHE [CASE ...] # split, groups of 2 and 1 ranks

`record` trains each case for one step on one process and saves what the test compares (final
weights, optimizer updates, the m of every mini-batch, the capability window, the step's metrics)
together with every generation the engines made. `replay` runs the same cases on 2 ranks with
`trainer=fsdp`; the only thing replaced is sampling: `RolloutDataModule.generate` returns the
recorded token ids of its prompts (sampling draws a different random stream when the batch is
split over ranks, so without this the two runs would train on different responses). Decoding,
rewards, the exchange, the gather over ranks, the plan, old log-probs and the updates are all real.
The ranks come from torch's launcher, so several runs share one process group.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback

REPO = Path(__file__).resolve().parents[1]

import hacrl_lightning.module as module_mod  # noqa: E402
from hacrl_lightning.callbacks.capability import CapabilityCallback  # noqa: E402
from hacrl_lightning.cli import compose_config  # noqa: E402
from hacrl_lightning.datamodule import RolloutDataModule  # noqa: E402
from hacrl_lightning.placement import end_process_group  # noqa: E402
from hacrl_lightning.training import train  # noqa: E402

SMALL = ["agents=[tiny_a,tiny_b]", "trainer.steps=1", "trainer.eval_every=0", "data.eval_size=2",
         "trainer.export_agents=false", "trainer.checkpoint_every=0",
         "trainer.diagnostics_every=1"]  # the gradient-share diagnostic runs too: it must leave the update alone
CASES = {
    # 9-response mini-batches split 5/4 over 2 ranks, micro-batches of 2: rank 1 pads with a dummy pass
    "hacpo": ["algorithm=hacpo", "data.prompts_per_step=6", "rollout.group_size=3", "trainer.mini_batch_prompts=3",
              "trainer.micro_batch_size=2"],
    "gspo_x2": ["algorithm=gspo_x2", "data.prompts_per_step=4", "rollout.group_size=2",
                "trainer.mini_batch_prompts=2", "trainer.micro_batch_size=3"],
    "grpo": ["algorithm=grpo", "data.prompts_per_step=4", "rollout.group_size=2", "trainer.mini_batch_prompts=2",
             "trainer.micro_batch_size=3"],
    # hacpo with tiny_a a LoRA agent (FSDP2 over a peft model: frozen base shards, adapter gradients) and the KL
    # penalty (its reference: the same model with the adapter off)
    "hacpo_lora": ["algorithm=hacpo", "data.prompts_per_step=6", "rollout.group_size=3", "trainer.mini_batch_prompts=3",
                   "trainer.micro_batch_size=2", "agents.tiny_a.lora.rank=4", "algorithm.kl_coef=0.01"],
}
TWO_RANKS = ["trainer.strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"]
TWO_NODES = ["trainer.strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.num_nodes=2"]
"""`replay-nodes`: two "nodes" of one CPU rank each, one process per node started by the test with the
environment Lightning reads on a cluster without a scheduler (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
NODE_RANK; tests/test_two_nodes.py)."""
SPLIT = ["trainer.strategy=fsdp", "trainer.accelerator=cpu", "trainer.placement=split"]
LAYOUTS = {"record": [], "replay": TWO_RANKS, "replay-nodes": TWO_NODES, "replay-split": [*SPLIT, "trainer.devices=2"],
           "replay-split4": [*SPLIT, "trainer.devices=4"],
           "replay-split3": [*SPLIT, "trainer.devices=3", "agents.tiny_a.ranks=2", "agents.tiny_b.ranks=1",
                             "rollout.backend=vllm"]}
"""`replay-split3`: groups of different sizes, which `rollout=hf` refuses (its generation waits for every rank
of the world at each token); the config says vLLM so that they may differ, and `transformers_engines` builds
the transformers engine all the same (there is no vLLM in this lane): generation is replayed, the engines only
answer the held-out evaluation, every rank as many prompts."""


def transformers_engines() -> None:
    """Build the transformers engine whatever the config's backend (`replay-split3`)."""
    import hacrl_lightning.datamodule as datamodule_mod

    real = datamodule_mod.make_engine
    datamodule_mod.make_engine = lambda backend, model, **options: real(
        "hf", model, **{k: v for k, v in options.items() if k in ("eos_token_ids", "pad_token_id", "batch_size")})


class Record(Callback):
    """What the test compares, taken at the end of the run (weights gathered from every rank), the initial
    weights, and every update's gradient as the optimizer is about to apply it (clipped, gathered whole
    from the shards) with the optimizer's settings of that update (lr after the schedule, betas, eps)."""

    def __init__(self):
        self.result = {}
        self.grads: dict[str, list[dict[str, torch.Tensor]]] = {}

    def on_train_start(self, trainer, pl_module):
        self.initial = self._weights(pl_module)
        (self.window,) = [c.window for c in trainer.callbacks if isinstance(c, CapabilityCallback)]

    @staticmethod
    def _weights(pl_module) -> dict:
        """This rank's agents' weights, whole (a sharded tensor gathered over its agent's group)."""
        full = lambda v: v.full_tensor() if hasattr(v, "full_tensor") else v  # noqa: E731
        return {name: {k: full(v).detach().float().cpu().clone() for k, v in agent.model.state_dict().items()}
                for name, agent in pl_module.agents.items()}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for name, agent in pl_module.agents.items():
            named = [(key, p) for key, p in agent.model.named_parameters() if id(p) in params]
            if named:
                full = lambda g: g.full_tensor() if hasattr(g, "full_tensor") else g  # noqa: E731
                group = optimizer.param_groups[0]
                self.grads.setdefault(name, []).append({
                    "grads": {key: full(p.grad).detach().float().cpu().clone() for key, p in named if p.grad is not None},
                    "hparams": {k: group[k] for k in ("lr", "betas", "eps", "weight_decay")},
                })

    def on_train_end(self, trainer, pl_module):
        self.result = {
            "initial_weights": self.initial,
            "weights": self._weights(pl_module),
            "updates": {name: c["optimizer_updates"] for name, c in pl_module.counters.items()},
            "responses": {name: c["responses_trained"] for name, c in pl_module.counters.items()},
            "capability": [list(h) for h in self.window.history],
            "metrics": dict(pl_module.last_metrics),
            "cross_ratios": dict(pl_module.cross_ratios.last),  # the diagnostics step's, gathered over ranks
            "grads": self.grads,
            "layout": {"num_nodes": trainer.num_nodes, "node_rank": trainer.node_rank,
                       "world_size": trainer.world_size, "global_rank": trainer.global_rank},
            "held": sorted({key.split(".")[1] for key, _ in [*pl_module.named_parameters(), *pl_module.named_buffers()]
                            if key.startswith(("agents.", "references."))}),
        }


def spy_on_m() -> dict:
    """Record, per learner, the m of every pass of its update (`HACRLModule._backward`; the gradient-share
    diagnostic's passes, which name their part, left out); returns the holder whose `calls` the caller resets
    for each run."""
    real_backward = module_mod.HACRLModule._backward
    state: dict = {"calls": {}}

    def backward_spy(module, agent, view, plan, tables, lowers, m, micro_batch, part=None, **keywords):
        if part is None:
            state["calls"].setdefault(agent.name, []).append(m)
        return real_backward(module, agent, view, plan, tables, lowers, m, micro_batch, part, **keywords)

    module_mod.HACRLModule._backward = backward_spy
    return state


def spy_on_local_accuracy() -> dict:
    """Record each agent's accuracy on this rank's own prompts (its rollouts before the gather)."""
    real = RolloutDataModule.gather
    state: dict = {"acc": {}}

    def gather(dm, examples, rollouts):
        for name in dm.agents:  # this rank's sources (all of them unless split)
            rewards = [r.reward for r in rollouts if r.source == name]
            state["acc"][name] = sum(rewards) / len(rewards)
        return real(dm, examples, rollouts)

    RolloutDataModule.gather = gather
    return state


def use_generations(mode: str, store: dict):
    """`record`: keep every training generation by (step, n, agent, prompt id); `replay`: answer from them."""
    real = RolloutDataModule.generate

    def generate(dm, examples, *, step, n):
        keys = [(step, n, name) for name in dm.agents]
        if mode == "record":
            out = real(dm, examples, step=step, n=n)
            for key, name in zip(keys, dm.agents):
                for p, example in enumerate(examples):
                    store[(*key, example.prompt_id)] = out[name][p * n : (p + 1) * n]
            return out
        return {name: [g for example in examples for g in store[(*key, example.prompt_id)]]
                for key, name in zip(keys, dm.agents)}

    RolloutDataModule.generate = generate


def main() -> None:
    mode, out, zoo_cache, *cases = sys.argv[1:]
    torch.set_num_threads(1)
    out = Path(out)
    rank = int(os.environ.get("RANK", os.environ.get("NODE_RANK", "0")))
    store = torch.load(out / "generations.pt", weights_only=False) if mode != "record" else {}
    use_generations(mode, store)
    if mode == "replay-split3":
        transformers_engines()
    spy = spy_on_m()
    local = spy_on_local_accuracy()
    try:
        results = run_cases(mode, out, zoo_cache, cases, spy, local)
    finally:
        end_process_group()  # as scripts/train.py ends: gloo's threads are not left to the interpreter's teardown
    torch.save(results, out / (f"{mode}.pt" if rank == 0 else f"{mode}_rank{rank}.pt"))
    if rank == 0:
        if mode == "record":
            torch.save(store, out / "generations.pt")
    print(f"EQUIVALENCE-DONE rank={rank} mode={mode}", flush=True)


def run_cases(mode: str, out: Path, zoo_cache: str, cases: list[str], spy: dict, local: dict) -> dict:
    results = {}
    for case in cases or list(CASES):
        spy["calls"] = calls = {}
        record = Record()
        overrides = [*SMALL, *CASES[case], *LAYOUTS[mode],
                     f"zoo_cache={zoo_cache}", f"run_dir={out / mode / case}"]
        cfg, _ = compose_config(overrides)
        train(cfg, extra_callbacks=[record])
        results[case] = {**record.result, "m": calls, "local_acc": dict(local["acc"])}
    return results


if __name__ == "__main__":
    main()
