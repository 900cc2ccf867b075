"""What the benchmarks share: one plain-text table (`print_table`), the MiB, and a sum over this process's
child processes (`children_total`: the vLLM engines' CPU time or memory).

Deliberately not here: what a benchmark measures (the other `bench` modules) or file output (`scripts/bench.py`).
"""

from __future__ import annotations

from typing import Callable

MB = 2**20


def children_total(read: Callable) -> float:
    """The sum of `read(child)` over this process's children, recursively (`psutil.Process`es); a child that
    ended between the listing and the read is left out."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            total += read(child)
        except psutil.Error:
            continue
    return total


def print_table(rows: list[dict], columns: list[str]) -> None:
    """`rows` as left-aligned columns under a header; floats with 4 significant digits."""
    cells = [[f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
