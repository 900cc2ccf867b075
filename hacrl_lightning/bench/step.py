"""`bench.py step`: full framework HACPO steps side by side with a bare PyTorch + transformers loop.

    python scripts/bench.py step [--agents tiny_a,tiny_b,tiny_c,tiny_d] [--n 2,3,4] [--groups 4,8,16]
                                 [--prompts 4] [--steps 3] [--warmup 1] [--headline-repeats 2]
                                 [--backend hf|vllm] [--interleave steps|processes] [--null]
                                 [--profile DIR] [--json bench.json]

Both paths start from the same tiny zoo weights, see the same prompts (the framework's seeded,
step-indexed prompt sampler), and sample with the same settings and seeds. Sampled response
lengths drift apart as soon as the two paths' weights differ, so both generate *exactly*
`max_response_len` tokens per response (stop tokens are masked until then: `min_new_tokens =
max_new_tokens`): the generation, the forward passes and the backward passes then process the same
numbers of sequences and tokens in both paths (partner responses are retokenized from text, so
trained-token counts may differ by a few tokens after the first step; both are reported).

(a) framework: the run `train()` builds (`training.build_system`: the real `HACRLModule`,
`RolloutDataModule`, callbacks, and Lightning `Trainer` with its TensorBoard logger), minus held-out
evaluation, checkpoints and the every-k-steps gradient-share diagnostics (`--diagnostics-every K` times them as
a phase of their own), which are not part of a step; phases are marked through the module's and
the DataModule's `phase_listeners`. Phase times
are the module's own `time/*` metrics and `WeightSyncCallback.last_seconds`; `logging` is the rest
of the step (metrics, `log_dict`, the TensorBoard write, the progress bar, the Lightning loop,
capability and advantages), measured from one `on_train_batch_start` to the next.
(b) bare: the repo's one bare HACPO loop, `reference.hacpo_step` (plain PyTorch + transformers, no
Lightning), timed per phase through its `phase` marks: the same engines generate (wrapped to sample full
length), the same reward function scores in-process, `view_for` retokenizes, one no-grad forward per
source gives the old log-probs, then per learner the same mini-batches (own responses first), HACPO's
loss, backward, gradient clip and AdamW step, with the same arithmetic as the framework (tested by
tests/test_reference.py). It runs one forward pass per mini-batch (and one per source for the old
log-probs) where the framework runs micro-batches of `trainer.micro_batch_size` (16): the same passes at
G = 4 (mini-batches of 4 prompts, 16 rows), two and four times as many in the framework at G = 8 and 16.

`framework_over_bare` is the ratio of the median CPU seconds per step (all threads of the trainer's process
and of the engines' processes: vLLM's own processes count), which a machine shared with other jobs leaves
nearly intact; the wall-time ratio is reported beside it. The headline (first) configuration runs
`--headline-repeats` framework/bare process pairs, pools their steps, and reports each pair's ratios (median,
min, max over the pairs: the spread). A pair's two processes run at once and take their steps in turn
(`--interleave steps`, `LockStep`: framework step, bare step, framework step, ...; one waits, idle, while the
other steps), so a slow spell of a shared machine falls on both paths alike; each then starts a step with the
other's data in the caches, which raises both a little. `--interleave processes` runs one process after the
other instead. `--null` times the bare loop against itself the same way: the machine's own spread.
`outside_phases_share` is the share of the step spent outside every timed phase (the `logging` remainder), and
`slowest_step_over_median` the slowest timed step over the median: no time goes unaccounted, and a spike shows.
Each (path, n, G) runs in a fresh process, so peak resident memory (RSS, sampled every 5 ms and
attributed to the phase running) is that configuration's alone. The warm-up steps are not timed;
in them the framework is searched, at every phase boundary, for CPU tensors shaped like a weight
matrix that are not parameters, gradients or optimizer state (`stray_weight_copies`).
Deliberately not here: checking the framework's math (tests do that) and vLLM throughput
(`bench.py rollout`).
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

from lightning.pytorch import Callback

from hacrl_lightning.bench.report import MB, children_total, print_table

PHASES = ("rollout", "reward", "exchange", "old_logprobs", "update", "diagnostics", "weight_sync", "logging")
"""The framework step's phases, in order; `diagnostics` is the gradient-share pass of `--diagnostics-every` steps
(none by default: the bare loop has none); `logging` is the remainder (see the module docstring)."""


def add_arguments(parser) -> None:
    parser.add_argument("--agents", default="tiny_a,tiny_b,tiny_c,tiny_d", help="agent presets, first n are used")
    parser.add_argument("--n", default="2,3,4", help="agent counts to time (at the first G)")
    parser.add_argument("--groups", default="4,8,16", help="G values to time (at the first n)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (P)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration and path")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--headline-repeats", type=int, default=2,
                        help="framework/bare process pairs, alternating, pooled for the headline (first) configuration")
    parser.add_argument("--json", default="bench.json", help="where to write the figures ('' for nowhere)")
    parser.add_argument("--profile", default="", help="a folder: the headline's first framework and bare runs under "
                                                      "cProfile, written there as framework.prof and bare.prof")
    parser.add_argument("--lora", type=int, default=0, help="every agent a LoRA agent of this rank (0: full "
                        "fine-tuning); the bare loop trains the same peft models")
    parser.add_argument("--diagnostics-every", type=int, default=0,
                        help="the framework's gradient-share pass every K steps (trainer.diagnostics_every; 0: never, "
                             "as the bare loop, which has none), timed as the phase `diagnostics`")
    parser.add_argument("--null", action="store_true",
                        help="the noise floor: --headline-repeats pairs of bare-loop processes, the second over the "
                             "first (what the same program against itself spreads on this machine)")
    parser.add_argument("--interleave", default="steps", choices=["steps", "processes"],
                        help="a pair's two runs: both at once, taking their steps in turn (steps: a slow spell of the "
                             "machine falls on both alike; both runs' models and engines are in memory at once), or "
                             "one process after the other (processes)")
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"],
                        help="rollout engine of both paths: transformers, or one vLLM engine per agent (CUDA or "
                             "vLLM's CPU build), synced after every step in both")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def lora_overrides(agent_names: list[str], rank: int) -> tuple[str, ...]:
    """`--lora R`: every agent trains a rank-R adapter (both paths load the same peft models, `Agent.load`)."""
    return tuple(f"agents.{name}.lora.rank={rank}" for name in agent_names) if rank else ()


def run_overrides(agent_names: list[str], args) -> tuple[str, ...]:
    """The command line's changes to both paths' config (after `compose`'s own): `--lora`, `--diagnostics-every`."""
    every = args.diagnostics_every
    return (*lora_overrides(agent_names, args.lora), *([f"trainer.diagnostics_every={every}"] if every else []))


def configurations(args) -> list[tuple[int, int]]:
    """(n, G) pairs: n grows at the first G, then G grows at the first n; the first pair is the headline."""
    counts, groups = _ints(args.n), _ints(args.groups)
    pairs = [(n, groups[0]) for n in counts] + [(counts[0], g) for g in groups[1:]]
    return list(dict.fromkeys(pairs))


# -- both paths ------------------------------------------------------------------------------------


VLLM_SHARE = {"cpu": 0.01, "cuda": 0.15}
"""Each agent's engine memory share in the benchmark: 1% of the machine's memory for a CPU engine's KV cache
(~240 MB on 24 GB, far more than these batches need), 15% of the GPU's on CUDA (four agents fit)."""


def compose(agent_names: list[str], group: int, prompts: int, steps: int, run_dir: str, backend: str = "hf",
            overrides: tuple[str, ...] = ()):
    from hacrl_lightning.cli import compose_config

    engine = []
    if backend == "vllm":
        from hacrl_lightning.rollout.vllm import vllm_platform

        share = VLLM_SHARE.get(vllm_platform() or "cpu")
        engine = ["rollout=vllm", *[f"agents.{name}.gpu_memory_utilization={share}" for name in agent_names]]
    cfg, _ = compose_config([f"agents=[{','.join(agent_names)}]", "algorithm=hacpo", f"rollout.group_size={group}",
                             f"data.prompts_per_step={prompts}", f"trainer.mini_batch_prompts={min(4, prompts)}",
                             f"trainer.steps={steps}", "trainer.eval_every=0", "trainer.export_agents=false",
                             "trainer.diagnostics_every=0", f"run_dir={run_dir}", *engine, *overrides])
    return cfg


class GcClock:
    """Seconds spent in Python's garbage collector since `start` (its `gc.callbacks`), and the collections of
    the oldest generation: a full collection walks every object of the heap, and vLLM's and pydantic's
    imports put millions there."""

    def __init__(self):
        self.seconds, self.full, self._t = 0.0, 0, None
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        elif self._t is not None:
            self.seconds += time.perf_counter() - self._t
            self.full += info.get("generation") == 2
            self._t = None


_GC: list[GcClock] = []


def gc_clock() -> GcClock:
    """The process's `GcClock`, installed on first use (a run of this module's paths, not its import)."""
    if not _GC:
        _GC.append(GcClock())
    return _GC[0]


class LockStep:
    """Two processes' steps taken in turn (`--interleave steps`): each waits for its turn before a step and hands
    the turn over after it, so one path's steps alternate with the other's and a slow spell of the machine falls on
    both alike. Built in the parent, handed to each child at its start (`install_turn`), one side each; the first
    `wait` also waits until both sides are built (loading and engine start-up are not timed). A side that has ended
    (`finish`: by itself, or by the parent when its process died) never holds the other up."""

    def __init__(self, ctx):
        self._cond = ctx.Condition()
        self._turn, self._ready, self._done = ctx.RawValue("i", 0), ctx.RawValue("i", 0), ctx.RawArray("b", 2)
        self.side: int | None = None
        self._arrived = False

    def _other_done(self) -> bool:
        return bool(self._done[1 - self.side])

    def wait(self, timeout: float = 3600.0) -> None:
        """Until it is this side's turn (or the other side has ended)."""
        with self._cond:
            if not self._arrived:
                self._arrived = True
                self._ready.value += 1
                self._cond.notify_all()
                if not self._cond.wait_for(lambda: self._ready.value == 2 or self._other_done(), timeout):
                    raise TimeoutError(f"the other benchmark process was not ready within {timeout:.0f} s")
            if not self._cond.wait_for(lambda: self._turn.value == self.side or self._other_done(), timeout):
                raise TimeoutError(f"the other benchmark process did not hand the turn over within {timeout:.0f} s")

    def hand_over(self) -> None:
        with self._cond:
            self._turn.value = 1 - self.side
            self._cond.notify_all()

    def finish(self, side: int | None = None) -> None:
        """`side` (this one by default) has ended: the other runs its remaining steps without waiting."""
        side = self.side if side is None else side
        with self._cond:
            self._done[side] = 1
            self._turn.value = 1 - side
            self._cond.notify_all()


class _Alone:
    """No other process to take turns with (`--interleave processes`, and every run outside the benchmark)."""

    def wait(self) -> None:
        pass

    def hand_over(self) -> None:
        pass

    def finish(self) -> None:
        pass


_TURN: list = [_Alone()]


def turn():
    """This process's `LockStep` side, or `_Alone`."""
    return _TURN[0]


def install_turn(gate: LockStep, side: int) -> None:
    """A child process's start (`ProcessPoolExecutor`'s initializer): take `side` of `gate`."""
    gate.side = side
    _TURN[0] = gate


class PhaseMemory:
    """The phase now running (set by `mark`) and the peak RSS seen in each phase (a 5 ms sampler thread)."""

    def __init__(self, interval: float = 0.005):
        import psutil

        self._process = psutil.Process()
        self.label = "setup"
        self.peak: dict[str, int] = defaultdict(int)
        self.scan = None
        """Called at each mark when set (the framework's weight-copy check in its warm-up steps)."""
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        label, rss = self.label, self._process.memory_info().rss
        self.peak[label] = max(self.peak[label], rss)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def mark(self, label: str) -> None:
        self._sample()
        if self.scan is not None:
            self.scan()
        self.label = label
        self._sample()

    def close(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {label: rss / MB for label, rss in self.peak.items()}


def engine_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process's children: the vLLM engines' processes (none
    with the transformers backend or engines in the trainer's process). An engine process that has ended
    drops out of the sum, so a step's difference is meaningful only while the engines live (all timed steps)."""
    return children_total(lambda child: sum(child.cpu_times()[:2]))  # user + system


def weight_copies(agents, optimizers) -> list[str]:
    """Live CPU tensors, other than parameters, gradients and optimizer state, shaped like a weight
    matrix of an agent (>= 4096 elements): copies of weights a phase would hold beyond the algorithm's."""
    import torch

    shapes = {tuple(p.shape) for agent in agents for p in agent.parameters() if p.numel() >= 4096}
    owned = set()
    for agent in agents:
        for p in agent.parameters():
            owned.add(p.untyped_storage().data_ptr())
            if p.grad is not None:
                owned.add(p.grad.untyped_storage().data_ptr())
    for optimizer in optimizers:
        for state in optimizer.state.values():
            owned.update(v.untyped_storage().data_ptr() for v in state.values() if isinstance(v, torch.Tensor))
    found = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and not isinstance(obj, torch.nn.Parameter) and tuple(obj.shape) in shapes:
            ptr = obj.untyped_storage().data_ptr()
            if ptr not in owned:
                found[ptr] = f"{tuple(obj.shape)} {obj.dtype}"
    return sorted(found.values())


def _weights_mb(agents) -> float:
    return sum(p.numel() * p.element_size() for agent in agents for p in agent.parameters()) / MB


# -- (a) the framework -----------------------------------------------------------------------------


def run_framework(agent_names: list[str], group: int, prompts: int, steps: int, warmup: int,
                  backend: str = "hf", overrides: tuple[str, ...] = ()) -> dict:
    """What `train()` builds (`training.build_system`), minus held-out evaluation and checkpoints, with
    fixed-length sampling, phase marks (the module's and the DataModule's `phase_listeners`) and a recorder."""
    import lightning.pytorch as pl
    import torch

    from hacrl_lightning.training import build_system, build_trainer

    memory = PhaseMemory()
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose(agent_names, group, prompts, warmup + steps, run_dir, backend, overrides)
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        module, datamodule, callbacks, _ = build_system(cfg, Path(run_dir), datamodule_class=fixed_length_datamodule())
        callbacks, recorder = instrument(module, datamodule, callbacks, memory, warmup)
        build_trainer(cfg, Path(run_dir), callbacks).fit(module, datamodule=datamodule)
        peaks = memory.close()
        weights = _weights_mb(module.agents.values())
    rows = recorder.steps[warmup:]
    return {"path": "framework", "steps": rows, "warmup_steps": recorder.steps[:warmup], "peak_rss_mb": peaks,
            "weights_mb": weights, "reference_copies": len(module.references), "stray_weight_copies": recorder.copies,
            "threads": torch.get_num_threads()}


def instrument(module, datamodule, callbacks: list, memory, warmup: int) -> tuple[list, "StepRecorder"]:
    """The run's callbacks with a step recorder first and phase marks around the weight sync, minus held-out
    evaluation and checkpoints (not part of a step); the module's and the DataModule's phase listeners mark
    `memory` (anything with `mark(label)`, `label` and `scan`). Returns the callbacks and the recorder, whose
    `steps` hold each step's phase times and token counts (the DataModule must be `fixed_length_datamodule`'s)."""
    from hacrl_lightning.callbacks.checkpoint import StepCheckpoint
    from hacrl_lightning.callbacks.evaluation import HeldOutEvalCallback
    from hacrl_lightning.callbacks.weight_sync import WeightSyncCallback

    module.phase_listeners.append(memory.mark)
    datamodule.phase_listeners.append(memory.mark)
    (sync,) = [c for c in callbacks if isinstance(c, WeightSyncCallback)]
    recorder = StepRecorder(module, sync, memory, warmup)
    datamodule.counts = recorder
    at = callbacks.index(sync)
    callbacks = [recorder, *callbacks[:at], PhaseMark(memory, "weight_sync"), sync, PhaseMark(memory, "logging"),
                 *callbacks[at + 1:]]
    return [c for c in callbacks if not isinstance(c, (HeldOutEvalCallback, StepCheckpoint))], recorder


def fixed_length_datamodule(varied: float = 0.0):
    """The real DataModule, every response exactly max_response_len tokens (module docstring), counting the
    step's rollout and trained tokens into `self.counts.current` (the recorder's). `varied` in (0, 1): each
    response then cut to a length drawn uniformly from [varied·L, L] (L = max_response_len; seeded by the step
    and agent), so the passes see rows of unequal length as real runs do, with the work still known."""
    from hacrl_lightning.datamodule import RolloutDataModule

    class FixedLengthDataModule(RolloutDataModule):
        counts = None

        def sampling(self, agent, *, n, seed, step):
            settings = super().sampling(agent, n=n, seed=seed, step=step)
            return replace(settings, min_new_tokens=settings.max_new_tokens)

        def generate(self, examples, *, step, n):
            out = super().generate(examples, step=step, n=n)
            if varied:
                import torch

                for j, (name, generations) in enumerate(sorted(out.items())):
                    full = self.agents[name].max_response_len
                    low = max(1, int(varied * full))
                    lengths = torch.randint(low, full + 1, (len(generations),),
                                            generator=torch.Generator().manual_seed(1000 * step + j)).tolist()
                    for generation, length in zip(generations, lengths):
                        if length < len(generation.token_ids):
                            generation.token_ids = generation.token_ids[:length]
                            generation.logprobs = generation.logprobs[:length]
                            generation.finish_reason = "length"
            return out

        def rollout(self, examples, *, step):
            self.counts.begin()  # a step begins with its rollouts
            batch = super().rollout(examples, step=step)
            self.counts.current["rollout_tokens"] = sum(len(r.token_ids) for r in batch.rollouts)
            # every row is trained (cross_samples_per_prompt=all)
            self.counts.current["trained_tokens"] = sum(int(view.loss_mask.sum()) for view in batch.views.values())
            # every token a learner's forward passes read (prompts and responses, no padding), own rows for
            # the old log-probs: what the FLOP counts of a GPU check use (bench/gpu_check.py)
            for name, view in batch.views.items():
                self.counts.current[f"update_tokens/{name}"] = int(view.attention_mask.sum())
                self.counts.current[f"old_logprob_tokens/{name}"] = int(view.attention_mask[view.is_own].sum())
            return batch

    return FixedLengthDataModule


class PhaseMark(Callback):
    """Marks `label` in the memory sampler at the end of each step (around the weight sync)."""

    def __init__(self, memory: PhaseMemory, label: str):
        self.memory, self.label = memory, label

    def on_train_batch_end(self, *args) -> None:
        self.memory.mark(self.label)


class StepRecorder(Callback):
    """Step wall time from the start of one step's rollouts to the next's (everything a step costs: `begin`,
    called by `fixed_length_datamodule`'s `rollout`); in the untimed warm-up steps, a search for stray weight
    copies at every phase boundary."""

    def __init__(self, module, sync, memory: PhaseMemory, warmup: int):
        self.module, self.sync, self.memory, self.warmup = module, sync, memory, warmup
        self.steps: list[dict] = []
        self.current: dict = defaultdict(float)
        self.copies: list[str] = []
        self._start = None

    def _close(self) -> None:
        if self._start is None:
            return
        row = dict(self.current)
        row["step_s"] = time.perf_counter() - self._start
        row["cpu_s"] = time.process_time() - self._cpu_start
        row["engine_cpu_s"] = engine_cpu_s() - self._engine_cpu_start
        clock = gc_clock()
        row["gc_s"], row["gc_full"] = clock.seconds - self._gc_start[0], clock.full - self._gc_start[1]
        metrics = self.module.last_metrics
        for phase in ("rollout", "reward", "exchange", "old_logprobs", "update"):
            row[phase] = float(metrics[f"time/{phase}"])
        row["diagnostics"] = float(metrics.get("time/diagnostics", 0.0))  # on a `--diagnostics-every` step
        row.update({key: float(value) for key, value in metrics.items() if "/perf/padding_frac/" in key})
        row["weight_sync"] = self.sync.last_seconds
        row["logging"] = row["step_s"] - sum(row[p] for p in PHASES[:-1])
        self.steps.append(row)

    def begin(self) -> None:
        """A step begins (the DataModule starts its rollouts; it marks the phase): the one before ends here, and the
        turn passes to the other process first when steps are interleaved (`LockStep`)."""
        if self._start is not None:
            self._close()
            turn().hand_over()
        turn().wait()
        self.memory.scan = self._scan if len(self.steps) < self.warmup else None
        self.current = defaultdict(float)
        self._engine_cpu_start, self._gc_start = engine_cpu_s(), (gc_clock().seconds, gc_clock().full)
        self._start, self._cpu_start = time.perf_counter(), time.process_time()  # the reads above are not the step's

    def _scan(self) -> None:
        copies = weight_copies(self.module.agents.values(), self.module.trainer.optimizers)
        if len(copies) > len(self.copies):
            self.copies = copies + [f"(found at the start of phase {self.memory.label})"]

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()
        self._start = None


# -- (b) the bare loop -----------------------------------------------------------------------------


def run_bare(agent_names: list[str], group: int, prompts: int, steps: int, warmup: int, backend: str = "hf",
             overrides: tuple[str, ...] = ()) -> dict:
    """The same steps without the framework: `reference.hacpo_step`, no Lightning. With the vLLM backend, the
    same engines as the framework's (`VLLMEngine`, built from the same exports) generate, and each is
    synced after its agent's updates, as `WeightSyncCallback` does."""
    with tempfile.TemporaryDirectory() as engine_dir:
        return _run_bare(agent_names, group, prompts, steps, warmup, backend, Path(engine_dir), overrides)


class FullLength:
    """An engine whose every response is exactly `max_new_tokens` long (stop tokens masked until then), as
    `fixed_length_datamodule` samples in the framework path."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompt_ids, settings):
        return self.engine.generate(prompt_ids, replace(settings, min_new_tokens=settings.max_new_tokens))


def _run_bare(agent_names: list[str], group: int, prompts: int, steps: int, warmup: int, backend: str,
              engine_dir: Path, overrides: tuple[str, ...] = ()) -> dict:
    import torch

    from hacrl_lightning import reference
    from hacrl_lightning.algorithms import CapabilityWindow
    from hacrl_lightning.compiling import compile_agent, compile_wanted
    from hacrl_lightning.data.tasks import load_task
    from hacrl_lightning.datamodule import StepBatchSampler
    from hacrl_lightning.rollout import close_engines, engine_options, make_engine
    from hacrl_lightning.training import load_agents

    memory = PhaseMemory()
    cfg = compose(agent_names, group, prompts, warmup + steps, str(engine_dir / "run"), backend, overrides)
    torch.manual_seed(cfg.seed)
    loaded = load_agents(cfg)          # loading is not timed
    if compile_wanted(cfg.trainer.compile, cfg.trainer.accelerator):  # as `train` does (`build_system`)
        for agent in loaded.values():
            compile_agent(agent)
    if backend == "vllm":
        engines = {k: make_engine("vllm", a.model, **engine_options(a, "vllm", batch_size=0, seed=cfg.seed,
                                                                    export_to=engine_dir / k))
                   for k, a in loaded.items()}
    else:
        engines = reference.hf_engines(loaded, cfg.rollout.generation_batch_size)
    full_length = {k: FullLength(engine) for k, engine in engines.items()}
    optimizers = reference.make_optimizers(loaded)
    window = CapabilityWindow(len(loaded), **cfg.algorithm.capability_settings())
    train_set, _ = load_task(cfg.data)
    sampler = StepBatchSampler(len(train_set), prompts, warmup + steps, seed=cfg.seed)
    marks: list[tuple[str, float]] = []

    def phase(label: str) -> None:
        memory.mark(label)
        marks.append((label, time.perf_counter()))

    out = []
    for step in range(warmup + steps):
        examples = [train_set[i] for i in sampler.indices(step)]
        turn().wait()
        marks.clear()
        clock = gc_clock()
        engine0, gc0 = engine_cpu_s(), (clock.seconds, clock.full)
        t0, cpu0 = time.perf_counter(), time.process_time()  # as in `StepRecorder`: the reads are not the step's
        done = reference.hacpo_step(loaded, optimizers, full_length, examples, window, cfg=cfg, step=step, phase=phase)
        phase("weight_sync")
        for k, engine in engines.items():  # the engines answer with the updated weights next step
            engine.sync_weights(loaded[k].model)
        end = time.perf_counter()
        row = {label: later - at for (label, at), (_, later) in zip(marks, [*marks[1:], ("end", end)])}
        row.update(step_s=end - t0, cpu_s=time.process_time() - cpu0, engine_cpu_s=engine_cpu_s() - engine0,
                   gc_s=clock.seconds - gc0[0], gc_full=clock.full - gc0[1],
                   rollout_tokens=sum(len(r.token_ids) for r in done.rollouts),
                   trained_tokens=sum(int(view.loss_mask.sum()) for view in done.views.values()))
        out.append(row)
        if step + 1 < warmup + steps:  # the last step's turn passes when this run ends (`_job`), engines closed
            turn().hand_over()
    close_engines(engines.values())  # as the datamodule's teardown closes them
    peaks = memory.close()
    return {"path": "bare", "steps": out[warmup:], "warmup_steps": out[:warmup], "peak_rss_mb": peaks,
            "weights_mb": _weights_mb(loaded.values()), "threads": torch.get_num_threads()}


# -- orchestration and report ----------------------------------------------------------------------


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in rows)


def _total_cpu(row: dict) -> float:
    return row.get("cpu_s", 0.0) + row.get("engine_cpu_s", 0.0)


def ratios(framework: dict, bare: dict) -> dict:
    """One framework/bare pair of runs: median CPU seconds per step (the trainer's and the engines' processes'
    together) and median wall seconds, framework over bare."""
    f_rows, b_rows = framework["steps"], bare["steps"]
    return {"cpu": statistics.median(map(_total_cpu, f_rows)) / statistics.median(map(_total_cpu, b_rows)),
            "wall": _median(f_rows, "step_s") / _median(b_rows, "step_s")}


def summarise(framework: dict, bare: dict, n: int, G: int, prompts: int, repeats: list[dict] | None = None) -> dict:
    """The figures of one (n, G) configuration from its pooled runs; `repeats`: each framework/bare pair's
    `ratios`, whose median, min and max are the headline's spread."""
    f_rows, b_rows = framework["steps"], bare["steps"]
    f_step, b_step = _median(f_rows, "step_s"), _median(b_rows, "step_s")
    f_cpu, b_cpu = statistics.median(map(_total_cpu, f_rows)), statistics.median(map(_total_cpu, b_rows))
    phases = {p: _median(f_rows, p) for p in PHASES}
    total = sum(phases.values())
    repeats = repeats or [ratios(framework, bare)]
    spread = _spread(repeats)
    return {
        "n": n, "G": G, "prompts": prompts, "steps_timed": len(f_rows),
        "framework_step_s": f_step, "bare_step_s": b_step, "framework_cpu_s": f_cpu, "bare_cpu_s": b_cpu,
        "framework_trainer_cpu_s": _median(f_rows, "cpu_s"), "bare_trainer_cpu_s": _median(b_rows, "cpu_s"),
        "framework_engine_cpu_s": _median(f_rows, "engine_cpu_s"), "bare_engine_cpu_s": _median(b_rows, "engine_cpu_s"),
        "framework_over_bare": f_cpu / b_cpu, "framework_over_bare_wall": f_step / b_step,
        "repeats": repeats, "spread": spread,
        # every step's time in a timed phase but the remainder (`logging`: the Lightning loop, metrics, callbacks)
        "outside_phases_share": statistics.median(r["logging"] / r["step_s"] for r in f_rows),
        "bare_outside_phases_share": statistics.median(
            (r["step_s"] - sum(r.get(p, 0.0) for p in PHASES[:-1])) / r["step_s"] for r in b_rows),
        "gc_s": _median(f_rows, "gc_s"), "bare_gc_s": _median(b_rows, "gc_s"),
        "gc_full_per_step": statistics.mean(r.get("gc_full", 0) for r in f_rows),
        "bare_gc_full_per_step": statistics.mean(r.get("gc_full", 0) for r in b_rows),
        "threads": framework["threads"], "bare_threads": bare["threads"],
        "slowest_step_over_median": max(r["step_s"] for r in f_rows) / f_step,
        "bare_slowest_step_over_median": max(r["step_s"] for r in b_rows) / b_step,
        "phase_s": phases, "phase_share": {p: s / total for p, s in phases.items()},
        "reward_plus_exchange_share": (phases["reward"] + phases["exchange"]) / total,
        "bare_phase_s": {p: _median(b_rows, p) for p in ("rollout", "reward", "exchange", "old_logprobs", "update",
                                                          "weight_sync")},
        "rollout_tokens": _median(f_rows, "rollout_tokens"), "bare_rollout_tokens": _median(b_rows, "rollout_tokens"),
        "trained_tokens": _median(f_rows, "trained_tokens"), "bare_trained_tokens": _median(b_rows, "trained_tokens"),
        "rollout_tokens_per_s": _median(f_rows, "rollout_tokens") / phases["rollout"],
        "trained_tokens_per_s": _median(f_rows, "trained_tokens") / phases["update"],
        "bare_rollout_tokens_per_s": _median(b_rows, "rollout_tokens") / _median(b_rows, "rollout"),
        "bare_trained_tokens_per_s": _median(b_rows, "trained_tokens") / _median(b_rows, "update"),
        "peak_rss_mb": framework["peak_rss_mb"], "bare_peak_rss_mb": bare["peak_rss_mb"],
        "max_rss_mb": max(framework["peak_rss_mb"].values()), "bare_max_rss_mb": max(bare["peak_rss_mb"].values()),
        "weights_mb": framework["weights_mb"], "reference_copies": framework["reference_copies"],
        "stray_weight_copies": framework["stray_weight_copies"],
        "framework_steps": f_rows, "bare_steps": b_rows,
        # the first (warm-up) step starts from the same weights: equal counts mean the same texts
        "first_step_tokens": {path: {key: r["warmup_steps"][0].get(key) for key in ("rollout_tokens", "trained_tokens")}
                              for path, r in (("framework", framework), ("bare", bare)) if r["warmup_steps"]},
    }


def _job(path: str, names: list[str], group: int, prompts: int, steps: int, warmup: int, backend: str,
         profile: str = "", overrides: tuple[str, ...] = ()) -> dict:
    """One path's run in this (fresh) process; with `profile`, under cProfile, its statistics written there
    (the whole run: building, warm-up and timed steps; `pstats` sorts them). Its turn passes for good at the end."""
    import warnings

    warnings.filterwarnings("ignore")
    run = run_framework if path == "framework" else run_bare
    try:
        if not profile:
            return run(names, group, prompts, steps, warmup, backend, overrides)
        import cProfile

        profiler = cProfile.Profile()
        try:
            return profiler.runcall(run, names, group, prompts, steps, warmup, backend, overrides)
        finally:
            profiler.dump_stats(profile)
    finally:
        turn().finish()


def run_pair(paths: tuple[str, str], args, n: int, G: int, interleave: str, profiles: tuple[str, str] = ("", "")
             ) -> list[dict]:
    """Two runs (`_job`), each in a fresh process: one after the other (`interleave="processes"`), or both at once
    taking their steps in turn (`"steps"`, `LockStep`), `paths[0]`'s first. Returns their results in `paths`' order."""
    agents = [a for a in args.agents.split(",") if a][:n]
    job = (G, args.prompts, args.steps, args.warmup, args.backend)
    overrides = run_overrides(agents, args)
    ctx = get_context("spawn")
    if interleave == "processes":
        out = []
        for path, profile in zip(paths, profiles):
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                out.append(pool.submit(_job, path, agents, *job, profile, overrides).result())
        return out
    gate = LockStep(ctx)
    pools = [ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=install_turn, initargs=(gate, side))
             for side in (0, 1)]
    try:
        futures = [pool.submit(_job, path, agents, *job, profile, overrides)
                   for pool, path, profile in zip(pools, paths, profiles)]
        for side, future in enumerate(futures):
            future.add_done_callback(lambda f, side=side: f.exception() is not None and gate.finish(side))
        return [future.result() for future in futures]
    finally:
        for pool in pools:
            pool.shutdown()


def _spread(repeats: list[dict]) -> dict:
    """Median, min and max over the pairs of each ratio (`ratios`)."""
    return {kind: {"median": statistics.median(r[kind] for r in repeats), "min": min(r[kind] for r in repeats),
                   "max": max(r[kind] for r in repeats)} for kind in ("cpu", "wall")}


def _pool(before: dict | None, run: dict) -> dict:
    """Two runs of one path as one: steps pooled, peak RSS per phase the larger."""
    if before is None:
        return run
    peaks = {p: max(before["peak_rss_mb"].get(p, 0.0), mb) for p, mb in run["peak_rss_mb"].items()}
    copies = max(before.get("stray_weight_copies", []), run.get("stray_weight_copies", []), key=len)
    return {**run, "steps": before["steps"] + run["steps"], "peak_rss_mb": peaks, "stray_weight_copies": copies}


def run_null(args) -> dict:
    """`--null`: the headline configuration's bare loop in `--headline-repeats` pairs of fresh processes (`run_pair`,
    `--interleave` as for the framework), each pair's second over its first, as `ratios` takes framework over bare:
    the spread that the machine alone gives two runs of one program, against which the framework's spread is read."""
    (n, G), repeats, runs = configurations(args)[0], [], []
    for _ in range(max(1, args.headline_repeats)):
        pair = run_pair(("bare", "bare"), args, n, G, args.interleave)
        runs += pair
        repeats.append(ratios(pair[1], pair[0]))
    return {"null": True, "n": n, "G": G, "interleave": args.interleave, "repeats": repeats,
            "spread": _spread(repeats), "bare_step_s": [_median(run["steps"], "step_s") for run in runs],
            "trained_tokens": [[row["trained_tokens"] for row in run["warmup_steps"] + run["steps"]] for run in runs],
            # each process's timed steps, phase by phase: whether a slow process is slow in one phase or in all
            "bare_steps": [run["steps"] for run in runs]}


def run(args) -> dict:
    """Every (n, G) configuration, framework then bare, each in a fresh process."""
    import torch

    agents = [a for a in args.agents.split(",") if a]
    pairs = configurations(args)
    if max(n for n, _ in pairs) > len(agents):
        raise SystemExit(f"--n asks for {max(n for n, _ in pairs)} agents but --agents names {len(agents)}")
    if args.null:
        return {"command": "python scripts/bench.py step " + " ".join(sys.argv[2:]), "backend": args.backend,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **run_null(args)}
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = []
    for index, (n, G) in enumerate(pairs):
        paths, repeats = {}, []
        for repeat in range(max(1, args.headline_repeats) if index == 0 else 1):
            # each path first in turn: framework, bare, then bare, framework, ...
            order = ("framework", "bare") if repeat % 2 == 0 else ("bare", "framework")
            profiles = tuple(str(Path(args.profile) / f"{path}.prof") if args.profile and index == 0 and not repeats
                             else "" for path in order)
            pair = dict(zip(order, run_pair(order, args, n, G, args.interleave, profiles)))
            for path in order:
                paths[path] = _pool(paths.get(path), pair[path])
            repeats.append(ratios(pair["framework"], pair["bare"]))
        results.append(summarise(paths["framework"], paths["bare"], n, G, args.prompts, repeats))
        print(f"  n={n} G={G}: framework {results[-1]['framework_step_s']:.3f} s/step, "
              f"bare {results[-1]['bare_step_s']:.3f} s/step", flush=True)
    head = results[0]
    return {
        "command": "python scripts/bench.py step " + " ".join(sys.argv[2:]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"torch {torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "headline": {"n": head["n"], "G": head["G"]},
        "backend": args.backend, "lora_rank": args.lora, "interleave": args.interleave,
        "framework_over_bare": head["framework_over_bare"],
        "framework_over_bare_wall": head["framework_over_bare_wall"],
        "spread": head["spread"], "outside_phases_share": head["outside_phases_share"],
        "slowest_step_over_median": head["slowest_step_over_median"],
        "phase_share": head["phase_share"],
        "reward_plus_exchange_share": head["reward_plus_exchange_share"],
        "configs": results,
    }


def print_report(result: dict) -> None:
    if result.get("null"):
        spread = result["spread"]
        print(f"null (bare loop against itself, n={result['n']}, G={result['G']}, {result['backend']}, "
              f"interleaved by {result['interleave']}): "
              f"{len(result['repeats'])} pairs, second over first: CPU {spread['cpu']['median']:.3f} "
              f"({spread['cpu']['min']:.3f}, {spread['cpu']['max']:.3f}), wall {spread['wall']['median']:.3f} "
              f"({spread['wall']['min']:.3f}, {spread['wall']['max']:.3f}); each process's median s/step: "
              + ", ".join(f"{s:.3f}" for s in result["bare_step_s"]))
        return
    print(f"machine: {result['machine']} | {result['date']} | load avg before "
          f"{result['load_avg_before'][0]:.2f}, after {result['load_avg_after'][0]:.2f} | {result['wall_s']:.0f} s")
    head = result["configs"][0]
    print(f"\nframework step phases (n={head['n']}, G={head['G']}, P={head['prompts']}, "
          f"median of {head['steps_timed']} steps):")
    print_table([{"phase": p, "seconds": head["phase_s"][p], "share": head["phase_share"][p],
                  "peak_rss_mb": head["peak_rss_mb"].get(p, float("nan"))} for p in PHASES],
                ["phase", "seconds", "share", "peak_rss_mb"])
    print("\nscaling (framework vs bare, medians):")
    rows = [{**c, "cpu_ratio": c["framework_over_bare"], "wall_ratio": c["framework_over_bare_wall"],
             "rew+exch": c["reward_plus_exchange_share"],
             "roll_tok/s": c["rollout_tokens_per_s"], "train_tok/s": c["trained_tokens_per_s"],
             "bare_train_tok/s": c["bare_trained_tokens_per_s"], "rss_mb": c["max_rss_mb"],
             "bare_rss_mb": c["bare_max_rss_mb"]} for c in result["configs"]]
    print_table(rows, ["n", "G", "framework_step_s", "bare_step_s", "framework_cpu_s", "bare_cpu_s", "cpu_ratio",
                       "wall_ratio", "rew+exch", "roll_tok/s",
                       "train_tok/s", "bare_train_tok/s", "rss_mb", "bare_rss_mb"])
    spread = result["spread"]
    print(f"\nframework_over_bare = {result['framework_over_bare']:.3f} CPU time, trainer and engine processes "
          f"({result['framework_over_bare_wall']:.3f} wall; target <= 1.10); over {len(head['repeats'])} pairs "
          f"interleaved by {result['interleave']}: CPU {spread['cpu']['median']:.3f} ({spread['cpu']['min']:.3f}, "
          f"{spread['cpu']['max']:.3f}), "
          f"wall {spread['wall']['median']:.3f} ({spread['wall']['min']:.3f}, {spread['wall']['max']:.3f})")
    print(f"engine processes' CPU: {head['framework_engine_cpu_s']:.3f} s/step framework, "
          f"{head['bare_engine_cpu_s']:.3f} bare; outside the timed phases: "
          f"{100 * result['outside_phases_share']:.1f}% of the framework's step "
          f"({100 * head['bare_outside_phases_share']:.1f}% of the bare loop's); slowest step "
          f"{result['slowest_step_over_median']:.2f}x the median "
          f"(bare {head['bare_slowest_step_over_median']:.2f}x)")
    print(f"garbage collection: {head['gc_s']:.3f} s/step framework ({head['gc_full_per_step']:.1f} full), "
          f"{head['bare_gc_s']:.3f} bare ({head['bare_gc_full_per_step']:.1f} full); torch threads "
          f"{head['threads']} framework, {head['bare_threads']} bare")
    print(f"reward + exchange = {100 * result['reward_plus_exchange_share']:.1f}% of the step (target <= 5%)")
