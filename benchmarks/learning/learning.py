"""Learning you can see: does a real pretrained team (two SmolLM2-135M agents) get better on held-out
problems it never trained on? The agents, the tasks and why they are not cooperative tasks:
``learning_tasks.py``'s docstring; the cooperative ones are ``cooperation.py``'s.

This file is the entry point; the benchmark lives in one module per concern:

- ``learning_tasks.py``: the tasks (rows, exact-match reward, DataModule, held-out recorder, calibration)
  and the coordinator's own task;
- ``learning_config.py``: the recorded settings and sample budgets of every row;
- ``learning_train.py``: one run of a library module (``build_module``, ``run_one``, the run record);
  ``learning_coordinator.py`` and ``learning_comlrl.py``: the coordinator's and CoMLRL's own rows;
- ``learning_runs.py``: which runner trains each row, the recorded runs, the section's data;
- ``learning_stats.py``: bootstrap intervals and the summary per row, the plot;
- ``learning_report.py``: the RESULTS.md section's Markdown.

    python benchmarks/learning/learning.py calibrate          # untrained held-out success per candidate task
    python benchmarks/learning/learning.py run magrpo,iac 0,1 # the missing (algorithm, seed) runs
    python benchmarks/learning/learning.py record             # recorded runs -> results.json and RESULTS.md
    python benchmarks/run.py --only learning --write # the RESULTS.md section (make learn)
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import bench_paths  # noqa: E402 - every benchmarks/<concern>/ on sys.path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from learning_config import ALGORITHMS, PILOT_FILE, PILOT_SEED, PNG, TASK, pilot_beta  # noqa: E402
from learning_coordinator import calibrate_coordinator  # noqa: E402
from learning_runs import plot_section, recorded_runs, run_missing, section  # noqa: E402
from learning_tasks import COORD_TASK, ROUNDS, TASKS, calibrate  # noqa: E402
from learning_train import PROBE_FILE, central_parse_probe, run_one  # noqa: E402

if __name__ == "__main__":
    if sys.argv[1:2] == ["calibrate_coordinator"]:
        res = calibrate_coordinator()
        with open(os.path.join(HERE, "learning_calibration_coordinator.json"), "w") as fh:
            json.dump(res, fh, indent=1)
        print("chosen:", res["chosen"])
    elif sys.argv[1:2] == ["calibrate"]:
        res = calibrate(ROUNDS[int(sys.argv[2]) - 1] if len(sys.argv) > 2 else tuple(TASKS))
        name = f"learning_calibration_{sys.argv[2] if len(sys.argv) > 2 else 'all'}.json"
        with open(os.path.join(HERE, name), "w") as fh:
            json.dump(res, fh, indent=1)
        print("chosen:", res["chosen"])
    elif sys.argv[1:2] == ["record"]:  # the recorded runs into results.json and RESULTS.md, running nothing
        import run as bench

        json_path = os.path.join(bench_paths.BENCH, "results.json")
        with open(json_path) as fh:
            res = json.load(fh)
        res["learning"] = section(False, run=False)
        runs = recorded_runs(TASK) + recorded_runs(COORD_TASK)
        import datetime

        ends = [datetime.datetime.strptime(r["date"], "%Y-%m-%d %H:%M") for r in runs]
        spans = sorted((e - datetime.timedelta(seconds=r["wall_s"]), e) for e, r in zip(ends, runs))
        busy, (lo, hi) = 0.0, spans[0]  # elapsed while a run ran: the union of the runs' spans
        for a, b in spans[1:] + [(max(ends) + datetime.timedelta(days=1),) * 2]:
            if a > hi:
                busy, lo = busy + (hi - lo).total_seconds(), a
            hi = max(hi, b)
        res["learning"]["ran"] = {
            "date": max(ends).strftime("%Y-%m-%d %H:%M"),  # elapsed: runs overlapped, with gaps between
            "wall_s": busy,
            "loadavg_start": min((r["loadavg_start"] for r in runs), key=lambda x: x[0]),
            "loadavg_end": max((r["loadavg_end"] for r in runs), key=lambda x: x[0]),
        }
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        code = bench.main(["--render"])  # the numbers first: a failing plot loses none
        plot_section(res["learning"], os.path.join(bench_paths.BENCH, PNG))
        sys.exit(code)
    elif sys.argv[1:2] == ["probe"]:  # centralized MAGRPO: do sampled joint completions keep the tags?
        probe = central_parse_probe()  # measured before the file is opened: a failure leaves no empty file
        with open(PROBE_FILE, "w") as fh:
            json.dump(probe, fh, indent=1)
    elif sys.argv[1:2] == ["pilot_marlhf"]:  # seed 100, no held-out evaluation: picks the beta
        r = run_one("marlhf", TASK, PILOT_SEED, held_out=False)
        m = r["marlhf"]
        r["pilot"] = {"beta_tried": m["beta"], "beta_chosen": pilot_beta(m["train_task_reward"], m["beta"])}
        with open(PILOT_FILE, "w") as fh:
            json.dump(r, fh, indent=1)
        print("pilot:", json.dumps({**r["pilot"], "gold": m["train_task_reward"]}), flush=True)
    elif sys.argv[1:2] == ["run"]:  # learning.py run magrpo,iac 0,1,2
        algos = sys.argv[2].split(",") if len(sys.argv) > 2 else list(ALGORITHMS)
        seeds = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0, 1, 2]
        run_missing(TASK, algos, seeds)
