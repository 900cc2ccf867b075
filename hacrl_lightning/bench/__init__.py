"""Benchmarks that print figures, never asserted by tests; `scripts/bench.py` is their command line.

One module per subcommand, each with `add_arguments(parser)`, `run(args) -> dict` (the figures, also
written as JSON) and `print_report(result)`: `step` (framework HACPO steps against a bare PyTorch
loop), `exchange` (responses crossing two agents' tokenizers), `rollout` (generation throughput per
agent and backend), `rewards` (math_verify in-process and through the reward pool); `report` holds
the shared table printer. The modules import nothing from one another but `report`.
Deliberately not here: checking the framework's math or timing (tests do the former, nothing the latter).
"""
