"""Main-job step time, two trees back to back: ``configs/humaneval_smollm2.yaml`` for a few steps.

    python benchmarks/speed/step_time.py --before /tmp/old           # older checkout first, then this tree
    python benchmarks/speed/step_time.py --before /tmp/old --steps 4 --pairs 1

Each run is ``comlrl-lightning fit --config configs/humaneval_smollm2.yaml --trainer.max_steps=N``
(validation before and after included, as in the main job) in a child process with the tree's
package first on the path; the wall time of the whole run and of the training loop (from
Lightning's ``fit`` timing of the train batches, via a callback) are printed with their ratio.
SmolLM2-135M needs 4-9 GB per run: check ``free -g`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository

CHILD = r"""
import json, sys, time
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f)]
sys.path.insert(0, {path!r})
import comlrl_lightning
comlrl_lightning.__path__.append({path!r})  # callbacks/ and datamodules/ sit at the root (pyproject package-dir)
import lightning.pytorch as pl
starts, steps = {{}}, []
class Clock(pl.Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        starts[batch_idx] = time.perf_counter()
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        steps.append(time.perf_counter() - starts[batch_idx])
import comlrl_lightning.cli as cli
import functools
init = pl.Trainer.__init__
@functools.wraps(init)  # keeps the signature LightningCLI reads
def patched(self, *a, **k):
    k["callbacks"] = list(k.get("callbacks") or []) + [Clock()]
    return init(self, *a, **k)
pl.Trainer.__init__ = patched
t = time.perf_counter()
cli.main(["fit", "--config", "configs/humaneval_smollm2.yaml", "--trainer.max_steps={steps}",
          "--trainer.enable_progress_bar=false", "--trainer.logger.init_args.save_dir={logdir}"])
print("RESULT " + json.dumps({{"total_s": time.perf_counter() - t, "batch_s": steps}}))
"""


def run(path: str, steps: int) -> dict:
    logdir = tempfile.mkdtemp(prefix="steptime_")
    code = CHILD.format(path=path, steps=steps, logdir=logdir)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=path, env=env, capture_output=True, text=True, check=False
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"{path}: run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[0][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="checkout of the older tree (run first)")
    ap.add_argument("--steps", type=int, default=4, help="trainer.max_steps (2 agents: steps/2 batches)")
    ap.add_argument("--pairs", type=int, default=1)
    args = ap.parse_args()
    res: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.pairs):
        for name, path in (("before", os.path.abspath(args.before)), ("after", ROOT)):
            load = os.getloadavg()[0]
            r = run(path, args.steps)
            r["load"] = load
            res[name].append(r)
            print(
                f"{name:>6}: total {r['total_s']:.1f} s, train batches {[round(x, 2) for x in r['batch_s']]} s"
                f" (1-min load {load:.2f} at start)",
                flush=True,
            )
    mean = {k: sum(sum(r["batch_s"]) / len(r["batch_s"]) for r in v) / len(v) for k, v in res.items()}
    total = {k: sum(r["total_s"] for r in v) / len(v) for k, v in res.items()}
    print(
        f"mean train batch: before {mean['before']:.2f} s, after {mean['after']:.2f} s, "
        f"ratio {mean['after'] / mean['before']:.2f}; whole run ratio {total['after'] / total['before']:.2f}"
    )


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
