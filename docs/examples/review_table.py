"""Fan out five reviewers, wait for all of them, print a table of their verdicts and costs.

    uv pip install /path/to/spawn       # the project: `import spawn` and the `spawn` command
    python review_table.py src/         # what to review: a path, or words such as "the last commit"

Each reviewer is its own background agent, with its own limits, started and
waited for through the spawn.py CLI, exactly as from a shell.
"""

from __future__ import annotations

import sys

import spawn

ASPECTS = ("correctness", "security", "performance", "tests", "readability")


def review(target: str) -> dict[str, spawn.Result]:
    agents = {
        aspect: spawn.start(
            f"Review the {aspect} of {target}. Name each issue's file and line.",
            tools=["Read", "Grep", "Glob"],
            schema="review",  # the built-in review schema: a verdict and a list of issues
            model="medium-tier",
            timeout=600.0,
            max_budget_usd=0.50,
        )
        for aspect in ASPECTS
    }
    by_id = {result.id: result for result in spawn.wait(list(agents.values())).agents}
    return {aspect: by_id[agent.id] for aspect, agent in agents.items()}


def table(results: dict[str, spawn.Result]) -> str:
    lines = [f"{'aspect':<12} {'status':<8} {'verdict':<16} {'issues':>6} {'cost':>9}"]
    for aspect, result in results.items():
        review = result.output if isinstance(result.output, dict) else {}
        cost = f"${result.cost_usd:.4f}" if result.cost_usd is not None else "unknown"
        lines.append(f"{aspect:<12} {result.status:<8} {review.get('verdict', '-'):<16} {len(review.get('issues', [])):>6} {cost:>9}")
    total = sum(result.cost_usd or 0.0 for result in results.values())
    lines.append(f"{'total':<12} {'':<8} {'':<16} {'':>6} {f'${total:.4f}':>9}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(review(sys.argv[1] if len(sys.argv) > 1 else "the uncommitted changes (git diff)")))
