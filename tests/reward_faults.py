"""Test-only reward functions that misbehave on purpose; importable by the pool's worker processes.

`faulty_reward(response, gold)` is exact match, except on a few magic responses that take the worker
down (`CRASH`: os._exit, `SEGV`: a segfault via ctypes), hang it (`SLEEP`, `SPIN`: a busy loop) or raise
(`RAISE`). `length_parity` is registered as `test_length_parity` for the datamodule test.
"""

from __future__ import annotations

import ctypes
import os
import time

from hacrl_lightning.rewards import exact_match_reward, register_reward


def faulty_reward(response: str, gold: str) -> float:
    if response == "CRASH":
        os._exit(3)
    if response == "SEGV":
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    if response == "SLEEP":
        time.sleep(600)
    if response == "SPIN":
        while True:
            pass
    if response == "RAISE":
        raise ValueError("bad item")
    return exact_match_reward(response, gold)


def length_parity(response: str, gold: str) -> float:
    """1.0 for an even-length response: a reward with a mix of values on any model's output."""
    return float(len(response) % 2 == 0)


register_reward("test_length_parity")(length_parity)
