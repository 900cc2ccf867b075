"""Test-only reward functions that misbehave on purpose; importable by the pool's worker processes.

`faulty_reward(response, gold)` is exact match, except on a few magic responses that take the worker
down (`CRASH`: os._exit, `SEGV`: a segfault via ctypes), hang it (`SLEEP`, `SPIN`: a busy loop) or raise
(`RAISE`). `char_parity` is registered as `test_char_parity` for the datamodule test.
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


def char_parity(response: str, gold: str) -> float:
    """1.0 when the code points of `response` sum to an even number: a mix of values on any output."""
    return float(sum(map(ord, response)) % 2 == 0)


register_reward("test_char_parity")(char_parity)
