"""The run's resolved config as TensorBoard hparams (the HPARAMS tab), beside its scalars.

At fit start (rank zero) every value of the typed `TrainConfig` is recorded under its command-line
key (`algorithm.name`, `agents.tiny_a.lr`, ...; `config.flat_values`), linked to each agent's held-out
accuracy (`{agent}/eval/acc`), so runs can be compared by their settings. Lightning's
`log_hyperparams` alone would only fill `hparams.yaml`: with `default_hp_metric=False` and no metric it
writes no hparams event, and with a metric it would also log that metric's value at one step (a
second point beside the evaluation's). So the summary is written here the way Lightning writes it,
naming the metric tags without logging values. Deliberately not here: the values themselves (the
module and the callbacks `report` them).
"""

from __future__ import annotations

from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from hacrl_lightning.config import TrainConfig, flat_values


class ConfigHParams(Callback):
    def __init__(self, cfg: TrainConfig):
        self.params = {key: value if isinstance(value, (bool, int, float, str)) else str(value)
                       for key, value in flat_values(cfg).items()}
        self.metrics = [f"{name}/eval/acc" for name in cfg.agents]

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        from torch.utils.tensorboard.summary import hparams

        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.log_hyperparams(self.params)  # hparams.yaml
                writer = logger.experiment._get_file_writer()  # as Lightning's own log_hyperparams
                for summary in hparams(self.params, dict.fromkeys(self.metrics, 0.0)):
                    writer.add_summary(summary)
