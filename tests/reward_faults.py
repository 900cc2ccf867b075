"""Test-only reward functions that misbehave on purpose; importable by the pool's worker processes.

`faulty_reward(response, gold)` is exact match, except on a few magic responses that take the worker
down (`CRASH`: os._exit, `SEGV`: a segfault via ctypes), hang it (`SLEEP`, `SPIN`: a busy loop) or raise
(`RAISE`), raise what is not an `Exception` (`SYSEXIT`: SystemExit(0), `KBINT`: KeyboardInterrupt, `GENEXIT`:
GeneratorExit) or fork a child that sleeps (`FORK:<file>`: the child's pid written there). `warm_up_sleeps`,
`warm_up_exits` and `warm_up_crashes` misbehave on the pool's warm-up item only ('\\boxed{1}', gold '1');
`warm_up_blocks` hangs there where no signal reaches it. `char_parity` is registered as `test_char_parity` for the
datamodule test.
"""

from __future__ import annotations

import ctypes
import os
import signal
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
    if response == "SYSEXIT":
        raise SystemExit(0)
    if response == "KBINT":
        raise KeyboardInterrupt
    if response == "GENEXIT":
        raise GeneratorExit
    if response.startswith("FORK:"):
        child = os.fork()
        if child == 0:  # the copy sleeps on, as a forgotten helper process would
            time.sleep(600)
            os._exit(0)
        with open(response[5:], "w") as out:
            out.write(str(child))
        return 0.5
    return exact_match_reward(response, gold)


def _warming(response: str, gold: str) -> bool:
    return response == "\\boxed{1}" and gold == "1"


def warm_up_sleeps(response: str, gold: str) -> float:
    if _warming(response, gold):
        time.sleep(600)
    return exact_match_reward(response, gold)


def warm_up_exits(response: str, gold: str) -> float:
    if _warming(response, gold):
        os._exit(0)
    return exact_match_reward(response, gold)


def warm_up_crashes(response: str, gold: str) -> float:
    if _warming(response, gold):
        os._exit(3)
    return exact_match_reward(response, gold)


def warm_up_blocks(response: str, gold: str) -> float:
    if _warming(response, gold):
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        time.sleep(600)
    return exact_match_reward(response, gold)


def char_parity(response: str, gold: str) -> float:
    """1.0 when the code points of `response` sum to an even number: a mix of values on any output."""
    return float(sum(map(ord, response)) % 2 == 0)


register_reward("test_char_parity")(char_parity)
