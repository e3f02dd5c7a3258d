"""The pre-registered plan of the cooperation benchmark (``cooperation_plan.toml``): read it, find the
commit that first added it, run what it lists in its order, and compute its primary family.

The plan's runs are recorded in ``cooperation.RUNS_FILE`` under the task's configuration plus
``"plan": <plan id>`` (:func:`plan_config`), so they never mix with the exploratory blocks. A task's
primary contrasts are computed only once every run the plan lists for it is recorded (no interim look);
until then the section shows how many are in.

    python benchmarks/cooperation/cooperation_plan.py run     # the plan's missing runs, in its order (resumable)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the package supports it): the same parser as a package
    import tomli as tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
PLAN_FILE = os.path.join(HERE, "cooperation_plan.toml")
PAIRINGS = ("apart", "swap", "cross_play")
"""Rows the plan's trained conditions give by pairing (``cooperation.pairings``)."""


def load_plan(path: str = PLAN_FILE) -> dict[str, Any]:
    """The plan as a dict (TOML).

    Raises:
        ValueError: a plan without ``id``, ``order``, ``conditions``, ``seeds`` or ``primary``, or a
            primary contrast whose task is not in ``order``.
    """
    with open(path, "rb") as fh:
        plan = tomllib.load(fh)
    missing = [k for k in ("id", "order", "conditions", "seeds", "primary") if k not in plan]
    if missing:
        raise ValueError(f"{os.path.basename(path)}: missing {missing}")
    for p in plan["primary"]:
        if p["task"] not in plan["order"]:
            raise ValueError(
                f"{os.path.basename(path)}: primary task {p['task']!r} not in order {plan['order']}"
            )
    return plan


def _git(where: str, *args: str) -> list[str]:
    """The output lines of ``git args`` run in ``where``; none when git fails (not a repository, no git)."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.stdout.splitlines() if line.strip()]


def plan_commits(path: str = PLAN_FILE) -> dict[str, Any]:
    """``{"added": "<hash> (<date>)" or None, "changed": [later commits, oldest first], "dirty": bool}``:
    the commit that first added ``path`` and every later commit that changed its content, followed across
    renames (``git log --follow``: a commit that only moved the file is no change), and whether the
    working copy differs from the last commit (git run in ``path``'s folder)."""
    where, name = os.path.split(os.path.abspath(path))
    log = _git(where, "log", "--follow", "--format=@%h (%cs)", "--name-status", "--", name)
    touched: list[tuple[str, str]] = []  # (commit, status letter and score), newest first
    for line in log:
        if line.startswith("@"):
            touched.append((line[1:], ""))
        elif line.strip() and touched and not touched[-1][1]:
            touched[-1] = (touched[-1][0], line.split("\t")[0])
    content = [c for c, status in reversed(touched) if status not in ("R100", "C100")]
    added = [c for c, status in reversed(touched) if status == "A"]
    first = added[0] if added else None
    changed = [c for c in content if c != first]
    dirty = bool(first) and bool(_git(where, "status", "--porcelain", "--", name))
    return {"added": first, "changed": changed, "dirty": dirty}


def plan_config(task: str, plan: dict[str, Any]) -> dict[str, Any]:
    """The configuration the plan's runs of ``task`` are recorded under: the task's, plus the plan id."""
    import cooperation as C

    return {**C.config_for(task), "plan": plan["id"]}


def expected_rows(plan: dict[str, Any]) -> list[tuple[str, int]]:
    """Every (row, seed) a task of the plan records: its conditions and their pairings, every seed."""
    conds = list(plan["conditions"])
    rows = conds + [p for p in PAIRINGS if p != "apart" or {"apart0", "apart1"} <= set(conds)]
    if "joint" not in conds:
        rows = [r for r in rows if r not in ("swap", "cross_play")]
    return [(r, s) for r in rows for s in plan["seeds"]]


def run_plan(plan: dict[str, Any] | None = None) -> None:
    """The plan's missing runs, task by task in its ``order`` (a task starts once the previous one is
    complete; ``cooperation.run_missing`` resumes).

    Raises:
        ValueError: a task of the plan that the library does not have yet (the communication task until
            it is built), after every earlier task ran.
    """
    import cooperation as C

    from comlrl_lightning.tasks.cooperation import TASKS

    plan = plan or load_plan()
    for task in plan["order"]:
        if task not in TASKS:
            raise ValueError(f"plan {plan['id']}: task {task!r} is not built yet (tasks: {sorted(TASKS)})")
        C.run_missing(
            task, tuple(plan["seeds"]), plan_config(task, plan), conditions=tuple(plan["conditions"])
        )


def _seed_gains(runs: Sequence[dict[str, Any]], row: str) -> dict[int, float]:
    """Per seed of ``row``: held-out success after minus the untrained team's (joint run of that seed)."""
    before = {r["seed"]: r["history"][0]["solved"] for r in runs if r["algorithm"] == "joint"}
    out = {}
    for r in runs:
        if r["algorithm"] == row:
            after, base = r["history"][-1]["solved"], before.get(r["seed"], r["history"][0]["solved"])
            out[r["seed"]] = sum(a - b for a, b in zip(after, base)) / len(after)
    return out


def recorded_count(plan: dict[str, Any], runs: Sequence[dict[str, Any]]) -> int:
    """How many of the (row, seed) runs the plan lists for a task are among ``runs``."""
    have = {(r["algorithm"], r["seed"]) for r in runs}
    return sum(key in have for key in expected_rows(plan))


def summarize_plan(
    plan: dict[str, Any],
    runs_by_task: dict[str, list[dict[str, Any]]],
    not_run: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Per primary contrast: how many of its task's runs are recorded and, when all are,
    :func:`seed_stats.compare_independent` of the two rows' seed-mean gains with the plan's sides; then
    Holm over the whole family (a contrast not complete enters with p = 1). ``not_run``: tasks the plan's
    own rules stopped before their runs (the communication task when no format passed its selection),
    with the reason, kept in the contrast's entry as ``"not_run"``."""
    from seed_stats import compare_independent, holm

    need = expected_rows(plan)
    out: list[dict[str, Any]] = []
    for p in plan["primary"]:
        runs = runs_by_task.get(p["task"], [])
        done = recorded_count(plan, runs)
        entry: dict[str, Any] = {
            "task": p["task"],
            "contrast": list(p["contrast"]),
            "recorded": done,
            "needed": len(need),
        }
        if (not_run or {}).get(p["task"]):
            entry["not_run"] = not_run[p["task"]]
        elif done == len(need):
            a, b = (_seed_gains(runs, row) for row in p["contrast"])
            entry["result"] = compare_independent(list(a.values()), list(b.values()), plan["test"]["sides"])
        out.append(entry)
    ps = {str(i): e["result"]["permutation"]["p"] if "result" in e else 1.0 for i, e in enumerate(out)}
    for i, adjusted in holm(ps).items():
        out[int(i)]["holm_p"] = adjusted
    return {"contrasts": out, "alpha": plan["test"]["alpha"]}


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
    import bench_paths  # noqa: F401 - every benchmarks/<concern>/ on sys.path

    if sys.argv[1:] == ["run"]:
        import torch

        torch.set_num_threads(1)  # as cooperation.py: one thread per run, the recorded setting
        run_plan()
    else:
        raise SystemExit("usage: python benchmarks/cooperation/cooperation_plan.py run")
