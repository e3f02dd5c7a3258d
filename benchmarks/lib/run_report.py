"""RESULTS.md from ``results.json``: the speed table (:func:`render`), the notes under it, the GPU
section and the whole file (:func:`write_results`, which asks each section's own module for its text).
"""

from __future__ import annotations

import os
from typing import Any

from bench_lib import ran_lines
from bench_paths import BENCH
from run_sections import COMLRL_PNG, CREDIT_PNG, SECTIONS, _desc


def _r(x: float, nd: int = 3) -> str:
    return "n/a" if x != x else f"{x:.{nd}f}"


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"


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
- **Memory**: each configuration in a fresh child process (`benchmarks/speed/memory_child.py`): build the module,
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

GPU_RESULTS = os.path.join(BENCH, "gpu_results.md")
GPU_PENDING = """\
`make gpu-check` (`benchmarks/gpu/gpu_check.py`: the GPU-marked tests, the main job in bf16, `gpu_bench.py`'s
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
        extra_sections += f"\n## Learning you can see: held-out success of a pretrained team\n\n{__import__('learning_report').render(res['learning'])}\n"
    if "sharded" in res:
        extra_sections += f"\n## Sharded agents (fsdp2): memory, step time, rollout\n\n{__import__('sharded').render(res['sharded'])}\n"
    if "cooperation" in res:
        extra_sections += f"\n## Cooperation: a team that learns a convention, against agents trained apart\n\n{__import__('cooperation_report').render(res['cooperation'])}\n"
    if "lora" in res:
        extra_sections += f"\n## Per-agent LoRA against full fine-tuning: memory and step time\n\n{__import__('lora').render(res['lora'])}\n"
    if "lora_learning" in res:
        extra_sections += f"\n## Per-agent LoRA against full fine-tuning: learning\n\n{__import__('lora_learning').render(res['lora_learning'])}\n"
    if "interrupt_memory" in res:
        extra_sections += f"\n## Interruption safety: memory with and without InterruptCheckpoint\n\n{__import__('interrupt_memory').render(res['interrupt_memory'])}\n"
    if "generation" in res:
        extra_sections += f"\n## Generation: a colocated vLLM engine against HF generate\n\n{__import__('generation').render(res['generation'])}\n"
        if "engine_fit" in res:
            extra_sections += f"\n{__import__('engine_fit').render(res['engine_fit'])}\n"
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
