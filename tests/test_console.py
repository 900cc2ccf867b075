"""The quiet console: the listed library chatter is dropped, everything else still shows."""

from __future__ import annotations

import logging
import warnings

from hacrl_lightning.console import quiet_libraries


def test_chatter_is_dropped_and_genuine_messages_pass(caplog):
    quiet_libraries()
    quiet_libraries()  # idempotent: no second filter
    assert len(logging.getLogger("lightning.pytorch.utilities.rank_zero").filters) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_libraries()  # inside this block, as a run installs them in its process
        warnings.warn("Found 70 module(s) in eval mode at the start of training.", UserWarning)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", UserWarning)
        warnings.warn("agent 'tiny_b': non-finite loss or gradient at step 1", UserWarning)
    assert [str(w.message) for w in caught] == ["agent 'tiny_b': non-finite loss or gradient at step 1"]

    lightning = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        lightning.info("GPU available: False, used: False")
        lightning.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
        lightning.info("Restoring states from the checkpoint path at /tmp/run/step_0000002.ckpt")
    assert [r.getMessage() for r in caplog.records] == [
        "Restoring states from the checkpoint path at /tmp/run/step_0000002.ckpt"]

    from transformers.utils import logging as hf_logging

    assert not hf_logging.is_progress_bar_enabled()
    handler = logging.getLogger("transformers").handlers[0]
    advice = logging.LogRecord("transformers.generation.utils", logging.WARNING, __file__, 1,
                               "The attention mask is not set and cannot be inferred from input", None, None)
    genuine = logging.LogRecord("transformers.modeling_utils", logging.WARNING, __file__, 1,
                                "Some weights of the model checkpoint were not used", None, None)
    assert not handler.filter(advice) and handler.filter(genuine)
