"""What the agents know together on a held-out set (the group's figures), from answers already scored.

Each agent's one answer per problem (its greedy answer; where it answered n times, only its first answer
counts) and whether the reward scored it right (reward > 0: the verifier's, as `acc` counts) give the union
accuracy (some agent is right), the majority-vote accuracy (the plurality answer of the agents that gave one;
a tie for the most votes is no majority and counts as wrong, and the share of tied problems is reported), the
gain of each over the best single agent, and the pairwise complementarity `right_wrong[i][j]` (the share of
problems agent i gets right and agent j wrong); the equations are `algorithms.metrics.collective_accuracy`'s.
Agents have different tokenizers, so answers are compared as the built-in rewards read them (`answer_key`: the
last `\\boxed{}`, whitespace removed; no box: no vote). The same figures come from the training's held-out
evaluation (`callbacks/evaluation.py`: the console, TensorBoard `collective/eval/*`, summary.json's
`eval_history`), from `evaluation.evaluate_agents` (results.json and results.md) and from compare.py's results.

Deliberately not here: generating or scoring answers (nothing is generated for these figures), and the means
over seeds (`experiments.py`).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from hacrl_lightning.rewards.exact_match import extract_boxed, normalize

__all__ = ["answer_key", "collective_figures", "collective_scalars", "figures_line", "markdown_lines"]

TAG = "collective/eval"
"""TensorBoard prefix of the group's figures (an agent's own are `{agent}/eval/*`)."""
FIGURES = ("best_single_acc", "union_acc", "union_gain", "majority_acc", "majority_gain", "majority_tied")
"""The scalar figures of `collective_figures`, in the order tables show them."""


def answer_key(response: str) -> Optional[str]:
    """The answer of `response` as the built-in rewards read it (its last `\\boxed{}`, whitespace removed), the
    key agents' answers are compared by; None without a complete box."""
    boxed = extract_boxed(response)
    return None if boxed is None else normalize(boxed)


def collective_figures(answers: Mapping[str, Sequence[Optional[str]]],
                       correct: Mapping[str, Sequence[Any]]) -> Optional[dict[str, Any]]:
    """The group's figures of the agents in `answers` (name -> each problem's answer key, None for none) and
    `correct` (name -> each problem's score, right when > 0 or True), every agent on the same problems in the same
    order. None with fewer than two agents or no problem. Returns `agents` (names), `problems`, `best_single` (the
    best agent's name, the first on a tie), the `FIGURES` and `right_wrong` ({i: {j: share}}, i != j)."""
    import torch

    from hacrl_lightning.algorithms.metrics import collective_accuracy

    names = list(answers)
    problems = len(answers[names[0]]) if names else 0
    if len(names) < 2 or problems == 0:
        return None
    if set(correct) != set(names) or any(len(answers[n]) != problems or len(correct[n]) != problems for n in names):
        raise ValueError(f"answers and scores of every agent on the same {problems} problems needed, got "
                         f"{ {n: (len(answers[n]), len(correct.get(n, ()))) for n in names} }")
    ids: list[list[int]] = [[] for _ in names]
    for p in range(problems):  # one id per distinct answer of a problem
        seen: dict[str, int] = {}
        for a, name in enumerate(names):
            key = answers[name][p]
            ids[a].append(-1 if key is None else seen.setdefault(key, len(seen)))
    hits = torch.tensor([[float(v) > 0 for v in correct[name]] for name in names])          # [A, P]
    out = collective_accuracy(hits, torch.tensor(ids, dtype=torch.long))
    accs = hits.double().mean(dim=1)                                                      # [A]
    pairs = out["right_wrong"]                                                            # [A, A]
    return {
        "agents": names, "problems": problems, "best_single": names[int(accs.argmax())],
        "best_single_acc": float(out["best"]), "union_acc": float(out["union"]),
        "union_gain": float(out["union_gain"]), "majority_acc": float(out["majority"]),
        "majority_gain": float(out["majority_gain"]), "majority_tied": float(out["tied"]),
        "right_wrong": {i: {j: float(pairs[a, b]) for b, j in enumerate(names) if b != a} for a, i in enumerate(names)},
    }


def collective_scalars(figures: Optional[Mapping[str, Any]]) -> dict[str, float]:
    """TensorBoard scalars of `collective_figures`: `collective/eval/<figure>` and
    `collective/eval/right_wrong/<i>/<j>` (i right, j wrong); none for None."""
    if not figures:
        return {}
    scalars = {f"{TAG}/{key}": float(figures[key]) for key in FIGURES}
    scalars.update({f"{TAG}/right_wrong/{i}/{j}": float(v) for i, row in figures["right_wrong"].items()
                    for j, v in row.items()})
    return scalars


def figures_line(figures: Optional[Mapping[str, Any]]) -> str:
    """`together: union 0.500 (+0.125) | majority 0.375 (+0.000, 25% tied)` (gains over the best single agent)."""
    if not figures:
        return ""
    return (f"together: union {figures['union_acc']:.3f} ({figures['union_gain']:+.3f}) | majority "
            f"{figures['majority_acc']:.3f} ({figures['majority_gain']:+.3f}, {figures['majority_tied']:.0%} tied)")


def markdown_lines(by_benchmark: Mapping[str, Mapping[str, Any]], *,
                   titles: Optional[Mapping[str, str]] = None) -> list[str]:
    """results.md's section on the agents together (`titles`: benchmark -> its title): one row per benchmark, then
    each benchmark's complementarity table."""
    if not by_benchmark:
        return []
    titles = titles or {}
    lines = ["## The agents together", "",
             "From each agent's first answer per problem (its greedy answer when it answered once), compared by "
             "boxed answer: union = some agent is right; majority = the most-given answer is right (a tie for "
             "the most votes is no majority: wrong; `tied` is the share of such problems); gains are over the "
             "best single agent on the same answers.", "",
             "| benchmark | best single agent | union | union gain | majority | majority gain | tied |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for key, f in by_benchmark.items():
        lines.append(f"| {titles.get(key, key)} | {f['best_single']} {f['best_single_acc']:.3f} | {f['union_acc']:.3f} "
                     f"| {f['union_gain']:+.3f} | {f['majority_acc']:.3f} | {f['majority_gain']:+.3f} | "
                     f"{f['majority_tied']:.3f} |")
    lines += ["", "Complementarity: the share of problems the row's agent gets right and the column's agent wrong.",
              ""]
    for key, f in by_benchmark.items():
        names = f["agents"]
        lines += [f"| {titles.get(key, key)}: right \\ wrong | " + " | ".join(names) + " |",
                  "|---|" + "---:|" * len(names)]
        lines += [f"| {i} | " + " | ".join("–" if i == j else f"{f['right_wrong'][i][j]:.3f}" for j in names) + " |"
                  for i in names]
        lines.append("")
    return lines
