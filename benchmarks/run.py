"""Side-by-side benchmarks of comlrl-lightning's MAGRPO against CoMLRL, TRL and a floor. ``make bench`` runs this file.

    python benchmarks/run.py                   # full run (~5-10 min on 2 CPU cores), writes RESULTS.md
    python benchmarks/run.py --quick           # fast sanity pass (prints, writes nothing unless --write)
    python benchmarks/run.py --only vs_comlrl,vs_trl

Sections (``--only`` names): ``vs_comlrl`` (CoMLRL MAGRPOTrainer + the floor, N=2), ``vs_trl`` (TRL
GRPOTrainer + the floor, N=1), ``memory`` (peak RSS and parameter bytes, separate vs shared weights,
in child processes), ``scaling`` (N = 1, 2, 4 and K = 2, 4, 8, with the floor), ``smollm2`` (one
SmolLM2-135M row with the floor), ``credit`` (credit-assignment modes on a three-agent task, several
seeds; ``benchmarks/credit.py``), ``main_job`` (the main job's training batches without and with
``stop_after_code_block``, back to back; ``benchmarks/main_job.py``, ~10 min), ``learning`` (held-out
success of two SmolLM2 agents before and after MAGRPO/IAC/MAAC, several seeds; ``benchmarks/learning.py``,
``make learn``; resumes from ``benchmarks/learning_runs.jsonl``), ``sharded`` (``strategy: fsdp2`` on 2 gloo ranks
against 1 process: per-rank bytes, step time, the two rollout options; ``benchmarks/sharded.py``), ``lora`` (N=2, 4
SmolLM2 agents as LoRA adapters on one base against full fine-tuning: trained bytes, peak RSS, step time;
``benchmarks/lora.py``), ``lora_learning`` (held-out success of LoRA adapters against the recorded
full fine-tuning runs of the coordination task; ``benchmarks/lora_learning.py``). ``--only X --write`` replaces section X in ``results.json`` and
regenerates RESULTS.md from every recorded section. Within a section every system trains on the same batch in turn
(A B A B ...), from the same initial weights, in this one process; numbers are medians after two
warm-up steps, ratios come from the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from bench_lib import (  # noqa: E402
    SMOLLM2,
    Setup,
    datamodule,
    first_last,
    fit_ours,
    med,
    paired,
    ran_lines,
    recorded_machine,
    recorded_sections,
    tokenizer_for,
)  # fmt: skip

from comlrl_lightning.core.generation import has_chat_template, render_prompt  # noqa: E402

SECTIONS = (
    "vs_comlrl",
    "vs_trl",
    "memory",
    "scaling",
    "smollm2",
    "credit",
    "main_job",
    "learning",
    "sharded",
    "cooperation",
    "lora",
    "lora_learning",
)


def _r(x: float, nd: int = 3) -> str:
    return "n/a" if x != x else f"{x:.{nd}f}"


def _per100(step_s: float, setup: Setup) -> float:
    return step_s / setup.samples_per_step * 100


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _setup(defaults: dict[str, Any], base: dict[str, Any] | None) -> Setup:
    """``Setup(defaults)`` with ``base``'s overrides (``batches`` is not a Setup field)."""
    over = {k: v for k, v in (base or {}).items() if k != "batches"}
    return Setup(**{**defaults, **over})


def _batches(quick: bool, base: dict[str, Any] | None, quick_n: int, full_n: int) -> int:
    return quick_n if quick else int((base or {}).get("batches", full_n))


def _desc(s: dict[str, Any]) -> str:
    model = "tiny GPT-2" if s["model"].endswith("tiny-gpt2") else s["model"].split(":")[-1]
    dev = "" if s["device"] == "cpu" and s["dtype"] == "float32" else f", {s['device']} {s['dtype']}"
    return f"N={s['num_agents']}, K={s['k']}, B={s['batch_size']}, {s['max_new_tokens']} tok, {model}{dev}"


# --------------------------------------------------------------------------- sections
def vs_comlrl(quick: bool, base: dict[str, Any] | None = None) -> dict[str, Any]:
    from peers import ComlrlPeer, FloorPeer

    s = _setup(dict(num_agents=2, k=4, batch_size=4, max_new_tokens=32, lr=1e-3), base)
    tok = tokenizer_for(s)
    batches = _batches(quick, base, 8, 75)
    torch.manual_seed(s.seed)
    cm, fl = ComlrlPeer(s, tok), FloorPeer(s, tok)
    h = fit_ours(s, batches, [cm, fl])
    P = h.peer_s
    ours, ours_mod, c, f = med(h.loop_s), med(h.module_s), med(h.peer_s["comlrl"]), med(h.peer_s["floor"])
    o_first, o_last = first_last(h.rewards)
    c_first, c_last = first_last(cm.rewards)
    per_batch = s.batch_size * s.k  # joint actions per batch, both systems
    curves = {name: [sum(r[i : i + per_batch]) / per_batch for i in range(0, len(r) - per_batch + 1, per_batch)]
              for name, r in (("CoMLRL MAGRPOTrainer", cm.rewards), ("ours (MAGRPO)", h.rewards))}  # fmt: skip
    return {
        "reward_curves": curves,
        "setup": s.__dict__,
        "batches": batches,
        "samples": batches * s.samples_per_step,
        "comlrl_s_per100": _per100(c, s),
        "ours_s_per100": _per100(ours, s),
        "ours_module_s_per100": _per100(ours_mod, s),
        "floor_s_per100": _per100(f, s),
        "speedup_vs_comlrl": paired(P["comlrl"], h.loop_s),
        "speedup_vs_comlrl_module": paired(P["comlrl"], h.module_s),
        "ours_over_floor": paired(h.loop_s, P["floor"]),
        "ours_module_over_floor": paired(h.module_s, P["floor"]),
        "reward_first20_last20": {"comlrl": [c_first, c_last], "ours": [o_first, o_last]},
        "mean_chars": {
            "comlrl": sum(cm.chars) / max(len(cm.chars), 1),
            "ours": sum(h.chars) / max(len(h.chars), 1),
        },
        "raw": {
            "comlrl": h.peer_s["comlrl"],
            "floor": h.peer_s["floor"],
            "ours_loop": h.loop_s,
            "ours_module": h.module_s,
        },
    }


def vs_trl(quick: bool, base: dict[str, Any] | None = None) -> dict[str, Any]:
    from peers import FloorPeer, TrlPeer

    s = _setup(
        dict(num_agents=1, k=4, batch_size=4, max_new_tokens=32, lr=1e-3, loss_aggregation="token_mean"), base
    )
    tok = tokenizer_for(s)
    batches = _batches(quick, base, 8, 60)
    dm = datamodule(s, batches)
    dm.setup("fit")
    chat = has_chat_template(
        tok
    )  # TRL gets the prompt text our module renders (chat template when there is one)
    prompts = [render_prompt(tok, [dm.env.formatters[0](row)], [], chat) for row in dm.train_rows]
    torch.manual_seed(s.seed)
    trl, fl = TrlPeer(s, tok, prompts, batches), FloorPeer(s, tok)
    h = fit_ours(s, batches, [trl, fl])
    P = h.peer_s
    ours, ours_mod, t, f = med(h.loop_s), med(h.module_s), med(h.peer_s["trl"]), med(h.peer_s["floor"])
    return {
        "setup": s.__dict__,
        "batches": batches,
        "trl_step_s": t,
        "ours_step_s": ours,
        "ours_module_step_s": ours_mod,
        "floor_step_s": f,
        "ours_over_trl": paired(h.loop_s, P["trl"]),
        "ours_module_over_trl": paired(h.module_s, P["trl"]),
        "ours_over_floor": paired(h.loop_s, P["floor"]),
        "ours_module_over_floor": paired(h.module_s, P["floor"]),
        "mean_chars": {
            "trl": sum(trl.chars) / max(len(trl.chars), 1),
            "ours": sum(h.chars) / max(len(h.chars), 1),
        },
        "raw": {
            "trl": h.peer_s["trl"],
            "floor": h.peer_s["floor"],
            "ours_loop": h.loop_s,
            "ours_module": h.module_s,
        },
    }


def memory(quick: bool, base: dict[str, Any] | None = None) -> dict[str, Any]:
    models = [("tiny-gpt2", "builtin:tiny-gpt2")] + ([] if quick else [("smollm2-135m", SMOLLM2)])
    out: dict[str, Any] = {}
    for label, model in models:
        for name, n, share in (("1 agent", 1, False), ("2 separate", 2, False), ("2 shared", 2, True)):
            spec = json.dumps({"model": model, "num_agents": n, "share_weights": share})
            proc = subprocess.run([sys.executable, os.path.join(HERE, "memory_child.py"), spec],
                                  capture_output=True, text=True, timeout=600)  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {label}/{name} failed:\n{proc.stderr[-3000:]}")
            out[f"{label}/{name}"] = json.loads(proc.stdout.strip().splitlines()[-1])
        one, shared = out[f"{label}/1 agent"], out[f"{label}/2 shared"]
        out[f"{label}/shared_param_ratio"] = shared["param_bytes"] / one["param_bytes"]
        out[f"{label}/separate_param_ratio"] = out[f"{label}/2 separate"]["param_bytes"] / one["param_bytes"]
    return out


def scaling(quick: bool, base: dict[str, Any] | None = None) -> dict[str, Any]:
    from peers import FloorPeer

    configs = [(1, 4), (2, 4), (4, 4), (2, 2), (2, 8)]
    batches, rounds = (5, 1) if quick else (12, 2)
    base = {k: v for k, v in (base or {}).items() if k != "batches"}
    times: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):  # configs alternate: A B C D E A B C D E
        for n, k in configs:
            s = _setup(
                {**dict(batch_size=4, max_new_tokens=32, lr=1e-3), **(base or {}), "num_agents": n, "k": k},
                None,
            )
            torch.manual_seed(s.seed)
            h = fit_ours(s, batches, [FloorPeer(s, tokenizer_for(s))])
            rec = times.setdefault(f"N={n},K={k}", {"loop": [], "module": [], "floor": [], "ratio": []})
            rec["loop"] += h.loop_s[2:]
            rec["module"] += h.module_s[2:]
            rec["floor"] += h.peer_s["floor"][2:]
            rec["ratio"] += [a / b for a, b in zip(h.loop_s[2:], h.peer_s["floor"][2:])]
    res: dict[str, Any] = {"batches_per_round": batches, "rounds": rounds, "configs": {}}
    for key, rec in times.items():
        n, k = (int(p.split("=")[1]) for p in key.split(","))
        ours, ours_mod, f = med(rec["loop"], 0), med(rec["module"], 0), med(rec["floor"], 0)
        res["configs"][key] = {"num_agents": n, "k": k, "samples_per_step": 4 * n * k, "ours_step_s": ours,
                               "ours_module_step_s": ours_mod, "floor_step_s": f, "ours_over_floor": med(rec["ratio"], 0)}  # fmt: skip
    c = res["configs"]
    res["N4_over_N1"] = c["N=4,K=4"]["ours_step_s"] / c["N=1,K=4"]["ours_step_s"]
    res["K8_over_K2"] = c["N=2,K=8"]["ours_step_s"] / c["N=2,K=2"]["ours_step_s"]
    res["floor_N4_over_N1"] = c["N=4,K=4"]["floor_step_s"] / c["N=1,K=4"]["floor_step_s"]
    res["floor_K8_over_K2"] = c["N=2,K=8"]["floor_step_s"] / c["N=2,K=2"]["floor_step_s"]
    return res


def smollm2(quick: bool, base: dict[str, Any] | None = None) -> dict[str, Any]:
    from peers import FloorPeer

    s = _setup(
        dict(num_agents=1, k=2, batch_size=1, max_new_tokens=8 if quick else 32, lr=1e-6, model=SMOLLM2), base
    )
    tok = tokenizer_for(s)
    batches = _batches(quick, base, 4, 8)
    torch.manual_seed(s.seed)
    fl = FloorPeer(s, tok)
    h = fit_ours(s, batches, [fl])
    P = h.peer_s
    ours, ours_mod, f = med(h.loop_s), med(h.module_s), med(h.peer_s["floor"])
    return {
        "setup": s.__dict__,
        "batches": batches,
        "ours_step_s": ours,
        "ours_module_step_s": ours_mod,
        "ours_rollout_s": med(h.rollout_s),
        "floor_step_s": f,
        "floor_generate_s": med(fl.generate_s),
        "ours_over_floor": paired(h.loop_s, P["floor"]),
        "ours_module_over_floor": paired(h.module_s, P["floor"]),
        "raw": {
            "floor": h.peer_s["floor"],
            "ours_loop": h.loop_s,
            "ours_module": h.module_s,
            "ours_rollout": h.rollout_s,
        },
    }


COMLRL_PNG, CREDIT_PNG, LEARNING_PNG = "vs_comlrl_reward.png", "credit_reward.png", "learning_curves.png"
COOPERATION_PNG = "cooperation.png"


def _plot_vs_comlrl(res: dict[str, Any]) -> None:
    from credit import plot

    s = _setup({}, res["setup"])
    plot({n: [c] for n, c in res["reward_curves"].items()}, s.samples_per_step, os.path.join(HERE, COMLRL_PNG),
         f"vs CoMLRL: {_desc(res['setup'])}, one seed", None)  # fmt: skip


PLOTS = {"vs_comlrl": _plot_vs_comlrl,
         "credit": lambda res: __import__("credit").plot_section(res, os.path.join(HERE, CREDIT_PNG)),
         "learning": lambda res: __import__("learning").plot_section(res, os.path.join(HERE, LEARNING_PNG)),
         "cooperation": lambda res: __import__("cooperation_report").plot(res, os.path.join(HERE, COOPERATION_PNG))}  # fmt: skip
"""Drawn after the sections' numbers are written (a plot that fails loses no number)."""

RUNNERS = {"vs_comlrl": vs_comlrl, "vs_trl": vs_trl, "memory": memory, "scaling": scaling, "smollm2": smollm2,
           "credit": lambda quick, base=None: __import__("credit").section(quick),
           "main_job": lambda quick, base=None: __import__("main_job").section(quick),
           "learning": lambda quick, base=None: __import__("learning").section(quick),
           "sharded": lambda quick, base=None: __import__("sharded").section(quick),
           "cooperation": lambda quick, base=None: __import__("cooperation_report").section(quick),
           "lora": lambda quick, base=None: __import__("lora").section(quick),
           "lora_learning": lambda quick, base=None: __import__("lora_learning").section(quick)}  # fmt: skip


# --------------------------------------------------------------------------- report
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


def render(res: dict[str, Any]) -> str:
    header = ("Comparison", "Setting", "Peer", "Ours (Lightning fit)", "Ours (in-module step)",
              "Ratio: Lightning / in-module", "Target", "Met")  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def row(*cells: Any) -> None:
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")

    if "vs_comlrl" in res:
        r = res["vs_comlrl"]
        row(f"vs CoMLRL {res['machine']['versions']['comlrl']} MAGRPOTrainer", f"{_desc(r['setup'])}; s / 100 samples",
            _r(r["comlrl_s_per100"]), _r(r["ours_s_per100"]), _r(r["ours_module_s_per100"]),
            f"CoMLRL ÷ ours: {r['speedup_vs_comlrl']:.2f}x / {r['speedup_vs_comlrl_module']:.2f}x", ">= 2.0x faster",
            _ok(r["speedup_vs_comlrl"] >= 2.0))  # fmt: skip
        rw = r["reward_first20_last20"]
        row("reward after the same samples", f"{r['samples']} samples; mean reward first 20% -> last 20%",
            f"{rw['comlrl'][0]:.3f} -> {rw['comlrl'][1]:.3f}", f"{rw['ours'][0]:.3f} -> {rw['ours'][1]:.3f}", "", "", "", "")  # fmt: skip
        row("vs floor (N=2)", "same batch, on our agents; s / 100 samples", _r(r["floor_s_per100"]),
            _r(r["ours_s_per100"]), _r(r["ours_module_s_per100"]),
            f"ours ÷ floor: {r['ours_over_floor']:.3f} / {r['ours_module_over_floor']:.3f}", "<= 1.15",
            _ok(r["ours_over_floor"] <= 1.15))  # fmt: skip
    if "vs_trl" in res:
        r = res["vs_trl"]
        row(f"vs TRL {res['machine']['versions']['trl']} GRPOTrainer", f"{_desc(r['setup'])}; s / step",
            _r(r["trl_step_s"], 4), _r(r["ours_step_s"], 4), _r(r["ours_module_step_s"], 4),
            f"ours ÷ TRL: {r['ours_over_trl']:.3f} / {r['ours_module_over_trl']:.3f}", "<= 1.10", _ok(r["ours_over_trl"] <= 1.10))  # fmt: skip
        row("vs floor (N=1)", "same batch, on our agents; s / step", _r(r["floor_step_s"], 4), _r(r["ours_step_s"], 4),
            _r(r["ours_module_step_s"], 4), f"ours ÷ floor: {r['ours_over_floor']:.3f} / {r['ours_module_over_floor']:.3f}", "<= 1.15",
            _ok(r["ours_over_floor"] <= 1.15))  # fmt: skip
    if "smollm2" in res:
        r = res["smollm2"]
        row("SmolLM2-135M vs floor", f"{_desc(r['setup'])}; s / step",
            _r(r["floor_step_s"], 2), _r(r["ours_step_s"], 2), _r(r["ours_module_step_s"], 2),
            f"ours ÷ floor: {r['ours_over_floor']:.3f} / {r['ours_module_over_floor']:.3f}", "<= 1.15", _ok(r["ours_over_floor"] <= 1.15))  # fmt: skip
    if "scaling" in res:
        r = res["scaling"]
        for key, c in r["configs"].items():
            row("scaling", f"{key}, B=4, 32 tok; s / step", _r(c["floor_step_s"], 4), _r(c["ours_step_s"], 4),
                _r(c["ours_module_step_s"], 4), f"ours ÷ floor: {c['ours_over_floor']:.3f} (Lightning)", "", "")  # fmt: skip
        row("scaling in N", "step(N=4) / step(N=1), K=4", f"floor {r['floor_N4_over_N1']:.2f}", f"{r['N4_over_N1']:.2f}", "", "",
            "<= 4 (linear)", _ok(r["N4_over_N1"] <= 4.0))  # fmt: skip
        row("scaling in K", "step(K=8) / step(K=2), N=2", f"floor {r['floor_K8_over_K2']:.2f}", f"{r['K8_over_K2']:.2f}", "", "",
            "<= 4 (linear)", _ok(r["K8_over_K2"] <= 4.0))  # fmt: skip
    if "memory" in res:
        m = res["memory"]
        for label in ("tiny-gpt2", "smollm2-135m"):
            if f"{label}/1 agent" not in m:
                continue
            cells = [f"{name}: {m[f'{label}/{name}']['peak_rss_mb']:.0f} MB peak RSS "
                     f"(+{m[f'{label}/{name}']['peak_rss_mb'] - m[f'{label}/{name}']['base_rss_mb']:.0f} over imports), "
                     f"params {m[f'{label}/{name}']['param_bytes'] / 2**20:.2f} MiB, "
                     f"AdamW state {m[f'{label}/{name}']['optimizer_state_bytes'] / 2**20:.2f} MiB"
                     for name in ("1 agent", "2 separate", "2 shared")]  # fmt: skip
            rss = {
                n: m[f"{label}/{n}"]["peak_rss_mb"] - m[f"{label}/{n}"]["base_rss_mb"]
                for n in ("1 agent", "2 shared")
            }
            rss_ratio = (
                f"; RSS over imports 2 shared / 1 = {rss['2 shared'] / rss['1 agent']:.2f}"
                if rss["1 agent"] > 50
                else ""
            )
            row(f"memory, {label}", "<br>".join(cells), "", "", "",
                f"params 2 shared / 1 = {m[f'{label}/shared_param_ratio']:.2f} (separate {m[f'{label}/separate_param_ratio']:.2f}){rss_ratio}",
                "<= 1.1", _ok(m[f"{label}/shared_param_ratio"] <= 1.1))  # fmt: skip
    return "\n".join(lines)


NOTES = """\
## What each row measures

- **Ours (Lightning fit)**: our `MAGRPO` trained by `pl.Trainer.fit` (logger, checkpointing and progress bar
  off): wall time of one batch through Lightning's loop — `training_step` (rollout + every agent's update),
  the hooks, `self.log`, fetching the next batch. The peers' time is excluded (they run at
  `on_train_batch_start`, before the clock starts). **Ours (in-module)**: the `step_time_s` that
  `training_step` returns (rollout + update, no Lightning loop).
- **vs CoMLRL**: `comlrl==1.4.3` `MAGRPOTrainer` given the same model objects (own copy of the same initial
  weights) via `agents=[...]`, `tokenizer=`; per batch of ours it runs `train()` for one epoch over the same
  B=4 episodes with `rollout_buffer_size = train_batch_size = 4`, so both do B rollouts (each agent samples
  K=4 per episode) and one AdamW step per agent per 4 episodes. `num_turns=1`, aligned joint actions,
  `early_termination_threshold=None`, `eval_interval=0`, wandb off, lr 1e-3, temperature 1, top_p 1, top_k 0
  (off), 32 new tokens. Samples = episodes × K × agents. Both train on their own for the whole run; the
  reward row is the mean shared reward of the first and last 20% of joint actions. Differences we do not
  remove: CoMLRL's tokenizer call appends the ByT5 EOS to each prompt; its loss drops each completion's last
  token and counts padding; ours clips gradients at norm 1.0 (its default), CoMLRL does not.
- **vs TRL**: `GRPOTrainer` (N=1; `beta=0`, `num_iterations=1`, `loss_type="dapo"` vs our `token_mean`,
  same K, 32 tokens, sampling, lr, AdamW weight decay 0.01, grad-norm clip 1.0, `use_cpu`, no vLLM, bf16/fp16
  off, `report_to="none"`, `logging_steps=1`, B·K=16 completions per step). Its own `train()` loop runs in a
  greenlet on the main thread and is paused after every step, so TRL and ours alternate step by step. Its time
  is one full iteration of its loop. Before each TRL step our current weights are copied into its model
  (untimed), so both sample from the same policy (equal completion lengths).
- **Floor**: the bare work of a step, per agent: tokenize the prompts, one HF `generate` over episodes × K
  (same sampling), one forward with `logits_to_keep` + gather/logsumexp over the completions, backward,
  `AdamW.step()`; no reward, no decode, no clipping, no logging. It runs on our agents' own model objects on
  the same batch (so it generates from the same weights, equally long), with its own AdamW at `lr=0` (all of
  AdamW's arithmetic, weights unchanged, so our run is not disturbed).
- **Scaling**: our step time (and the floor's) for N = 1, 2, 4 agents at K=4 and K = 2, 4, 8 at N=2; each
  configuration is a separate short fit, the configurations alternate over two rounds; N>2 uses a chain
  length-ratio reward. Linear means step(N=4)/step(N=1) <= 4 and step(K=8)/step(K=2) <= 4.
- **SmolLM2**: `builtin:smollm2-135m-instruct` (134.5M parameters, fp32, chat template), N=1, K=2, one
  episode per step, 32 new tokens, against the floor.
- **Memory**: each configuration in a fresh child process (`benchmarks/memory_child.py`): build the module,
  train 2 batches (K=2, 8 tokens) so gradients and AdamW state exist; peak RSS is `ru_maxrss` of that child,
  "over imports" subtracts its peak after importing torch/transformers/lightning. Parameter bytes count
  distinct storages (shared weights once). `AgentSpec(share_weights_with=0)` shares weights; each agent still
  has its own optimizer, so AdamW state is per agent.
- Where the gap to the floor comes from (profiled separately, tiny GPT-2, N=1, ~43 ms per step): the
  `generate` wrapper (tokenize, mask, decode texts for the reward: ~1.5 ms), reward/tree/advantages (~0.6 ms),
  the grad-norm for logging plus clipping (~0.6 ms), `self.log` calls (~1.5 ms) and Lightning's loop (~0.7 ms):
  a fixed cost per step, which is why the tiny-model ratio is the worst case; at SmolLM2 size it is ~1%.
- Times are medians after each system's first two steps (warm-up). Ratios are the median over steps of the
  per-step ratio: the systems ran back to back on the same batch, so the load of the (shared, 2-core)
  machine mostly cancels in each ratio. "Ratio" shows the Lightning-loop ratio / the in-module ratio; the
  target is judged on the Lightning-loop ratio (how users run it).
"""

GPU_RESULTS = os.path.join(HERE, "gpu_results.md")
PARTIAL = os.path.join(HERE, "results.partial.json")
"""Every finished section of the current run, rewritten after each (not tracked)."""
GPU_PENDING = """\
`make gpu-check` (`benchmarks/gpu_check.py`: the GPU-marked tests, the main job in bf16, `gpu_bench.py`'s
CoMLRL/TRL/floor comparison and generation throughput per `generation_backend`) has not run on a GPU yet:
no session has had one. Its `gpu_results.md`, copied to `benchmarks/`, is included here when present.
"""


def gpu_section() -> str:
    """The GPU section: ``benchmarks/gpu_results.md`` (written by ``make gpu-check`` on a GPU) if present."""
    if not os.path.exists(GPU_RESULTS):
        return f"## GPU\n\n{GPU_PENDING}"
    with open(GPU_RESULTS) as fh:
        return f"## GPU\n\n{fh.read().strip()}\n"


def write_results(path: str, res: dict[str, Any], table: str) -> None:
    import credit

    mc = res["machine"]
    vers = ", ".join(f"{k} {v}" for k, v in mc["versions"].items())
    extra_sections = ""
    if "credit" in res:
        extra_sections = f"""## Credit assignment

{credit.render(res["credit"])}

![reward vs samples per credit mode]({CREDIT_PNG})

{credit.NOTES}
"""
    if "main_job" in res:
        extra_sections += f"\n## The HumanEval co-writing job: stopping at the code block\n\n{__import__('main_job').render(res['main_job'])}\n"
    if "learning" in res:
        extra_sections += f"\n## Learning you can see: held-out success of a pretrained team\n\n{__import__('learning').render(res['learning'])}\n"
    if "sharded" in res:
        extra_sections += f"\n## Sharded agents (fsdp2): memory, step time, rollout\n\n{__import__('sharded').render(res['sharded'])}\n"
    if "cooperation" in res:
        extra_sections += f"\n## Cooperation: a team that learns a convention, against agents trained apart\n\n{__import__('cooperation_report').render(res['cooperation'])}\n"
    if "lora" in res:
        extra_sections += f"\n## Per-agent LoRA against full fine-tuning: memory and step time\n\n{__import__('lora').render(res['lora'])}\n"
    if "lora_learning" in res:
        extra_sections += f"\n## Per-agent LoRA against full fine-tuning: learning\n\n{__import__('lora_learning').render(res['lora_learning'])}\n"
    comlrl_plot = (
        f"\nReward against samples in the CoMLRL run: ![vs CoMLRL]({COMLRL_PNG})\n"
        if "reward_curves" in res.get("vs_comlrl", {})
        else ""
    )
    text = f"""# Benchmarks

Generated by `python benchmarks/run.py` (what `make bench` runs; `--only X --write` re-runs one section).
Sections ran at (other jobs shared the cores):

{ran_lines(res, SECTIONS)}

Machine: {mc["cores"]} cores ({mc["cpu"]}), torch threads {mc["torch_threads"]}, no GPU; Python {mc["python"]};
{vers}.

{table}

Raw numbers: `benchmarks/results.json`.
{comlrl_plot}
{extra_sections}
{NOTES}
{gpu_section()}"""
    with open(path, "w") as fh:
        fh.write(text)


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
    if args.write or (not args.quick and not args.only):
        write_results(args.results, res, table)
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        print(f"[bench] wrote {args.results}")
    failed = []
    for name in [n for n in only if n in PLOTS]:
        try:
            PLOTS[name](res[name])
        except Exception as err:  # noqa: BLE001 - the numbers are written; say which plot failed
            failed.append(name)
            print(f"[bench] {name}: the plot failed ({type(err).__name__}: {err}); its numbers are in {PARTIAL}",
                  file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
