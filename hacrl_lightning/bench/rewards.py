"""`bench.py rewards`: math_verify items/s in-process and through `RewardPool`, with hostile answers mixed in.

    python scripts/bench.py rewards [--items 1000] [--adversarial 10] [--workers 1 2] [--timeout 2] [--json out.json]

Ordinary answers (fractions, decimals, sets, intervals, expressions) are scored in this process and
through the pool with each worker count; then the same items with `--adversarial` hostile ones
spread through (power towers, deeply nested braces), each of which costs a worker the timeout.
Deliberately not here: checking the scores beyond pool == in-process on the ordinary items (tests do).
"""

from __future__ import annotations

import os
import platform
import time

from hacrl_lightning.bench.report import print_table

COLUMNS = ["mode", "workers", "items", "adversarial", "start_s", "seconds", "timeouts", "items_per_s"]


def add_arguments(parser) -> None:
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--adversarial", type=int, default=10, help="hostile responses among the items")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--timeout", type=float, default=2.0, help="RewardPool per-item timeout (s)")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")


def math_items(n: int, adversarial: int) -> tuple[list[str], list[str], list[str]]:
    """n (response, gold) pairs of unique ordinary answers (fractions, decimals, sets, ...) and the
    indices' kinds, with `adversarial` hostile responses (symbolic powers that pass math_verify's input
    guards and still hang sympy: what the pool's timeout is for) spread through."""
    responses, golds, kinds = [], [], []
    for i in range(n):
        a, b = i + 2, i + 3
        response, gold = [
            (f"so \\boxed{{\\frac{{{a}}}{{{b}}}}}", f"{a}/{b}"), (f"\\boxed{{{a / 4}}}", f"\\frac{{{a}}}{{4}}"),
            (f"\\boxed{{{a + 1}}}", f"{a}"), (f"\\boxed{{\\{{{a}, {b}\\}}}}", f"\\{{{b},{a}\\}}"),
            (f"\\boxed{{({a}, {b}]}}", f"({a},{b})"), (f"$x = {a}$, \\boxed{{x^2 + {a}}}", f"{a} + x^2"),
        ][i % 6]
        responses.append(response), golds.append(gold), kinds.append("ordinary")
    hostile = ["\\boxed{(x+1)^{99999}}", "\\boxed{(x-2)^{88888}}"]
    for k in range(adversarial):
        index = (k * n) // max(1, adversarial) + 1
        responses[index], golds[index], kinds[index] = hostile[k % 2], "5", "adversarial"
    return responses, golds, kinds


def run(args) -> dict:
    """items/s of math_verify: in-process (ordinary items only: nothing would stop a hang) and through
    RewardPool with each worker count, on the ordinary items and on the mix with hostile ones."""
    from hacrl_lightning.rewards import RewardPool, math_verify_reward

    responses, golds, kinds = math_items(args.items, args.adversarial)
    ordinary = [i for i, kind in enumerate(kinds) if kind == "ordinary"]
    clean = ([responses[i] for i in ordinary], [golds[i] for i in ordinary])
    math_verify_reward("\\boxed{1}", "1")  # imports and grammar warm-up, as a started worker has done
    start = time.perf_counter()
    serial = [math_verify_reward(r, g) for r, g in zip(*clean)]
    rows = [{"mode": "in-process", "workers": 0, "items": len(serial), "adversarial": 0, "start_s": 0.0,
             "seconds": time.perf_counter() - start, "timeouts": 0}]
    for workers in args.workers:
        for batch, hostile in ((clean, 0), ((responses, golds), args.adversarial)):
            with RewardPool(math_verify_reward, workers=workers, timeout_s=args.timeout) as pool:
                begin = time.perf_counter()
                pool.score(["\\boxed{1}"] * workers, ["1"] * workers)  # workers up
                started = time.perf_counter() - begin
                begin = time.perf_counter()
                scores = pool.score(*batch)
                seconds = time.perf_counter() - begin
            if hostile == 0 and scores != serial:
                raise RuntimeError("pool and in-process scores differ on the ordinary items")
            rows.append({"mode": "pool", "workers": workers, "items": len(scores), "adversarial": hostile,
                         "start_s": started, "seconds": seconds, "timeouts": pool.stats["timeouts"]})
    for row in rows:
        row["items_per_s"] = row["items"] / row["seconds"]
    return {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                       f"load {os.getloadavg()[0]:.1f}", "timeout_s": args.timeout, "rewards": rows}


def print_report(result: dict) -> None:
    print(f"machine: {result['machine']} | timeout {result['timeout_s']:g} s")
    print_table(result["rewards"], COLUMNS)
