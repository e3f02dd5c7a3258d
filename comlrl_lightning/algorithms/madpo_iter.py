"""Iterative MADPO: pairs rebuilt every round against a comparator (CoMLRL 1.4.3
``preference/iterative.py``, ``MADPOIterTrainer``), as a LightningModule.

Each of ``rounds.num_rounds`` rounds (``docs/iterative.md``, "One round"):

1. ``build``: the comparator opens the round (``begin_round``); the training set is walked once in
   dataset order (its first ``limit_train_batches`` batches, when that is set), one dataloader batch
   of prompts per ``training_step``: the current agents sample
   ``preference_num_candidates`` joint responses, the comparator its ``comparator_num_candidates``
   for the same prompts, the task reward scores both, and current ``i`` is paired with comparator
   ``i`` (:func:`~comlrl_lightning.comparator.candidates.build_candidates`, ``pair_selection``);
2. at the end of the walk the round's pairs become its replay shard and the replay picks the round's
   training pairs (:class:`~comlrl_lightning.core.replay.PreferenceReplay`);
3. ``train``: ``num_train_epochs`` shuffled passes over them, one joint-DPO update of every agent per
   ``train_batch_size`` pairs and ``training_step`` (one-shot MADPO's update: the same loss, step
   and metrics);
4. the comparator closes the round (``end_round``: ``history`` saves the policy), and the next begins.
   The module stops the fit after the last round (leave ``max_steps=-1``).

A round with no pair (every pair tied) skips step 3. Every ``training_step`` counts ``num_agents``
optimizer steps (a build step's count as skipped ones, as one-shot MADPO's empty batch), so
``every_n_train_steps`` checkpoints fall inside a round's build as well as its training.

Pair tokens: both sides are text (the comparator's may come from another model or an API), so each
agent's prompt is re-rendered and its completion re-tokenised with that agent's tokenizer (as CoMLRL
does); the EOS is appended unless the completion has ``max_new_tokens`` tokens (clipped).

Checkpoints hold, besides one-shot MADPO's state (``preference_pairs``: the round's training pairs,
their order and position), ``checkpoint["iterative"]``: the round, phase, build position, the pairs
built so far, the sample count, the ``random`` pair-selection generator, the comparator's state and
the replay's (its shards stay on disk, under ``preference_replay_dir``); a resumed run, mid-build or
mid-training, continues bit-exact. The API key is in none of them.
"""

from __future__ import annotations

import copy
import math
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from comlrl_lightning.algorithms.madpo import COLLABORATION_MODE, MADPO
from comlrl_lightning.comparator.candidates import build_candidates
from comlrl_lightning.comparator.config import ComparatorConfig, RoundsConfig
from comlrl_lightning.comparator.policies import Comparator, build_comparator
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.config import DEFAULTS, PlacementConfig, RolloutConfig, SamplingConfig
from comlrl_lightning.core.dpo import DPOConfig
from comlrl_lightning.core.generation import (
    context_length,
    fit_to_context,
    has_chat_template,
    render_prompt,
    tokenize_prompts,
)
from comlrl_lightning.core.pair_batch import PairTokens, pair_step_output
from comlrl_lightning.core.pairs import PreferencePair
from comlrl_lightning.core.preference import PreferenceConfig
from comlrl_lightning.core.records import StepOutput
from comlrl_lightning.core.replay import PreferenceReplay, ReplayConfig
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.team.agents import AgentSpec


@dataclass
class IterativePreferenceConfig(PreferenceConfig):
    """:class:`~comlrl_lightning.core.preference.PreferenceConfig`'s fields, with
    ``pair_selection="comparator_reward"`` accepted (current ``i`` against comparator ``i``)."""

    with_comparator: ClassVar[bool] = True


_ITER_PREFERENCE = IterativePreferenceConfig(pair_selection="comparator_reward")
_ITER_DPO = DPOConfig(num_train_epochs=1)
_ROUNDS, _COMPARATOR, _REPLAY = RoundsConfig(), ComparatorConfig(), ReplayConfig()
_GROUPS: dict[str, type] = {"rounds": RoundsConfig, "comparator": ComparatorConfig, "replay": ReplayConfig}


class MADPOIter(MADPO):
    """Iterative MADPO (CoMLRL's ``MADPOIterTrainer``): ``num_rounds`` rounds of (sample current and
    comparator, pair, replay, ``num_train_epochs`` of joint DPO). See the module docstring.

    A subclass of :class:`MADPO` rather than a mode of it: the round loop, the comparator and the
    replay are state one-shot MADPO never has, while the update, the loss and the metrics are
    exactly MADPO's (inherited, not copied).

    Args:
        preference: as :class:`MADPO`'s; ``pair_selection`` here defaults to ``comparator_reward``
            (CoMLRL's iterative default) and ``preference_num_candidates`` is the current policy's
            samples per prompt (``K``).
        dpo: as :class:`MADPO`'s; ``num_train_epochs`` (default 1, CoMLRL's iterative default) are
            passes per round; ``preference_mode`` must be ``one_shot`` (each round's pair set is
            built once, then trained on).
        rounds: :class:`~comlrl_lightning.comparator.config.RoundsConfig` (``num_rounds``;
            ``preference_scoring_reward`` must be ``task``: MADPO has no reward model).
        comparator: :class:`~comlrl_lightning.comparator.config.ComparatorConfig` (the five
            ``comparator_policy`` values; ``history`` without ``policy_checkpoint_dir`` writes under
            ``<default_root_dir>/policy_checkpoints``).
        replay: :class:`~comlrl_lightning.core.replay.ReplayConfig` (shards under
            ``preference_replay_dir``, default ``<default_root_dir>/preference_replay``).
        seed: seeds the comparator's sampling stream, the replay draws and ``pair_selection="random"``
            (int, default 0; the current policy samples from the global RNG, ``seed_everything``).
        other arguments: see :class:`MADPO`.

    Raises:
        ValueError: a bad value of any group (naming the field, the value and what is allowed), a
            comparator knob that does not fit the team (``ComparatorConfig.check``), or an unset
            ``comparator_api_key_env`` variable; all before any model is loaded.
    """

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_agents: int | None = None,
        preference: IterativePreferenceConfig = _ITER_PREFERENCE,
        dpo: DPOConfig = _ITER_DPO,
        rounds: RoundsConfig = _ROUNDS,
        comparator: ComparatorConfig = _COMPARATOR,
        replay: ReplayConfig = _REPLAY,
        rollout: RolloutConfig = DEFAULTS["rollout"],
        sampling: SamplingConfig = DEFAULTS["sampling"],
        placement: PlacementConfig = DEFAULTS["placement"],
        collaboration_mode: COLLABORATION_MODE.literal = "decentralized",  # type: ignore[valid-type]
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        learning_rate: float = 5e-6,
        val_sampling: bool = False,
        seed: int = 0,
        env: DecPOMDP | None = None,
    ) -> None:
        given = dict(rounds=rounds, comparator=comparator, replay=replay)
        groups = {k: _GROUPS[k](**c) if isinstance(c, dict) else replace(c) for k, c in given.items()}
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: got {seed!r}, must be an integer")
        dpo_mode = dpo.get("preference_mode", "one_shot") if isinstance(dpo, dict) else dpo.preference_mode
        if dpo_mode != "one_shot":
            raise ValueError(
                f"dpo.preference_mode: got {dpo_mode!r}; MADPOIter builds each round's pairs once and "
                "trains on them (num_train_epochs passes): allowed 'one_shot' (for per-batch pairs "
                "without a comparator use MADPO with 'online')"
            )
        if groups["rounds"].preference_scoring_reward != "task":
            raise ValueError(
                f"rounds.preference_scoring_reward: got {groups['rounds'].preference_scoring_reward!r}; "
                "MADPO has no reward model to order pairs with: allowed 'task' (reward_model is iterative MARLHF's)"
            )
        if collaboration_mode != "decentralized":
            raise ValueError(
                f"collaboration_mode: got {collaboration_mode!r}; MADPOIter trains one model per agent "
                "(a centralized comparator is comparator.comparator_generation_mode): allowed 'decentralized'"
            )
        if isinstance(preference, dict):
            preference = IterativePreferenceConfig(**preference)
        elif not isinstance(preference, IterativePreferenceConfig):
            preference = IterativePreferenceConfig(**asdict(preference))
        super().__init__(
            agents,
            num_agents,
            preference=preference,
            dpo=dpo,
            rollout=rollout,
            sampling=sampling,
            placement=placement,
            optimizer=optimizer,
            scheduler=scheduler,
            learning_rate=learning_rate,
            val_sampling=val_sampling,
            env=env,
        )
        self.rounds: RoundsConfig = groups["rounds"]
        self.comparator_config: ComparatorConfig = groups["comparator"]
        self.replay_config: ReplayConfig = groups["replay"]
        self.seed = seed
        for name, cfg in groups.items():
            self.hparams[name] = asdict(cfg)
        self._hparams_initial = copy.deepcopy(self._hparams)
        self.comparator: Comparator | None = None
        if (
            self.comparator_config.comparator_policy != "history"
            or self.comparator_config.policy_checkpoint_dir
        ):
            self.comparator = self._make_comparator(None)  # loads nothing; checks the key's variable
        else:
            self.comparator_config.check(self.num_agents)
        self.replay: PreferenceReplay | None = None
        self._pair_rng = random.Random(seed)
        self._round, self._phase, self._position, self._samples = 0, "build", 0, 0
        self._round_pairs: list[PreferencePair] = []
        self._round_open = False
        self._last_counts: list[int] | None = None
        """``[pairs built, pairs trained on, pairs in every shard]`` of the last round built."""

    def _make_comparator(self, history_dir: str | None) -> Comparator:
        s = self.sampling_config
        sampling = dict(
            max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k
        )
        return build_comparator(self.comparator_config, self.team, self.seed, sampling, history_dir)

    @property
    def samples_generated(self) -> int:
        """Joint responses generated for pairs so far, current plus comparator (the sample budget)."""
        return self._samples

    @property
    def round(self) -> int:
        """The round in progress (0-based; ``num_rounds`` once every round is done)."""
        return self._round

    def setup(self, stage: str) -> None:
        if self.trainer.world_size > 1:
            raise ValueError(
                f"MADPOIter: {self.trainer.world_size} processes; a round's pairs, replay shards and "
                "history folders are written by one process: run it on one device (docs/iterative.md)"
            )
        super().setup(stage)
        root = self.trainer.default_root_dir
        if self.comparator is None:
            self.comparator = self._make_comparator(os.path.join(root, "policy_checkpoints"))
        if self.replay is None:
            directory = self.replay_config.preference_replay_dir or os.path.join(root, "preference_replay")
            self.replay = PreferenceReplay(self.replay_config, directory, self.seed, self.num_agents)

    # ------------------------------------------------------------------ the round's steps
    def training_step(self, batch: list[Episode], batch_idx: int) -> StepOutput | None:
        if self._round >= self.rounds.num_rounds:
            self.trainer.should_stop = True
            return None
        if self._phase == "build":
            self._build_step()
            return None
        return self._train_step()

    def _build_step(self) -> None:
        """One dataloader batch of the round's walk over the training set (the batch Lightning passes
        only paces the walk: the walk is in dataset order, as CoMLRL's)."""
        assert self.comparator is not None
        if not self._round_open:  # also after a resume inside a build (current_copy copies again)
            self.comparator.begin_round(self._round)
            self._round_open = True
        loader = self.trainer.train_dataloader
        dataset, size = loader.dataset, max(int(getattr(loader, "batch_size", 1) or 1), 1)
        walk = len(dataset)
        if math.isfinite(self.trainer.num_training_batches):  # limit_train_batches caps the walk
            walk = min(walk, int(self.trainer.num_training_batches) * size)
        end = min(self._position + size, walk)
        episodes = [dataset[i] for i in range(self._position, end)]
        p, c = self.preference, self.comparator_config
        built = build_candidates(
            self.team,
            self.env,
            self.comparator,
            episodes,
            p.preference_num_candidates,
            c.comparator_num_candidates or p.preference_num_candidates,
            p.pair_selection,
            p.preference_pairs_per_sample,
            self._pair_rng,
            step=self.global_step,
        )
        self._round_pairs += built.pairs
        self._samples += built.samples
        self._position = end
        opts, _ = self.agent_optimizers()
        for opt in opts:  # a build step moves no weight; it counts as the batch's N steps
            self._count_skipped_step(opt)
        n = len(episodes)
        self.log(M.REWARD, built.current_rewards.mean().to(self.device), prog_bar=True, batch_size=n)
        self._log_round(n)
        if self._position >= walk:
            self._finish_build()

    def _finish_build(self) -> None:
        """The round's shard, the replay's pick, and the switch to training (or the next round)."""
        assert self.replay is not None
        current, r = self._round_pairs, self._round
        self.replay.add_round(r, current)
        train = self.replay.select(r, current)
        self._last_counts = [len(current), len(train), self.replay.counts()[1]]
        self._log_counts()
        self._round_pairs, self._position, self._phase = [], 0, "train"
        self.pairs, self.pair_tokens = train, text_pair_tokens(self.team, train)
        self._order, self._epoch, self._cursor = list(range(len(train))), 0, 0
        if not train:
            self._end_round()

    def _train_step(self) -> StepOutput | None:
        t0 = time.perf_counter()
        chosen = self._next_pairs()
        if chosen is None:
            self._end_round()
            return None
        assert self.pairs is not None
        pairs, tokens = [self.pairs[j] for j in chosen], [self.pair_tokens[j] for j in chosen]
        stats, logged = self.update_agents(tokens)
        out = pair_step_output(pairs, tokens, stats)
        out.step_time_s = time.perf_counter() - t0
        self.log_step(out, logged, len(pairs))
        self._log_round(len(pairs))
        if self._epoch >= self.dpo.num_train_epochs:
            self._end_round()
        return out

    def _end_round(self) -> None:
        assert self.comparator is not None
        self.comparator.end_round(self._round)
        self._round_open = False
        self._round, self._phase, self._position = self._round + 1, "build", 0
        self.pairs, self.pair_tokens, self._order = None, [], []
        if self._round >= self.rounds.num_rounds:
            self.trainer.should_stop = True

    def _log_counts(self) -> None:
        """``pairs/*`` of the last round built, at every step from its end on (so that no
        ``log_every_n_steps`` drops a once-a-round value)."""
        if self._last_counts is not None:
            for name, value in zip((M.PAIRS_CURRENT, M.PAIRS_TRAIN, M.PAIRS_TOTAL), self._last_counts):
                self.log(name, float(value), batch_size=1)

    def _log_round(self, batch_size: int) -> None:
        assert self.comparator is not None
        self.log(M.ROUND, float(self._round), batch_size=batch_size)
        self.log(M.SAMPLES, float(self._samples), batch_size=batch_size)
        for name, value in self.comparator.metrics().items():
            self.log(name, value, batch_size=batch_size)
        self._log_counts()

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """MADPO's (RNG, finite weights, the round's training pairs), plus the round loop's state."""
        super().on_save_checkpoint(checkpoint)
        assert self.comparator is not None and self.replay is not None
        version, internal, gauss = self._pair_rng.getstate()
        checkpoint["iterative"] = {
            "round": self._round,
            "phase": self._phase,
            "position": self._position,
            "samples": self._samples,
            "last_counts": self._last_counts,
            "round_pairs": [p.to_json() for p in self._round_pairs],
            "pair_rng": [version, list(internal), gauss],
            "comparator": self.comparator.state_dict(),
            "replay": self.replay.state_dict(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._resume_iterative = checkpoint.get("iterative")

    def on_fit_start(self) -> None:
        """MADPO's, then the round loop's state from the checkpoint being resumed (the comparator and
        the replay exist only after :meth:`setup`, which runs before the checkpoint is read)."""
        super().on_fit_start()
        state = getattr(self, "_resume_iterative", None)
        if state is None:
            return
        assert self.comparator is not None and self.replay is not None
        self._round, self._phase, self._position = state["round"], state["phase"], state["position"]
        self._samples, self._last_counts = state["samples"], state.get("last_counts")
        self._round_pairs = [PreferencePair.from_json(d, "checkpoint") for d in state["round_pairs"]]
        version, internal, gauss = state["pair_rng"]
        self._pair_rng.setstate((version, tuple(internal), gauss))
        self.comparator.load_state_dict(state["comparator"])
        self.replay.load_state_dict(state["replay"])
        self._round_open = False
        self._resume_iterative = None


def text_pair_tokens(team: Any, pairs: list[PreferencePair]) -> list[list[PairTokens]]:
    """``[P][N]`` each pair's tokens per agent from its texts: the agent's observation rendered and cut
    as a rollout's prompt is (chat template if the agent uses one, ``max_prompt_length``, the model's
    context); each side's completion tokenised without special tokens, cut at ``max_new_tokens``, plus
    the EOS (the model's first ``eos_token_id``, else the tokenizer's) unless it has ``max_new_tokens``
    tokens (then ``clipped``). Tensors are 1-D CPU ``long``."""
    out: list[list[PairTokens]] = [[] for _ in pairs]
    for i in range(team.num_agents):
        tok, spec, sampling, model = team.tokenizers[i], team.specs[i], team.sampling[i], team.agents[i]
        chat = spec.chat_template and has_chat_template(tok)
        limit = sampling.max_new_tokens
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos = tok.eos_token_id if eos is None else eos
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        for row, pair in zip(out, pairs):
            rendered = render_prompt(tok, [pair.prompts[i]], [], spec.chat_template)
            ids, mask = tokenize_prompts(tok, [rendered], chat, sampling.max_prompt_length)
            ids, mask = fit_to_context(ids, mask, context_length(model), limit)
            prompt = ids[0][mask[0].bool()].long()
            sides = []
            for text in (pair.chosen[i], pair.rejected[i]):
                ids_ = tok(text, add_special_tokens=False)["input_ids"][:limit]
                clipped = len(ids_) >= limit
                sides.append((torch.tensor(ids_ + ([] if clipped else [eos]), dtype=torch.long), clipped))
            row.append(PairTokens(prompt, prompt, sides[0][0], sides[1][0], sides[0][1], sides[1][1]))
    return out
