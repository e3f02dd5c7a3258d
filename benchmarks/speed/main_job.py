"""The HumanEval co-writing job (`make run CONFIG=configs/humaneval_smollm2.yaml`; the main job until the coordination job replaced it) as a user runs it: step time, clipped ratio and a peak-RSS breakdown.

    python benchmarks/speed/main_job.py                         # configs/humaneval_smollm2.yaml, max_steps=4
    python benchmarks/speed/main_job.py --max_steps 8 -- --model.init_args.max_new_tokens=64

Runs ``comlrl-lightning fit`` on the config in a child process (so its peak RSS is its own) with a
timing callback added, and prints one JSON object:

- ``train_batch_s``: wall time of each training batch (``on_train_batch_start`` → ``end``:
  rollout, reward, every agent's update); ``val_s``: each validation run;
- ``clipped_ratio``: fraction of training completions that hit ``max_new_tokens`` (all agents);
  ``mean_length``: their mean length in tokens;
- ``rss_mb``: resident set size (``/proc/self/status`` ``VmRSS``) and peak (``VmHWM``) after the
  imports and at each phase (models loaded, after each batch, after validation, at the end);
- ``state_mb``: the bytes of what training must hold (distinct parameters, gradients, optimizer
  state) and ``peak_over_imports_mb`` / ``state_mb``: the ratio the issue asks to be ≤ 1.5.

Absolute times depend on the load of the (shared) machine: ``loadavg`` is printed with them.
Compare two commits by running this script in each, back to back.
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


def _status_mb() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) / 1024.0
    return {"rss": round(out["VmRSS"]), "peak": round(out["VmHWM"])}


def _child(cli_args: list[str], result_path: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import lightning.pytorch as pl
    import torch

    from comlrl_lightning import cli

    record: dict = {"rss_mb": {"imports": _status_mb()}, "train_batch_s": [], "val_s": [], "clipped": [],
                    "lengths": []}  # fmt: skip

    class Probe(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            self.t0 = None

        def on_fit_start(self, trainer, pl_module):
            record["rss_mb"]["models_loaded"] = _status_mb()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            record["train_batch_s"].append(round(time.perf_counter() - self.t0, 2))
            record["clipped"] += torch.cat([c.float() for c in outputs["clipped"]]).tolist()
            record["lengths"] += torch.cat([c.float() for c in outputs["completion_lengths"]]).tolist()
            record["rss_mb"][f"batch_{batch_idx}"] = _status_mb()
            opt_bytes, seen = 0, set()
            for opt in trainer.optimizers:
                for state in opt.state.values():
                    for v in state.values():
                        if torch.is_tensor(v) and v.untyped_storage().data_ptr() not in seen:
                            seen.add(v.untyped_storage().data_ptr())
                            opt_bytes += v.untyped_storage().nbytes()
            params = {p.untyped_storage().data_ptr(): p for p in pl_module.agents.parameters()}
            param_bytes = sum(p.untyped_storage().nbytes() for p in params.values())
            record["state_mb"] = {"params": round(param_bytes / 2**20), "grads": round(param_bytes / 2**20),
                                  "optimizer": round(opt_bytes / 2**20)}  # fmt: skip

        def on_validation_epoch_start(self, trainer, pl_module):
            self.v0 = time.perf_counter()

        def on_validation_epoch_end(self, trainer, pl_module):
            record["val_s"].append(round(time.perf_counter() - self.v0, 2))
            record["rss_mb"][f"validation_{len(record['val_s'])}"] = _status_mb()

    class ProbedCLI(cli.CoMLRLCLI):
        def before_fit(self) -> None:
            self.trainer.callbacks.append(Probe())
            super().before_fit()

    cli.CoMLRLCLI = ProbedCLI
    t0 = time.perf_counter()
    cli.main(cli_args)
    record["fit_s"] = round(time.perf_counter() - t0, 1)
    record["rss_mb"]["end"] = _status_mb()
    with open(result_path, "w") as f:
        json.dump(record, f)


def summarise(record: dict) -> dict:
    """The headline numbers of one child's record (see the module docstring)."""
    state = sum(record.get("state_mb", {}).values())
    peak = record["rss_mb"]["end"]["peak"] - record["rss_mb"]["imports"]["rss"]
    batches = record["train_batch_s"]
    return {
        "train_batch_s": batches,
        "mean_batch_s_after_first": round(sum(batches[1:]) / max(len(batches) - 1, 1), 2),
        "val_s": record["val_s"],
        "fit_s": record["fit_s"],
        "clipped_ratio": round(sum(record["clipped"]) / max(len(record["clipped"]), 1), 3),
        "mean_length": round(sum(record["lengths"]) / max(len(record["lengths"]), 1), 1),
        "state_mb": record.get("state_mb"),
        "peak_over_imports_mb": peak,
        "peak_over_imports_per_state": round(peak / state, 2) if state else None,
        "rss_mb": record["rss_mb"],
    }


def measure(extra: list[str], max_steps: int = 6, config: str | None = None) -> dict:
    """One child run of the main job (``summarise``'d), validation off so that only training is timed."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "record.json")
        cli_args = ["fit", "--config", config or os.path.join(ROOT, "configs", "humaneval_smollm2.yaml"),
                    f"--trainer.max_steps={max_steps}", f"--trainer.default_root_dir={tmp}",
                    "--validate_before_fit=false", "--trainer.limit_val_batches=0", *extra]  # fmt: skip
        load0 = os.getloadavg()
        subprocess.run([sys.executable, __file__, "--child", result, "--", *cli_args], check=True, cwd=tmp,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        with open(result) as f:
            out = summarise(json.load(f))
    out["loadavg_start_end"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
    return out


STOP_KNOB = "--model.init_args.sampling.stop_after_code_block"


def section(quick: bool = False) -> dict:
    """``benchmarks/run.py --only main_job``: the main job without and with ``stop_after_code_block``,
    back to back (A B A B; 3 batches each, 1 with ``--quick``), same seed and batches."""
    steps, reps = (2, 1) if quick else (6, 2)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in range(reps):
        for name, flag in (("off", "false"), ("on", "true")):
            runs[name].append(measure([f"{STOP_KNOB}={flag}"], max_steps=steps))
    return {"runs": runs, "max_steps": steps}


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def render(res: dict) -> str:
    """The markdown of the ``main_job`` section."""
    rows, batch = [], {}
    for name in ("off", "on"):
        runs = res["runs"][name]
        batch[name] = _mean([b for r in runs for b in r["train_batch_s"]])
        peak = max(r["peak_over_imports_mb"] for r in runs)
        state = sum(runs[0]["state_mb"].values())
        rows.append(f"| {name} | {batch[name]:.1f} | {' / '.join(f'{b:.0f}' for r in runs for b in r['train_batch_s'])} | "
                    f"{runs[0]['clipped_ratio']:.3f} | {runs[0]['mean_length']:.1f} | {peak} ({peak / state:.2f}× "
                    f"{state} MiB) | {' / '.join(str(r['loadavg_start_end']) for r in runs)} |")  # fmt: skip
    batches = res["max_steps"] // 2  # 2 agents: 2 optimizer steps per batch
    return f"""`benchmarks/speed/main_job.py` via `run.py --only main_job`: `configs/humaneval_smollm2.yaml` as `make run CONFIG=configs/humaneval_smollm2.yaml`
trains it (its agents, batch size, K and `max_new_tokens`), validation off, `max_steps={res["max_steps"]}`
({batches} batches) per run, runs alternating off / on, same seed (so the same problems and, up to the
stop, the same samples).

| `stop_after_code_block` | mean batch s | each batch s | clipped ratio | mean completion tokens | peak RSS over imports, MiB (× weights+grads+AdamW) | load average start, end |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Batch time with the stop ÷ without: **{batch["on"] / batch["off"]:.2f}** (the load column includes the run itself, 2 threads).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "humaneval_smollm2.yaml"))
    parser.add_argument("--max_steps", type=int, default=4, help="trainer.max_steps (2 agents: 2 per batch)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="more CLI arguments, after --")
    args = parser.parse_args()
    if args.child:
        _child(args.extra, args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "record.json")
        cli_args = ["fit", "--config", args.config, f"--trainer.max_steps={args.max_steps}",
                    f"--trainer.default_root_dir={tmp}", *args.extra]  # fmt: skip
        load0 = os.getloadavg()
        subprocess.run([sys.executable, __file__, "--child", result, "--", *cli_args], check=True, cwd=tmp,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        with open(result) as f:
            out = summarise(json.load(f))
    out["loadavg_start_end"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
    out["args"] = cli_args[3:]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
