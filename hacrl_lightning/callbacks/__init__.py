"""The Lightning callbacks of a run: capability window, stepwise clip schedule, weight sync to the
engines, held-out evaluation, checkpoints and step timing.

Each callback only reads and writes the module's state at the right hook; the math lives in
`hacrl_lightning.algorithms`. Deliberately not here: building the callback list of a run
(`hacrl_lightning.training`).
"""

from hacrl_lightning.callbacks.capability import CapabilityCallback
from hacrl_lightning.callbacks.checkpoint import StepCheckpoint, latest_checkpoint
from hacrl_lightning.callbacks.clip_schedule import StepwiseClipCallback
from hacrl_lightning.callbacks.evaluation import HeldOutEvalCallback
from hacrl_lightning.callbacks.timing import StepTimer
from hacrl_lightning.callbacks.weight_sync import WeightSyncCallback

__all__ = [
    "CapabilityCallback",
    "HeldOutEvalCallback",
    "StepCheckpoint",
    "StepTimer",
    "StepwiseClipCallback",
    "WeightSyncCallback",
    "latest_checkpoint",
]
