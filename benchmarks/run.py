"""Side-by-side benchmarks of comlrl-lightning's MAGRPO against CoMLRL, TRL and a floor. ``make bench`` runs this file.

    python benchmarks/run.py                   # full run (~5-10 min on 2 CPU cores), writes RESULTS.md
    python benchmarks/run.py --quick           # fast sanity pass (prints, writes nothing unless --write)
    python benchmarks/run.py --only vs_comlrl,vs_trl

Sections (``--only`` names): ``vs_comlrl`` (CoMLRL MAGRPOTrainer + the floor, N=2), ``vs_trl`` (TRL
GRPOTrainer + the floor, N=1), ``memory`` (peak RSS and parameter bytes, separate vs shared weights,
in child processes), ``scaling`` (N = 1, 2, 4 and K = 2, 4, 8, with the floor), ``smollm2`` (one
SmolLM2-135M row with the floor), ``credit`` (credit-assignment modes on a three-agent task, several
seeds; ``benchmarks/learning/credit.py``), ``main_job`` (the main job's training batches without and with
``stop_after_code_block``, back to back; ``benchmarks/speed/main_job.py``, ~10 min), ``learning`` (held-out
success of two SmolLM2 agents before and after MAGRPO/IAC/MAAC, several seeds; ``benchmarks/learning/learning.py``,
``make learn``; resumes from ``benchmarks/learning/learning_runs.jsonl``), ``sharded`` (``strategy: fsdp2`` on 2 gloo ranks
against 1 process: per-rank bytes, step time, the two rollout options; ``benchmarks/speed/sharded.py``), ``lora`` (N=2, 4
SmolLM2 agents as LoRA adapters on one base against full fine-tuning: trained bytes, peak RSS, step time;
``benchmarks/speed/lora.py``), ``lora_learning`` (held-out success of LoRA adapters against the recorded
full fine-tuning runs of the coordination task; ``benchmarks/learning/lora_learning.py``), ``interrupt_memory`` (peak RSS of the main
job and its LoRA team with and without ``InterruptCheckpoint``; ``benchmarks/speed/interrupt_memory.py``), ``generation``
(a colocated vLLM engine against HF ``generate`` on the main job's teams; ``benchmarks/speed/generation.py``, run from
``.venv-vllm``), ``engine_fit`` (the main job trained through the engine against the HF run's interval;
``benchmarks/learning/engine_fit.py``, from ``.venv-vllm``). ``--only X --write`` replaces section X in ``results.json`` and
regenerates RESULTS.md from every recorded section. Within a section every system trains on the same batch in turn
(A B A B ...), from the same initial weights, in this one process; numbers are medians after two
warm-up steps, ratios come from the same run.

This file runs the sections and writes the results; ``speed/run_sections.py`` holds the sections measured
here (vs_comlrl ... smollm2) and ``lib/run_report.py`` turns ``results.json`` into RESULTS.md. The scripts
live by concern: ``speed/`` (step time, memory, generation, LoRA, sharding, interrupts), ``learning/``
(held-out gains, credit, the engine's fit), ``cooperation/`` (the plan, its runs and report), ``gpu/``
(the lent-device check), ``attacks/`` (the cooperation bonus's attack sweep and reward throughput),
``ui/`` (the TensorBoard table in a browser), ``lib/`` (what several share; ``bench_paths.py`` puts every
folder on ``sys.path``, so a script imports another by its name). Outputs stay here, beside this file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
import torch  # noqa: E402
from bench_lib import recorded_machine, recorded_sections  # noqa: E402
from run_report import render, write_results  # noqa: E402
from run_sections import (  # noqa: E402
    COOPERATION_PNG,
    CREDIT_PNG,
    LEARNING_PNG,
    SECTIONS,
    _plot_vs_comlrl,
    memory,
    scaling,
    smollm2,
    vs_comlrl,
    vs_trl,
)

PARTIAL = os.path.join(HERE, "results.partial.json")
"""Every finished section of the current run, rewritten after each (not tracked)."""


PLOTS = {"vs_comlrl": _plot_vs_comlrl,
         "credit": lambda res: __import__("credit").plot_section(res, os.path.join(HERE, CREDIT_PNG)),
         "learning": lambda res: __import__("learning_runs").plot_section(res, os.path.join(HERE, LEARNING_PNG)),
         "cooperation": lambda res: __import__("cooperation_report").plot(res, os.path.join(HERE, COOPERATION_PNG))}  # fmt: skip
"""Drawn after the sections' numbers are written (a plot that fails loses no number)."""

RUNNERS = {"vs_comlrl": vs_comlrl, "vs_trl": vs_trl, "memory": memory, "scaling": scaling, "smollm2": smollm2,
           "credit": lambda quick, base=None: __import__("credit").section(quick),
           "main_job": lambda quick, base=None: __import__("main_job").section(quick),
           "learning": lambda quick, base=None: __import__("learning_runs").section(quick),
           "sharded": lambda quick, base=None: __import__("sharded").section(quick),
           "cooperation": lambda quick, base=None: __import__("cooperation_report").section(quick),
           "lora": lambda quick, base=None: __import__("lora").section(quick),
           "lora_learning": lambda quick, base=None: __import__("lora_learning").section(quick),
           "interrupt_memory": lambda quick, base=None: __import__("interrupt_memory").section(quick),
           "generation": lambda quick, base=None: __import__("generation").section(quick),
           "engine_fit": lambda quick, base=None: __import__("engine_fit").section(quick)}  # fmt: skip


# --------------------------------------------------------------------------- the machine, the entry point
def machine() -> dict[str, Any]:
    import importlib.metadata as md

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}
    for pkg in ("torch", "transformers", "lightning", "trl", "comlrl", "accelerate"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {"cores": os.cpu_count(), "cpu": cpu, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "versions": versions, "loadavg_start": os.getloadavg()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few steps, tiny models only: a sanity pass")
    ap.add_argument("--only", default="", help=f"comma-separated sections of {', '.join(SECTIONS)}")
    ap.add_argument(
        "--write", action="store_true", help="write RESULTS.md/results.json even for --quick/--only"
    )
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: rewrite RESULTS.md from results.json (and gpu_results.md, if present)",
    )
    args = ap.parse_args(argv)
    if args.render:
        json_path = os.path.join(os.path.dirname(args.results), "results.json")
        with open(json_path) as fh:
            res = {**json.load(fh), **recorded_sections(json_path, SECTIONS)}
        write_results(args.results, res, render(res))
        print(f"[bench] rewrote {args.results} from results.json")
        return 0
    only = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        ap.error(f"--only: unknown sections {unknown}; known: {list(SECTIONS)}")
    res: dict[str, Any] = {
        "machine": machine(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "quick": args.quick,
        "argv": argv,
    }
    t0 = time.time()
    for name in only:
        ts, load = time.time(), os.getloadavg()
        print(f"[bench] {name} ...", flush=True)
        res[name] = RUNNERS[name](args.quick, None)
        res[name]["ran"] = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "wall_s": time.time() - ts,
                            "loadavg_start": load, "loadavg_end": os.getloadavg(), "machine": machine()}  # fmt: skip
        print(f"[bench] {name} done in {time.time() - ts:.0f} s", flush=True)
        with open(PARTIAL, "w") as fh:  # this section's numbers, before anything later can fail
            json.dump(res, fh, indent=1, default=str)
    res["wall_s"] = time.time() - t0
    res["loadavg_end"] = os.getloadavg()
    json_path = os.path.join(os.path.dirname(args.results), "results.json")
    if args.write and args.only:
        res = {
            **recorded_sections(json_path, SECTIONS),
            **res,
        }  # sections not re-run keep their recorded numbers, and the header its recorded machine
        res["machine"] = recorded_machine(json_path) or res["machine"]
    table = render(res)
    print(table)
    written = args.write or (not args.quick and not args.only)
    if written:
        write_results(args.results, res, table)
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        print(f"[bench] wrote {args.results}")
    failed = []
    for name in [n for n in only if n in PLOTS and written]:  # a plot shows the recorded numbers only
        try:
            PLOTS[name](res[name])
        except Exception as err:  # noqa: BLE001 - the numbers are written; say which plot failed
            failed.append(name)
            print(f"[bench] {name}: the plot failed ({type(err).__name__}: {err}); its numbers are in {PARTIAL}",
                  file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
