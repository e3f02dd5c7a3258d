"""The learning benchmark's runs: which runner trains each algorithm, the recorded runs file
(:data:`~learning_config.RUNS_FILE`), running the missing (algorithm, seed) pairs, and the RESULTS.md
section's data (:func:`section`; the text is :mod:`learning_report`'s).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from learning_comlrl import run_comlrl_madpo
from learning_config import ALGORITHMS, CONFIG, PILOT_FILE, PNG, RUNS_FILE, TASK
from learning_coordinator import run_coordinator
from learning_stats import plot, summarize
from learning_tasks import COORD_SCHEDULE, COORD_TASK, HERE, TASK_RULE, question_overlap
from learning_train import PROBE_FILE, run_one

RUNNERS: dict[str, Any] = {"coordinator": run_coordinator, "comlrl_madpo": run_comlrl_madpo}
"""Algorithms with a runner of their own (default :func:`run_one`)."""
TASK_OF: dict[str, str] = {"coordinator": COORD_TASK}
"""Algorithms trained on a task of their own (default :data:`TASK`)."""


def recorded_runs(task: str, cfg: dict[str, Any] = CONFIG, path: str | None = None) -> list[dict[str, Any]]:
    """The finished runs of ``task`` under ``cfg`` in ``path`` (default :data:`RUNS_FILE`)."""
    path = path or RUNS_FILE
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        runs = [json.loads(line) for line in fh if line.strip()]
    return [r for r in runs if r["task"] == task and r["config"] == cfg]


def run_missing(
    task: str,
    algorithms: Sequence[str],
    seeds: Sequence[int],
    cfg: dict[str, Any] = CONFIG,
    path: str = RUNS_FILE,
) -> None:
    """Run every (algorithm, seed) not yet in ``path``, appending each as it finishes."""
    done = {
        (r["algorithm"], r["seed"]) for t in {task, *TASK_OF.values()} for r in recorded_runs(t, cfg, path)
    }
    for algorithm in algorithms:
        for seed in seeds:
            if (algorithm, seed) in done:
                continue
            print(f"[learning] {algorithm} seed {seed} ...", flush=True)
            r = RUNNERS.get(algorithm, run_one)(algorithm, TASK_OF.get(algorithm, task), seed, cfg)
            append_run(r, path, f"[learning] {algorithm} seed {seed}")


def append_run(record: dict[str, Any], path: str, label: str) -> None:
    """Append ``record`` to ``path`` as one JSON line, in one write (runs in parallel processes may
    share the file), and print ``label`` with its held-out success at each evaluation and wall time."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)
    curve = [round(sum(x["solved"]) / len(x["solved"]), 3) for x in record["history"]]
    print(f"{label}: {curve} in {record['wall_s']:.0f} s", flush=True)


QUICK = {**CONFIG, "batches": 2, "eval_every": 1, "k": 2}


def _load_calibration() -> dict[str, Any]:
    out: dict[Any, Any] = {}
    for r in (1, 2):
        with open(os.path.join(HERE, f"learning_calibration_{r}.json")) as fh:
            tasks = json.load(fh)["tasks"]
        out[r] = {t: v["success"] for t, v in tasks.items()}
        if TASK in tasks:
            out["untrained_texts"] = tasks[TASK]["examples"]
    with open(os.path.join(HERE, "learning_calibration_coordinator.json")) as fh:
        tasks = json.load(fh)["tasks"]
    out["coordinator"] = {t: [v["success"], v["draft_success"]] for t, v in tasks.items()}
    return out


def section(
    quick: bool,
    algorithms: Sequence[str] = ALGORITHMS,
    seeds: Sequence[int] = (0, 1, 2),
    run: bool = True,
) -> dict[str, Any]:
    """Run the (algorithm, seed) pairs not yet recorded in :data:`RUNS_FILE` (each appended as it
    ends) and summarise every recorded one; :func:`plot_section` draws the figure after the numbers are
    written (benchmarks/run.py's ``PLOTS``).
    ``quick``: one 2-batch MAGRPO run and one 2-round coordinator run in a scratch file, a check that the
    harness runs; ``run=False``:
    summarise what is recorded, run nothing."""
    if quick:
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "learning_quick_runs.jsonl")
        if os.path.exists(path):
            os.remove(path)
        run_missing(TASK, ["magrpo", "coordinator"], [0], QUICK, path)
        runs = recorded_runs(TASK, QUICK, path) + recorded_runs(COORD_TASK, QUICK, path)
    else:
        if run:
            run_missing(TASK, algorithms, seeds)
        runs = recorded_runs(TASK) + recorded_runs(COORD_TASK)
    out = {
        "task": TASK,
        "rule": TASK_RULE,
        "calibration": _load_calibration(),
        "config": QUICK if quick else CONFIG,
        "summary": summarize(runs),
        "png": PNG,
        "coordinator": {"task": COORD_TASK, "schedule": COORD_SCHEDULE},
    }
    out["overlap"] = question_overlap(TASK)
    if not quick and os.path.exists(PROBE_FILE):
        with open(PROBE_FILE) as fh:
            out["central_probe"] = json.load(fh)
    if not quick and os.path.exists(PILOT_FILE):
        with open(PILOT_FILE) as fh:
            pilot = json.load(fh)
        out["marlhf_pilot"] = {"seed": pilot["seed"], **pilot["pilot"], **pilot["marlhf"]}
    return out


def plot_section(res: dict[str, Any], path: str) -> None:
    """The held-out curves of :func:`section`'s result, drawn to ``path``."""
    coord = (
        f"\n(coordinator: its own task {res['coordinator']['task']})"
        if "coordinator" in res["summary"]
        else ""
    )
    plot(res["summary"], path, f"SmolLM2-135M x2 (fp32 from Q4_1 GGUF), {res['task']}{coord}, held-out")
