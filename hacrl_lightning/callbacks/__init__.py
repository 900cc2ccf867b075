"""The Lightning callbacks of a run, ten of them, each owning one concern at its hooks:

- `CapabilityCallback` (`capability.py`): the capability window's state, updated once per step over the
  global batch before the update (it hands the step's omega forward on the batch) and saved in checkpoints;
- `StepwiseClipCallback` (`clip_schedule.py`): the cross-ratio lower bound of each mini-batch (Eq. 14),
  handed forward on the step's batch before the update;
- `WeightSyncCallback` (`weight_sync.py`): pushes every agent's new weights to its rollout engine (the
  DataModule's engines);
- `HeldOutEvalCallback` (`evaluation.py`): greedy held-out accuracy through the DataModule's `evaluate`;
- `StepCheckpoint` (`checkpoint.py`): writes checkpoints to disk (on a schedule, at the end, after a
  signal) and checks the free space first;
- `StepTimer` (`timing.py`): the run's clocks (training-step wall time apart from evaluation, the run's
  whole wall time across resumed sessions), checkpointed;
- `StopOnSignal` (`interrupt.py`): turns SIGINT/SIGTERM/SIGHUP into a stop after the current step,
  agreed by every rank;
- `PlainProgress` (`progress.py`): a progress line per step on stdout when it is not a terminal;
- `NoSignalWarning` (`no_signal.py`): warns when an agent's rewards are all one value for several steps in a row;
- `ConfigHParams` (`hparams.py`): the resolved config as TensorBoard hparams.

Data flows one way: the DataModule makes a step, the callbacks complete it at `on_train_batch_start`, the
module trains on it and calls no callback. So callbacks reach beyond the module: the engines, the DataModule, the disk, stdout, the loggers and
the process's signal handlers. Metrics they log go through the module's `report` (`ConfigHParams`
writes its summary to the loggers itself); the math lives in
`hacrl_lightning.algorithms`. Deliberately not here: building the callback list of a run and its order
(`hacrl_lightning.training`).
"""

from hacrl_lightning.callbacks.capability import CapabilityCallback
from hacrl_lightning.callbacks.checkpoint import StepCheckpoint, latest_checkpoint
from hacrl_lightning.callbacks.clip_schedule import StepwiseClipCallback
from hacrl_lightning.callbacks.evaluation import HeldOutEvalCallback
from hacrl_lightning.callbacks.hparams import ConfigHParams
from hacrl_lightning.callbacks.interrupt import StopOnSignal
from hacrl_lightning.callbacks.progress import PlainProgress
from hacrl_lightning.callbacks.timing import StepTimer
from hacrl_lightning.callbacks.weight_sync import WeightSyncCallback

__all__ = [
    "CapabilityCallback",
    "ConfigHParams",
    "HeldOutEvalCallback",
    "PlainProgress",
    "StepCheckpoint",
    "StepTimer",
    "StepwiseClipCallback",
    "StopOnSignal",
    "WeightSyncCallback",
    "latest_checkpoint",
]
