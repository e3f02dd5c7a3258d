"""The learning benchmark's recorded settings: the shared :data:`CONFIG`, each row's own settings
(MARLHF, one-shot and iterative MADPO, CoMLRL's MADPOTrainer), the sample budgets they spend and the
task :data:`TASK` the rule chose. Fixed before the held-out numbers they produce were seen.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from learning_tasks import HERE, MAX_NEW_TOKENS, TASKS, datamodule

RUNS_FILE = os.path.join(HERE, "learning_runs.jsonl")
"""One JSON line per finished run (written as each run ends, so a failure keeps the finished ones)."""
PNG = "learning_curves.png"
CONFIG: dict[str, Any] = {  # the same task, samples and sampling for every algorithm
    "batch_size": 2,  # episodes per batch
    "k": 4,  # num_generations: samples per agent per episode
    "batches": 12,
    "eval_every": 4,  # batches between held-out evaluations (plus one before training)
    "learning_rate": 1e-5,
    "critic_learning_rate": 1e-4,  # IAC/MAAC critics (value heads start from scratch)
    "temperature": 0.7,
}
ALGORITHMS = (
    "magrpo",
    "iac",
    "maac",
    "coordinator",
    "centralized_magrpo",
    "madpo",
    "marlhf",
    "madpo_one_shot",
    "madpo_iter",
    "comlrl_madpo",
)
MARLHF_CONFIG: dict[str, Any] = {  # design 2, fixed by the lead before any held-out number of it was seen
    "pair_candidates": 4,  # K joint responses per one_shot_problems problem: 24 x 4 x 2 agents = 192 labels
    "pairs_per_prompt": 16,  # reward_gap pairs kept per problem at most (PreferenceConfig's default: all non-tied)
    "reward_epochs": 2,  # Bradley-Terry passes over the training pairs
    "reward_learning_rate": 1e-5,
    "reward_val_fraction": 0.2,  # floor(0.2 x pairs) held out: the reward model's held-out pair accuracy / loss
    "beta": 0.04,  # k3 KL to the initial policy in phase 2 (TRL/DeepSeekMath GRPO's classic value)
    "rl_batches": 12,  # phase 2: CONFIG["batches"] MAGRPO batches, 192 completions the task reward never trains on
}
"""The ``marlhf`` row (MARLHF -> MAGRPO), design 2, fixed by the lead *before* any held-out number of it
was seen. The stated budget is the completions the task reward scores (labels): 192, MAGRPO's. Phase 1
spends all of it: the :func:`one_shot_problems` (the 24 training problems the seed's online rows train
on, as the ``madpo_one_shot`` row) x K=4 candidates x 2 agents, ``reward_gap`` pairs, ``floor(0.2 P)`` of
them held out to measure the reward model (its held-out pair accuracy and loss are recorded). Phase 2 is
MAGRPO for ``CONFIG["batches"]`` batches on the same 24 problems in the online rows' order, rewarded by
the learned model alone, with a k3 KL penalty (``beta``) to the initial policy: 192 more completions,
384 sampled in all; the task reward scores them only for the ``marlhf/task_reward`` diagnostic, which
no update sees. The previous design (8 problems' ~20 pairs, all trained on, no KL, 8 RL batches) is
recorded as ``marlhf_v1``.

Pilot (seed 100, not a recorded seed; ``learning.py pilot_marlhf``, :data:`PILOT_FILE`), reading only the
reward model's held-out-pair accuracy and phase 2's gold training reward, never the held-out problems.
Its pre-declared fallback, the only one (:func:`pilot_beta`): if the gold training reward falls over
phase 2 (the last 4 batches' mean below the first 4's), ``beta`` = 0.1 instead of 0.04. Which was used
and why: see :data:`PILOT_OUTCOME`."""
PILOT_SEED = 100
PILOT_FILE = os.path.join(HERE, "learning_marlhf_pilot.json")
"""What the MARLHF pilot measured (no held-out number), read by the section."""
PILOT_OUTCOME = "the gold training reward rose, so the fallback was not taken and beta stayed 0.04"
"""The pilot's outcome and the beta it chose, written once the pilot ran (2026-12-01, 1087 s at load
2.8-3.0, one torch thread) and before any recorded seed: 71 pairs (14 held out), the reward model's
held-out pair accuracy 100% (loss 0.126); phase 2's gold training reward per batch 0.25, 0.25, 0.375,
0.4375 ... 0.625, 0.8125, 0.625, 0.6875 (first 4 batches' mean 0.328, last 4's 0.688): it rose, so
``beta`` stayed 0.04 for seeds 0, 1, 2. No held-out problem was evaluated in the pilot."""


def pilot_beta(gold: Sequence[float], beta: float = 0.04, fallback: float = 0.1) -> float:
    """The pre-declared fallback: ``fallback`` if the gold (task) training reward of phase 2's batches
    (``gold``: one mean per batch, in order) fell, the last 4 batches' mean below the first 4's; else
    ``beta``.

    Raises:
        ValueError: fewer than 8 batches (the two windows would overlap).
    """
    if len(gold) < 8:
        raise ValueError(f"pilot_beta: got {len(gold)} batches, need >= 8 (first 4 and last 4)")
    first, last = sum(gold[:4]) / 4, sum(gold[-4:]) / 4
    return fallback if last < first else beta


ONE_SHOT_CONFIG: dict[str, Any] = {  # MADPO one_shot (CoMLRL's mode) within MAGRPO's budget
    # pair set: batches x batch_size = 24 training problems rolled out once by the untrained team, K = 4
    # candidates each (preference_num_candidates), 24 x 4 x 2 agents = 192 completions: MAGRPO's budget
    "num_train_epochs": 2,  # passes over the pair set (CoMLRL's default 20: ~10x the CPU time of 2)
    "train_batch_size": 2,  # pairs per update (CoMLRL's default, rollout_buffer_size = 2)
}
"""The ``madpo_one_shot`` row: every pair built once, at the first step, from the untrained team over
the :func:`one_shot_problems` (the problems the online row's seed trains on, every sample spent up front),
then ``num_train_epochs`` shuffled passes, one update per ``train_batch_size`` pairs. The epoch count was
fixed before any one-shot run from a CPU-time estimate (the online row: ~400 s a seed for 12 batches of
generation and updates on up to 32 pairs; one pass here was estimated at ~70 pairs, measured 74-80),
not from held-out results."""


ONE_SHOT_EVAL = 10**6
"""``val_check_interval`` of the one-shot row: never reached, so held-out evaluations are before training
and when the module stops after its last pass (Lightning validates on ``should_stop``); an intermediate
point would sit at the same x (192: every sample is spent up front), so there is none."""


COMLRL_MADPO_CONFIG: dict[str, Any] = {  # CoMLRL 1.4.3's MADPOTrainer, fixed before any held-out number of it
    "num_train_epochs": ONE_SHOT_CONFIG["num_train_epochs"],  # passes over the pairs: the one-shot row's
    "train_batch_size": ONE_SHOT_CONFIG["train_batch_size"],  # pairs per update: the one-shot row's
    "preference_pairs_per_sample": 16,  # reward_gap pairs kept per problem (ours and CoMLRL's default; K=4: <= 6)
    "pair_selection": "reward_gap",
    "dpo_beta": 0.1,  # ours and CoMLRL's default
    "top_p": 1.0,  # CoMLRL's default 0.6; ours samples the full distribution
    "top_k": 0,  # off (CoMLRL's default 50); ours has none
    "eval_interval": 0,  # CoMLRL's own evaluation off: held-out success is the harness's greedy evaluation
    "pad_token": "<|endoftext|>",  # CoMLRL's tokenizer pad (see the docstring); ours stays <|im_end|>
}
"""The ``comlrl_madpo`` row: CoMLRL 1.4.3's own ``MADPOTrainer`` (its class and ``train()``, nothing
transcribed) on what the ``madpo_one_shot`` row trains on, fixed before any held-out number of it was seen:
the seed's :func:`one_shot_problems` (24) as ``train_dataset`` (one problem per batch, CoMLRL's loader),
K = 4 candidates per agent, ``reward_gap`` pairs, 2 passes of one update per 2 pairs, AdamW at
``CONFIG["learning_rate"]`` (CoMLRL's ``agent_learning_rate``), ``dpo_beta`` 0.1, temperature 0.7, the
task's 8 new tokens; the two SmolLM2 agents are the model objects our module loads
(``builtin:smollm2-135m-instruct``, passed as ``agents=`` with their tokenizers), the reward is the task's
:class:`ExactMatchReward` (the fraction of agents right) as ``reward_func``, the formatters return the text
our team renders (the task's template in the tokenizer's chat template). Held-out success is our module's
greedy validation of those same model objects before and after ``train()``, so the x/y compare with the
one-shot row's (x = 192: every completion is sampled before the first update).

Differences from the one-shot row, all CoMLRL's own behaviour unless said:

- reference-free: the loss is ``-logsigmoid(beta (Δ_own + Δ_others detached))`` with ``Δ`` the policy's
  winner-minus-loser log-prob; no frozen reference copy (ours subtracts the reference's Δ).
- log-probs from the raw logits (ours divides by the sampling temperature) and without the completion's
  last token (CoMLRL scores ``prompt + completion[:-1]``, whose logits predict ``completion[:-1]`` only:
  the EOS, or the 8th token of a clipped answer, is not scored).
- ``top_p`` 1.0 and ``top_k`` 0 (off) are passed: CoMLRL's defaults are 0.6 and 50, ours none.
- the pad token: SmolLM2's is ``<|im_end|>``, its EOS, which the chat-templated prompt holds twice; CoMLRL
  takes the prompt to end at its first pad token (decentralized mode) and the completion to end at the
  first pad, so with that tokenizer every "completion" would be the prompt's tail and no gradient would
  reach the answer. CoMLRL gets a copy of the tokenizer whose pad is ``<|endoftext|>`` (a token no prompt
  holds) and ``generate`` pads with it (``train(pad_token_id=...)``, passed on to ``generate``); the
  models' ``config.pad_token_id`` (which CoMLRL sets) is put back before our evaluation.
- prompt tokens: CoMLRL tokenizes the rendered prompt with ``add_special_tokens=True``, ours without;
  SmolLM2's tokenizer adds nothing, so the ids are the same.
- one problem per rollout (CoMLRL's loader) and its own RNG use, so the pair set differs from ours in
  the draws, not in the problems; updates: each agent in turn, its own AdamW (``weight_decay`` 0.01, as
  ours), no gradient clipping (ours: ``max_grad_norm`` 1.0, ``DPOConfig``'s default, TRL's); a non-finite
  loss becomes a constant 0.1 (a step with no gradient; ours skips the step).
- cost: CoMLRL scores each pair's winner and loser one sequence at a time, twice per agent (once without
  gradient for the teammate's term, once with), where ours batches them: one update here took 13-52 s at
  load 3-6 with one torch thread (ours: ~8-13 s an update, its whole run included).
"""


def one_shot_samples(cfg: dict[str, Any] = CONFIG) -> int:
    """Completions (both agents) the one-shot pair set costs, every one sampled before the first update:
    :func:`one_shot_num_problems` x K x 2 agents (the whole budget of ``cfg``)."""
    return one_shot_num_problems(cfg) * cfg["k"] * 2


def one_shot_num_problems(cfg: dict[str, Any] = CONFIG) -> int:
    """Training problems of the one-shot pair set: the ``batches x batch_size`` an online run sees."""
    return cfg["batches"] * cfg["batch_size"]


def one_shot_problems(task: str, cfg: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The :func:`one_shot_num_problems` training problems of the one-shot pair set: the first ones the seed's
    training loader yields (the problems the online ``madpo`` row of that seed trains on), in that order."""
    dm = datamodule(task, cfg["batch_size"], seed)
    dm.setup("fit")
    out: list[dict[str, Any]] = []
    for batch in dm.train_dataloader():
        out += [dict(ep.data) for ep in batch]
        if len(out) >= one_shot_num_problems(cfg):
            return out[: one_shot_num_problems(cfg)]
    raise ValueError(f"one_shot_problems: the {task!r} training set has fewer than {len(out) + 1} problems")


def marlhf_pair_samples(cfg: dict[str, Any] = CONFIG) -> int:
    """Completions (both agents) phase 1 samples to build its pairs: every one scored by the task
    reward (MARLHF's labels), :func:`one_shot_num_problems` x K x 2 agents."""
    return one_shot_num_problems(cfg) * MARLHF_CONFIG["pair_candidates"] * 2


def marlhf_rl_batches(cfg: dict[str, Any] = CONFIG) -> int:
    """Phase 2's MAGRPO batches (``MARLHF_CONFIG["rl_batches"]``, MAGRPO's ``cfg["batches"]``)."""
    return min(MARLHF_CONFIG["rl_batches"], cfg["batches"])


ITERATIVE_ROUNDS = 3
"""``madpo_iter`` (CoMLRL's ``MADPOIterTrainer``): rounds. Each round walks :func:`iterative_walk`
batches (:func:`iterative_problems`: the seed's first ``walk x batch_size`` online problems, the same
ones every round, as CoMLRL walks its dataset every iteration) with :func:`iterative_candidates`
current and as many comparator (``current_copy``: a frozen copy taken at the round's start) joint
responses per problem. Budget in the recorded :data:`CONFIG`, comparator samples counted: 3 rounds x
8 problems x (2 current + 2 comparator) x 2 agents = 192 completions = :func:`one_shot_samples`
(:func:`iterative_samples`)."""
ITERATIVE_CONFIG: dict[str, Any] = {  # fixed before any madpo_iter run, not tuned on held-out results
    "num_rounds": ITERATIVE_ROUNDS,  # 3 rounds of 4 batches: a round per 64 completions
    "comparator_policy": "current_copy",  # the default comparison: the round's start policy
    "pair_selection": "comparator_reward",  # CoMLRL's iterative default: current i vs comparator i
    "preference_replay_mode": "current",  # CoMLRL's default: a round trains on its own pairs
    "num_train_epochs": ONE_SHOT_CONFIG["num_train_epochs"],  # passes per round's pairs = one-shot's
    "train_batch_size": ONE_SHOT_CONFIG["train_batch_size"],  # pairs per update = one-shot's
}
"""The ``madpo_iter`` row's settings: the same passes, pairs per update, beta, loss, reference copies and
learning rate as the one-shot row, so the rows differ in where the pairs come from (rebuilt each round
from the current team against a frozen copy, vs once from the untrained team). Held-out: before
training and after the last round only (:data:`ONE_SHOT_EVAL`: a round's length in steps depends on its
pair count, so a fixed ``val_check_interval`` would fall at different rounds in different seeds)."""


def iterative_walk(cfg: dict[str, Any] = CONFIG) -> int:
    """Batches of training problems each ``madpo_iter`` round walks (``limit_train_batches``)."""
    return max(cfg["batches"] // ITERATIVE_ROUNDS, 1)


def iterative_candidates(cfg: dict[str, Any] = CONFIG) -> int:
    """Current joint responses per problem in a ``madpo_iter`` round, and comparator ones: ``k / 2``
    each (at least 2, ``preference_num_candidates``' minimum)."""
    return max(cfg["k"] // 2, 2)


def iterative_samples(cfg: dict[str, Any] = CONFIG) -> int:
    """Completions (both agents) a ``madpo_iter`` run samples for its pairs, comparator's counted:
    rounds x walked problems x (current + comparator candidates) x 2 agents."""
    problems = iterative_walk(cfg) * cfg["batch_size"]
    return ITERATIVE_ROUNDS * problems * 2 * iterative_candidates(cfg) * 2


def iterative_problems(task: str, cfg: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The training problems a ``madpo_iter`` round walks: the first :func:`iterative_walk` x ``batch_size``
    of :func:`one_shot_problems` (so a subset of the one-shot and online rows' problems of that seed)."""
    return one_shot_problems(task, cfg, seed)[: iterative_walk(cfg) * cfg["batch_size"]]


TAG_TOKENS = 25
"""SmolLM2 tokens of the tagged format's four tags with their newlines
(``"<agent_0>\\n\\n</agent_0>\\n<agent_1>\\n\\n</agent_1>"``, what TaggedAdapter's prompt asks for)."""


def central_max_new_tokens(task: str) -> int:
    """Centralized MAGRPO's token budget: both roles' answers (MAGRPO's per-agent budget each) plus
    the tags, so the one joint model gets the tokens the two agents get and the format's overhead."""
    return 2 * TASKS[task].get("max_new_tokens", MAX_NEW_TOKENS) + TAG_TOKENS


TASK = "mul_1d_last8"
"""The task :data:`TASK_RULE` chose (``learning_calibration_2.json``: untrained greedy held-out success
add_1d_last8 0.60, add_2d_last8 0.00, mul_1d_last8 0.42 -> closest to 0.35 in [0.10, 0.60])."""
