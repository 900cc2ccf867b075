"""Which agents live on which ranks: the one place the DataModule, the module and the callbacks read it.

`trainer.placement=shared` (the default): every rank holds every agent, each FSDP2-sharded over the whole
world. `split`: the world's ranks are divided into one contiguous group per agent, in agent order (group
sizes `agents.<key>.ranks`, or picked in proportion to each agent's parameters, at least one rank each);
an agent's weights, optimizer state, KL reference and engine exist only on its group, sharded over the
group's own `DeviceMesh`. Under `split` a group generates its agent's responses for all prompts of the
step (the prompts divided over the group's ranks); what crosses between groups are the responses and
small per-row tables, never weights (docs/training.md#placement).

`Placement` answers, for this rank: the agents it holds (`local`), an agent's group, this rank's place in
it (`rank_in(name)`, `size_of(name)`), its process group, and the engines on its machine
(`engines_on_node`). `connect()` creates the groups' process groups (a collective: every rank calls it once
the world exists). `split_problems` and `group_sizes` are the checks and the choice of sizes, and
`engine_shares` the vLLM engines' memory shares summed over a machine, all made before anything loads;
`launch_rank` this process's rank before the Trainer exists.
Deliberately not here: moving memory (`offload.py`), sharding (`strategies.py`) and the step itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

__all__ = ["CPU_ENGINES_SHARE", "DEFAULT_SHARE", "Placement", "engine_shares", "group_sizes", "launch_rank",
           "split_problems"]


def _world(cfg) -> int:
    return cfg.trainer.world_size


def split_problems(cfg) -> list[tuple[str, Any, str, str]]:
    """(key, value, allowed, fix) for each reason `cfg`'s split placement cannot be made; pure (no file read)."""
    tr, names = cfg.trainer, list(cfg.agents)
    world = _world(cfg)
    problems = []
    if tr.strategy != "fsdp":
        problems.append(("trainer.placement", "split", "trainer.strategy=fsdp (a group per agent needs several ranks)",
                         "add trainer=fsdp (or trainer.strategy=fsdp) with trainer.devices >= the number of agents"))
        return problems
    if world < len(names):
        problems.append(("trainer.devices", tr.devices, f"devices x num_nodes >= {len(names)} (one rank per agent at "
                         f"least: {len(names)} agents on {world} ranks)",
                         f"set trainer.devices={len(names)} or more, or trainer.placement=shared"))
        return problems
    fixed = {name: cfg.agents[name].ranks for name in names if cfg.agents[name].ranks}
    for name, size in fixed.items():
        if size < 0:
            problems.append((f"agents.{name}.ranks", size, "an int >= 1 (0: the plan picks)",
                             f"set agents.{name}.ranks to 1 or more"))
    if any(size < 0 for size in fixed.values()):
        return problems
    free = len(names) - len(fixed)
    total = sum(fixed.values())
    if (free == 0 and total != world) or (free and total + free > world):
        keys = " + ".join(f"agents.{name}.ranks={size}" for name, size in fixed.items())
        wanted = f"sizes that sum to the world size {world}" if free == 0 else \
            f"at most {world - free} ranks set by hand ({free} agent(s) without a size need one rank each)"
        problems.append((f"agents.{next(iter(fixed))}.ranks", f"{keys} = {total}", wanted,
                         f"change the ranks so they sum to {world} (trainer.devices x trainer.num_nodes), or leave "
                         "them unset (0) and let the plan pick"))
        return problems
    prompts = cfg.data.prompts_per_step
    sizes = group_sizes(cfg)
    uneven = {name: size for name, size in sizes.items() if prompts % size}
    if uneven:
        name, size = next(iter(uneven.items()))
        problems.append(("data.prompts_per_step", prompts, f"a multiple of every group's size ({name}: {size} ranks): "
                         "a group divides all the step's prompts over its ranks",
                         f"set data.prompts_per_step to a multiple of {size}, or agents.{name}.ranks to a divisor of it"))
    elif cfg.rollout.backend == "hf" and len(set(sizes.values())) > 1:
        name = max(sizes, key=sizes.get)
        problems.append((f"agents.{name}.ranks", sizes[name], f"groups of one size with rollout=hf ({sizes}): "
                         "transformers' generation under FSDP2 waits for every rank of the world at each token, so "
                         "every rank must answer as many prompts", f"set every agents.<key>.ranks={world // len(names)}"
                         if world % len(names) == 0 else "use rollout=vllm, or as many ranks per agent"))
    return problems


def group_sizes(cfg, weights: Optional[Mapping[str, float]] = None) -> dict[str, int]:
    """Ranks per agent under `split`: `agents.<key>.ranks` where set; the others share the remaining ranks in
    proportion to `weights` (what each agent holds, e.g. its parameter count; default equal), at least one
    each, every size a divisor of `data.prompts_per_step` (a group divides all the step's prompts over its
    ranks): of the sizes that sum to the ranks left, the ones closest to the proportional shares (least squares;
    the proportional rounding itself where it divides). Without any such sizes, the proportional rounding, which
    `split_problems` then refuses naming `data.prompts_per_step`. With `rollout=hf` the weights are left out:
    every group must be as large as the others there (`split_problems`)."""
    names = list(cfg.agents)
    sizes = {name: cfg.agents[name].ranks for name in names if cfg.agents[name].ranks > 0}
    free = [name for name in names if name not in sizes]
    left = _world(cfg) - sum(sizes.values())
    if cfg.rollout.backend == "hf":  # one size for every group where it can be (`split_problems`)
        weights = None
    if free:
        weight = {name: float((weights or {}).get(name, 1.0)) for name in free}
        total = sum(weight.values()) or 1.0
        share = {name: 1 + (left - len(free)) * weight[name] / total for name in free}
        sizes.update(_closest_divisors(free, share, left, cfg.data.prompts_per_step))
    return {name: sizes[name] for name in names}


def _closest_divisors(free: list[str], share: Mapping[str, float], left: int, prompts: int) -> dict[str, int]:
    """Sizes >= 1 for `free` summing to `left`, each dividing `prompts`, nearest `share` in squared error (a
    small dynamic programme: agents x ranks x divisors); the largest-remainder rounding where none exists."""
    rounded = {name: int(share[name]) for name in free}
    for name in sorted(free, key=lambda n: (-(share[n] - int(share[n])), free.index(n)))[: left - sum(rounded.values())]:
        rounded[name] += 1
    divisors = [d for d in range(1, left + 1) if prompts % d == 0]
    if all(prompts % size == 0 for size in rounded.values()) or not divisors:
        return rounded
    best: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {(len(free), 0): (0.0, ())}
    for i in range(len(free) - 1, -1, -1):  # best[(i, r)]: agents i.. with r ranks
        for r in range(left + 1):
            options = [(best[(i + 1, r - d)][0] + (d - share[free[i]]) ** 2, (d, *best[(i + 1, r - d)][1]))
                       for d in divisors if d <= r and (i + 1, r - d) in best]
            if options:
                best[(i, r)] = min(options)
    if (0, left) not in best:
        return rounded
    return dict(zip(free, best[(0, left)][1]))


DEFAULT_SHARE = 0.3
"""An engine's share of a GPU's memory where `agents.<key>.gpu_memory_utilization` is null."""
CPU_ENGINES_SHARE = 0.25
"""On vLLM's CPU build: the part of the machine's memory that the KV caches of the engines whose share is null
divide among them (the trainer processes, the engines' weights and their processes need the rest)."""


def engine_shares(shares: dict[str, float | None], engines_per_agent: dict[str, int], *, total_bytes: int,
                  available_bytes: int, platform: str) -> tuple[dict[str, float], list[tuple], str]:
    """Each agent's engine memory share on this host, what cannot fit, and what was decided, before any engine
    starts. `shares`: `agents.<key>.gpu_memory_utilization` (None: not set); `engines_per_agent`: that agent's
    engines on this host (its ranks here). On a GPU a null share is `DEFAULT_SHARE` (the memory plan checks
    what a GPU holds). On vLLM's CPU build, where a share is the machine's memory its KV cache takes, the
    shares of every engine on the host are summed: the set ones must fit in the memory available now (else a
    problem line, with the figures and the setting), and the null ones divide `CPU_ENGINES_SHARE` of the
    machine's memory, less the set ones, equally (at most `DEFAULT_SHARE` each). Returns (shares, problems as
    (key, value, allowed, fix), a line saying what was decided, empty when nothing was)."""
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    if platform != "cpu":
        return {name: DEFAULT_SHARE if share is None else share for name, share in shares.items()}, [], ""
    fixed = {name: share for name, share in shares.items() if share is not None}
    wanted = sum(share * engines_per_agent[name] for name, share in fixed.items()) * total_bytes
    problems = []
    if fixed and wanted > available_bytes:
        name = max(fixed, key=lambda n: fixed[n] * engines_per_agent[n])
        parts = " + ".join(f"{engines_per_agent[n]} x {fixed[n]:g} ({n})" for n in fixed)
        problems.append((f"agents.{name}.gpu_memory_utilization", fixed[name],
                         f"shares whose KV caches fit in this machine's free memory: its engines ask for {parts} of "
                         f"{gib(total_bytes)}, {gib(wanted)}, and {gib(available_bytes)} are free",
                         f"lower the shares, or leave them unset (the engines then share {CPU_ENGINES_SHARE:g} of the "
                         "machine's memory)"))
    auto = [name for name, share in shares.items() if share is None]
    count = sum(engines_per_agent[name] for name in auto)
    left = max(0.0, CPU_ENGINES_SHARE - sum(share * engines_per_agent[n] for n, share in fixed.items()))
    each = min(DEFAULT_SHARE, left / count) if count else 0.0
    if count and each <= 0:
        problems.append((f"agents.{auto[0]}.gpu_memory_utilization", None,
                         f"room for its engines: the shares set for the others take {CPU_ENGINES_SHARE:g} of the machine's "
                         "memory or more", "lower the others' shares, or set this one"))
    line = (f"vLLM (CPU): {count} engine(s) on this machine without a memory share ({', '.join(auto)}): each engine's KV "
            f"cache takes {each:.4g} of its memory ({gib(each * total_bytes)}; agents.<key>.gpu_memory_utilization "
            "sets it)") if count else ""
    return {**{name: each for name in auto}, **fixed}, problems, line


def on_every_rank(value: Any) -> list:
    """`value` of every rank, in rank order (one `all_gather_object`, a collective; `[value]` in one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def launch_rank(devices: Any) -> int:
    """This process's global rank as Lightning will set it, known before the Trainer exists (rank zero claims
    the run directory): Lightning's own reading of RANK / SLURM_PROCID / LOCAL_RANK, or, in Lightning's plain
    multi-node environment where a node is told only its NODE_RANK (docs/training.md#several-nodes),
    node_rank * devices + local_rank."""
    import os

    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if "RANK" in os.environ or "SLURM_PROCID" in os.environ or "NODE_RANK" not in os.environ:
        return rank_zero_only.rank
    per_node = devices if isinstance(devices, int) and devices > 0 else 1
    return int(os.environ["NODE_RANK"]) * per_node + int(os.environ.get("LOCAL_RANK", 0))


@dataclass
class Placement:
    """The agents of a run (`names`, in agent order) and the global ranks of each agent's group (`groups`),
    seen from `rank` of `world` ranks. `kind` is `shared` (every group is the whole world) or `split`."""

    names: tuple[str, ...]
    groups: dict[str, tuple[int, ...]]
    rank: int = 0
    world: int = 1
    kind: str = "shared"
    _process_groups: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def shared(cls, names: Sequence[str], *, rank: int = 0, world: int = 1) -> "Placement":
        everyone = tuple(range(world))
        return cls(tuple(names), {name: everyone for name in names}, rank, world, "shared")

    @classmethod
    def split(cls, sizes: Mapping[str, int], *, rank: int, world: int) -> "Placement":
        """Contiguous groups in agent order: the first agent on ranks [0, s0), the next on [s0, s0 + s1), ..."""
        if sum(sizes.values()) != world or min(sizes.values()) < 1:
            raise ValueError(f"group sizes {dict(sizes)} must be >= 1 and sum to the world size {world}")
        groups, first = {}, 0
        for name, size in sizes.items():
            groups[name] = tuple(range(first, first + size))
            first += size
        return cls(tuple(sizes), groups, rank, world, "split")

    @classmethod
    def of(cls, cfg, *, rank: int, weights: Optional[Mapping[str, float]] = None) -> "Placement":
        """The run's placement (`trainer.placement`) for global rank `rank`."""
        world = _world(cfg) if cfg.trainer.strategy == "fsdp" else 1
        if cfg.trainer.placement == "split":
            return cls.split(group_sizes(cfg, weights), rank=rank, world=world)
        return cls.shared(list(cfg.agents), rank=rank, world=world)

    @property
    def is_split(self) -> bool:
        return self.kind == "split"

    @property
    def local(self) -> tuple[str, ...]:
        """The agents this rank holds, in agent order."""
        return tuple(name for name in self.names if self.rank in self.groups[name])

    def size_of(self, name: str) -> int:
        """Ranks in `name`'s group (its data-parallel world)."""
        return len(self.groups[name])

    def rank_in(self, name: str) -> int:
        """This rank's place in `name`'s group (0 = the group's first rank)."""
        return self.groups[name].index(self.rank)

    def sizes(self) -> dict[str, int]:
        return {name: len(ranks) for name, ranks in self.groups.items()}

    @property
    def prompt_share(self) -> tuple[int, int]:
        """(index, parts): which part of the step's prompts this rank generates for. Shared: its rank of the
        world; split: its place in its agent's group (every group answers all the prompts)."""
        if not self.is_split:
            return self.rank, self.world
        (name,) = self.local
        return self.rank_in(name), self.size_of(name)

    def engines_on_node(self, per_node: int) -> dict[str, int]:
        """How many engines of each agent run on this rank's machine (`per_node` ranks a machine): one for each
        rank of the machine in the agent's group (every rank under `shared`)."""
        first = self.rank // per_node * per_node
        node = set(range(first, first + per_node))
        return {name: len(node & set(ranks)) for name, ranks in self.groups.items()}

    def connect(self) -> None:
        """Create each group's process group (split only; a collective: every rank, in the same order). Idempotent."""
        if not self.is_split or self._process_groups:
            return
        import torch.distributed as dist

        for name in self.names:
            self._process_groups[name] = dist.new_group(list(self.groups[name]))

    def process_group(self, name: str):
        """`name`'s process group (None: the whole world, as under `shared`)."""
        if not self.is_split:
            return None
        if not self._process_groups:
            raise RuntimeError("Placement.connect() must run on every rank before a group is used")
        return self._process_groups[name]

    def mesh(self, name: str, device_type: str):
        """`name`'s 1-D `DeviceMesh` (dimension `data_parallel`) over its group: what FSDP2 shards it over."""
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(self.process_group(name), device_type, mesh_dim_names=("data_parallel",))


def end_process_group() -> None:
    """Destroy every process group of this process, if any, while the interpreter is still whole: left to its
    teardown, gloo's worker threads may still hold Python objects and abort the process at exit (SIGABRT,
    "terminate called without an active exception"; pytorch/pytorch#179291). Seen once, on a resumed 2-rank split
    run. For the end of a process only (`scripts/train.py`): a caller that goes on with collectives keeps its group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
