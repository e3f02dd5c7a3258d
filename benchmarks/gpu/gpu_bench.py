"""The benchmark comparisons on one CUDA GPU, with bf16 weights everywhere (ours, CoMLRL, TRL, the floor).

    python benchmarks/gpu/gpu_bench.py --out DIR [--quick] [--no-smollm2]   # writes DIR/gpu_bench.{md,json}

``make gpu-check`` runs it with ``--quick`` (few steps per row, to fit its 5 minutes) and includes the
table in the GPU section of RESULTS.md; ``--no-smollm2`` drops the SmolLM2 rows when its GGUF is absent.

Rows: vs CoMLRL (N=2) and vs TRL (N=1) on the tiny GPT-2 and on SmolLM2-135M, the floor (N=1 and
N=2), scaling in N and K, and peak GPU memory (``torch.cuda.max_memory_allocated``) for two SmolLM2
agents with separate vs shared weights. Same alternation and medians as ``run.py``.

Without a GPU it prints that no GPU is available and exits 0: it never reports CPU numbers as GPU
numbers. ``--cpu-dry-run`` runs the same code on the CPU in bf16 with few steps, to check the code
path; its numbers mean nothing and are never written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
import run  # noqa: E402  (sets the offline/wandb environment first)
import torch  # noqa: E402
from bench_lib import SMOLLM2, Setup, build_ours, fit_ours, unique_param_bytes  # noqa: E402


def gpu_memory(device: str, dtype: str) -> dict[str, Any]:
    """Peak allocated GPU memory of a 2-batch fit: SmolLM2 x2 separate vs shared weights (and x1)."""
    out: dict[str, Any] = {}
    for name, n, share in (("1 agent", 1, False), ("2 separate", 2, False), ("2 shared", 2, True)):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        s = Setup(num_agents=n, share_weights=share, model=SMOLLM2, k=2, batch_size=1, max_new_tokens=16,
                  lr=1e-6, device=device, dtype=dtype)  # fmt: skip
        module = build_ours(s)
        params = unique_param_bytes(module.agents)
        fit_ours(s, 2, module=module)
        out[name] = {"peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20, "param_bytes": params}
        del module
    out["shared_param_ratio"] = out["2 shared"]["param_bytes"] / out["1 agent"]["param_bytes"]
    return out


def render_memory(m: dict[str, Any]) -> str:
    lines = [
        "| SmolLM2-135M bf16, fit of 2 batches | peak GPU memory allocated | parameter bytes |",
        "|---|---|---|",
    ]
    for name in ("1 agent", "2 separate", "2 shared"):
        lines.append(
            f"| {name} | {m[name]['peak_allocated_mb']:.0f} MiB | {m[name]['param_bytes'] / 2**20:.1f} MiB |"
        )
    lines.append(f"\nParameters, 2 shared / 1 agent: {m['shared_param_ratio']:.2f} (target <= 1.1).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few steps per row")
    ap.add_argument("--out", default=None, help="folder for gpu_bench.md and gpu_bench.json (GPU runs only)")
    ap.add_argument("--no-smollm2", action="store_true", help="tiny GPT-2 rows only (no SmolLM2 GGUF here)")
    ap.add_argument(
        "--cpu-dry-run", action="store_true", help="exercise the code path on CPU (bf16); writes nothing"
    )
    args = ap.parse_args(argv)
    if args.cpu_dry_run:
        device, quick = "cpu", True
    elif not torch.cuda.is_available():
        print(
            "No GPU available (torch.cuda.is_available() is False): nothing measured, no GPU numbers written."
        )
        return 0
    else:
        device, quick = "cuda", args.quick
    base = {"device": device, "dtype": "bfloat16"}
    smol = {**base, "model": SMOLLM2, "max_new_tokens": 64, "lr": 1e-6}
    res: dict[str, Any] = {
        "machine": run.machine(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    if device == "cuda":
        res["machine"]["gpu"] = torch.cuda.get_device_name(0)
    t0 = time.time()
    parts: list[str] = []
    plan = [
        ("tiny GPT-2", {"vs_comlrl": base, "vs_trl": base, "scaling": base}),
        ("SmolLM2-135M", {"vs_comlrl": {**smol, "batches": 20}, "vs_trl": {**smol, "batches": 20},
                          "smollm2": {**smol, "k": 4, "batch_size": 4, "batches": 10}}),
    ]  # fmt: skip
    if quick:  # one SmolLM2 row (the CPU dry run: 8 tokens)
        plan[1] = ("SmolLM2-135M", {"smollm2": {**smol, "max_new_tokens": 8 if device == "cpu" else 64}})
    if args.no_smollm2:
        plan = plan[:1]
    for title, sections in plan:
        sub: dict[str, Any] = {"machine": res["machine"]}
        for name, over in sections.items():
            print(f"[gpu-bench] {title}: {name} ...", flush=True)
            sub[name] = run.RUNNERS[name](quick, over)
        res[title] = {k: v for k, v in sub.items() if k != "machine"}
        parts.append(f"### {title}\n\n{run.render(sub)}")
    if device == "cuda" and not args.no_smollm2:
        res["memory"] = gpu_memory(device, "bfloat16")
        parts.append(f"### Memory\n\n{render_memory(res['memory'])}")
    res["wall_s"] = time.time() - t0
    text = "\n\n".join(parts)
    print(text)
    if device == "cuda" and args.out:
        mc = res["machine"]
        header = (f"`python benchmarks/gpu/gpu_bench.py{' --quick' if quick else ''}` on {res['date']} in "
                  f"{res['wall_s'] / 60:.1f} min. GPU: {mc.get('gpu')}; {mc['cores']} CPU cores; "
                  + ", ".join(f"{k} {v}" for k, v in mc["versions"].items())
                  + ". All weights bf16 (no autocast); rows as described above.\n\n")  # fmt: skip
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_bench.md"), "w") as fh:
            fh.write(header + text + "\n")
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as fh:
            json.dump(res, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
