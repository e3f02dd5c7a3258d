"""`make run` as a new user runs it: a clean clone of the committed HEAD, a fresh venv and model cache,
the main job; its wall time, the machine's load and the summary it prints.

    python benchmarks/cooperation/cooperation_main_job.py               # clone, make run, record
    python benchmarks/cooperation/cooperation_main_job.py CONFIG=configs/coop_division.yaml

Appends one JSON line to :data:`RECORDS` (commit, config, wall seconds of ``make run`` — venv, model
conversion, both validations and training —, the 1-minute load average at start and end, the exit code
and the summary lines the CLI printed: held-out team success before -> after with the paired 95%
interval on the gain, ``val/pass@1`` with its Wilson intervals). The "Cooperation" section of RESULTS.md
shows the latest record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository
RECORDS = os.path.join(HERE, "cooperation_main_job.jsonl")
KEEP = ("held-out team success:", "val/pass@1:", "val/final/pass@1:", "val/reward:", "reward:")


def is_summary(line: str) -> bool:
    """A start -> end line of the CLI's end-of-fit summary (not the progress bar or the validation table)."""
    return line.strip().startswith(KEEP) and " -> " in line


def measure(make_args: list[str]) -> dict:
    """Clone HEAD into a temp folder and time ``make run`` there (its own venv and model cache)."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    with tempfile.TemporaryDirectory(prefix="coop_main_job_") as tmp:
        clone = os.path.join(tmp, "clone")
        subprocess.run(["git", "clone", "-q", ROOT, clone], check=True)
        env = {**os.environ, "COMLRL_LIGHTNING_CACHE": os.path.join(tmp, "cache")}
        env.pop("OMP_NUM_THREADS", None)  # as a user runs it: torch's default threads
        load0, t0 = os.getloadavg(), time.time()
        proc = subprocess.run(["make", "run", *make_args], cwd=clone, env=env, capture_output=True, text=True)
        wall = time.time() - t0
    lines = [ln.strip() for ln in proc.stdout.splitlines() if is_summary(ln)]
    return {
        "commit": commit.stdout.strip(),
        "make_args": make_args,
        "wall_s": round(wall),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "cores": os.cpu_count(),
        "returncode": proc.returncode,
        "summary": lines,
        "stderr_tail": proc.stderr[-2000:] if proc.returncode else "",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def latest() -> dict | None:
    """The last record of :data:`RECORDS` (None before any)."""
    if not os.path.exists(RECORDS):
        return None
    with open(RECORDS) as fh:
        lines = [line for line in fh if line.strip()]
    return json.loads(lines[-1]) if lines else None


if __name__ == "__main__":
    rec = measure(sys.argv[1:])
    with open(RECORDS, "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    print(json.dumps(rec, indent=1))
