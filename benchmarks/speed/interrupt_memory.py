"""What ``InterruptCheckpoint`` costs in memory: the main job and its LoRA team, with and without it.

    python benchmarks/speed/interrupt_memory.py                  # both configs, A B A B, max_steps=4 (2 batches)
    python benchmarks/speed/interrupt_memory.py --reps 1 --configs configs/coop_coordination.yaml

Each run is ``comlrl-lightning fit --config configs/trainer/cpu.yaml --config <config>`` (what ``make
run`` starts) in a fresh child process, so its peak RSS is its own, with ``trainer.max_steps`` small
and validation off (``--validate_before_fit=false --trainer.limit_val_batches=0``). ``with``: the
config as shipped (it lists an ``InterruptCheckpoint``); ``without``: the same run with that callback
taken out of ``trainer.callbacks`` before ``fit``. The runs alternate with / without (A B A B), so
both variants see the same load. Each child records:

- ``peak_rss_mb``: the process's peak resident set (``/proc/self/status`` ``VmHWM``) at the end, and
  ``peak_over_imports_mb``: that peak less the resident set after the imports;
- ``cuda_peak_mb``: ``torch.cuda.max_memory_allocated`` on a GPU run (None on CPU);
- ``update_window_s``: per batch, seconds from its first optimizer step to its end: the longest a
  signal waits for the batch's remaining updates before the checkpoint is written (a signal before
  the first step abandons the batch at once).

The printed ratios (with / without, of the largest peak of each variant) are the figure the issue asks
to be <= 1.05. ``benchmarks/run.py --only interrupt_memory --write`` records them in RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository
CONFIGS = {"main job": "configs/coop_coordination.yaml", "LoRA team": "configs/coop_coordination_lora.yaml"}
VARIANTS = ("with", "without")
TARGET = 1.05
"""Peak memory with the callback over without it, at most: the interruption-safety target."""


def _child(cli_args: list[str], result_path: str, keep: bool) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
    import bench_paths  # noqa: F401 - every benchmarks/<concern>/ on sys.path
    import lightning.pytorch as pl
    import torch
    from main_job import _status_mb

    from comlrl_lightning import cli
    from comlrl_lightning.callbacks import InterruptCheckpoint

    record: dict = {"imports_rss_mb": _status_mb()["rss"], "update_window_s": [], "batches": 0}

    class Probe(pl.Callback):
        first_step: float | None = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.first_step = None

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if self.first_step is None:
                self.first_step = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            record["batches"] += 1
            if self.first_step is not None:
                record["update_window_s"].append(round(time.perf_counter() - self.first_step, 3))

    class ProbedCLI(cli.CoMLRLCLI):
        def before_fit(self) -> None:
            callbacks = self.trainer.callbacks
            if not keep:  # the "without" variant: the shipped config's callback taken out
                callbacks[:] = [c for c in callbacks if not isinstance(c, InterruptCheckpoint)]
            record["interrupt_checkpoints"] = sum(isinstance(c, InterruptCheckpoint) for c in callbacks)
            callbacks.append(Probe())
            super().before_fit()

    cli.CoMLRLCLI = ProbedCLI
    t0 = time.perf_counter()
    cli.main(cli_args)
    record["fit_s"] = round(time.perf_counter() - t0, 1)
    status = _status_mb()
    record["peak_rss_mb"] = status["peak"]
    record["peak_over_imports_mb"] = status["peak"] - record["imports_rss_mb"]
    record["cuda_peak_mb"] = (
        round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None
    )
    with open(result_path, "w") as f:
        json.dump(record, f)


def measure(config: str, variant: str, max_steps: int) -> dict:
    """One child run of ``config`` (``variant``: ``with`` or ``without`` the InterruptCheckpoint)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "record.json")
        cli_args = ["fit", "--config", os.path.join(ROOT, "configs", "trainer", "cpu.yaml"),
                    "--config", os.path.join(ROOT, config), f"--trainer.max_steps={max_steps}",
                    f"--trainer.default_root_dir={tmp}", "--validate_before_fit=false",
                    "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false"]  # fmt: skip
        load0 = os.getloadavg()[0]
        proc = subprocess.run([sys.executable, __file__, "--child", result, "--variant", variant, "--", *cli_args],
                              cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"{config} {variant}: the child failed:\n{proc.stderr[-3000:]}")
        with open(result) as f:
            out = json.load(f)
    expected = 1 if variant == "with" else 0
    if out["interrupt_checkpoints"] != expected:
        raise RuntimeError(
            f"{config} {variant}: {out['interrupt_checkpoints']} InterruptCheckpoint(s) in the fit"
        )
    out["loadavg_start_end"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return out


def _ratio(runs: dict[str, list[dict]], key: str) -> float | None:
    peaks = {v: [r[key] for r in runs[v] if r.get(key) is not None] for v in VARIANTS}
    if not all(peaks.values()):
        return None
    return round(max(peaks["with"]) / max(peaks["without"]), 3)


def section(quick: bool = False, reps: int = 2, max_steps: int = 4, configs: dict | None = None) -> dict:
    """``benchmarks/run.py --only interrupt_memory``: each config with / without, A B A B (``quick``:
    A B once)."""
    reps = 1 if quick else reps
    out: dict = {"max_steps": max_steps, "reps": reps, "configs": {}}
    for name, config in (configs or CONFIGS).items():
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for _ in range(reps):
            for variant in VARIANTS:  # one heavy run at a time
                runs[variant].append(measure(config, variant, max_steps))
                print(f"[interrupt_memory] {name} {variant}: peak RSS {runs[variant][-1]['peak_rss_mb']} MB, "
                      f"load {runs[variant][-1]['loadavg_start_end']}", flush=True)  # fmt: skip
        out["configs"][name] = {
            "config": config,
            "runs": runs,
            "peak_rss_ratio": _ratio(runs, "peak_rss_mb"),
            "peak_over_imports_ratio": _ratio(runs, "peak_over_imports_mb"),
            "cuda_peak_ratio": _ratio(runs, "cuda_peak_mb"),
        }
    return out


def render(res: dict) -> str:
    """The markdown of the ``interrupt_memory`` section."""
    rows = []
    for name, c in res["configs"].items():
        runs = c["runs"]
        cells = {v: " / ".join(str(r["peak_rss_mb"]) for r in runs[v]) for v in VARIANTS}
        over = {v: " / ".join(str(r["peak_over_imports_mb"]) for r in runs[v]) for v in VARIANTS}
        windows = [w for r in runs["with"] for w in r["update_window_s"]]
        window = f"{max(windows):.1f} ({' / '.join(f'{w:.1f}' for w in windows)})"
        loads = " / ".join(str(r["loadavg_start_end"]) for v in VARIANTS for r in runs[v])
        ok = "yes" if c["peak_rss_ratio"] <= TARGET else "**no**"
        rows.append(f"| {name} (`{c['config']}`) | {cells['with']} ({over['with']}) | {cells['without']} "
                    f"({over['without']}) | **{c['peak_rss_ratio']:.3f}** ({c['peak_over_imports_ratio']:.3f}) | "
                    f"{ok} | {window} | {loads} |")  # fmt: skip
    return f"""`benchmarks/speed/interrupt_memory.py` via `run.py --only interrupt_memory`: each config as `make run` trains
it (`--config configs/trainer/cpu.yaml --config <config>`), `max_steps={res["max_steps"]}` ({res["max_steps"] // 2} batches of
2 agents), validation off, in a fresh child process; with the shipped `InterruptCheckpoint` and with it taken
out, alternating ({res["reps"]} of each). The callback copies nothing: a signal after a batch's first
optimizer step lets that batch's remaining updates finish, then saves; the last column is the longest such
wait measured (first optimizer step to batch end; each batch of the runs with it).

| team | peak RSS with, MB (over imports) | without, MB (over imports) | with ÷ without, peak (over imports) | <= {TARGET} | longest update wait, s (each) | load start, end (each run) |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS.values()), help="configs to measure")
    parser.add_argument("--reps", type=int, default=2, help="runs of each variant (alternating)")
    parser.add_argument("--max_steps", type=int, default=4, help="trainer.max_steps (2 agents: 2 per batch)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.extra, args.child, keep=args.variant == "with")
        return
    names = {v: k for k, v in CONFIGS.items()}
    res = section(
        reps=args.reps, max_steps=args.max_steps, configs={names.get(c, c): c for c in args.configs}
    )
    for name, c in res["configs"].items():
        print(f"{name}: peak RSS with / without = {c['peak_rss_ratio']} (over imports {c['peak_over_imports_ratio']}, "
              f"CUDA {c['cuda_peak_ratio']}); target <= {TARGET}")  # fmt: skip
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
