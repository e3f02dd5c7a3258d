"""The main job trained through the engine: `make run`'s default config (the coordination task, 24 batches)
with ``sampling.generation_backend: vllm``, its held-out gain set against the HF run of the same config,
seed and budget (:mod:`cooperation_main_job`'s latest record), and both runs' wall time.

    .venv-vllm/bin/python benchmarks/run.py --only engine_fit --write   # ~15-25 min on 2 cores

The fit runs as the CLI runs it (a child process, torch's default threads, the config's seed), so what it
prints is what a user sees; the section keeps its summary lines, wall time and load. Passes when the
engine run's gain lies inside the HF run's 95% interval (paired over the 50 held-out problems).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository
CONFIG = "configs/coop_coordination.yaml"
"""The Makefile's default ``CONFIG`` (`make run`)."""


def blocks(config: str = CONFIG) -> list[str]:
    """The config blocks the config's header names before it, as the Makefile's ``BLOCKS`` reads them
    (``# ... comlrl-lightning fit <blocks> --config <config>``)."""
    with open(os.path.join(ROOT, config)) as fh:
        for line in fh:
            m = re.match(r"^#.*comlrl-lightning fit (.*) --config [^ ]*$", line.rstrip("\n"))
            if m:
                return m.group(1).split()
    return []


def hf_record() -> dict[str, Any] | None:
    """The latest main-job record of the default config (`make run` with no arguments) that exited 0."""
    from cooperation_main_job import RECORDS

    if not os.path.exists(RECORDS):
        return None
    with open(RECORDS) as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    ok = [r for r in recs if not r["make_args"] and r["returncode"] == 0]
    return ok[-1] if ok else None


GAIN = re.compile(
    r"held-out team success: ([\d.]+) -> ([\d.]+); gain ([+-][\d.]+), 95% interval \[([+-][\d.]+), ([+-][\d.]+)\]"
)


def parse_gain(lines: list[str]) -> dict[str, float] | None:
    """``{"before", "after", "gain", "lo", "hi"}`` from the fit summary's held-out line (None without it)."""
    for line in lines:
        m = GAIN.search(line)
        if m:
            return dict(zip(("before", "after", "gain", "lo", "hi"), map(float, m.groups())))
    return None


def seconds_per_batch(log_dir: str) -> float | None:
    """Median wall seconds between consecutive training batches, from the TensorBoard events' wall times
    of the per-batch ``reward`` scalar (a validation between two batches is left out by the median)."""
    import glob
    import statistics

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    times = []
    for path in glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True):
        acc = EventAccumulator(path)
        acc.Reload()
        if "reward" in acc.Tags()["scalars"]:
            times += [e.wall_time for e in acc.Scalars("reward")]
    times.sort()
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else None


def within(engine: dict[str, float] | None, hf: dict[str, float] | None) -> bool | None:
    """Whether the engine run's gain lies in the HF run's 95% interval (None when either is missing)."""
    if engine is None or hf is None:
        return None
    return hf["lo"] <= engine["gain"] <= hf["hi"]


def section(quick: bool) -> dict[str, Any]:
    """Run the main job with the engine (``quick``: 2 batches, 4 held-out problems) and compare."""
    from cooperation_main_job import is_summary

    extra = ["--model.init_args.sampling.generation_backend=vllm"]
    if quick:
        extra += [
            "--trainer.max_steps=4",
            "--trainer.val_check_interval=2",
            "--data.init_args.num_held_out=4",
        ]
    with tempfile.TemporaryDirectory(prefix="engine_fit_") as tmp:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("OMP_NUM_THREADS", None)  # as a user runs it: torch's default threads
        cmd = [sys.executable, "-m", "comlrl_lightning", "fit", *blocks(), "--config", CONFIG, *extra,
               f"--trainer.logger.init_args.save_dir={tmp}"]  # fmt: skip
        load0, t0 = os.getloadavg(), time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.time() - t0
        batch_s = seconds_per_batch(tmp)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if is_summary(ln)]
    hf = hf_record()
    engine_gain, hf_gain = parse_gain(lines), parse_gain(hf["summary"]) if hf else None
    inside = within(engine_gain, hf_gain)
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
    return {
        "config": CONFIG,
        "extra": extra,
        "returncode": proc.returncode,
        "wall_s": wall,
        "seconds_per_batch": batch_s,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "summary": lines,
        "engine": engine_gain,
        "hf": hf_gain,
        "hf_record": {k: hf[k] for k in ("commit", "date", "wall_s", "loadavg_start", "loadavg_end")}
        if hf
        else None,
        "inside_hf_interval": inside,
        "quick": quick,
    }


def render(res: dict[str, Any]) -> str:
    """The subsection of the Generation section."""
    e, h, rec = res["engine"], res["hf"], res["hf_record"]
    if res["returncode"] or e is None:
        return f"The main job through the engine: the fit failed (exit code {res['returncode']}); nothing to compare."
    got = (
        f"held-out team success {e['before']:.3f} -> {e['after']:.3f}, gain {e['gain']:+.3f} "
        f"(95% interval [{e['lo']:+.3f}, {e['hi']:+.3f}])"
    )
    if res.get("seconds_per_batch"):
        got += f", {res['seconds_per_batch']:.1f} s per training batch (median)"
    if h is None:
        return f"The main job through the engine: {got}; no HF record to compare with."
    verdict = "inside" if res["inside_hf_interval"] else "**outside**"
    if res.get("quick"):
        return f"The main job through the engine, **quick check only** (2 batches, 4 held-out problems; not comparable with the HF run's interval): {got}."
    return (
        f"**The main job through the engine** (`{res['config']}`, `{' '.join(res['extra'])}`, the config's seed "
        f"and budget; `benchmarks/learning/engine_fit.py`): {got}, {res['wall_s'] / 60:.1f} min for the fit (load "
        f"{res['loadavg_start'][0]:.1f} -> {res['loadavg_end'][0]:.1f}). The HF run of the same config (the main "
        f"job's record, a clean clone of `{rec['commit'][:10]}`, {rec['date']}: {rec['wall_s'] / 60:.1f} min including "
        f"the venv and model conversion, load {rec['loadavg_start'][0]:.1f} -> {rec['loadavg_end'][0]:.1f}) gained "
        f"{h['gain']:+.3f}, 95% interval [{h['lo']:+.3f}, {h['hi']:+.3f}]: the engine run's gain is {verdict} it. "
        "The two runs sample different completions (different kernels and RNG streams), so equal gains are "
        "not expected, only gains the HF run's interval does not rule out."
    )
