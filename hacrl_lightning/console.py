"""A quiet console: library chatter a user can do nothing about is silenced, genuine warnings still show.

A run prints its run directory, a progress bar with each agent's train reward (sampled rollouts;
when stdout is not a terminal, a plain line every `trainer.progress_every` steps instead,
`callbacks/progress.py`), a line per held-out evaluation (greedy accuracy) and the final table
(`scripts/train.py`). `quiet_libraries()` removes, once per process,
exactly the messages below and nothing else:

- Lightning's info lines: the litlogger tips, "GPU/TPU available", "LOCAL_RANK: ... CUDA_VISIBLE_DEVICES",
  "`Trainer.fit` stopped", and the `weights_only` note (our checkpoint reads say `weights_only=True` at the source,
  `safe_load.py`; this catches the rest);
- Lightning's "Found N module(s) in eval mode" warning: RL forward passes run without dropout, so the
  module puts its agents in eval mode on purpose (`HACRLModule.on_train_batch_start`);
- Lightning's `LeafSpec` deprecation warning (its own use of torch's pytree, nothing for a user to do);
- transformers' "Loading weights" and "Writing model shards" progress bars (a tiny agent loads in
  milliseconds; a hub model's download has its own bar in huggingface_hub), and its advice to pass
  an attention mask (the engines always do).

`exit_on_interrupt(message)` makes Ctrl-C, until a run installs its own handling, one line and exit status 130
(no traceback), for the scripts' first seconds (imports, composing) and for evaluate.py throughout.

Deliberately not here: anything that changes what a run computes, and any blanket filter (no
`ignore` of a whole category or logger): an unknown warning is shown as it comes.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import warnings

LIGHTNING_CHATTER = re.compile(
    r"Tip: For seamless|^GPU available|^TPU available|^HPU available|^LOCAL_RANK: |`Trainer\.fit` stopped|"
    r"`weights_only` was not set")
TRANSFORMERS_CHATTER = re.compile(r"attention mask")


class _DropMatching(logging.Filter):
    def __init__(self, pattern: re.Pattern):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def _add_once(target: logging.Filterer, pattern: re.Pattern) -> None:
    if not any(isinstance(f, _DropMatching) and f.pattern is pattern for f in target.filters):
        target.addFilter(_DropMatching(pattern))


def quiet_libraries() -> None:
    """Install the filters above (idempotent: calling it again adds nothing; safe in every rank)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.pytorch.trainer.connectors.checkpoint_connector"):
        _add_once(logging.getLogger(name), LIGHTNING_CHATTER)
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")  # replaces an equal filter
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # peft (LoRA agents) reads a transformers attribute that v5 renamed: nothing the user can change
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.get_logger("transformers")  # configures the library's handler
    for handler in logging.getLogger("transformers").handlers:  # records of every transformers.* logger pass here
        _add_once(handler, TRANSFORMERS_CHATTER)


def exit_on_interrupt(message: str) -> None:
    """From now until another handler replaces it (a run's `catch_signals`), SIGINT prints `message` on stderr
    and exits with 128 + 2, raising SystemExit where the program is (its `finally` blocks run)."""

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C during the clean-up ends it at once
        print(message, file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored at start (`cmd &` in a script): stays so
        signal.signal(signal.SIGINT, handler)
