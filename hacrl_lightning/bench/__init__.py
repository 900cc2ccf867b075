"""Benchmarks that print figures; `scripts/bench.py` is their command line. Their timings are never
asserted; `tests/test_bench.py` runs `bench.py step` in a tiny mode and asserts that its figures exist,
are positive, and that the framework and bare paths do the same work (equal token counts).

One module per subcommand, each with `add_arguments(parser)`, `run(args) -> dict` (the figures, also
written as JSON) and `print_report(result)`: `step` (framework HACPO steps against a bare PyTorch
loop), `exchange` (responses crossing two agents' tokenizers), `rollout` (generation throughput per
agent and backend), `rewards` (math_verify in-process and through the reward pool), `sync` (a vLLM
engine's weight sync per method); `report` holds what they share (the table printer, a sum over child
processes). `gpu_check` (the prepared GPU check, `scripts/gpu_check.py`, docs/GPU.md) runs
`step`'s instrumented framework step on real architectures. Otherwise the modules import nothing from one
another but `report`.
Deliberately not here: checking the framework's math or timing (tests do the former, nothing the latter).
"""
