"""Iterative MADPO: pairs rebuilt every round against a comparator (CoMLRL 1.4.3
``preference/iterative.py``, ``MADPOIterTrainer``), as a LightningModule.

Each of ``rounds.num_rounds`` rounds (``docs/iterative.md``, "One round"):

1. ``build``: the comparator opens the round (``begin_round``); the training set is walked once in
   dataset order (its first ``limit_train_batches`` batches, when that is set), one dataloader batch
   of prompts per ``training_step``: the current agents sample
   ``preference_num_candidates`` joint responses, the comparator its ``comparator_num_candidates``
   for the same prompts, the task reward scores both, and current ``i`` is paired with comparator
   ``i`` (:func:`~comlrl_lightning.preference.comparator.candidates.build_candidates`, ``pair_selection``);
2. at the end of the walk the round's pairs become its replay shard and the replay picks the round's
   training pairs (:class:`~comlrl_lightning.preference.replay.PreferenceReplay`);
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

import time
from typing import Any

import torch

from comlrl_lightning.core.config import DEFAULTS, PlacementConfig, RolloutConfig, SamplingConfig
from comlrl_lightning.core.generation import (
    context_length,
    fit_to_context,
    has_chat_template,
    render_prompt,
    tokenize_prompts,
)
from comlrl_lightning.core.records import StepOutput
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.preference.comparator.config import ComparatorConfig, RoundsConfig
from comlrl_lightning.preference.dpo import DPOConfig
from comlrl_lightning.preference.madpo import COLLABORATION_MODE, MADPO
from comlrl_lightning.preference.pair_batch import PairTokens, pair_step_output
from comlrl_lightning.preference.pairs import PreferencePair
from comlrl_lightning.preference.replay import ReplayConfig
from comlrl_lightning.preference.round_loop import (
    IterativePreferenceConfig,
    RoundLoop,
    iterative_preference,
    round_groups,
)
from comlrl_lightning.team.agents import AgentSpec

__all__ = ["IterativePreferenceConfig", "MADPOIter", "text_pair_tokens"]

_ITER_PREFERENCE = IterativePreferenceConfig(pair_selection="comparator_reward")
_ITER_DPO = DPOConfig(num_train_epochs=1)
_ROUNDS, _COMPARATOR, _REPLAY = RoundsConfig(), ComparatorConfig(), ReplayConfig()


class MADPOIter(RoundLoop, MADPO):
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
        rounds: :class:`~comlrl_lightning.preference.comparator.config.RoundsConfig` (``num_rounds``;
            ``preference_scoring_reward`` must be ``task``: MADPO has no reward model).
        comparator: :class:`~comlrl_lightning.preference.comparator.config.ComparatorConfig` (the five
            ``comparator_policy`` values; ``history`` without ``policy_checkpoint_dir`` writes under
            ``<default_root_dir>/policy_checkpoints``).
        replay: :class:`~comlrl_lightning.preference.replay.ReplayConfig` (shards under
            ``preference_replay_dir``, default ``<default_root_dir>/preference_replay``).
        seed: seeds the comparator's sampling stream, the replay draws and ``pair_selection="random"``
            (int, default 0; the current policy samples from the global RNG, ``seed_everything``).
        **kwargs: :class:`CoMLRLModule`'s ``optimizer``, ``scheduler``, ``learning_rate``,
            ``val_sampling``, ``env``; other arguments: see :class:`MADPO`.

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
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        groups = round_groups(rounds, comparator, replay, seed)
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
        super().__init__(
            agents,
            num_agents,
            preference=iterative_preference(preference),
            dpo=dpo,
            rollout=rollout,
            sampling=sampling,
            placement=placement,
            collaboration_mode=collaboration_mode,
            num_roles=2,  # MADPO's centralized-only arguments: MADPOIter is decentralized (checked above)
            adapter=None,
            **kwargs,
        )
        self.init_round_loop(groups, seed)  # the comparator loads nothing; checks the key's variable

    def setup(self, stage: str) -> None:
        self.setup_round_loop()  # refuses fsdp2 and several processes before any model loads
        super().setup(stage)

    # ------------------------------------------------------------------ the round's steps
    def training_step(self, batch: list[Episode], batch_idx: int) -> StepOutput | None:
        self.begin_step()  # a checkpoint written inside this step holds the state before it
        self._pass_start = self.pass_position()  # MADPO's pass position, likewise
        out = self._round_step()
        self.end_step()
        self._pass_start = None
        return out

    def _round_step(self) -> StepOutput | None:
        if self._round >= self.rounds.num_rounds:
            self.trainer.should_stop = True
            return None
        if self._phase == "build":
            if self.build_step(self.env, self.preference):
                self._finish_build()
            return None
        return self._train_step()

    def on_train_end(self) -> None:
        super().on_train_end()
        self.warn_if_unfinished()  # a trainer limit ended the fit before the last round
        self.refuse_if_nothing_trained()  # every round formed 0 pairs: no success to report

    def _finish_build(self) -> None:
        """The round's shard, the replay's pick, and the switch to training (or the next round)."""
        train = self.finish_build()
        self._phase = "train"
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
        self.log_round(len(pairs))
        if self._epoch >= self.dpo.num_train_epochs:
            self._end_round()
        return out

    def _end_round(self) -> None:
        self.close_round()
        self.pairs, self.pair_tokens, self._order = None, [], []

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """MADPO's (RNG, finite weights, the round's training pairs), plus the round loop's state."""
        super().on_save_checkpoint(checkpoint)
        checkpoint["iterative"] = self.saved_round_loop_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._resume_iterative = checkpoint.get("iterative")

    def on_fit_start(self) -> None:
        """MADPO's, then the round loop's state from the checkpoint being resumed (the comparator and
        the replay exist only after :meth:`setup`, which runs before the checkpoint is read)."""
        super().on_fit_start()
        state = getattr(self, "_resume_iterative", None)
        if state is not None:
            self.load_round_loop_state(state)
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
