"""How the benchmarks print their figures: one plain-text table (`print_table`).

Deliberately not here: any measurement (the other `bench` modules) or file output (`scripts/bench.py`).
"""

from __future__ import annotations


def print_table(rows: list[dict], columns: list[str]) -> None:
    """`rows` as left-aligned columns under a header; floats with 4 significant digits."""
    cells = [[f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
