"""The measured sections of ``benchmarks/run.py`` that live in it: our MAGRPO against CoMLRL
(``vs_comlrl``), TRL (``vs_trl``) and the floor, ``memory``, ``scaling`` and ``smollm2``; the other
sections are their own files (``credit.py``, ``main_job.py``, ``learning_runs.py``, ``sharded.py``,
``cooperation_report.py``). Each returns the section's numbers as a dict for ``results.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch
from bench_lib import SMOLLM2, Setup, datamodule, first_last, fit_ours, med, paired, tokenizer_for
from bench_paths import BENCH

from comlrl_lightning.core.generation import has_chat_template, render_prompt

HERE = os.path.dirname(os.path.abspath(__file__))
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
    "interrupt_memory",
    "generation",
    "engine_fit",
)
"""Every section ``run.py --only`` knows, in the order RESULTS.md lists them."""


def _per100(step_s: float, setup: Setup) -> float:
    return step_s / setup.samples_per_step * 100


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
        "reward_first20_last20": {"comlrl": [c_first, c_last], "ours": [o_first, o_last]},
        **_against_floor(h, "comlrl", cm),
    }


def _against_floor(h: Any, name: str, peer: Any) -> dict[str, Any]:
    """The keys every peer comparison shares: our loop and module step over the floor peer's (paired
    ratios), mean completion characters (the peer ``name``'s and ours) and the raw step times."""
    return {
        "ours_over_floor": paired(h.loop_s, h.peer_s["floor"]),
        "ours_module_over_floor": paired(h.module_s, h.peer_s["floor"]),
        "mean_chars": {
            name: sum(peer.chars) / max(len(peer.chars), 1),
            "ours": sum(h.chars) / max(len(h.chars), 1),
        },
        "raw": {
            name: h.peer_s[name],
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
        **_against_floor(h, "trl", trl),
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
    plot({n: [c] for n, c in res["reward_curves"].items()}, s.samples_per_step, os.path.join(BENCH, COMLRL_PNG),
         f"vs CoMLRL: {_desc(res['setup'])}, one seed", None)  # fmt: skip
