"""Per-agent LoRA against full fine-tuning: memory and step time (``benchmarks/run.py --only lora``).

For N = 2 and N = 4 SmolLM2-135M agents, each configuration trains a few batches in a fresh child
process (``python benchmarks/lora.py --child '<json>'``, so its peak RSS is its own, as
``memory_child.py`` does): full fine-tuning (N models, N AdamW states) and LoRA (N adapters, ``r=8``,
``lora_alpha=16``, ``all-linear``, on one frozen base held once; ``configs/coop_coordination_lora.yaml``'s
adapters). Each child reports the bytes of trainable parameters, of gradients (the most held at any
moment: each agent's are freed after its step), of optimizer state, of every distinct parameter
storage, its peak RSS and its per-batch step times (``step_time_s``: rollout + update). The children
run A B A B (full, LoRA, full, LoRA per N), so the step-time ratio LoRA / full comes from one run,
with the load average at its start and end.
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
    sys.path.insert(0, HERE)
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
    return "\n".join(lines) + (
        f"\n\n{res['model']}, LoRA `r={a['r']}, lora_alpha={a['lora_alpha']}, target_modules={a['target_modules']}` "
        f"(N adapters on one frozen base) against N fully trained models, AdamW, K=2, one episode per batch, "
        f"8 new tokens; {res['batches']} batches per child process, the first 2 not timed, children run A B A B "
        f"({res['rounds']} rounds per N); {load}. Step time is the module's rollout + update "
        "(`step_time_s`), so generation, which LoRA does not shrink, is in both. `benchmarks/lora.py`."
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        print(render(section("--quick" in sys.argv)))
