"""The wall times the README quotes, measured as a user meets them, with the load they ran at.

    python benchmarks/speed/readme_timings.py            # both
    python benchmarks/speed/readme_timings.py --only toy

- ``toy``: ``make toy``'s command (``comlrl-lightning fit`` on ``configs/toy_length_ratio.yaml`` and
  the blocks its header names), in a child process from a clean log folder: wall seconds and the
  child's peak RSS.
- ``example``: the README's Python quick tour as written, with the one change the README offers for
  "a run of seconds" (``AGENT = "builtin:tiny-gpt2"``), in a child process: wall seconds (imports,
  model build, its ``NUM_BATCHES`` batches, the end-of-fit summary).

Each line carries the 1-minute load average before and after (``os.getloadavg()``): on a shared
machine a wall time means little without it. Prints one JSON object per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository
TOY = "configs/toy_length_ratio.yaml"


def toy_command() -> list[str]:
    """``make toy``'s command line: the config's header blocks, then the config."""
    for line in open(os.path.join(ROOT, TOY)).read().splitlines():
        if line.startswith("#") and "comlrl-lightning fit " in line:
            return ["fit", *shlex.split(line.split("comlrl-lightning fit", 1)[1])]
    raise SystemExit(f"{TOY}: no '# comlrl-lightning fit ...' header line")


def readme_example() -> str:
    """The README's Python quick tour, on the tiny model (the README's own suggestion)."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "trainer.fit" in b]
    code = code.replace('AGENT = "builtin:smollm2-135m-instruct"', 'AGENT = "builtin:tiny-gpt2"')
    return code.replace(
        '"configs/data/topics.jsonl"', repr(os.path.join(ROOT, "configs", "data", "topics.jsonl"))
    )


def timed(name: str, argv: list[str], cwd: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(
        argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wall, load1 = time.perf_counter() - t0, os.getloadavg()[0]
    if proc.returncode:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far
    return {"what": name, "wall_s": round(wall, 1), "peak_rss_mb_max_so_far": round(peak_mb),
            "load_before": round(load0, 1), "load_after": round(load1, 1), "cpus": os.cpu_count()}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["toy", "example"])
    args = ap.parse_args(argv)
    cli = os.path.join(os.path.dirname(sys.executable), "comlrl-lightning")
    with tempfile.TemporaryDirectory(prefix="readme-timings-") as tmp:
        if args.only in (None, "toy"):
            argv = [cli, *toy_command(), "--config", TOY, f"--trainer.default_root_dir={tmp}/toy"]
            print(json.dumps(timed("make toy", argv, ROOT)), flush=True)
        if args.only in (None, "example"):
            print(
                json.dumps(
                    timed("README Python example (tiny)", [sys.executable, "-c", readme_example()], tmp)
                )
            )


if __name__ == "__main__":
    main()
