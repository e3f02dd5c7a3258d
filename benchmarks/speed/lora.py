"""Per-agent LoRA against full fine-tuning: memory and step time (``benchmarks/run.py --only lora``).

For N = 2 and N = 4 SmolLM2-135M agents, each configuration trains a few batches in a fresh child
process (``python benchmarks/speed/lora.py --child '<json>'``, so its peak RSS is its own, as
``memory_child.py`` does): full fine-tuning (N models, N AdamW states) and LoRA (N adapters, ``r=8``,
``lora_alpha=16``, ``all-linear``, on one frozen base held once; ``configs/coop_coordination_lora.yaml``'s
adapters). Each child reports the bytes of trainable parameters, of gradients (the most held at any
moment: each agent's are freed after its step), of optimizer state, of every distinct parameter
storage, its peak RSS and its per-batch step times (``step_time_s``: rollout + update). The children
run A B A B (full, LoRA, full, LoRA per N), so the step-time ratio LoRA / full comes from one run,
with the load average at its start and end.

``rollouts`` (``python benchmarks/speed/lora.py --rollouts``; also part of the section): the main job's
rollouts as its two configs build them (``configs/coop_coordination.yaml`` against
``configs/coop_coordination_lora.yaml``: 2 SmolLM2-135M agents, K=4, 3 new tokens, a batch of 2
training episodes, and the held-out validation's 50 problems, greedy), both teams in this one
process, A B A B, at 1 intra-op thread and at torch's default. Each rollout is timed in wall and
process CPU seconds with the load average beside it: on 2 cores shared with other jobs, 2 threads
make every small op wait at a barrier for a descheduled thread, and a LoRA layer runs 3 linears and 2
element-wise ops where a full one runs 1.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER = {"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "lora_dropout": 0.0}
NUM_AGENTS = (2, 4)
KINDS = ("full", "lora")


def _specs(model: str, n: int, kind: str) -> list[dict[str, Any]]:
    if kind == "full":
        return [{"model": model} for _ in range(n)]
    return [
        {"model": model, "adapter": ADAPTER, **({"share_weights_with": 0} if i else {})} for i in range(n)
    ]


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration in this process: build, train ``spec["batches"]`` batches, measure."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
    import bench_paths  # noqa: F401 - every benchmarks/<concern>/ on sys.path
    import torch
    from bench_lib import Harness, Setup, datamodule, optimizer_state_bytes, trainer_for, unique_param_bytes

    from comlrl_lightning import MAGRPO

    rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # noqa: E731 - Linux: KiB
    base_rss = rss()
    n = spec["num_agents"]
    setup = Setup(num_agents=n, k=2, batch_size=1, max_new_tokens=spec["max_new_tokens"], lr=1e-6,
                  model=spec["model"])  # fmt: skip
    torch.manual_seed(0)
    module = MAGRPO(agents=_specs(spec["model"], n, spec["kind"]), rollout={"num_generations": setup.k},
                    sampling={"max_new_tokens": setup.max_new_tokens, "top_k": 0}, learning_rate=setup.lr)  # fmt: skip
    module.configure_model()
    trainable = [module.team.trainable_parameters(i) for i in range(n)]
    grad_peak = [0]
    real_step = module.step_agent

    def step_agent(agent: int, loss: Any, cfg: Any) -> bool:  # the gradients held just before a step
        held = sum(
            p.grad.numel() * p.grad.element_size() for ps in trainable for p in ps if p.grad is not None
        )
        grad_peak[0] = max(grad_peak[0], held)
        return real_step(agent, loss, cfg)

    module.step_agent = step_agent  # type: ignore[method-assign]
    harness = Harness()
    trainer_for(setup, spec["batches"], [harness]).fit(module, datamodule(setup, spec["batches"]))
    opt_bytes = optimizer_state_bytes(module.trainer.optimizers)
    return {
        "trainable_bytes": sum(unique_param_bytes([torch.nn.ParameterList(ps)]) for ps in trainable),
        "grad_bytes_peak": grad_peak[0],
        "optimizer_state_bytes": opt_bytes,
        "param_bytes": unique_param_bytes(module.agents),
        "base_rss_mb": base_rss,
        "peak_rss_mb": rss(),
        "step_s": harness.module_s,
    }


ROLLOUT_CONFIGS = {"full": "configs/coop_coordination.yaml", "lora": "configs/coop_coordination_lora.yaml"}
ROLLOUT_KINDS = {
    "full": ("full", {}),
    "lora": ("lora", {}),
    "lora_unmerged": ("lora", {"adapter_rollouts": "unmerged"}),
}
"""Rollout rows: the config each is built from and its ``sampling`` changes (``lora``: the shipped default,
``adapter_rollouts: merged``; ``lora_unmerged``: through PEFT's adapter layers, as before it existed)."""


def _config_module(path: str, sampling: dict[str, Any] | None = None) -> Any:
    """The MAGRPO module and data module a shipped config builds (its ``init_args``, ``sampling``
    entries changed), loaded."""
    import yaml

    from comlrl_lightning import MAGRPO
    from comlrl_lightning.datamodules import CooperationDataModule

    with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), path)) as f:
        cfg = yaml.safe_load(f)
    init = cfg["model"]["init_args"]
    init["sampling"] = {**init.get("sampling", {}), **(sampling or {})}
    module = MAGRPO(**init)
    data = CooperationDataModule(**cfg["data"]["init_args"])
    data.setup("fit")
    module._env = data.env  # noqa: SLF001 - what fit takes from trainer.datamodule
    module.configure_model()
    module.train()  # as in fit: generate puts the model in eval mode and back
    return module, data


def rollouts(quick: bool = False) -> dict[str, Any]:
    """LoRA / full rollout time at the main job's shape, one process, A B A B per thread count."""
    import time

    import torch

    modules = {k: _config_module(ROLLOUT_CONFIGS[c], change) for k, (c, change) in ROLLOUT_KINDS.items()}
    _, data = modules["full"]
    train_batch = next(iter(data.train_dataloader()))
    val_batch = next(iter(data.val_dataloader()))
    default_threads = torch.get_num_threads()
    reps = 1 if quick else 2
    out: dict[str, Any] = {"threads": {}, "loadavg_start": os.getloadavg()}
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        rec: dict[str, dict[str, list[list[float]]]] = {k: {"train": [], "val": []} for k in ROLLOUT_KINDS}
        for rep in range(reps + 1):  # the first round warms up each team and is not kept
            for kind in ROLLOUT_KINDS:
                module = modules[kind][0]
                for part, batch in (("train", train_batch), ("val", val_batch)):
                    torch.manual_seed(rep)
                    wall, cpu, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
                    module.rollout(batch, evaluation=part == "val")
                    if rep:
                        t = [time.perf_counter() - wall, time.process_time() - cpu, load]
                        rec[kind][part].append([round(x, 3) for x in t])
        row: dict[str, Any] = {"runs": rec}
        for part in ("train", "val"):
            for i, name in ((0, "wall"), (1, "cpu")):
                mine = {k: sorted(r[i] for r in rec[k][part])[len(rec[k][part]) // 2] for k in ROLLOUT_KINDS}
                row[f"{part}_{name}_s"] = mine
                row[f"{part}_{name}_ratio"] = mine["lora"] / mine["full"]
                row[f"{part}_{name}_ratio_unmerged"] = mine["lora_unmerged"] / mine["full"]
        out["threads"][threads] = row
        print(f"threads={threads}: " + ", ".join(
            f"{part} LoRA/full {row[f'{part}_wall_ratio']:.2f} wall, {row[f'{part}_cpu_ratio']:.2f} CPU "
            f"(unmerged {row[f'{part}_wall_ratio_unmerged']:.2f} wall; "
            f"{row[f'{part}_wall_s']['lora']:.2f} / {row[f'{part}_wall_s']['full']:.2f} s)"
            for part in ("train", "val")) + f"; load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    torch.set_num_threads(default_threads)
    out["loadavg_end"] = os.getloadavg()
    return out


def render_rollouts(res: dict[str, Any]) -> str:
    """The rollout table: LoRA / full at the main job's shape, per thread count, merged and unmerged."""
    lines = [
        "| intra-op threads | rollout | full (wall) | LoRA merged (wall) | LoRA unmerged (wall) "
        "| merged / full (wall) | merged / full (CPU) | unmerged / full (wall) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for threads, row in res["threads"].items():
        for part, name in (
            ("train", "training batch (2 episodes x K=4)"),
            ("val", "held-out validation (50)"),
        ):
            w = row[f"{part}_wall_s"]
            lines.append(
                f"| {threads} | {name} | {w['full']:.2f} s | {w['lora']:.2f} s | {w['lora_unmerged']:.2f} s | "
                f"**{row[f'{part}_wall_ratio']:.2f}** | {row[f'{part}_cpu_ratio']:.2f} | "
                f"{row[f'{part}_wall_ratio_unmerged']:.2f} |"
            )
    load = f"load average {res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at the end"
    return "\n".join(lines) + (
        "\n\nRollouts of the main job's two configs (`configs/coop_coordination.yaml`, "
        "`configs/coop_coordination_lora.yaml`: 2 SmolLM2-135M agents, K=4, 3 new tokens), the three teams in one "
        f"process, A B C A B C, medians of the kept rounds (one warm-up round not kept); {load}. LoRA merged is "
        "the shipped `sampling.adapter_rollouts: merged` (each agent samples from base + B @ A in a temporary "
        "copy of the adapted weights); unmerged samples through PEFT's layers. "
        "`python benchmarks/speed/lora.py --rollouts`."
    )


def section(quick: bool) -> dict[str, Any]:
    """Every (N, kind) twice, A B A B, each in a child process; medians and ratios per N."""
    from bench_lib import SMOLLM2, med

    model = "builtin:tiny-gpt2" if quick else SMOLLM2
    batches, rounds = (3, 1) if quick else (5, 2)
    runs: dict[str, list[dict[str, Any]]] = {}
    load_start = os.getloadavg()
    for n in NUM_AGENTS:
        for _ in range(rounds):
            for kind in KINDS:
                spec = {
                    "model": model,
                    "num_agents": n,
                    "kind": kind,
                    "batches": batches,
                    "max_new_tokens": 8,
                }
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                                      capture_output=True, text=True, timeout=1800)  # fmt: skip
                if proc.returncode != 0:
                    raise RuntimeError(f"lora child {spec} failed:\n{proc.stderr[-3000:]}")
                runs.setdefault(f"N={n}/{kind}", []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {"model": model, "batches": batches, "rounds": rounds, "adapter": ADAPTER,
                           "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "runs": runs}  # fmt: skip
    if not quick:  # SmolLM2 only: the main job's configs
        out["rollouts"] = rollouts()
    for n in NUM_AGENTS:
        row: dict[str, Any] = {}
        for kind in KINDS:
            first = runs[f"N={n}/{kind}"][0]
            steps = [s for r in runs[f"N={n}/{kind}"] for s in r["step_s"][2:]]  # 2 warm-up batches per child
            row[kind] = {
                "train_state_bytes": first["trainable_bytes"]
                + first["grad_bytes_peak"]
                + first["optimizer_state_bytes"],
                "param_bytes": first["param_bytes"],
                "peak_rss_mb": max(r["peak_rss_mb"] for r in runs[f"N={n}/{kind}"]),
                "step_s": med(steps, 0),
                **{k: first[k] for k in ("trainable_bytes", "grad_bytes_peak", "optimizer_state_bytes")},
            }
        row["train_state_ratio"] = row["lora"]["train_state_bytes"] / row["full"]["train_state_bytes"]
        row["rss_ratio"] = row["lora"]["peak_rss_mb"] / row["full"]["peak_rss_mb"]
        row["step_time_ratio"] = row["lora"]["step_s"] / row["full"]["step_s"]
        out[f"N={n}"] = row
    return out


def _mb(b: float) -> str:
    return f"{b / 2**20:,.1f} MB"


def render(res: dict[str, Any]) -> str:
    """The section's Markdown table and how it was measured."""
    lines = [
        "| agents | kind | trainable params | gradients (peak) | optimizer state | params + grads + optimizer "
        "| all parameter storage | peak RSS | step time (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in NUM_AGENTS:
        row = res[f"N={n}"]
        for kind in KINDS:
            r = row[kind]
            lines.append(
                f"| {n} | {kind} | {_mb(r['trainable_bytes'])} | {_mb(r['grad_bytes_peak'])} | "
                f"{_mb(r['optimizer_state_bytes'])} | {_mb(r['train_state_bytes'])} | {_mb(r['param_bytes'])} | "
                f"{r['peak_rss_mb']:,.0f} MB | {r['step_s']:.2f} s |"
            )
        lines.append(
            f"| {n} | **LoRA / full** | | | | **{row['train_state_ratio']:.4f}** | | **{row['rss_ratio']:.2f}** | "
            f"**{row['step_time_ratio']:.2f}** |"
        )
    a = res["adapter"]
    load = f"load average {res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at the end"
    return (
        "\n".join(lines)
        + (
            f"\n\n{res['model']}, LoRA `r={a['r']}, lora_alpha={a['lora_alpha']}, target_modules={a['target_modules']}` "
            f"(N adapters on one frozen base) against N fully trained models, AdamW, K=2, one episode per batch, "
            f"8 new tokens; {res['batches']} batches per child process, the first 2 not timed, children run A B A B "
            f"({res['rounds']} rounds per N); {load}. Step time is the module's rollout + update "
            "(`step_time_s`), so generation, which LoRA does not shrink, is in both. `benchmarks/speed/lora.py`."
        )
        + (f"\n\n{render_rollouts(res['rollouts'])}" if "rollouts" in res else "")
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    elif "--rollouts" in sys.argv:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lib"))
        import bench_lib  # noqa: F401 - quiets Lightning / transformers logging and warnings
        import bench_paths  # noqa: F401 - every benchmarks/<concern>/ on sys.path

        result = rollouts("--quick" in sys.argv)
        print(json.dumps(result))
        print(render_rollouts(result))
    else:
        print(render(section("--quick" in sys.argv)))
