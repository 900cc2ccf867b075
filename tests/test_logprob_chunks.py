"""`Agent.token_logprobs` in chunks (`agents.agent.token_logprobs`, `head_logprobs`): the output layer and the
log-softmax run a chunk of positions at a time from the decoder's hidden states, so the logits of a pass never exist
at once; the values and gradients are those of the full logits (`gather_logprobs` of the model's own logits, the
computation before chunking), for every architecture of the zoo (tied and untied heads, a real 152k
vocabulary), a LoRA agent, and with or without grad.

Tolerances: the two computations share the decoder call, so the hidden states are the same bits; what differs is
the output layer's matrix product, now over a chunk of rows instead of the whole pass, which may sum each logit's H
products in another order. A float32 dot product summed in any order is within gamma_H * sum|h_i w_i| of the exact
one (gamma_H = H u / (1 - H u), u = 2^-24), and a log-softmax moves by at most twice its largest logit's move, so
`logit_bound` is the tolerance of the values. Where the arithmetic is the same (one chunk over every position of
the pass) they are equal to the bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hacrl_lightning.agents.agent import gather_logprobs, head_logprobs, separate_head, token_logprobs

ZOO = ("tiny_a", "tiny_b", "tiny_c", "tiny_d", "tiny_e", "tiny_qwen3")
"""Llama, Qwen3, GPT-2, Mistral, GPT-NeoX (an untied head), and Qwen3 with its real 151,936-token vocabulary."""
U = 2.0**-24
GRAD_RTOL = 1e-4
"""Gradients, relative (2-norm): the gradient reaching the hidden states sums the output layer's V rows weighted by
softmax - onehot, which sums to 0, so its terms nearly cancel and a reordering moves it by up to gamma_V sum_v |dz_v|
|w_v|, large next to the cancelled sum. Measured at most 1.6e-5 (tiny_qwen3's 151,936 rows), 7.4e-6 with the small
vocabularies (2026-11-28): 1e-4 leaves a margin of 6."""


def rows(agent, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Four rows as the update sees them: prompts left-padded, responses right-padded, random token ids; and the
    first response column (`first_target`)."""
    g = torch.Generator().manual_seed(seed)
    vocab = agent.model.get_input_embeddings().num_embeddings
    prompt, response = [5, 3, 6, 4], [6, 2, 5, 3]
    width = max(prompt) + max(response)
    ids = torch.randint(0, vocab, (4, width), generator=g)
    mask = torch.zeros(4, width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt, response)):
        mask[i, max(prompt) - p: max(prompt) + r] = 1
    return ids * mask + agent.pad_token_id * (1 - mask), mask, max(prompt)


def full_logprobs(agent, ids, mask, first: int, temperature: float) -> torch.Tensor:
    """The log-probs from the model's full logits, every position at once (the computation before chunking)."""
    logits = agent(ids, mask)[:, first - 1:-1]                                               # [B, T-first, V]
    real = mask[:, first - 1:-1].bool() & mask[:, first:].bool()
    return F.pad(gather_logprobs(logits, ids[:, first:], temperature=temperature) * real, (first, 0))


def logit_bound(agent, ids, mask, temperature: float) -> float:
    """2 gamma_H max_t sum_i |h_ti w_vi| / temperature: how far two float32 summation orders of the output layer can
    move a log-prob (the module docstring)."""
    lm = agent.model.get_base_model() if hasattr(agent.model, "get_base_model") else agent.model
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        hidden = lm.base_model(input_ids=ids, attention_mask=mask, position_ids=position_ids)[0]  # [B, T, H]
        head = lm.get_output_embeddings()
        weight = head.base_layer.weight if hasattr(head, "base_layer") else head.weight
        products = hidden.abs().flatten(0, 1) @ weight.abs().T                               # [B*T, V]
    width = hidden.shape[-1]
    return float(2 * width * U / (1 - width * U) * products.max() / temperature)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_chunks_give_the_full_logits_log_probs_and_gradients(load_zoo_agent, name):
    agent = load_zoo_agent(name, dtype="float32")
    agent.eval()
    ids, mask, first = rows(agent)
    temperature = 0.7
    with torch.no_grad():  # the old log-probs' pass
        want = full_logprobs(agent, ids, mask, first, temperature)
        got = token_logprobs(agent.model, ids, mask, temperature=temperature, first_target=first, chunk=5)
        assert torch.equal(agent.token_logprobs(ids, mask, temperature=temperature, first_target=first),
                           token_logprobs(agent.model, ids, mask, temperature=temperature, first_target=first))
    bound = logit_bound(agent, ids, mask, temperature)
    assert got.dtype == torch.float32 and got.shape == ids.shape
    assert torch.equal(got == 0, want == 0)  # the same positions scored: responses' real tokens only
    assert (got - want).abs().max() <= bound, (float((got - want).abs().max()), bound)

    # the update's pass: the same gradients (chunks: checkpoints made again in the backward)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    grads = []
    for compute in (lambda: full_logprobs(agent, ids, mask, first, temperature),
                    lambda: token_logprobs(agent.model, ids, mask, temperature=temperature, first_target=first,
                                           chunk=5)):
        agent.model.zero_grad(set_to_none=True)
        (compute() * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in agent.model.named_parameters() if p.grad is not None})
    full, chunked = grads
    assert full.keys() == chunked.keys() and len(full) == len(list(agent.model.parameters()))
    for key in full:
        err = (chunked[key] - full[key]).norm() / full[key].norm().clamp(min=1e-30)
        assert err < GRAD_RTOL, (key, float(err))


def test_one_chunk_over_the_whole_pass_is_the_same_arithmetic_to_the_bit(load_zoo_agent):
    agent = load_zoo_agent("tiny_e", dtype="float32")  # an untied head
    head = agent.model.get_output_embeddings()
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 7, head.in_features, generator=g)
    targets = torch.randint(0, head.out_features, (3, 7), generator=g)
    every = torch.ones(3, 7, dtype=torch.bool)
    with torch.no_grad():
        want = gather_logprobs(head(hidden), targets, temperature=0.7)
        assert torch.equal(head_logprobs(head, hidden, targets, every, temperature=0.7), want)
        some = every.clone()
        some[1, 4:] = False
        assert torch.equal(head_logprobs(head, hidden, targets, some, temperature=0.7, chunk=4)[~some],
                           torch.zeros(3))


@pytest.mark.slow
def test_a_lora_agent_s_chunks_give_the_same_log_probs_and_adapter_gradients(load_zoo_agent):
    agent = load_zoo_agent("tiny_b", dtype="float32", lora={"rank": 4})
    agent.eval()
    with torch.no_grad():  # B = 0 at the start: give the adapters something to say
        for name, param in agent.model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(3)))
    ids, mask, first = rows(agent, seed=4)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(5))
    results = []
    for compute in (lambda: full_logprobs(agent, ids, mask, first, 1.0),
                    lambda: token_logprobs(agent.model, ids, mask, first_target=first, chunk=3)):
        agent.model.zero_grad(set_to_none=True)
        logp = compute()
        (logp * weights).sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in agent.model.named_parameters()
                                        if p.grad is not None}))
    (want, full), (got, chunked) = results
    assert (got - want).abs().max() <= logit_bound(agent, ids, mask, 1.0)
    assert full.keys() == chunked.keys() and full and all("lora_" in key for key in full)  # the adapters only
    for key in full:
        assert (chunked[key] - full[key]).norm() <= GRAD_RTOL * full[key].norm(), key


def test_an_architecture_that_changes_its_logits_keeps_the_full_logits():
    from transformers import AutoModelForCausalLM, Gemma2Config, Qwen3Config

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, vocab_size=64)
    assert separate_head(AutoModelForCausalLM.from_config(Qwen3Config(**small)))
    # Gemma 2 soft-caps its logits after the output layer: a separate head would skip that
    assert not separate_head(AutoModelForCausalLM.from_config(Gemma2Config(**small, final_logit_softcapping=30.0)))
