"""The memory plan's KV cache against vLLM's CPU engine (the `.venv-vllm` lane; skipped without vLLM).

For a given memory share, the KV-cache capacity the engine reports (its blocks times its block size) is
the plan's (`memory.kv_tokens`: the share's bytes over 2 x layers x KV heads x head size x dtype bytes
per token), to within one block, and so is how many maximum-length sequences that holds. On vLLM's CPU
build the share is of the machine's memory (`rollout.vllm.cpu_kv_cache_bytes`); on CUDA the plan also
takes the engine's weights and activation reserve out of the GPU's share (not measurable here).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
from hacrl_lightning.rollout.vllm import vllm_platform  # noqa: E402

if vllm_platform() != "cpu":  # pragma: no cover - on CUDA the share covers weights and activations too
    pytest.skip("vLLM's CPU build is not what is installed here", allow_module_level=True)

from hacrl_lightning.architecture import architecture_of  # noqa: E402
from hacrl_lightning.config import AgentConfig  # noqa: E402
from hacrl_lightning.memory import DTYPE_BYTES, kv_tokens  # noqa: E402
from hacrl_lightning.rollout import engine_options, make_engine  # noqa: E402
from hacrl_lightning.rollout.vllm import cpu_kv_cache_bytes  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("name, share", [("tiny_qwen3", 0.002), ("tiny_e", 0.001)])
def test_kv_cache_capacity_is_the_plans(load_zoo_agent, zoo_cache, tmp_path, name, share):
    agent = load_zoo_agent(name, dtype="float32")
    options = engine_options(agent, "vllm", batch_size=8, seed=0, gpu_memory_utilization=share,
                             export_to=tmp_path / name, in_process=True)
    engine = make_engine("vllm", agent.model, **options)
    cache = engine.llm.llm_engine.vllm_config.cache_config
    reported = cache.num_gpu_blocks * cache.block_size
    arch = architecture_of(name, AgentConfig(model=f"zoo:{name}"), zoo_cache=zoo_cache)
    planned = kv_tokens(arch, cpu_kv_cache_bytes(share), DTYPE_BYTES[agent.cfg.dtype])
    print(f"{name} share {share}: vLLM {reported} tokens ({cache.num_gpu_blocks} blocks of {cache.block_size}), plan {planned}")
    assert planned - cache.block_size < reported <= planned, (reported, planned, cache.block_size)
    seq = agent.max_prompt_len + agent.max_response_len
    assert reported // seq in (planned // seq, planned // seq - 1)
