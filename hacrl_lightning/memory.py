"""The per-GPU memory plan: what each agent of a run holds on one GPU, before any weights load.

`plan_memory(cfg, architectures, gpu_bytes)` turns a `TrainConfig` and each agent's `Architecture` (the
numbers of its config.json) into a `MemoryPlan`: per agent and per GPU, the fp32 master weights,
gradients and AdamW state sharded over the data-parallel world (`trainer=fsdp`: devices x nodes; one
device holds them whole), the frozen KL reference (`algorithm.kl_coef > 0`), the weights FSDP2
all-gathers in the compute dtype, the activation and logits peak of one micro-batch at the maximum
lengths (with and without gradient checkpointing), and the rollout engine: vLLM's bf16 weights, the KV
cache its memory share leaves and how many maximum-length sequences that holds (or, for `rollout=hf`,
the KV cache of one generation chunk). `fixes(...)` ranks the changes that would make a run fit;
`larger_passes(...)` proposes, for a run that fits with room, the largest passes that still fit.

The architectures come from architecture.py (`architecture_of`, `run_architectures`: each agent's
config.json, read offline without loading the model); this module only plans with them.
`scripts/plan.py` prints the plan; `memory_problems` (through `preflight.memory_plan_problems`) refuses a GPU run that cannot fit.

Which figures are exact and which are estimates (docs/PERFORMANCE.md, "Memory plan"): parameter
counts and training-state bytes are exact (tested against the zoo's models after a real step); the
logits and activation peak follows the autograd graph of `Agent.token_logprobs` (the logits made a chunk of
positions at a time, `LOGPROB_TOKENS`) and is checked against
torch's CPU profiler; the KV cache per token is checked against vLLM's CPU engine. Estimates, not
measured here: FSDP2's gathered weights, vLLM's own activation reserve and RUNTIME_RESERVE. Deliberately
not here: host memory, tensor parallelism, and anything that loads a model.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any, List, Mapping, Optional

from hacrl_lightning.architecture import Architecture, UnknownArchitecture, architecture_of, run_architectures
from hacrl_lightning.config import TrainConfig
from hacrl_lightning.errors import Problem
from hacrl_lightning.placement import DEFAULT_SHARE

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
RUNTIME_RESERVE = 2 * GIB
"""Assumed per GPU for the CUDA context, NCCL buffers and allocator fragmentation (not measured here)."""
LOGPROB_TOKENS = 1024
"""Positions whose logits `agents.agent.head_logprobs` makes at a time (`agents.agent.LOGPROB_TOKENS`)."""
LOGPROB_COPIES = 3
"""fp32 tensors of one chunk's logits' size alive at once in its backward (the log-softmax's input, its gradient,
the gather's scattered gradient; with the second chunk's output-layer gradient, `logits_peak`, torch's CPU profiler
measured 462 MiB for 460 MiB planned at 151,936 tokens, tests/test_memory_plan.py)."""
VLLM_BATCHED_TOKENS = 16384
VLLM_MAX_SEQS = 1024
"""vLLM's defaults for an offline `LLM` on a large GPU: the profile run's tokens (activations) and sampled
sequences (fp32 logits) it reserves before sizing the KV cache (an estimate of that reserve)."""


# ---------------------------------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class AgentMemory:
    """One agent on one GPU, in bytes."""

    name: str
    parameters: int
    trainable: int
    """The parameters the optimizer steps: all of them, or a LoRA agent's adapters."""
    master_weights: int
    gradients: int
    adamw: int
    kl_reference: int
    gathered: int
    """FSDP2's transients in the compute dtype (an estimate): the root's weights and gradients (held through
    forward and backward), two blocks' weights (the one computed, the one prefetched) and one block's
    gradients; on one device under bf16-mixed, autocast's bf16 copy of every weight."""
    activations: int
    """The activation and logits peak of one micro-batch at the maximum lengths, without checkpointing."""
    activations_checkpointed: int
    """The same with gradient checkpointing (each block's input kept, one block recomputed at a time)."""
    forward_peak: int
    """The old log-probs' forward pass of one micro-batch (no autograd graph): one chunk's logits and their fp32
    working copies (`logits_forward`)."""
    checkpointing: bool
    gradient_buffers: int
    """One device: the embedding's gradient contributions (LM head and input embedding when tied) that
    autograd sums at the end of backward, in fp32 (under FSDP2 part of `gathered`)."""
    engine_weights: int
    engine_reserve: int
    """vLLM's activation reserve (an estimate); 0 for the HF backend."""
    kv_cache: int
    """vLLM: what the memory share leaves for the KV cache; HF: the KV cache of one generation chunk."""
    kv_sequences: int
    """Maximum-length sequences the KV cache holds (vLLM); sequences per generation chunk (HF)."""
    engine: int
    """What the engine holds all the time (vLLM: its whole share of the GPU; HF: nothing)."""
    sync_buffer: int = 0
    """The weight sync's bucket in the trainer's GPU memory, held all run whatever sleeps or is offloaded: an
    engine in its own process synced through CUDA IPC (`rollout.weight_sync=shared_memory`, `weight_sync_mb`;
    rollout/vllm_sync.py); 0 otherwise."""
    sync_copies: int = 0
    """What the engine's worker holds on the GPU while that sync loads (given back after it): one bucket's copies,
    and the embedding put together from row ranges where it is larger than the bucket."""
    lora_rank: int = 0
    """LoRA: the adapters' rank (0: the agent trains every weight)."""
    lora_layers: tuple = ()
    """LoRA: the names of the linear layers of each block that carry an adapter."""

    @property
    def state(self) -> int:
        """Held all run long: master weights, gradients (kept between updates), AdamW, the KL reference."""
        return self.master_weights + self.gradients + self.adamw + self.kl_reference

    @property
    def peak_activations(self) -> int:
        return self.activations_checkpointed if self.checkpointing else self.activations

    @property
    def transient(self) -> int:
        """This agent's peak above its state: its update (gathered weights + activations) or, with the HF
        backend, its generation (gathered weights + KV cache), whichever is larger."""
        generation = 0 if self.engine else self.kv_cache
        return self.gathered + max(self.peak_activations, self.gradient_buffers, generation)


def group_phases(members: List[AgentMemory], *, backend: str, offload: bool, sleep: bool) -> List[tuple[str, int]]:
    """(phase, bytes on one GPU) of every phase of a step on a GPU that holds `members` (in agent order; the
    agents take their turns one after another), before the runtime reserve:

    - resident: every member's training state (`AgentMemory.state`), or nothing with `offload` (each part is
      brought in for the phases that need it: weights, + reference for old log-probs, + gradients and AdamW
      for the update, + weights for a transformers rollout or a vLLM sync); and every CUDA IPC sync buffer;
    - engines: every vLLM engine's whole share all the time; with `sleep`, during agent k's rollout its share
      plus the weights of the engines still to generate (synced, their KV cache asleep), during agent k's sync
      the weights of the engines synced so far (and what its worker copies while it loads, `sync_copies`), and
      nothing while the trainer scores or updates;
    - the phase's own transient: FSDP2's gathered weights plus the KV cache of one generation chunk
      (transformers rollout), one forward pass (old log-probs), or one micro-batch's activations (update)."""
    resident = (0 if offload else sum(a.state for a in members)) + sum(a.sync_buffer for a in members)
    awake = sum(a.engine for a in members)
    idle = 0 if sleep else awake
    phases: List[tuple[str, int]] = []
    for k, a in enumerate(members):
        if backend == "vllm":
            engines = a.engine + sum(b.engine_weights for b in members[k + 1:]) if sleep else awake
            phases.append((f"rollout {a.name}", resident + engines))
        else:
            phases.append((f"rollout {a.name}", resident + (a.master_weights if offload else 0) + a.gathered + a.kv_cache))
    for a in members:
        bring = a.master_weights + a.kl_reference if offload else 0
        phases.append((f"old log-probs {a.name}", resident + idle + bring + a.gathered + a.forward_peak))
    for a in members:
        bring = a.master_weights + a.gradients + a.adamw if offload else 0
        phases.append((f"update {a.name}", resident + idle + bring + a.gathered
                       + max(a.peak_activations, a.gradient_buffers)))
    if backend == "vllm":
        for k, a in enumerate(members):
            engines = sum(b.engine_weights for b in members[: k + 1]) if sleep else awake
            phases.append((f"weight sync {a.name}", resident + engines + (a.master_weights if offload else 0)
                           + a.sync_copies))
    return phases


@dataclass(frozen=True)
class MemoryPlan:
    """Every agent on the GPUs that hold it, phase by phase, and the peak against one GPU's memory."""

    agents: List[AgentMemory]
    gpu_bytes: int
    world: int
    """Ranks of the run (1 unless trainer=fsdp); under `split` each group's own is in `groups`."""
    devices: int
    num_nodes: int
    micro_batch_size: int
    backend: str
    precision: str
    reserve: int = RUNTIME_RESERVE
    groups: Optional[List[tuple[List[str], int]]] = None
    """(agents, ranks) of each group of GPUs that hold the same agents: one group of every agent on every rank
    (`shared`, the default), or one per agent (`trainer.placement=split`)."""
    offload: bool = False
    """`trainer.offload_idle`."""
    sleep: bool = False
    """`rollout.sleep`."""

    @property
    def placement(self) -> str:
        return "split" if self.groups and len(self.groups) > 1 else "shared"

    def _groups(self) -> List[tuple[List[AgentMemory], int]]:
        by_name = {a.name: a for a in self.agents}
        groups = self.groups or [([a.name for a in self.agents], self.world)]
        return [([by_name[name] for name in names], ranks) for names, ranks in groups]

    def phases(self) -> List[tuple[str, int, List[tuple[str, int]]]]:
        """(the group's agents, its ranks, [(phase, bytes)]) of every group (`group_phases`)."""
        return [(", ".join(a.name for a in members), ranks,
                 group_phases(members, backend=self.backend, offload=self.offload, sleep=self.sleep))
                for members, ranks in self._groups()]

    @property
    def peak(self) -> tuple[str, str, int]:
        """(group, phase, bytes) of the largest phase on any GPU, before the runtime reserve."""
        return max(((group, phase, size) for group, _, phases in self.phases() for phase, size in phases),
                   key=lambda item: item[2], default=("", "", 0))

    def _peak_members(self) -> List[AgentMemory]:
        group = self.peak[0]
        return next((members for members, _ in self._groups() if ", ".join(a.name for a in members) == group), [])

    @property
    def state(self) -> int:
        """The training state resident all run long on a GPU of the peak's group (0 with `offload_idle`)."""
        return 0 if self.offload else sum(a.state for a in self._peak_members())

    @property
    def engines(self) -> int:
        """The engines' memory on a GPU of the peak's group while they are all awake, with their sync buffers."""
        return sum(a.engine + a.sync_buffer for a in self._peak_members())

    @property
    def transient(self) -> int:
        """The peak phase's figure above `state` and `engines` (with their sync buffers; engines that sleep: the
        sync buffers alone): with every agent on every GPU and nothing offloaded or asleep, state + engines +
        transient + reserve = total."""
        buffers = sum(a.sync_buffer for a in self._peak_members())
        return max(0, self.peak[2] - self.state - (buffers if self.sleep else self.engines))

    @property
    def total(self) -> int:
        return self.peak[2] + self.reserve

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_bytes and all(a.kv_sequences >= 1 for a in self.agents)

    def to_json(self, changes: Optional[List[dict]] = None) -> dict:
        """The same figures as `table`, bytes and GiB, with `"fits"` and every group's phases."""
        agents = {a.name: {**asdict(a), "state": a.state, "transient": a.transient} for a in self.agents}
        totals = {"state": self.state, "engines": self.engines, "transient": self.transient, "reserve": self.reserve,
                  "total": self.total, "gpu": self.gpu_bytes}
        group, phase, _ = self.peak
        phases = [{"agents": agents_, "ranks": ranks, "phases": [{"phase": p, "bytes": b, "gib": round(b / GIB, 3)}
                                                                for p, b in rows]}
                  for agents_, ranks, rows in self.phases()]
        return {"fits": self.fits, "gib": {k: round(v / GIB, 3) for k, v in totals.items()}, "bytes": totals,
                "world": self.world, "devices": self.devices, "num_nodes": self.num_nodes,
                "micro_batch_size": self.micro_batch_size, "backend": self.backend, "precision": self.precision,
                "placement": self.placement, "offload_idle": self.offload, "sleep": self.sleep,
                "peak": {"agents": group, "phase": phase}, "phases": phases,
                "agents": agents, "changes": changes or []}

    def lora_lines(self) -> List[str]:
        """One line per LoRA agent: its adapters (rank, layers), their trainable parameters and what they hold on a
        GPU (their fp32 weights, gradients and AdamW state, in the columns above beside the frozen base)."""
        lines = []
        for a in self.agents:
            if not a.lora_rank:
                continue
            held = a.trainable / max(1, a.parameters) * a.master_weights  # the adapters' share of the weights
            lines.append(f"  LoRA {a.name}: rank {a.lora_rank} adapters on {', '.join(a.lora_layers)} of every block: "
                         f"{a.trainable / 1e6:,.2f} M trainable parameters ({100 * a.trainable / max(1, a.parameters):.2f}"
                         f"% of {a.parameters / 1e9:.3f} B), holding {(held + a.gradients + a.adamw) / GIB:.3f} GiB "
                         f"per GPU (weights {held / GIB:.3f}, grads {a.gradients / GIB:.3f}, AdamW {a.adamw / GIB:.3f}); "
                         "the base is frozen (its KL reference: the adapters switched off, no copy)")
        return lines

    def table(self) -> str:
        """The plan as a table a person reads (GiB = 2^30 bytes)."""
        gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731
        head = ("agent", "params", "weights", "grads", "AdamW", "KL ref", "gathered", "act (no ckpt)", "act (ckpt)",
                "engine wts", "KV cache", "KV seqs")
        rows = [head]
        for a in self.agents:
            mark = lambda on: "*" if on else ""  # noqa: E731
            rows.append((a.name, f"{a.parameters / 1e9:.3f} B", gib(a.master_weights), gib(a.gradients), gib(a.adamw),
                         gib(a.kl_reference), gib(a.gathered), gib(a.activations) + mark(not a.checkpointing),
                         gib(a.activations_checkpointed) + mark(a.checkpointing), gib(a.engine_weights),
                         gib(a.kv_cache), str(a.kv_sequences)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
                 for r in rows]
        verdict = "fits" if self.fits else "does NOT fit"
        short = [a.name for a in self.agents if a.kv_sequences < 1]
        layout = ("every agent on every rank" if self.placement == "shared" else
                  "split: " + ", ".join(f"{names[0]} on {ranks}" for names, ranks in self.groups))
        phase_lines = []
        for group, ranks, rows in self.phases():
            phase_lines.append(f"phases on a GPU of {group} ({ranks} rank(s)), GiB before the runtime reserve:")
            width = max(len(phase) for phase, _ in rows)
            phase_lines += [f"  {phase.ljust(width)}  {gib(size).rjust(7)}" for phase, size in rows]
        group, phase, size = self.peak
        if self.placement == "shared" and not self.offload and not self.sleep:
            summary = (f"per GPU: training state {gib(self.state)} + engines {gib(self.engines)} + largest update/"
                       f"generation peak {gib(self.transient)} + runtime reserve {gib(self.reserve)}")
        else:
            summary = f"per GPU: largest phase ({phase}, GPU of {group}) {gib(size)} + runtime reserve {gib(self.reserve)}"
        return "\n".join([
            f"memory plan per GPU (GiB): {self.devices} device(s) x {self.num_nodes} node(s), {layout}, "
            f"training state sharded over {self.world if self.placement == 'shared' else 'its group'}"
            f"{', offloaded while idle' if self.offload else ''}, {self.precision}, micro-batch {self.micro_batch_size}, "
            f"rollout={self.backend}{' (engines sleep)' if self.sleep else ''}",
            *lines,
            "  (* the activation peak that applies: agents.<key>.gradient_checkpointing)",
            *self.lora_lines(),
            *phase_lines,
            f"{summary} = {gib(self.total)} GiB of {gib(self.gpu_bytes)} GiB: {verdict}"
            + (f"; no room for one maximum-length sequence in the KV cache of {short}" if short else ""),
        ])


def compute_bytes(cfg: TrainConfig) -> int:
    """Bytes of a float in the forward pass: bf16 under bf16-mixed, fp32 otherwise."""
    return 2 if cfg.trainer.precision == "bf16-mixed" else 4


def shard_world(cfg: TrainConfig) -> int:
    """The ranks FSDP2 shards each agent over (`strategies.make_strategy`): devices x nodes under fsdp."""
    return cfg.trainer.world_size if cfg.trainer.strategy == "fsdp" else 1


def logits_peak(arch: Architecture, rows: int, tokens: int, c: int, chunk: int = LOGPROB_TOKENS) -> int:
    """`Agent.token_logprobs` on `rows` x `tokens` with grad (`agents.agent.head_logprobs`): the hidden states the
    chunks' checkpoints keep (compute dtype), and the backward of one chunk of `chunk` positions, whose logits are
    made again: in the compute dtype and LOGPROB_COPIES fp32 copies, beside (from the second chunk on) the output
    layer's fp32 gradient of that chunk before it is added to the weight's. The whole micro-batch's logits never
    exist at once."""
    positions = rows * tokens
    head_gradient = 4 * arch.vocab * arch.hidden if positions > chunk else 0
    return c * positions * arch.hidden + (c + 4 * LOGPROB_COPIES) * min(positions, chunk) * arch.vocab + head_gradient


def logits_forward(arch: Architecture, rows: int, tokens: int, c: int, chunk: int = LOGPROB_TOKENS) -> int:
    """`Agent.token_logprobs` without autograd (old log-probs): the hidden states picked for the output layer, and
    one chunk's logits in the compute dtype with two fp32 working copies."""
    positions = rows * tokens
    return c * positions * arch.hidden + (c + 2 * 4) * min(positions, chunk) * arch.vocab


def activation_peak(arch: Architecture, rows: int, tokens: int, c: int, *, checkpointed: bool,
                    chunk: int = LOGPROB_TOKENS) -> int:
    """One micro-batch's forward and backward: what the blocks keep, the final norm, and the log-probs' chunk."""
    per_layer = arch.saved_per_token_layer(c)
    blocks = arch.layers * c * arch.hidden + per_layer if checkpointed else arch.layers * per_layer
    final_norm = 2 * c * arch.hidden if arch.family.layer_norm else (4 + c) * arch.hidden
    return rows * tokens * (blocks + final_norm) + logits_peak(arch, rows, tokens, c, chunk)


def _gathered(arch: Architecture, cfg: TrainConfig, world: int, c: int) -> int:
    if cfg.trainer.strategy == "fsdp":  # see AgentMemory.gathered (FSDP2 gathers block by block, on 1 rank too)
        return c * (2 * arch.root_parameters + 3 * arch.block_parameters)
    return c * arch.parameters if cfg.trainer.precision == "bf16-mixed" else 0


def _engine(name: str, arch: Architecture, cfg: TrainConfig, gpu_bytes: int, rows_local: int) -> dict:
    agent = cfg.agents[name]
    seq = agent.max_prompt_len + agent.max_response_len
    if cfg.rollout.backend != "vllm":
        c = compute_bytes(cfg)
        n = cfg.responses_per_prompt
        chunk = min(max(1, cfg.rollout.generation_batch_size // n) * n, rows_local)
        kv = chunk * (seq * arch.kv_bytes_per_token(c) + 4 * arch.vocab)
        return dict(engine_weights=0, engine_reserve=0, kv_cache=kv, kv_sequences=chunk, engine=0)
    weights = arch.parameters * DTYPE_BYTES[agent.dtype]
    adapter = agent.lora.rank > 0 and agent.lora.engine == "adapter"  # synced as an adapter's files instead
    own_process_buckets = not cfg.rollout.vllm_in_process and cfg.rollout.weight_sync == "shared_memory"
    buffer = int(cfg.rollout.weight_sync_mb * 2**20) if own_process_buckets and not adapter else 0
    embedding = arch.vocab * arch.hidden * DTYPE_BYTES[agent.dtype]
    copies = buffer + (embedding if embedding > buffer else 0) if buffer else 0
    reserve = 2 * VLLM_BATCHED_TOKENS * (2 * arch.intermediate + 4 * arch.hidden) + 4 * VLLM_MAX_SEQS * arch.vocab
    share = int((DEFAULT_SHARE if agent.gpu_memory_utilization is None else agent.gpu_memory_utilization) * gpu_bytes)
    kv = max(0, share - weights - reserve)
    sequences = kv_tokens(arch, kv, DTYPE_BYTES[agent.dtype]) // seq
    return dict(engine_weights=weights, engine_reserve=reserve, kv_cache=kv, kv_sequences=int(sequences), engine=share,
                sync_buffer=buffer, sync_copies=copies)


def kv_tokens(arch: Architecture, kv_bytes: int, dtype_bytes: int) -> int:
    """Tokens a KV cache of `kv_bytes` holds (vLLM then rounds down to whole blocks of its block size;
    on its CPU build `kv_bytes` is the memory share of the machine, `rollout.vllm.cpu_kv_cache_bytes`)."""
    return kv_bytes // arch.kv_bytes_per_token(dtype_bytes)


def pass_shape(rows: int, tokens: int, budget: int) -> tuple[int, int]:
    """The largest pass as (rows, tokens per row): `rows` rows of `tokens` (the longest sequence), or under a token
    budget (`trainer.micro_batch_tokens` > 0, which counts padded tokens) one row of the budget's tokens, of
    `tokens` at least (a longer row runs alone). What a pass holds grows with rows x tokens alone."""
    if budget and rows * tokens > budget:
        return 1, max(tokens, budget)
    return rows, tokens


def agent_memory(name: str, arch: Architecture, cfg: TrainConfig, gpu_bytes: int,
                 world: Optional[int] = None) -> AgentMemory:
    """One agent's figures on one GPU of the `world` ranks that hold it (default: the run's, `shard_world`;
    under `split` its group's), see AgentMemory."""
    world, c = world or shard_world(cfg), compute_bytes(cfg)
    agent = cfg.agents[name]
    adapter, adapter_tensors = arch.lora_parameters(agent.lora.rank, list(agent.lora.target_modules))
    params = arch.parameters + adapter
    shard = math.ceil(params / world)
    # what the optimizer steps: every weight, or (LoRA) the adapters alone, the base frozen in fp32 beside them
    trained, trained_tensors = (adapter, adapter_tensors) if adapter else (arch.parameters, arch.parameter_tensors)
    trained_shard = math.ceil(trained / world)
    tokens = agent.max_prompt_len + agent.max_response_len
    rows, tokens = pass_shape(cfg.trainer.micro_batch_size, tokens, cfg.trainer.micro_batch_tokens)
    ranks = world if cfg.trainer.placement == "split" else cfg.trainer.world_size
    rows_local = max(1, cfg.data.prompts_per_step // ranks) * cfg.responses_per_prompt
    return AgentMemory(
        name=name, parameters=params, trainable=trained, master_weights=4 * shard, gradients=4 * trained_shard,
        adamw=8 * trained_shard + 4 * trained_tensors,
        kl_reference=4 * shard if cfg.algorithm.kl_coef > 0 and not adapter else 0,  # LoRA: the adapter switched off
        gathered=_gathered(arch, cfg, world, c),
        activations=activation_peak(arch, rows, tokens, c, checkpointed=False),
        activations_checkpointed=activation_peak(arch, rows, tokens, c, checkpointed=True),
        forward_peak=logits_forward(arch, rows, tokens, c),
        checkpointing=agent.gradient_checkpointing,
        gradient_buffers=0 if cfg.trainer.strategy == "fsdp" else (2 if arch.tied_embeddings else 1) * 4 * arch.vocab
        * arch.hidden,
        **_engine(name, arch, cfg, gpu_bytes, rows_local),
        lora_rank=agent.lora.rank if adapter else 0,
        lora_layers=tuple(sorted({n for n, _, _ in arch.lora_layers(list(agent.lora.target_modules))})) if adapter
        else (),
    )


def plan_memory(cfg: TrainConfig, architectures: Mapping[str, Architecture], gpu_bytes: int) -> MemoryPlan:
    """The plan of `cfg` on GPUs of `gpu_bytes` each; `architectures`: one per agent of cfg. Under
    `trainer.placement=split` each agent is planned on its own group (`placement.group_sizes`, in proportion to
    the agents' parameter counts where `agents.<key>.ranks` is unset)."""
    tr = cfg.trainer
    groups = None
    if tr.placement == "split" and tr.strategy == "fsdp" and len(cfg.agents) <= shard_world(cfg):
        from hacrl_lightning.placement import group_sizes

        sizes = group_sizes(cfg, {name: architectures[name].parameters for name in cfg.agents})
        groups = [([name], size) for name, size in sizes.items()]
    worlds = {name: size for (name,), size in ((g[0], g[1]) for g in groups)} if groups else {}
    return MemoryPlan(agents=[agent_memory(name, architectures[name], cfg, gpu_bytes, worlds.get(name))
                              for name in cfg.agents],
                      gpu_bytes=int(gpu_bytes), world=shard_world(cfg), devices=tr.devices, num_nodes=tr.num_nodes,
                      micro_batch_size=tr.micro_batch_size, backend=cfg.rollout.backend, precision=tr.precision,
                      groups=groups, offload=tr.offload_idle, sleep=cfg.rollout.sleep and cfg.rollout.backend == "vllm")


# ---------------------------------------------------------------------------------------------------
# what would make it fit


def _smaller_micro_batch(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    if cfg.trainer.micro_batch_tokens:  # passes by tokens: a smaller budget, down to one longest row
        budget = cfg.trainer.micro_batch_tokens
        longest = max(agent.max_prompt_len + agent.max_response_len for agent in cfg.agents.values())
        for smaller in [b for b in (budget // 2, budget // 4, budget // 8, longest) if longest <= b < budget]:
            cfg.trainer.micro_batch_tokens = smaller
            if plan_of(cfg).fits:
                break
        now = cfg.trainer.micro_batch_tokens
        return [f"trainer.micro_batch_tokens={now}"] if now < budget else None
    size = cfg.trainer.micro_batch_size
    for smaller in [s for s in (size // 2, size // 4, size // 8, 1) if 1 <= s < size]:
        cfg.trainer.micro_batch_size = smaller
        if plan_of(cfg).fits:
            break
    return [f"trainer.micro_batch_size={cfg.trainer.micro_batch_size}"] if cfg.trainer.micro_batch_size < size else None


def _checkpointing(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    off = [name for name, agent in cfg.agents.items() if not agent.gradient_checkpointing]
    for name in off:
        cfg.agents[name].gradient_checkpointing = True
    return [f"agents.{name}.gradient_checkpointing=true" for name in off] or None


def _engine_memory(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    """vLLM: every share lowered by 0.05 at a time while its KV cache still holds one maximum-length
    sequence; HF: the generation chunk halved."""
    if cfg.rollout.backend != "vllm":
        size = cfg.rollout.generation_batch_size
        while cfg.rollout.generation_batch_size > 1 and not plan_of(cfg).fits:
            cfg.rollout.generation_batch_size //= 2
        return [f"rollout.generation_batch_size={cfg.rollout.generation_batch_size}"] \
            if cfg.rollout.generation_batch_size != size else None
    for agent in cfg.agents.values():  # unset: the GPU default, lowered from there
        agent.gpu_memory_utilization = DEFAULT_SHARE if agent.gpu_memory_utilization is None else agent.gpu_memory_utilization
    before = {name: agent.gpu_memory_utilization for name, agent in cfg.agents.items()}
    while not plan_of(cfg).fits:
        lowered = False
        for k, agent in enumerate(cfg.agents.values()):
            saved = agent.gpu_memory_utilization
            agent.gpu_memory_utilization = round(saved - 0.05, 2)
            if agent.gpu_memory_utilization <= 0 or plan_of(cfg).agents[k].kv_sequences < 1:
                agent.gpu_memory_utilization = saved
            else:
                lowered = True
        if not lowered:
            break
    return [f"agents.{name}.gpu_memory_utilization={agent.gpu_memory_utilization:g}"
            for name, agent in cfg.agents.items() if agent.gpu_memory_utilization != before[name]] or None


def _sleep(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    if cfg.rollout.backend != "vllm" or cfg.rollout.sleep:
        return None
    cfg.rollout.sleep = True
    return ["rollout.sleep=true"]


def _offload(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    if cfg.trainer.offload_idle:
        return None
    cfg.trainer.offload_idle = True
    return ["trainer.offload_idle=true"]


def _split(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    """One group of GPUs per agent, sized in proportion to what each agent holds (each size a divisor of the
    step's prompts; else equal groups), when the run has a rank per agent."""
    from hacrl_lightning.placement import group_sizes, split_problems

    if cfg.trainer.placement == "split" or cfg.trainer.strategy != "fsdp" or shard_world(cfg) < len(cfg.agents):
        return None
    before = {name: agent.ranks for name, agent in cfg.agents.items()}
    cfg.trainer.placement = "split"
    if not split_problems(cfg):
        weights = {a.name: a.parameters for a in plan_of(cfg).agents}
        sizes = group_sizes(cfg, weights)
        world = shard_world(cfg)
        if any(cfg.data.prompts_per_step % size for size in sizes.values()) and world % len(sizes) == 0:
            sizes = {name: world // len(sizes) for name in sizes}
        for name, size in sizes.items():
            cfg.agents[name].ranks = size
    if split_problems(cfg):
        cfg.trainer.placement = "shared"
        for name, ranks in before.items():
            cfg.agents[name].ranks = ranks
        return None
    return ["trainer.placement=split", *(f"agents.{name}.ranks={agent.ranks}" for name, agent in cfg.agents.items())]


LORA_RANK = 16
"""The adapter rank `fixes` proposes (on every linear layer of the blocks)."""


def _lora(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    full = [name for name, agent in cfg.agents.items() if agent.lora.rank == 0]
    for name in full:
        cfg.agents[name].lora.rank = LORA_RANK
    return [f"agents.{name}.lora.rank={LORA_RANK}" for name in full] or None


def _more_nodes(cfg: TrainConfig, plan_of) -> Optional[List[str]]:
    if cfg.trainer.strategy != "fsdp":
        if cfg.trainer.devices == 1:
            return None
        cfg.trainer.strategy = "fsdp"
        return ["trainer.strategy=fsdp"]
    nodes = cfg.trainer.num_nodes
    while cfg.trainer.num_nodes < MAX_NODES and not plan_of(cfg).fits:
        cfg.trainer.num_nodes += 1
    return [f"trainer.num_nodes={cfg.trainer.num_nodes}"] if cfg.trainer.num_nodes != nodes else None


MAX_NODES = 16
"""The most nodes `fixes` tries."""
CHANGES = (("fewer sequences per forward/backward pass: the same update in more passes", _smaller_micro_batch),
           ("gradient checkpointing: about a third more forward compute", _checkpointing),
           ("engines asleep while the trainer scores and updates: a wake-up and a KV-cache allocation per step",
            _sleep),
           ("idle agents' training state in host memory: host-device copies of each agent's state per step",
            _offload),
           ("a smaller engine memory share: a smaller KV cache, slower rollouts", _engine_memory),
           ("each agent on its own GPUs: its state sharded over fewer ranks, the groups generating at once",
            _split),
           ("LoRA adapters instead of full fine-tuning: gradients and AdamW state for a few million parameters per "
            "agent and no KL reference copy; a different update (only the adapters learn)", _lora),
           ("more nodes: the training state sharded further", _more_nodes))
"""Changes in the order of what they cost. `algorithm.cross_samples_per_prompt` is not among them: it caps
the rows a learner trains on (time), not what one micro-batch holds (memory)."""


def fixes(cfg: TrainConfig, architectures: Mapping[str, Architecture], gpu_bytes: int) -> List[dict]:
    """The changes that would make `cfg` fit, cumulative and ranked by cost: each entry's `overrides` come
    on top of the ones before it, and `total` is the plan's figure with all of them. Stops once it fits."""
    trial = copy.deepcopy(cfg)
    plan_of = lambda candidate: plan_memory(candidate, architectures, gpu_bytes)  # noqa: E731
    out: List[dict] = []
    for why, change in CHANGES:
        if plan_of(trial).fits:
            break
        overrides = change(trial, plan_of)
        if overrides:
            plan = plan_of(trial)
            out.append({"overrides": overrides, "why": why, "total": plan.total, "fits": plan.fits})
    return out


def with_changes(cfg: TrainConfig, changes: List[dict]) -> TrainConfig:
    """A copy of `cfg` with every override of `changes` (`fixes`) applied: the run the last change plans."""
    import yaml

    trial = copy.deepcopy(cfg)
    for change in changes:
        for override in change["overrides"]:
            key, value = override.split("=", 1)
            *path, leaf = key.split(".")
            node: Any = trial
            for part in path:
                node = node[part] if isinstance(node, dict) else getattr(node, part)
            setattr(node, leaf, yaml.safe_load(value))
    return trial


def describe_fixes(changes: List[dict], gpu_bytes: int) -> str:
    """The ranked changes, one line each, with the plan's figure after it."""
    if not changes:
        return ("no change among micro-batch size, checkpointing, engine sleep, offload, engine share, split placement "
                "and nodes makes it fit")
    lines = []
    for i, change in enumerate(changes, 1):
        verdict = "fits" if change["fits"] else "still too large"
        lines.append(f"  {i}. {'+ ' if i > 1 else ''}{' '.join(change['overrides'])}: {change['total'] / GIB:.1f} GiB "
                     f"of {gpu_bytes / GIB:.1f} ({verdict}; {change['why']})")
    return "\n".join(lines)


LARGER_PASSES_HEADROOM = 0.9
"""`larger_passes` proposes only a plan within this share of one GPU: the activation figure is an estimate (within
20 % of the profiler's, tests/test_memory_plan.py), and the allocator fragments what is left."""


def learner_rows(cfg: TrainConfig) -> int:
    """The rows of one learner's mini-batch on its most loaded rank: a mini-batch holds `trainer.mini_batch_prompts`
    x G rows (`training.update_settings`; partners' rows make more mini-batches, not larger ones), split over the
    data-parallel ranks with the first ones taking the odd row (`plan.split_even`). Under `trainer.placement=split`
    not split: an upper bound, which only caps the passes `larger_passes` proposes."""
    size = (cfg.trainer.mini_batch_prompts // cfg.algorithm.rollout_multiplier) * cfg.responses_per_prompt
    ranks = 1 if cfg.trainer.placement == "split" else cfg.trainer.world_size
    return max(1, math.ceil(size / ranks))


def larger_passes(cfg: TrainConfig, architectures: Mapping[str, Architecture], gpu_bytes: int) -> Optional[dict]:
    """For a run that fits with room to spare: the largest passes that still fit within LARGER_PASSES_HEADROOM of
    one GPU, as `trainer.micro_batch_size` (a whole mini-batch's rows on one rank) and `trainer.micro_batch_tokens`
    (the token budget, doubled from what a pass holds today), with the plan's total; None when no larger pass fits
    or a pass already holds a whole mini-batch. Fewer, fuller passes run faster on a GPU: the 2026-11-28 H200 bare
    loop reached 20 % MFU at 8 rows of 288 tokens and 28 % at 32 (docs/GPU.md)."""
    tr = cfg.trainer
    longest = max(agent.max_prompt_len + agent.max_response_len for agent in cfg.agents.values())
    rows = learner_rows(cfg)
    now = min(tr.micro_batch_tokens or tr.micro_batch_size * longest, tr.micro_batch_size * longest)
    whole = rows * longest  # a mini-batch's rows at the longest length: no pass needs more
    if now >= whole:
        return None
    trial = copy.deepcopy(cfg)
    trial.trainer.micro_batch_size = rows
    best = None
    budget = now
    while budget < whole:
        budget = min(2 * budget, whole)
        trial.trainer.micro_batch_tokens = budget
        plan = plan_memory(trial, architectures, gpu_bytes)
        if not plan.fits or plan.total > LARGER_PASSES_HEADROOM * gpu_bytes:
            break
        best = (budget, plan.total)
    if best is None:
        return None
    budget, total = best
    overrides = [f"trainer.micro_batch_size={rows}"] + ([f"trainer.micro_batch_tokens={budget}"] if budget < whole
                                                         else ["trainer.micro_batch_tokens=0"] * bool(tr.micro_batch_tokens))
    return {"overrides": overrides, "total": total, "tokens": budget, "tokens_now": now,
            "why": f"passes of up to {budget:,} tokens instead of {now:,}: fewer, fuller passes, the same update"}


def describe_larger_passes(proposal: Optional[dict], gpu_bytes: int) -> str:
    """One line for `scripts/plan.py` (empty without a proposal)."""
    if not proposal:
        return ""
    return (f"room for larger passes: {' '.join(proposal['overrides'])}: {proposal['total'] / GIB:.1f} GiB of "
            f"{gpu_bytes / GIB:.1f} ({proposal['why']}; docs/PERFORMANCE.md#the-update-loop-on-a-gpu)")


# ---------------------------------------------------------------------------------------------------
# the run's plan, and the preflight's refusal


def gpu_memory_bytes(cfg: TrainConfig) -> tuple[int, str]:
    """(bytes of one GPU, where the figure comes from): the device's own where CUDA is present, else the
    `trainer.gpu_memory_gib` setting."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, f"{torch.cuda.get_device_name(0)}, this machine's GPU"
    return int(cfg.trainer.gpu_memory_gib * GIB), "trainer.gpu_memory_gib"


def memory_problems(cfg: TrainConfig, *, on_gpu: bool) -> List[Problem]:
    """The preflight's memory check (`preflight.check_run`): on a GPU (`on_gpu`), a run whose plan does not
    fit is refused with the plan's table and the changes that would make it fit, cheapest first; an agent
    whose architecture is unknown offline names the file to add. `trainer.ignore_memory_plan` launches
    anyway. On CPU the plan is not checked: it plans GPUs (`scripts/plan.py` shows it)."""
    if not on_gpu or cfg.trainer.ignore_memory_plan:
        return []
    architectures, problems = run_architectures(cfg)
    if problems:
        return problems
    gpu_bytes, source = gpu_memory_bytes(cfg)
    plan = plan_memory(cfg, architectures, gpu_bytes)
    if plan.fits:
        return []
    changes = describe_fixes(fixes(cfg, architectures, gpu_bytes), gpu_bytes)
    return [Problem("memory_plan", f"{plan.total / GIB:.1f} GiB per GPU",
                    f"at most {gpu_bytes / GIB:.1f} GiB, one GPU's memory ({source})",
                    f"the changes that would make it fit, cheapest first (each with the plan's total after it):\n"
                    f"{changes}\n  or launch anyway: trainer.ignore_memory_plan=true\n{plan.table()}")]


def lora_rank_problems(cfg: TrainConfig) -> List[Problem]:
    """A LoRA agent whose `lora.rank` is above the width of the layers it targets (`Architecture.lora_width`, from
    config.json: no weights are read), on any device: such an adapter only grows the run (a rank of 100,000 on a
    0.9 MB model wrote a 3.7 GB checkpoint). An architecture not known offline is checked when it loads
    (`agents.lora.apply_lora`)."""
    from hacrl_lightning.agents.sources import AgentLoadError

    problems = []
    for name, agent in cfg.agents.items():
        if agent.lora.rank <= 0:
            continue
        try:
            arch = architecture_of(name, agent, zoo_cache=cfg.zoo_cache)
        except (UnknownArchitecture, AgentLoadError):
            continue
        width = arch.lora_width(list(agent.lora.target_modules))
        if width and agent.lora.rank > width:
            layers = sorted({n for n, _, _ in arch.lora_layers(list(agent.lora.target_modules))})
            problems.append(Problem(f"agents.{name}.lora.rank", agent.lora.rank,
                                    f"at most {width}, the fewest in or out features of its targeted layers {layers} "
                                    "(a higher rank adds parameters, never a direction)",
                                    f"set agents.{name}.lora.rank={min(width, 16)} (ranks of 8 to 64 are usual; "
                                    f"{width} at most)"))
    return problems


__all__ = ["AgentMemory", "MemoryPlan", "plan_memory", "fixes", "with_changes", "describe_fixes", "lora_rank_problems",
           "memory_problems", "gpu_memory_bytes", "larger_passes", "describe_larger_passes", "learner_rows"]
