"""`trainer.offload_idle`: an idle agent's training state in host memory, the same update, the phase table.

On this CPU machine host and device are one, so every move is an identity and the update must be bitwise the
same; what can fail here is the bookkeeping: which part is resident in which phase (`Residency.log`, checked
against docs/training.md#placement's table), Parameter objects the optimizer no longer holds, state lost in
a round trip. The GPU check (`make gpu-check`) measures the memory the moves free on a real device.
"""

from __future__ import annotations

import copy

import pytest
import torch

from hacrl_lightning.offload import Residency, move_optimizer_state


def test_a_round_trip_keeps_the_parameters_the_optimizer_holds_and_every_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    params = list(model.parameters())
    weights, state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    residency = Residency(enabled=True)
    residency.register("a", model, optimizer=opt)
    residency.offload_all()
    with residency.resident("a", optimizer=True):
        assert all(p is q for p, q in zip(model.parameters(), params))
    residency.restore_all()
    assert all(p is q for p, q in zip(model.parameters(), params))  # the optimizer still steps these
    assert all(torch.equal(weights[key], value) for key, value in model.state_dict().items())
    after = opt.state_dict()
    for key, moments in state["state"].items():
        assert all(torch.equal(moments[k], after["state"][key][k]) for k in moments)
    assert all(p.grad is None for p in model.parameters())  # dropped once the update was done
    move_optimizer_state(opt, torch.device("cpu"))
    assert all(s["step"].device.type == "cpu" for s in opt.state.values())


@pytest.mark.slow
def test_offload_idle_makes_the_same_update_and_follows_the_phase_table(tmp_path, zoo_cache):
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.training import train

    seen = {}

    def run(offload: bool):
        cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "trainer.steps=2", "data.prompts_per_step=4",
                                 "trainer.mini_batch_prompts=2", "rollout.group_size=2", "trainer.eval_every=1",
                                 "data.eval_size=4", "trainer.export_agents=true", "algorithm.kl_coef=0.001",
                                 f"trainer.offload_idle={str(offload).lower()}", f"zoo_cache={zoo_cache}",
                                 f"run_dir={tmp_path / str(offload)}"])
        from lightning.pytorch import Callback

        class Keep(Callback):
            def on_train_end(self, trainer, pl_module):
                seen[offload] = pl_module.residency

        train(cfg, extra_callbacks=[Keep()])
        from safetensors.torch import load_file

        return {name: load_file(str(tmp_path / str(offload) / "exports" / name / "model.safetensors"))
                for name in ("tiny_a", "tiny_b")}

    off, on = run(False), run(True)
    for name in off:
        assert all(torch.equal(off[name][key], on[name][key]) for key in off[name]), name
    assert seen[False].log == []
    log = seen[True].log
    # replay the moves: where each (agent, part) is; the table of docs/training.md#placement
    where = {}
    phases = []
    assert log[-6:] == [("device", name, part) for name in ("tiny_a", "tiny_b")
                        for part in ("weights", "optimizer", "reference")]  # the run ends resident (exports)
    idle = [("host", name, part) for name in ("tiny_a", "tiny_b") for part in ("reference", "optimizer", "weights")]
    start = next(i for i in range(len(log)) if log[i : i + 6] == idle)  # the run starts idle (after the first
    assert all(name and part == "weights" for _, name, part in log[:start])  # evaluation, which needs weights only)
    for place, name, part in log[start:-6]:
        where[(name, part)] = place
        on_device = {key for key, value in where.items() if value == "device"}
        optimizers = {n for n, p in on_device if p == "optimizer"}
        references = {n for n, p in on_device if p == "reference"}
        assert len(optimizers) <= 1 and len(references) <= 1  # one agent's update or old log-probs at a time
        assert not optimizers & references  # its update never holds its reference
        assert all((n, "weights") in on_device for n in optimizers | references)
        phases.append(frozenset(on_device))
    assert all(value == "host" for value in where.values())  # idle between phases
    updates = [p for p in phases if any(part == "optimizer" for _, part in p)]
    scoring = [p for p in phases if any(part == "reference" for _, part in p)]
    assert len(updates) >= 2 * 2 and len(scoring) >= 2 * 2  # each agent's update and old log-probs, each step
