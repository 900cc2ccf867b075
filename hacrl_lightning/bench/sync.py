"""`bench.py sync`: the weight sync of a vLLM engine in a process of its own, per method: seconds per sync and
the extra memory a sync takes, in the trainer and in the engine's processes.

    python scripts/bench.py sync [--agents tiny_b,tiny_qwen3] [--methods file,shared_memory] [--bucket-mb 256]
                                 [--repeats 5] [--ranks 1] [--json sync.json]

Each agent is loaded with fp32 master weights (as training holds them) and gets one engine per method, in its
own process (the default placement), its dtype the agent file's; one untimed sync, then `--repeats` timed ones
(median, min, max). While a sync runs, a sampler thread (every 2 ms) reads the resident memory of the trainer
(RSS, shared pages included: the bucket's pages count) and of the engine's process tree; the figures are the
peaks above what each held just before the sync. The file method's disk traffic is the safetensors file's size.
`--ranks N` (N > 1): N gloo ranks on this machine, each agent FSDP2-sharded over them as training shards it
(`strategies.shard_agent`) and one engine per rank, as `trainer=fsdp` runs; every sync gathers the shards one
tensor at a time, on all ranks together; one row per rank and method (`model_mb`: the whole model at the
engine's dtype, what a sync that gathered it all at once would add).
Needs vLLM (the `.venv-vllm` lane on CPU, or CUDA). Deliberately not here: whether the synced engine answers
as the trainer (tests/test_vllm.py does that).
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from hacrl_lightning.bench.report import MB, children_total, print_table
from hacrl_lightning.config import RolloutConfig

COLUMNS = ["agent", "params_m", "dtype", "method", "rank", "bucket_mb", "buckets", "sync_s", "sync_s_min",
           "sync_s_max", "model_mb", "trainer_extra_mb", "engine_extra_mb", "disk_mb"]


def add_arguments(parser) -> None:
    parser.add_argument("--agents", default="tiny_b,tiny_qwen3", help="agent presets, one engine per method each")
    parser.add_argument("--methods", default="file,shared_memory", help="rollout.weight_sync values to time")
    parser.add_argument("--bucket-mb", type=float, default=RolloutConfig.weight_sync_mb,
                        help="rollout.weight_sync_mb of shared_memory")
    parser.add_argument("--repeats", type=int, default=5, help="timed syncs per agent and method")
    parser.add_argument("--ranks", type=int, default=1,
                        help="gloo ranks on this machine, the agent FSDP2-sharded over them, one engine per rank")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")


class Peaks:
    """Resident memory of this process and of its children (the engine's processes), sampled every 2 ms
    between `start` and `stop`: the peaks above the values at `start`."""

    def __init__(self):
        import psutil

        self.me = psutil.Process()

    @staticmethod
    def _children_rss() -> float:
        return children_total(lambda child: child.memory_info().rss)

    def start(self) -> None:
        self.base = (self.me.memory_info().rss, self._children_rss())
        self.peak = list(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak[0] = max(self.peak[0], self.me.memory_info().rss)
            self.peak[1] = max(self.peak[1], self._children_rss())

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return (self.peak[0] - self.base[0]) / MB, (self.peak[1] - self.base[1]) / MB


def run(args) -> dict:
    from hacrl_lightning.rollout.vllm import require_vllm, vllm_platform

    require_vllm()
    if args.ranks < 1:
        raise SystemExit(f"--ranks {args.ranks}: 1 or more")
    if args.ranks == 1:
        rows = _measure(args)
    else:
        rows = _measure_on_ranks(args)
    return {"command": "python scripts/bench.py sync", "machine": f"{platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads, vLLM on {vllm_platform()}", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                                   time.gmtime()),
            "repeats": args.repeats, "ranks": args.ranks, "sync": rows}


def _measure(args, *, mesh=None) -> list[dict]:
    """The rows of this process: every agent and method (`mesh`: this rank's FSDP2 mesh, or None for one
    process). Under a mesh every rank runs the same syncs in the same order (the gathers are collectives)."""
    from hacrl_lightning.agents.agent import Agent
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.rollout import engine_options, make_engine
    from hacrl_lightning.rollout.vllm import vllm_platform
    from hacrl_lightning.strategies import shard_agent

    ranks = mesh.size() if mesh is not None else 1
    share = min(0.2, 0.8 / ranks) if vllm_platform() == "cuda" else 0.01  # one engine per rank alive at a time
    rank = mesh.get_rank() if mesh is not None else 0
    barrier = (lambda: torch.distributed.barrier()) if mesh is not None else (lambda: None)
    cfg, _ = compose_config([f"agents=[{args.agents}]", "algorithm=gspo"])
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, agent_cfg in cfg.agents.items():
            agent = Agent.load(name, agent_cfg, zoo_cache=cfg.zoo_cache, dtype=torch.float32)
            params = sum(p.numel() for p in agent.model.parameters())
            engine_dtype = getattr(torch, agent.cfg.dtype)
            model_mb = sum(t.numel() for t in agent.model.state_dict().values()) * engine_dtype.itemsize / MB
            folder = Path(workdir) / name
            options = engine_options(agent, "vllm", batch_size=0, gpu_memory_utilization=share, export_to=folder,
                                     writes=True, weight_sync_mb=args.bucket_mb)  # this rank's own export, whole
            if mesh is not None:  # then sharded, as training builds its engines before `configure_model` shards
                shard_agent(agent.model, mesh)
            for method in [m for m in args.methods.split(",") if m]:
                # on a GPU the ranks' engines start one after another (vLLM profiles the free memory), else together
                for turn in range(ranks if vllm_platform() == "cuda" else 1):
                    if turn == rank or vllm_platform() != "cuda":
                        engine = make_engine("vllm", agent.model, **{**options, "weight_sync": method})
                    barrier()
                engine.sync_weights(agent.model)  # untimed: the first sync maps the buffer
                seconds, trainer, engine_mb = [], [], []
                peaks = Peaks()
                for _ in range(args.repeats):
                    barrier()  # the ranks start each sync together
                    peaks.start()
                    start = time.perf_counter()
                    engine.sync_weights(agent.model)
                    seconds.append(time.perf_counter() - start)
                    extra = peaks.stop()
                    trainer.append(extra[0])
                    engine_mb.append(extra[1])
                shared = engine.shared_memory
                disk = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / MB if method == "file" else 0.0
                rows.append({
                    "agent": name, "params_m": params / 1e6, "dtype": agent.cfg.dtype, "method": method, "rank": rank,
                    "bucket_mb": shared.buffer_bytes / MB if shared else float("nan"),
                    "buckets": shared.buckets_sent if shared else 0,
                    "sync_s": statistics.median(seconds), "sync_s_min": min(seconds), "sync_s_max": max(seconds),
                    "model_mb": model_mb, "trainer_extra_mb": max(trainer), "engine_extra_mb": max(engine_mb),
                    "disk_mb": disk,
                })
                engine.close()
                print(f"  {name} {method} rank {rank}: {rows[-1]['sync_s']:.3f} s/sync", flush=True)
    return rows


def _measure_on_ranks(args) -> list[dict]:
    """`--ranks N`: N spawned gloo ranks on this machine, each `_measure` under a 1-D CPU mesh over all of them;
    the rows of every rank, rank by rank."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:  # a free port for the ranks' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank_main, args=(args, port, out), nprocs=args.ranks, join=True)
        return [row for rank in range(args.ranks)
                for row in json.loads((Path(out) / f"rank{rank}.json").read_text())]


def _rank_main(rank: int, args, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    try:
        rows = _measure(args, mesh=init_device_mesh("cpu", (args.ranks,)))
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def print_report(result: dict) -> None:
    ranks = f" | {result['ranks']} ranks, FSDP2-sharded" if result.get("ranks", 1) > 1 else ""
    print(f"machine: {result['machine']} | {result['date']}{ranks} | median (min, max) of {result['repeats']} syncs; "
          "extra memory: peak above the value before the sync")
    print_table(result["sync"], COLUMNS)
