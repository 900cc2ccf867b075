"""`bench.py sync`: the weight sync of a vLLM engine in a process of its own, per method: seconds per sync and
the extra memory a sync takes, in the trainer and in the engine's processes.

    python scripts/bench.py sync [--agents tiny_b,tiny_qwen3] [--methods file,shared_memory] [--bucket-mb 256]
                                 [--repeats 5] [--json sync.json]

Each agent is loaded with fp32 master weights (as training holds them) and gets one engine per method, in its
own process (the default placement), its dtype the agent file's; one untimed sync, then `--repeats` timed ones
(median, min, max). While a sync runs, a sampler thread (every 2 ms) reads the resident memory of the trainer
(RSS, shared pages included: the bucket's pages count) and of the engine's process tree; the figures are the
peaks above what each held just before the sync. The file method's disk traffic is the safetensors file's size.
Needs vLLM (the `.venv-vllm` lane on CPU, or CUDA). Deliberately not here: whether the synced engine answers
as the trainer (tests/test_vllm.py does that).
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from hacrl_lightning.bench.report import MB, children_total, print_table
from hacrl_lightning.config import RolloutConfig

COLUMNS = ["agent", "params_m", "dtype", "method", "bucket_mb", "buckets", "sync_s", "sync_s_min", "sync_s_max",
           "trainer_extra_mb", "engine_extra_mb", "disk_mb"]


def add_arguments(parser) -> None:
    parser.add_argument("--agents", default="tiny_b,tiny_qwen3", help="agent presets, one engine per method each")
    parser.add_argument("--methods", default="file,shared_memory", help="rollout.weight_sync values to time")
    parser.add_argument("--bucket-mb", type=float, default=RolloutConfig.weight_sync_mb,
                        help="rollout.weight_sync_mb of shared_memory")
    parser.add_argument("--repeats", type=int, default=5, help="timed syncs per agent and method")
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
    from hacrl_lightning.agents.agent import Agent
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.rollout import engine_options, make_engine
    from hacrl_lightning.rollout.vllm import require_vllm, vllm_platform

    require_vllm()
    share = 0.2 if vllm_platform() == "cuda" else 0.01
    cfg, _ = compose_config([f"agents=[{args.agents}]", "algorithm=gspo"])
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, agent_cfg in cfg.agents.items():
            agent = Agent.load(name, agent_cfg, zoo_cache=cfg.zoo_cache, dtype=torch.float32)
            params = sum(p.numel() for p in agent.model.parameters())
            for method in [m for m in args.methods.split(",") if m]:
                folder = Path(workdir) / f"{name}-{method}"
                engine = make_engine("vllm", agent.model, **engine_options(
                    agent, "vllm", batch_size=0, gpu_memory_utilization=share, export_to=folder,
                    weight_sync=method, weight_sync_mb=args.bucket_mb))
                engine.sync_weights(agent.model)  # untimed: the first sync maps the buffer
                seconds, trainer, engine_mb = [], [], []
                peaks = Peaks()
                for _ in range(args.repeats):
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
                    "agent": name, "params_m": params / 1e6, "dtype": agent.cfg.dtype, "method": method,
                    "bucket_mb": shared.buffer_bytes / MB if shared else float("nan"),
                    "buckets": shared.buckets_sent if shared else 0,
                    "sync_s": statistics.median(seconds), "sync_s_min": min(seconds), "sync_s_max": max(seconds),
                    "trainer_extra_mb": max(trainer), "engine_extra_mb": max(engine_mb), "disk_mb": disk,
                })
                engine.close()
                print(f"  {name} {method}: {rows[-1]['sync_s']:.3f} s/sync", flush=True)
    return {"command": "python scripts/bench.py sync", "machine": f"{platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads, vLLM on {vllm_platform()}", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                                   time.gmtime()),
            "repeats": args.repeats, "sync": rows}


def print_report(result: dict) -> None:
    print(f"machine: {result['machine']} | {result['date']} | median (min, max) of {result['repeats']} syncs; "
          "extra memory: peak above the value before the sync")
    print_table(result["sync"], COLUMNS)
