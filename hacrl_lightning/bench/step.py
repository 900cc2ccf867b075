"""`bench.py step`: full framework HACPO steps side by side with a bare PyTorch + transformers loop.

    python scripts/bench.py step [--agents tiny_a,tiny_b,tiny_c,tiny_d] [--n 2,3,4] [--groups 4,8,16]
                                 [--prompts 4] [--steps 3] [--warmup 1] [--headline-repeats 2]
                                 [--json bench.json]

Both paths start from the same tiny zoo weights, see the same prompts (the framework's seeded,
step-indexed prompt sampler), and sample with the same settings and seeds. Sampled response
lengths drift apart as soon as the two paths' weights differ, so both generate *exactly*
`max_response_len` tokens per response (stop tokens are masked until then: `min_new_tokens =
max_new_tokens`): the generation, the forward passes and the backward passes then process the same
numbers of sequences and tokens in both paths (partner responses are retokenized from text, so
trained-token counts may differ by a few tokens after the first step; both are reported).

(a) framework: the run `train()` builds (`training.build_system`: the real `HACRLModule`,
`RolloutDataModule`, callbacks, and Lightning `Trainer` with its TensorBoard logger), minus held-out
evaluation and checkpoints, which are not part of a step; phases are marked through the module's and
the DataModule's `phase_listeners`. Phase times
are the module's own `time/*` metrics and `WeightSyncCallback.last_seconds`; `logging` is the rest
of the step (metrics, `log_dict`, the TensorBoard write, the progress bar, the Lightning loop,
capability and advantages), measured from one `on_train_batch_start` to the next.
(b) bare: what a HACPO step needs and nothing else, written plainly: `model.generate`, decode,
reward, each learner's token view of every response (partner responses retokenized in one batched
call per learner), one no-grad forward per source over its own responses (old log-probs, shared
with every learner), then per learner the same mini-batches (own responses first) of the same
micro-batches, backward, gradient clip and AdamW step. Its loss is a plain clipped sequence-ratio
surrogate: the arithmetic differs from HACPO's, the tensor work does not.

`framework_over_bare` is the ratio of the median process CPU seconds per step (all threads), which
a machine shared with other jobs leaves nearly intact; the wall-time ratio is reported beside it.
The headline (first) configuration runs `--headline-repeats` framework/bare process pairs,
alternating, and pools their steps.
Each (path, n, G) runs in a fresh process, so peak resident memory (RSS, sampled every 5 ms and
attributed to the phase running) is that configuration's alone. The warm-up steps are not timed;
in them the framework is searched, at every phase boundary, for CPU tensors shaped like a weight
matrix that are not parameters, gradients or optimizer state (`stray_weight_copies`).
Deliberately not here: checking the framework's math (tests do that) and vLLM throughput
(`bench.py rollout`).
"""

from __future__ import annotations

import gc
import math
import os
import platform
import re
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

from hacrl_lightning.bench.report import print_table

PHASES = ("rollout", "reward", "exchange", "old_logprobs", "update", "weight_sync", "logging")
"""The framework step's phases, in order; `logging` is the remainder (see the module docstring)."""
MB = 2**20


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
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"],
                        help="rollout engine of both paths: transformers, or one vLLM engine per agent (CUDA or "
                             "vLLM's CPU build), synced after every step in both")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def configurations(args) -> list[tuple[int, int]]:
    """(n, G) pairs: n grows at the first G, then G grows at the first n; the first pair is the headline."""
    counts, groups = _ints(args.n), _ints(args.groups)
    pairs = [(n, groups[0]) for n in counts] + [(counts[0], g) for g in groups[1:]]
    return list(dict.fromkeys(pairs))


# -- both paths ------------------------------------------------------------------------------------


VLLM_SHARE = {"cpu": 0.01, "cuda": 0.15}
"""Each agent's engine memory share in the benchmark: 1% of the machine's memory for a CPU engine's KV cache
(~240 MB on 24 GB, far more than these batches need), 15% of the GPU's on CUDA (four agents fit)."""


def compose(agent_names: list[str], group: int, prompts: int, steps: int, run_dir: str, backend: str = "hf"):
    from hacrl_lightning.cli import compose_config

    engine = []
    if backend == "vllm":
        from hacrl_lightning.rollout.vllm import vllm_platform

        share = VLLM_SHARE.get(vllm_platform() or "cpu")
        engine = ["rollout=vllm", *[f"agents.{name}.gpu_memory_utilization={share}" for name in agent_names]]
    cfg, _ = compose_config([f"agents=[{','.join(agent_names)}]", "algorithm=hacpo", f"rollout.group_size={group}",
                             f"data.prompts_per_step={prompts}", f"trainer.mini_batch_prompts={min(4, prompts)}",
                             f"trainer.steps={steps}", "trainer.eval_every=0", "trainer.export_agents=false",
                             f"run_dir={run_dir}", *engine])
    return cfg


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
                  backend: str = "hf") -> dict:
    """What `train()` builds (`training.build_system`), minus held-out evaluation and checkpoints, with
    fixed-length sampling, phase marks (the module's and the DataModule's `phase_listeners`) and a recorder."""
    import lightning.pytorch as pl
    import torch

    from hacrl_lightning.training import build_system, build_trainer

    memory = PhaseMemory()
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose(agent_names, group, prompts, warmup + steps, run_dir, backend)
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


def fixed_length_datamodule():
    """The real DataModule, every response exactly max_response_len tokens (module docstring), counting the
    step's rollout and trained tokens into `self.counts.current` (the recorder's)."""
    from hacrl_lightning.datamodule import RolloutDataModule

    class FixedLengthDataModule(RolloutDataModule):
        counts = None

        def sampling(self, agent, *, n, seed):
            settings = super().sampling(agent, n=n, seed=seed)
            return replace(settings, min_new_tokens=settings.max_new_tokens)

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
        metrics = self.module.last_metrics
        for phase in ("rollout", "reward", "exchange", "old_logprobs", "update"):
            row[phase] = float(metrics[f"time/{phase}"])
        row["weight_sync"] = self.sync.last_seconds
        row["logging"] = row["step_s"] - sum(row[p] for p in PHASES[:-1])
        self.steps.append(row)

    def begin(self) -> None:
        """A step begins (the DataModule starts its rollouts; it marks the phase): the one before ends here."""
        self._close()
        self.memory.scan = self._scan if len(self.steps) < self.warmup else None
        self.current = defaultdict(float)
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def _scan(self) -> None:
        copies = weight_copies(self.module.agents.values(), self.module.trainer.optimizers)
        if len(copies) > len(self.copies):
            self.copies = copies + [f"(found at the start of phase {self.memory.label})"]

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()
        self._start = None


# -- (b) the bare loop -----------------------------------------------------------------------------


def run_bare(agent_names: list[str], group: int, prompts: int, steps: int, warmup: int, backend: str = "hf") -> dict:
    """The same steps written plainly: no Lightning, no framework code inside a step. With the vLLM backend,
    the same engines as the framework's (`VLLMEngine`, built from the same exports) generate, and each is
    synced after its agent's updates, as `WeightSyncCallback` does."""
    with tempfile.TemporaryDirectory() as engine_dir:
        return _run_bare(agent_names, group, prompts, steps, warmup, backend, Path(engine_dir))


def _run_bare(agent_names: list[str], group: int, prompts: int, steps: int, warmup: int, backend: str,
              engine_dir: Path) -> dict:
    import torch
    from transformers import GenerationConfig

    from hacrl_lightning.data.tasks import load_task
    from hacrl_lightning.datamodule import StepBatchSampler
    from hacrl_lightning.step import step_seed
    from hacrl_lightning.rollout import SamplingSettings, engine_options, make_engine
    from hacrl_lightning.training import load_agents

    memory = PhaseMemory()
    cfg = compose(agent_names, group, prompts, warmup + steps, str(engine_dir / "run"), backend)
    torch.manual_seed(cfg.seed)
    loaded = load_agents(cfg)          # loading is not timed; a step touches only .model and .tokenizer
    engines = {k: make_engine("vllm", a.model, **engine_options(a, "vllm", batch_size=0, seed=cfg.seed,
                                                                export_to=engine_dir / k))
               for k, a in loaded.items()} if backend == "vllm" else {}
    names = list(loaded)
    models = {k: a.model.eval() for k, a in loaded.items()}
    toks = {k: a.tokenizer for k, a in loaded.items()}
    acfg = {k: a.cfg for k, a in loaded.items()}
    eos = {k: list(a.eos_token_ids) for k, a in loaded.items()}
    pad = {k: a.pad_token_id for k, a in loaded.items()}
    opts = {k: torch.optim.AdamW(models[k].parameters(), lr=acfg[k].lr, betas=tuple(acfg[k].betas),
                                 weight_decay=acfg[k].weight_decay) for k in names}
    train_set, _ = load_task(cfg.data)
    sampler = StepBatchSampler(len(train_set), prompts, warmup + steps, seed=cfg.seed)
    n, G, alg, tr = len(names), group, cfg.algorithm, cfg.trainer
    mini_size, micro = tr.mini_batch_prompts * G, tr.micro_batch_size
    boxed = re.compile(r"\\boxed\{([^{}]*)\}")

    def prompt_ids(k, questions):
        texts = toks[k].apply_chat_template([[{"role": "user", "content": q}] for q in questions], tokenize=False,
                                            add_generation_prompt=True)
        return [ids[-acfg[k].max_prompt_len:] for ids in toks[k](texts, add_special_tokens=False)["input_ids"]]

    def right_pad(rows, pad_id):
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return ids, mask

    def logprobs(k, rows):  # [b, T-1]: log p(x_t | x_<t)
        ids, mask = right_pad(rows, pad[k])
        logits = models[k](input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
        return torch.log_softmax(logits.float() / acfg[k].temperature, -1).gather(-1, ids[:, 1:, None])[..., 0]

    def response_mask(rows, starts, width):  # [b, T-1]: True where position t predicts a response token
        t = torch.arange(width)
        first = torch.tensor(starts)[:, None] - 1
        return (t >= first) & (t < torch.tensor([len(r) for r in rows])[:, None] - 1)

    out = []
    for step in range(warmup + steps):
        row, t0, cpu0 = defaultdict(float), time.perf_counter(), time.process_time()
        examples = [train_set[i] for i in sampler.indices(step)]
        # rollout: every agent answers every prompt G times, exactly max_response_len tokens each
        memory.mark("rollout")
        prompts_of, sampled = {}, {}
        for j, k in enumerate(names):
            prompts_of[k] = prompt_ids(k, [ex.prompt for ex in examples])
            length, chunk = acfg[k].max_response_len, max(1, cfg.rollout.generation_batch_size // G)
            torch.manual_seed(step_seed(cfg.seed, step, 1000 * j))
            sampled[k] = []
            if engines:
                settings = SamplingSettings(max_new_tokens=length, n=G, temperature=acfg[k].temperature,
                                            top_p=acfg[k].top_p, top_k=acfg[k].top_k, min_new_tokens=length,
                                            seed=step_seed(cfg.seed, step, 1000 * j), return_logprobs=False)
                sampled[k] = [g.token_ids for g in engines[k].generate(prompts_of[k], settings)]
            for c in range(0, prompts, chunk) if not engines else ():
                batch = prompts_of[k][c : c + chunk]
                width = max(map(len, batch))
                ids = torch.tensor([[pad[k]] * (width - len(b)) + b for b in batch])
                mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
                with torch.no_grad():
                    seqs = models[k].generate(input_ids=ids, attention_mask=mask, generation_config=GenerationConfig(
                        do_sample=True, temperature=acfg[k].temperature, top_k=acfg[k].top_k, top_p=acfg[k].top_p,
                        max_new_tokens=length, min_new_tokens=length, num_return_sequences=G,
                        eos_token_id=eos[k], pad_token_id=pad[k]))
                sampled[k] += seqs[:, width:].tolist()
        t1 = time.perf_counter()
        row["rollout_tokens"] = sum(len(s) for k in names for s in sampled[k])
        # reward: decode once, last \boxed{} against the gold answer
        memory.mark("reward")
        texts = {k: toks[k].batch_decode(sampled[k], skip_special_tokens=True) for k in names}
        rewards = torch.tensor([[[float((m := boxed.findall(texts[k][p * G + i])) != [] and m[-1].strip() == ex.gold)
                                  for i in range(G)] for k in names] for p, ex in enumerate(examples)])  # [P, n, G]
        joint = rewards.flatten(1)
        adv = ((joint - joint.mean(1, keepdim=True)) / (joint.std(1, keepdim=True) + 1e-6)).view(prompts, n, G)
        t2 = time.perf_counter()
        # exchange: each learner's rows (prompt-major, then source, then sample); partners retokenized
        memory.mark("exchange")
        views = {}
        for k in names:
            partner = [(p, j, i) for p in range(prompts) for j, s in enumerate(names) if s != k for i in range(G)]
            bodies = [texts[names[j]][p * G + i] for p, j, i in partner]
            encoded = dict(zip(partner, toks[k](bodies, add_special_tokens=False)["input_ids"]))
            rows, starts, keys = [], [], []
            for p in range(prompts):
                for j, s in enumerate(names):
                    for i in range(G):
                        body = sampled[k][p * G + i] if s == k else encoded[(p, j, i)][: acfg[k].max_response_len]
                        rows.append(prompts_of[k][p] + body)
                        starts.append(len(prompts_of[k][p]))
                        keys.append((p, j, i))
            views[k] = (rows, starts, keys)
        t3 = time.perf_counter()
        # old log-probs: one no-grad forward per source over its own responses, shared with every learner
        memory.mark("old_logprobs")
        old_mean = torch.zeros(prompts, n, G)  # the sequence ratio needs only the mean over response tokens
        with torch.no_grad():
            for j, k in enumerate(names):
                rows, starts, keys = views[k]
                own = [b for b, key in enumerate(keys) if key[1] == j]
                for part in [own[c : c + micro] for c in range(0, len(own), micro)]:
                    logp = logprobs(k, [rows[b] for b in part])
                    resp = response_mask([rows[b] for b in part], [starts[b] for b in part], logp.shape[1])
                    p, _, i = torch.tensor([keys[b] for b in part]).T
                    old_mean[p, j, i] = (logp * resp).sum(-1) / resp.sum(-1)
        t4 = time.perf_counter()
        # update: per learner, mini-batches (own first, then partners in agent order), micro-batch accumulation
        memory.mark("update")
        for j, k in enumerate(names):
            rows, starts, keys = views[k]
            gen = torch.Generator().manual_seed(step_seed(cfg.seed, step, 31 + j))
            own = [b for b, key in enumerate(keys) if key[1] == j]
            cross = [b for b, key in enumerate(keys) if key[1] != j]
            own = [own[t] for t in torch.randperm(len(own), generator=gen)]
            cross = sorted((cross[t] for t in torch.randperm(len(cross), generator=gen)), key=lambda b: keys[b][1])
            order = own + cross
            for m, start in enumerate(range(0, len(order), mini_size)):
                mini = order[start : start + mini_size]
                opts[k].zero_grad(set_to_none=True)
                lower = min(1.0, 1 - alg.delta + m * alg.delta_step)
                for part in [mini[c : c + micro] for c in range(0, len(mini), micro)]:
                    logp = logprobs(k, [rows[b] for b in part])
                    resp = response_mask([rows[b] for b in part], [starts[b] for b in part], logp.shape[1])
                    p, s, i = torch.tensor([keys[b] for b in part]).T
                    row["trained_tokens"] += int(resp.sum())
                    ratio = torch.exp(((logp * resp).sum(-1) / resp.sum(-1) - old_mean[p, s, i]).clamp(-10, 10))
                    a = adv[p, s, i]
                    own_loss = -torch.minimum(ratio * a, ratio.clamp(1 - alg.clip_low, 1 + alg.clip_high) * a)
                    cross_loss = -ratio.clamp(lower, 1.0) * a
                    (torch.where(s == j, own_loss, cross_loss).sum() / len(mini)).backward()
                torch.nn.utils.clip_grad_norm_(models[k].parameters(), acfg[k].grad_clip or math.inf)
                opts[k].step()
        t5 = time.perf_counter()
        memory.mark("weight_sync")
        for k, engine in engines.items():  # the engines answer with the updated weights next step
            engine.sync_weights(models[k])
        t6 = time.perf_counter()
        row.update(rollout=t1 - t0, reward=t2 - t1, exchange=t3 - t2, old_logprobs=t4 - t3, update=t5 - t4,
                   weight_sync=t6 - t5, step_s=t6 - t0, cpu_s=time.process_time() - cpu0)
        out.append(dict(row))
    for engine in engines.values():
        engine.close()
    peaks = memory.close()
    return {"path": "bare", "steps": out[warmup:], "warmup_steps": out[:warmup], "peak_rss_mb": peaks,
            "weights_mb": _weights_mb(loaded.values()), "threads": torch.get_num_threads()}


# -- orchestration and report ----------------------------------------------------------------------


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in rows)


def summarise(framework: dict, bare: dict, n: int, G: int, prompts: int) -> dict:
    f_rows, b_rows = framework["steps"], bare["steps"]
    f_step, b_step = _median(f_rows, "step_s"), _median(b_rows, "step_s")
    f_cpu, b_cpu = _median(f_rows, "cpu_s"), _median(b_rows, "cpu_s")
    phases = {p: _median(f_rows, p) for p in PHASES}
    total = sum(phases.values())
    return {
        "n": n, "G": G, "prompts": prompts, "steps_timed": len(f_rows),
        "framework_step_s": f_step, "bare_step_s": b_step, "framework_cpu_s": f_cpu, "bare_cpu_s": b_cpu,
        "framework_over_bare": f_cpu / b_cpu, "framework_over_bare_wall": f_step / b_step,
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


def _job(path: str, names: list[str], group: int, prompts: int, steps: int, warmup: int, backend: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    run = run_framework if path == "framework" else run_bare
    return run(names, group, prompts, steps, warmup, backend)


def _pool(before: dict | None, run: dict) -> dict:
    """Two runs of one path as one: steps pooled, peak RSS per phase the larger."""
    if before is None:
        return run
    peaks = {p: max(before["peak_rss_mb"].get(p, 0.0), mb) for p, mb in run["peak_rss_mb"].items()}
    copies = max(before.get("stray_weight_copies", []), run.get("stray_weight_copies", []), key=len)
    return {**run, "steps": before["steps"] + run["steps"], "peak_rss_mb": peaks, "stray_weight_copies": copies}


def run(args) -> dict:
    """Every (n, G) configuration, framework then bare, each in a fresh process."""
    import torch

    agents = [a for a in args.agents.split(",") if a]
    pairs = configurations(args)
    if max(n for n, _ in pairs) > len(agents):
        raise SystemExit(f"--n asks for {max(n for n, _ in pairs)} agents but --agents names {len(agents)}")
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = []
    for index, (n, G) in enumerate(pairs):
        paths = {}
        for _ in range(max(1, args.headline_repeats) if index == 0 else 1):
            for path in ("framework", "bare"):
                with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
                    done = pool.submit(_job, path, agents[:n], G, args.prompts, args.steps, args.warmup,
                                       args.backend).result()
                paths[path] = _pool(paths.get(path), done)
        results.append(summarise(paths["framework"], paths["bare"], n, G, args.prompts))
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
        "backend": args.backend,
        "framework_over_bare": head["framework_over_bare"],
        "framework_over_bare_wall": head["framework_over_bare_wall"],
        "phase_share": head["phase_share"],
        "reward_plus_exchange_share": head["reward_plus_exchange_share"],
        "configs": results,
    }


def print_report(result: dict) -> None:
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
    print(f"\nframework_over_bare = {result['framework_over_bare']:.3f} CPU time "
          f"({result['framework_over_bare_wall']:.3f} wall; target <= 1.10); reward + exchange = "
          f"{100 * result['reward_plus_exchange_share']:.1f}% of the step (target <= 5%)")
