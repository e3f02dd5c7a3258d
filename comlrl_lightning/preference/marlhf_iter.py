"""Iterative MARLHF: every round, pairs against a comparator, a reward model trained anew on them,
then online RL against it (CoMLRL 1.4.3 ``preference/iterative.py``, ``MARLHFIterTrainer``).

Each of ``rounds.num_rounds`` rounds (``docs/iterative.md``, "One round"), the state machine
``(round, phase, position)`` with ``phase`` ``build`` | ``reward`` | ``rl``:

1. ``build`` (:class:`~comlrl_lightning.preference.round_loop.RoundLoop`, as iterative MADPO): one
   dataloader batch of training prompts per ``training_step``, in dataset order; the current agents'
   ``preference_num_candidates`` joint responses against the comparator's, current ``i`` paired with
   comparator ``i`` and ordered by ``rounds.preference_scoring_reward``: the task reward, or
   (``reward_model``) the previous round's reward model (round 0, and every round before one was
   trained, fall back to the task reward, as CoMLRL); the round's replay shard, the replay's pick;
2. ``reward``: the reward model is re-initialised from its backbone (``reward_model.reward_model``,
   default agent 0's model: the backbone's weights and a new scalar head drawn from a generator seeded
   by ``reward_seed``, so every round starts from the same fresh model, as CoMLRL loads one), then
   trained on the round's pairs, one epoch (of ``reward_num_train_epochs``) per ``training_step``
   (:func:`~comlrl_lightning.preference.joint_reward_model.fit_reward_model`: Bradley–Terry,
   ``reward_val_fraction`` held out, ``reward_model/*`` and ``val/reward_model/*`` logged); the
   trained model is saved as an HF folder ``<reward_model_dir>/round_<r>`` (the previous round's
   folder removed);
3. ``rl``: the chosen RL module's own ``training_step`` (``rl_algorithm``: MAGRPO, its aliases, IAC,
   MAAC) against the frozen reward model for ``rl_phase.num_train_epochs`` × (training batches per
   epoch) steps; validation keeps the task reward;
4. the comparator closes the round (``history`` saves the policy). The fit stops after the last round
   (leave ``max_steps=-1``).

A round with no pair skips 2 and 3 (``pairs/train`` is 0); with ``reward_model`` scoring the last
trained model keeps scoring. Build and reward steps move no agent; each counts as ``num_agents``
skipped steps, so ``every_n_train_steps`` checkpoints fall in every phase. A checkpoint holds the
round loop (``checkpoint["iterative"]``), the reward model's weights while trained and needed and
``checkpoint["marlhf_iter"]`` (the reward phase's pairs, epoch, optimizer, order generator), as they
were at the step's start when written inside one (a SIGTERM under ``InterruptCheckpoint``); a resumed
run continues bit-exact in any phase.

Not supported: ``num_turns > 1`` (MARLHF's rule), ``pair_source`` (the pairs come from the rounds),
several processes (refused in ``setup``, before any model loads).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
from dataclasses import asdict, fields, replace
from typing import Any

import torch

from comlrl_lightning.core.records import StepOutput
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.preference.comparator.config import ComparatorConfig, RLPhaseConfig, RoundsConfig
from comlrl_lightning.preference.joint_reward_model import (
    RewardFitState,
    RewardModelConfig,
    fit_reward_model,
    load_reward_backbone,
    save_reward_model,
)
from comlrl_lightning.preference.marlhf import (
    MARLHF,
    MARLHFIAC,
    MARLHFMAAC,
    MARLHFMAGRPO,
    MARLHFMAREINFORCE,
    MARLHFMARLOO,
    RL_ALGORITHM,
    MARLHFMAReMax,
)
from comlrl_lightning.preference.replay import ReplayConfig
from comlrl_lightning.preference.reward_model_folder import global_seed, training_record
from comlrl_lightning.preference.round_loop import (
    IterativePreferenceConfig,
    RoundLoop,
    checked_group,
    iterative_preference,
    round_groups,
)
from comlrl_lightning.team.agents import AgentSpec

_ITER_REWARD = RewardModelConfig(reward_num_train_epochs=2)
_ITER_PREFERENCE = IterativePreferenceConfig(pair_selection="comparator_reward")
_ROUNDS, _COMPARATOR, _REPLAY, _RL = RoundsConfig(), ComparatorConfig(), ReplayConfig(), RLPhaseConfig()
_FIT_SAVED = [f.name for f in fields(RewardFitState) if f.name not in ("model", "rng_states")]
"""The reward phase's state in a checkpoint: its weights are the module's (``reward_models.<j>.*``),
the global RNG is Lightning's (``rng_states``)."""


class MARLHFIter(RoundLoop, MARLHF):
    """Iterative MARLHF (CoMLRL's ``MARLHFIterTrainer``): ``num_rounds`` rounds of (build pairs
    against the comparator, re-initialise and train the reward model, RL against it). Module docstring.

    ``MARLHFIter(rl_algorithm=a, ...)`` is an instance of ``MARLHFIter`` and of the RL module ``a``
    names (as :class:`MARLHF`): the RL phase is that module's own ``training_step``, unchanged.

    Args:
        agents, num_agents, rl_algorithm: as :class:`MARLHF`.
        reward_model: as :class:`MARLHF`'s (:class:`RewardModelConfig`); ``reward_num_train_epochs``
            defaults to 2 (CoMLRL's iterative default); ``reward_model_dir`` (default
            ``<trainer.log_dir>/reward_model``) receives ``round_<r>``.
        preference: as :class:`~comlrl_lightning.preference.madpo_iter.MADPOIter`'s
            (``pair_selection`` default ``comparator_reward``).
        rounds, comparator, replay, seed: as ``MADPOIter``'s; ``rounds.preference_scoring_reward``:
            ``task`` or ``reward_model``.
        rl_phase: the RL steps per round (:class:`RLPhaseConfig`).
        **kwargs: the RL module's arguments (``rollout``, ``advantage``, ``loss``, ``sampling``,
            ``placement``, ``critics``, ``critic``, and :class:`CoMLRLModule`'s ``optimizer``,
            ``scheduler``, ``learning_rate``, ``val_sampling``, ``env``), forwarded to :class:`MARLHF`.

    Raises:
        TypeError: an argument not listed here or in :class:`MARLHF` (``pair_source`` included).
        ValueError: a bad value of any group (naming the field, the value and what is allowed), a
            group the RL module does not have, ``num_turns > 1``, a comparator knob that does not fit
            the team, or an unset ``comparator_api_key_env`` variable; all before any model loads.
    """

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_agents: int | None = None,
        rl_algorithm: RL_ALGORITHM.literal = "magrpo",  # type: ignore[valid-type]
        reward_model: RewardModelConfig = _ITER_REWARD,
        preference: IterativePreferenceConfig = _ITER_PREFERENCE,
        rounds: RoundsConfig = _ROUNDS,
        comparator: ComparatorConfig = _COMPARATOR,
        replay: ReplayConfig = _REPLAY,
        rl_phase: RLPhaseConfig = _RL,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        groups = round_groups(rounds, comparator, replay, seed)
        phase = checked_group(RLPhaseConfig, rl_phase, "rl_phase")
        if "pair_source" in kwargs:
            raise TypeError(
                "MARLHFIter.__init__() got an unexpected keyword argument 'pair_source' (the rounds make the pairs)"
            )
        preference = iterative_preference(preference)
        super().__init__(agents, num_agents, rl_algorithm, reward_model=reward_model, preference=preference,
                         pair_source=None, **kwargs)  # fmt: skip
        self.rl_phase = phase
        self.hparams.pop("pair_source", None)  # not an argument here: the rounds make the pairs
        self.hparams["rl_phase"] = asdict(phase)
        self.init_round_loop(groups, seed)
        self._rm_trained = False
        """A round's reward model finished training (``reward_model`` scoring uses it from then on)."""
        self._fit: RewardFitState | None = None
        self._resume_marlhf_iter: dict[str, Any] | None = None

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str) -> None:
        self.setup_round_loop()  # refuses several processes before any model loads
        super().setup(stage)

    def on_train_start(self) -> None:
        """The RL module's start (placement, RNG of a resumed run); no one-shot phase 1 (the rounds
        train the reward model). The reward model is frozen outside its own phase."""
        super(MARLHF, self).on_train_start()
        if self._phase != "reward":
            self.reward_models[self._rm_index].eval().requires_grad_(False)

    def training_step(self, batch: list[Episode], batch_idx: int) -> StepOutput | None:
        self.begin_step()  # a checkpoint written inside this step holds the state before it
        out = self._round_step(batch, batch_idx)
        self.end_step()
        return out

    def _round_step(self, batch: list[Episode], batch_idx: int) -> StepOutput | None:
        if self._round >= self.rounds.num_rounds:
            self.trainer.should_stop = True
            return None
        if self._phase == "build":
            if self.build_step(self._scoring_env(), self.preference_config):
                self._start_reward_phase(self.finish_build())
            return None
        if self._phase == "reward":
            self._reward_step()
            return None
        out = super().training_step(batch, batch_idx)  # the RL module's step, against the reward model
        self._position += 1
        self.log_round(out.num_episodes)
        if self._position >= self.rl_steps_per_round:
            self._end_round()
        return out

    @property
    def rl_steps_per_round(self) -> int:
        """``rl_phase.num_train_epochs × trainer.num_training_batches`` (RL steps of a round).

        Raises:
            ValueError: the training dataloader has no length (an iterable dataset) and
                ``limit_train_batches`` is not an integer: a pass has no size.
        """
        batches = self.trainer.num_training_batches
        if not math.isfinite(batches):
            raise ValueError(
                "rl_phase.num_train_epochs: the training dataloader has no length, so a pass has no "
                "size; set trainer.limit_train_batches to an integer (the batches of one pass)"
            )
        return self.rl_phase.num_train_epochs * max(int(batches), 1)

    def on_train_end(self) -> None:
        super().on_train_end()
        self.warn_if_unfinished()  # a trainer limit ended the fit before the last round

    # ------------------------------------------------------------------ the phases
    def _scoring_env(self) -> DecPOMDP:
        """The build's env: the task's, or (``reward_model`` scoring, once a round trained one) the
        env whose reward is the last trained reward model alone (not the RL phase's
        ``log_task_reward`` probe: its task reward would be computed for every candidate, unused)."""
        env = self.env
        if self.rounds.preference_scoring_reward != "reward_model" or not self._rm_trained:
            return env
        return DecPOMDP(env.formatters, self.joint_reward_model, env.transition_fn)

    def _start_reward_phase(self, train: list[Any]) -> None:
        self._position = 0
        if not train:  # nothing to learn from: no reward model, no RL this round
            self._end_round()
            return
        self._phase, self._reward_ready = "reward", False
        self._fit = RewardFitState(pairs=[p.to_json() for p in train])

    def reinit_reward_model(self) -> None:
        """The reward model anew from its backbone (:func:`load_reward_backbone`; the head drawn from
        a generator seeded by ``reward_seed``, the global RNG untouched), trainable."""
        cfg = self.reward_config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.reward_seed)
            fresh, _ = load_reward_backbone(cfg.reward_model or self.specs[0].model)
        model = self.reward_models[self._rm_index]
        model.load_state_dict(fresh.state_dict())
        model.requires_grad_(True).train()

    def _reward_step(self) -> None:
        """One epoch of the round's reward model (the first re-initialises it)."""
        assert self._fit is not None
        if self._fit.epoch == 0:
            self.reinit_reward_model()
        model, rm = self.reward_models[self._rm_index], self.joint_reward_model
        cfg = replace(self.reward_config, reward_num_train_epochs=self._fit.epoch + 1)
        self._fit = fit_reward_model(model, rm._tokenizer, rm, self._fit, cfg, log=self._log_reward)
        self._fit.rng_states = None  # the global RNG goes on (Lightning's checkpoint restores it)
        self._reward_ready = True  # its weights are trained: checkpoints keep them
        self._position = self._fit.epoch
        self.count_idle_step()
        self.log_round(1)
        if self._fit.epoch >= self.reward_config.reward_num_train_epochs:
            self._save_round_reward_model()
            model.eval().requires_grad_(False)
            self._rm_trained, self._fit = True, None
            self._phase, self._position = "rl", 0

    def _log_reward(self, metrics: dict[str, float], epoch: int) -> None:
        for name, value in metrics.items():
            self.log(name, float(value), batch_size=1)

    def _save_round_reward_model(self) -> None:
        """``<reward_model_dir>/round_<r>`` (an HF sequence classifier with ``marlhf.json``); the
        previous round's folder removed."""
        assert self._fit is not None
        rm = self.joint_reward_model
        info = {
            "template": self.reward_config.reward_template,
            "max_length": rm.max_length,
            "source": self.reward_config.reward_model or self.specs[0].model,
            "round": self._round,
            "num_pairs": len(self._fit.pairs),
            "skipped_steps": self._fit.skipped_steps,
            "history": self._fit.history,
            "seed": global_seed(),  # what trained it, beside how: the RNG, the prompts, the task reward
            **training_record(self),
        }
        folder = os.path.join(self.reward_model_dir, f"round_{self._round}")
        save_reward_model(self.reward_models[self._rm_index], rm._tokenizer, folder, info)
        self.reward_info = info
        for r in range(self._round):
            shutil.rmtree(os.path.join(self.reward_model_dir, f"round_{r}"), ignore_errors=True)

    def _end_round(self) -> None:
        self.close_round()
        # kept in checkpoints only while the next build scores with it
        self._reward_ready = self.rounds.preference_scoring_reward == "reward_model" and self._rm_trained

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """MARLHF's (the RL module's, the reward model's weights while they are needed), plus the
        round loop's state and the reward phase's; inside a step, those the step started from (the
        reward model's weights at its epoch's start; :meth:`RoundLoop.begin_step`)."""
        start, live = self._step_start, self._reward_ready
        self._reward_ready = live if start is None else start["reward_ready"]
        try:
            super().on_save_checkpoint(checkpoint)
        finally:
            self._reward_ready = live
        own = self._marlhf_iter_state(deep=False) if start is None else start["marlhf_iter"]
        checkpoint["iterative"], checkpoint["marlhf_iter"] = self.saved_round_loop_state(), own
        if start is not None:
            checkpoint["marlhf"]["reward_info"] = start["reward_info"]
            prefix = f"reward_models.{self._rm_index}."
            for name, value in (start["rm_weights"] or {}).items():
                checkpoint["state_dict"][prefix + name] = value

    def step_start_state(self) -> dict[str, Any]:
        """The round loop's, the reward phase's (its optimizer state copied: the next epoch's optimizer
        steps the same tensors) and, between reward epochs, the weights the next epoch starts from."""
        weights = self._fit.model if self._fit is not None and self._fit.epoch > 0 else None
        own = dict(marlhf_iter=self._marlhf_iter_state(deep=True), rm_weights=weights)
        return {
            **super().step_start_state(),
            **own,
            "reward_ready": self._reward_ready,
            "reward_info": self.reward_info,
        }

    def _marlhf_iter_state(self, deep: bool) -> dict[str, Any]:
        fit = None if self._fit is None else {k: getattr(self._fit, k) for k in _FIT_SAVED}
        if deep and fit is not None:
            fit["optimizer"] = copy.deepcopy(fit["optimizer"])
        return {"rm_trained": self._rm_trained, "reward_fit": fit}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._resume_iterative = checkpoint.get("iterative")
        self._resume_marlhf_iter = checkpoint.get("marlhf_iter")

    def on_fit_start(self) -> None:
        """The RL module's, then the rounds' state of the checkpoint being resumed (after ``setup``
        made the comparator and the replay; the weights are restored by then)."""
        super().on_fit_start()
        state, own = getattr(self, "_resume_iterative", None), self._resume_marlhf_iter
        if state is None or own is None:
            return
        self.load_round_loop_state(state)
        self._rm_trained, fit = own["rm_trained"], own["reward_fit"]
        self._fit = None if fit is None else RewardFitState(**fit)
        if self._fit is not None and self._fit.epoch > 0:  # fit_reward_model resumes from these weights
            weights = self.reward_models[self._rm_index].state_dict()
            self._fit.model = {k: v.detach().cpu().clone() for k, v in weights.items()}
        self._resume_iterative = self._resume_marlhf_iter = None


class MARLHFIterMAGRPO(MARLHFIter, MARLHFMAGRPO):
    """Iterative MARLHF whose RL phase is MAGRPO."""


class MARLHFIterMAREINFORCE(MARLHFIter, MARLHFMAREINFORCE):
    """Iterative MARLHF whose RL phase is MAREINFORCE."""


class MARLHFIterMARLOO(MARLHFIter, MARLHFMARLOO):
    """Iterative MARLHF whose RL phase is MARLOO."""


class MARLHFIterMAReMax(MARLHFIter, MARLHFMAReMax):
    """Iterative MARLHF whose RL phase is MAReMax."""


class MARLHFIterIAC(MARLHFIter, MARLHFIAC):
    """Iterative MARLHF whose RL phase is IAC."""


class MARLHFIterMAAC(MARLHFIter, MARLHFMAAC):
    """Iterative MARLHF whose RL phase is MAAC."""


MARLHFIter.variants = {
    "magrpo": MARLHFIterMAGRPO,
    "mareinforce": MARLHFIterMAREINFORCE,
    "marloo": MARLHFIterMARLOO,
    "maremax": MARLHFIterMAReMax,
    "iac": MARLHFIterIAC,
    "maac": MARLHFIterMAAC,
}
