"""The round loop the iterative preference trainers share (CoMLRL 1.4.3 ``preference/iterative.py``:
``MADPOIterTrainer.train`` and ``MARLHFIterTrainer.train``): the comparator, the replay, the build
phase that walks the training set one dataloader batch per ``training_step``, the round's pair counts
and the checkpointed ``(round, phase, position)`` state.

:class:`RoundLoop` is a mixin of a :class:`~comlrl_lightning.algorithms.base.CoMLRLModule` subclass
(:class:`~comlrl_lightning.preference.madpo_iter.MADPOIter`,
:class:`~comlrl_lightning.preference.marlhf_iter.MARLHFIter`): it defines no Lightning hook, only
helpers the module's own hooks call (``init_round_loop`` in ``__init__``, ``setup_round_loop`` in
``setup``, ``build_step`` / ``finish_build`` / ``close_round`` in ``training_step``,
``round_loop_state`` / ``load_round_loop_state`` around checkpoints). What a round trains on after its
build (joint DPO; a reward model then RL) is the module's.
"""

from __future__ import annotations

import copy
import math
import os
import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from comlrl_lightning.core import metrics as M
from comlrl_lightning.envs.base import DecPOMDP
from comlrl_lightning.infra.run_lock import hold_run_folder
from comlrl_lightning.infra.sharded import ShardedTeamStrategy
from comlrl_lightning.preference.comparator.build import build_comparator
from comlrl_lightning.preference.comparator.candidates import build_candidates
from comlrl_lightning.preference.comparator.config import ComparatorConfig, RoundsConfig
from comlrl_lightning.preference.comparator.policies import Comparator
from comlrl_lightning.preference.pairs import PreferencePair
from comlrl_lightning.preference.replay import PreferenceReplay, ReplayConfig
from comlrl_lightning.preference.selection import PreferenceConfig

_GROUPS: dict[str, type] = {"rounds": RoundsConfig, "comparator": ComparatorConfig, "replay": ReplayConfig}


@dataclass
class IterativePreferenceConfig(PreferenceConfig):
    """:class:`~comlrl_lightning.preference.selection.PreferenceConfig`'s fields, with
    ``pair_selection="comparator_reward"`` accepted (current ``i`` against comparator ``i``)."""

    with_comparator: ClassVar[bool] = True


def iterative_preference(preference: Any) -> IterativePreferenceConfig:
    """``preference`` (a mapping, a ``PreferenceConfig`` or an ``IterativePreferenceConfig``) as an
    :class:`IterativePreferenceConfig` (Raises ValueError: a bad value, naming the field)."""
    if isinstance(preference, dict):
        return IterativePreferenceConfig(**preference)
    if isinstance(preference, IterativePreferenceConfig):
        return preference
    return IterativePreferenceConfig(**asdict(preference))


def checked_group(cls: type, value: Any, name: str) -> Any:
    """``value`` (None: the defaults, a mapping, or a ``cls``) as a checked copy of the dataclass ``cls``.

    Raises:
        ValueError: an unknown field (naming ``name``, the fields and the allowed ones), a value of
            another type, or a bad value (``cls``'s own check, at construction).
    """
    if value is None:
        return cls()
    if isinstance(value, dict):
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ValueError(f"{name}: unknown field(s) {unknown}; allowed: {allowed}")
        return cls(**value)
    if not isinstance(value, cls):
        raise ValueError(f"{name}: got a {type(value).__name__}, give a {cls.__name__} or a mapping")
    return replace(value)


def round_groups(rounds: Any, comparator: Any, replay: Any, seed: Any) -> dict[str, Any]:
    """The ``rounds``, ``comparator`` and ``replay`` groups as checked copies (mappings or instances).

    Raises:
        ValueError: a bad value or an unknown field of any group (naming the field, the value and what
            is allowed; :func:`checked_group`), or a ``seed`` that is not an integer; before any model
            loads.
    """
    given = dict(rounds=rounds, comparator=comparator, replay=replay)
    groups = {k: checked_group(_GROUPS[k], c, k) for k, c in given.items()}
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: got {seed!r}, must be an integer")
    return groups


class RoundLoop:
    """The iterative trainers' round loop, a mixin of a ``CoMLRLModule`` (module docstring).

    State: ``_round`` (0-based; ``num_rounds`` once done), ``_phase`` (``build`` or the module's own
    phases), ``_position`` (the build's next prompt index, or the module's position in its phase),
    ``_samples`` (joint responses generated for pairs, comparator's included), the round's pairs so
    far, the ``random`` pair-selection generator, the comparator's and the replay's states.
    """

    rounds: RoundsConfig
    comparator_config: ComparatorConfig
    replay_config: ReplayConfig

    def init_round_loop(self, groups: dict[str, Any], seed: int) -> None:
        """Keep the checked groups (also in ``hparams``) and build the comparator (it loads nothing; an
        unset ``comparator_api_key_env`` variable raises ValueError here, before any model loads)."""
        self.rounds, self.comparator_config = groups["rounds"], groups["comparator"]
        self.replay_config, self.seed = groups["replay"], seed
        for name, cfg in groups.items():
            self.hparams[name] = asdict(cfg)
        self.hparams["seed"] = seed
        self._hparams_initial = copy.deepcopy(self._hparams)
        self.comparator: Comparator | None = None
        if (
            self.comparator_config.comparator_policy != "history"
            or self.comparator_config.policy_checkpoint_dir
        ):
            self.comparator = self._make_comparator(None)
        else:
            self.comparator_config.check(self.num_agents)
        self.replay: PreferenceReplay | None = None
        self._pair_rng = random.Random(seed)
        self._round, self._phase, self._position, self._samples = 0, "build", 0, 0
        self._round_pairs: list[PreferencePair] = []
        self._round_open = False
        self._last_counts: list[int] | None = None
        """``[pairs built, pairs trained on, pairs in every shard]`` of the last round built."""
        self._step_start: dict[str, Any] | None = None
        """:meth:`step_start_state` of the ``training_step`` in progress (None between steps)."""

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

    def setup_round_loop(self) -> None:
        """Refuse several processes, then make the comparator (``history``: under
        ``<default_root_dir>/policy_checkpoints`` unless ``policy_checkpoint_dir``) and the replay
        (``<default_root_dir>/preference_replay`` unless ``preference_replay_dir``).

        Raises:
            RunFolderBusy: another running process holds the replay or history folder.
            ValueError: the strategy is ``fsdp2`` or ``trainer.world_size > 1`` (a round's pairs, replay shards and history folders
                are written by one process), or ``trainer.min_steps`` / ``min_epochs`` set (the module
                ends the fit after the last round; Lightning ignores that stop until the minimum, and
                a finished round loop steps nothing: with ``max_epochs=-1`` a ``min_steps`` run never
                ends); called from ``setup``, before any model loads.
        """
        for name in ("min_steps", "min_epochs"):
            value = getattr(self.trainer, name)
            if value not in (None, 0, -1):
                raise ValueError(
                    f"trainer.{name}: got {value!r}; {type(self).__name__} ends the fit after its last "
                    "round (rounds.num_rounds), so leave it unset"
                )
        strategy = self.trainer.strategy
        if isinstance(strategy, ShardedTeamStrategy):  # one process writes the pairs: nothing to shard
            raise ValueError(
                f"trainer.strategy: got {strategy.strategy_name!r} ({type(strategy).__name__}); "
                f"{type(self).__name__} runs in one process, where fsdp2 has nothing to shard: allowed a "
                "one-process strategy ('auto', the default)"
            )
        if self.trainer.world_size > 1:
            raise ValueError(
                f"{type(self).__name__}: {self.trainer.world_size} processes; a round's pairs, replay "
                "shards and history folders are written by one process: run it on one device "
                "(docs/iterative.md)"
            )
        root = self.trainer.default_root_dir
        if self.comparator is None:
            self.comparator = self._make_comparator(os.path.join(root, "policy_checkpoints"))
        history = self.comparator_config.policy_checkpoint_dir or os.path.join(root, "policy_checkpoints")
        if self.comparator_config.comparator_policy == "history":  # one run per folder (infra/run_lock.py)
            hold_run_folder(history, "comparator.policy_checkpoint_dir")
        directory = self.replay_config.preference_replay_dir or os.path.join(root, "preference_replay")
        hold_run_folder(directory, "replay.preference_replay_dir")
        if self.replay is None:
            self.replay = PreferenceReplay(self.replay_config, directory, self.seed, self.num_agents)

    def count_idle_step(self) -> None:
        """Count a step that moved no agent (a build step, a reward-model step) as the batch's
        ``num_agents`` skipped steps, so ``every_n_train_steps`` checkpoints fall inside it too."""
        opts, _ = self.agent_optimizers()
        for opt in opts:
            self._count_skipped_step(opt)

    def build_step(self, env: DecPOMDP, preference: PreferenceConfig) -> bool:
        """One dataloader batch of the round's walk over the training set, in dataset order (the batch
        Lightning passes only paces the walk, as CoMLRL walks its dataset; ``limit_train_batches`` caps
        it): current and comparator candidates scored by ``env``'s reward and paired
        (:func:`~comlrl_lightning.preference.comparator.candidates.build_candidates`). Returns whether the walk
        is done (then call :meth:`finish_build`)."""
        assert self.comparator is not None
        if not self._round_open:  # also after a resume inside a build (current_copy copies again)
            self.comparator.begin_round(self._round)
            self._round_open = True
            rank_zero_info(f"{type(self).__name__}: round {self._round + 1}/{self.rounds.num_rounds}: building its "
                           f"pairs (current vs {self.comparator_config.comparator_policy})")  # fmt: skip
        loader = self.trainer.train_dataloader
        dataset, size = loader.dataset, max(int(getattr(loader, "batch_size", 1) or 1), 1)
        walk = len(dataset)
        if math.isfinite(self.trainer.num_training_batches):
            walk = min(walk, int(self.trainer.num_training_batches) * size)
        end = min(self._position + size, walk)
        episodes = [dataset[i] for i in range(self._position, end)]
        p, c = preference, self.comparator_config
        built = build_candidates(
            self.team,
            env,
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
        self.count_idle_step()
        n = len(episodes)
        self.log(M.REWARD, built.current_rewards.mean().to(self.device), prog_bar=True, batch_size=n)
        self.log_round(n)
        return self._position >= walk

    def finish_build(self) -> list[PreferencePair]:
        """The round's replay shard and the replay's pick (returned: the round's training pairs);
        the build's state is reset and ``pairs/*`` logged."""
        assert self.replay is not None
        current, r = self._round_pairs, self._round
        self.replay.add_round(r, current)
        train = self.replay.select(r, current)
        self._last_counts = [len(current), len(train), self.replay.counts()[1]]
        self.log_counts()
        if not train:  # ties never pair: a reward that scores every candidate alike forms none
            rank_zero_warn(
                f"{type(self).__name__}: round {r} formed 0 training pairs ({len(current)} built; ties "
                f"never pair): it trains nothing; does the reward tell the preference.preference_num_"
                "candidates joint responses of a prompt apart?"
            )
        self._round_pairs, self._position = [], 0
        return train

    def close_round(self) -> None:
        """The comparator closes the round (``history`` saves the policy); the next round's build
        begins, or the fit stops after the last round."""
        assert self.comparator is not None
        self.comparator.end_round(self._round)
        self._round_open = False
        self._round, self._phase, self._position = self._round + 1, "build", 0
        if self._round >= self.rounds.num_rounds:
            self.trainer.should_stop = True

    def warn_if_unfinished(self) -> None:
        """Warn (from the module's ``on_train_end``) when the fit ended before the last round: a
        trainer limit (``max_steps``, ``max_epochs``, ``max_time``) stopped it, not the round loop."""
        if self._round < self.rounds.num_rounds:
            rank_zero_warn(
                f"{type(self).__name__}: the fit ended in round {self._round} of rounds.num_rounds="
                f"{self.rounds.num_rounds} (phase {self._phase!r}, position {self._position}): a trainer "
                "limit (max_steps, max_epochs or max_time) stopped it before the last round; resume with "
                "fit --ckpt_path <a checkpoint of this run> and a larger limit (or max_steps: -1)"
            )

    def refuse_if_nothing_trained(self) -> None:
        """Raise (from the module's ``on_train_end``) when every round ran and none formed a pair: the
        fit trained nothing, which must not end as a success (a fit a trainer limit cut short is
        reported by :meth:`warn_if_unfinished` and each empty round's warning instead).

        Raises:
            RuntimeError: naming the rounds and the fields that decide the pairs."""
        assert self.replay is not None
        if self._round >= self.rounds.num_rounds and self.replay.counts()[1] == 0:
            raise RuntimeError(
                f"preference.pair_selection: {type(self).__name__} formed 0 preference pairs in {self._round} "
                f"round(s), so it trained nothing (ties never pair: the reward scored every joint response "
                "of a prompt alike); check the reward, or raise preference.preference_num_candidates"
            )

    def log_counts(self) -> None:
        """``pairs/*`` of the last round built, at every step from its end on (so that no
        ``log_every_n_steps`` drops a once-a-round value)."""
        if self._last_counts is not None:
            for name, value in zip((M.PAIRS_CURRENT, M.PAIRS_TRAIN, M.PAIRS_TOTAL), self._last_counts):
                self.log(name, float(value), batch_size=1)

    def log_round(self, batch_size: int) -> None:
        """``iter/round``, ``iter/samples``, the comparator's counters and ``pairs/*``."""
        assert self.comparator is not None
        self.log(M.ROUND, float(self._round), batch_size=batch_size)
        self.log(M.SAMPLES, float(self._samples), batch_size=batch_size)
        for name, value in self.comparator.metrics().items():
            self.log(name, value, batch_size=batch_size)
        self.log_counts()

    # ------------------------------------------------------------------ checkpoint
    def begin_step(self) -> None:
        """Call first in ``training_step`` (and :meth:`end_step` when it returns): until then a
        checkpoint holds the state the step started from (:meth:`step_start_state`), not the half-done
        live one. ``InterruptCheckpoint`` abandons a step at a SIGTERM and saves the counters, loop and
        RNG of the batch end before it; the round's state must be that batch end's too (else the
        comparator's draws, the pairs' RNG or a reward-model epoch part-way through are saved)."""
        self._step_start = self.step_start_state()

    def end_step(self) -> None:
        self._step_start = None

    def step_start_state(self) -> dict[str, Any]:
        """The checkpoint entries a step changes, as they are now (the module's own added by it)."""
        return {"iterative": self.round_loop_state()}

    def saved_round_loop_state(self) -> dict[str, Any]:
        """``checkpoint["iterative"]``: the step start's while a step is in progress, else the live one."""
        return self.round_loop_state() if self._step_start is None else self._step_start["iterative"]

    def round_loop_state(self) -> dict[str, Any]:
        """What ``checkpoint["iterative"]`` holds: the round, phase, position, sample count, the last
        round's counts, the pairs built so far, the ``random`` generator, the comparator's state and
        the replay's (its shards stay on disk). Never the API key."""
        assert self.comparator is not None and self.replay is not None
        version, internal, gauss = self._pair_rng.getstate()
        return {
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

    def load_round_loop_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`round_loop_state` (after ``setup``: the comparator and the replay exist)."""
        assert self.comparator is not None and self.replay is not None
        self._round, self._phase, self._position = state["round"], state["phase"], state["position"]
        self._samples, self._last_counts = state["samples"], state.get("last_counts")
        self._round_pairs = [PreferencePair.from_json(d, "checkpoint") for d in state["round_pairs"]]
        version, internal, gauss = state["pair_rng"]
        self._pair_rng.setstate((version, tuple(internal), gauss))
        self.comparator.load_state_dict(state["comparator"])
        self.replay.load_state_dict(state["replay"])
        self._round_open = False
