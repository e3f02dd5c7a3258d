"""MARLHF: learn a joint reward model from preference pairs, then run online multi-agent RL against it
(CoMLRL ``preference/marlhf.py``, ``MARLHFTrainer``).

Features:
    - phase 1 (the reward model): preference pairs built from rollouts of the initial policy
      (:func:`~comlrl_lightning.preference.selection.build_preference_pairs`: ``preference_num_candidates``
      joint responses per training prompt, scored by the task reward, ``pair_selection``), or read
      from a user's ``jsonl`` file (``pair_source.pairs_path``: human preferences); a joint reward
      model (:mod:`~comlrl_lightning.preference.joint_reward_model`: backbone + scalar head on the
      last non-pad token) trained with the Bradley–Terry loss, held-out loss and accuracy logged;
      saved as an HF ``AutoModelForSequenceClassification`` folder with the pairs it learned from;
    - phase 2 (RL): the chosen RL algorithm (``rl_algorithm``: :data:`RL_ALGORITHM`) trains the agents
      with the frozen reward model as the shared reward; validation keeps the task reward (CoMLRL);
    - one turn only (CoMLRL's rule): ``num_turns > 1`` is refused before any model loads.

The Lightning shape: ``MARLHF(rl_algorithm=..., ...)`` *is* the chosen module (``MAGRPO``,
``MAREINFORCE``, ``MARLOO``, ``MAReMax``, ``IAC`` or ``MAAC``): it returns an instance of a subclass of
both (``MARLHFMAGRPO(MARLHF, MAGRPO)``, ...), so phase 2 is that module's own ``training_step``,
optimizers, validation and ``StepOutput``, unchanged; MARLHF only swaps the reward of training
rollouts (:meth:`rollout_env`) and adds phase 1. One ``fit`` (one CLI command) runs both: phase 1 in
``on_train_start``, after any checkpoint is restored, before the first batch. The reward model is
loaded in ``configure_model`` into ``reward_models``, so the strategy places it (``reward_devices``);
its own AdamW is not counted in ``global_step`` (``max_steps`` counts the agents' steps only).

Saving and resuming: phase 1 writes its state after every epoch (the pairs, weights, optimizer,
pair order and global RNG states) to ``<reward_model_dir>/phase1_state.pt``; a run started again
with the same ``reward_model_dir`` (a checkpoint written during phase 1 records it) continues from
the last epoch, bit-exact. The finished model is saved as an HF folder (``marlhf.json`` last, marking
it done); a later run given that folder loads it instead of training again, only when the config the
folder records is its own (``reward_model_folder.py``: else an error names each difference). The trained reward model
is the exception to "frozen reward-model weights are not written into checkpoints": a phase-2
checkpoint keeps its weights (``reward_models.<j>.*``), so it resumes without the folder.

Not supported: ``num_turns > 1``; no pairs (every candidate tied) is an error, not CoMLRL's silent return.

A SIGTERM / Ctrl+C in phase 1 (under ``InterruptCheckpoint``) abandons it at once: before the pairs
are saved nothing is; after, the checkpoint resumes from the last finished reward-model epoch.
"""

from __future__ import annotations

import copy
import inspect
import os
from dataclasses import asdict, is_dataclass
from typing import Any

import torch
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from comlrl_lightning.algorithms.base import CoMLRLModule
from comlrl_lightning.algorithms.iac import IAC
from comlrl_lightning.algorithms.maac import MAAC
from comlrl_lightning.algorithms.magrpo import MAGRPO, MAREINFORCE, MARLOO, MAReMax
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.choices import Choice
from comlrl_lightning.core.config import (
    AdvantageConfig,
    LossConfig,
    PlacementConfig,
    RolloutConfig,
    SamplingConfig,
)
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.envs.reward_model import GOLD_KEY, GoldRewardProbe, RewardModelReward, position_limit
from comlrl_lightning.infra.interrupts import interruptible
from comlrl_lightning.preference.joint_reward_model import RewardModelConfig, load_reward_backbone
from comlrl_lightning.preference.pair_source import PairSourceConfig, collect_pairs, config_group
from comlrl_lightning.preference.pairs import PreferencePair, read_pairs
from comlrl_lightning.preference.reward_model_folder import reward_phase, reward_recipe
from comlrl_lightning.preference.selection import PreferenceConfig
from comlrl_lightning.team.agents import AgentSpec
from comlrl_lightning.team.critics import ActorCriticRolloutConfig, CriticConfig, CriticSpec

RL_ALGORITHM = Choice(
    "rl_algorithm",
    {
        "magrpo": "MAGRPO (`advantage.advantage_mode` as given, default `mean`)",
        "mareinforce": "MAREINFORCE: MAGRPO with raw returns, no baseline (`advantage_mode: raw`)",
        "marloo": "MARLOO: MAGRPO with the leave-one-out baseline (`advantage_mode: rloo`)",
        "maremax": "MAReMax: MAGRPO with the group-max baseline (`advantage_mode: max`)",
        "iac": "IAC: one critic per agent (`critics`, `critic`)",
        "maac": "MAAC: one centralised critic",
    },
)
"""The RL algorithm of MARLHF's phase 2 (CoMLRL ``MARLHFConfig.rl_algorithm``)."""
_DEFAULTS = (RewardModelConfig(), PreferenceConfig(), PairSourceConfig())
"""The signature defaults (``--print_config`` lists every field); never mutated: ``__init__`` copies."""
_HAVE = {"advantage": "the MAGRPO family", "critics": "iac, maac", "critic": "iac, maac"}
_STATE_FILE = "phase1_state.pt"
_PHASE1 = "MARLHF phase 1 (preference pairs, reward-model epochs)"


class _ByAlgorithm(type(CoMLRLModule)):
    """``MARLHF(rl_algorithm=a, ...)`` builds a ``VARIANTS[a]`` (a metaclass ``__call__``, not ``__new__``:
    jsonargparse then still reads ``MARLHF.__init__``'s typed signature for the CLI)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.rl_base is CoMLRLModule:  # MARLHF, MARLHFIter: no RL module chosen yet
            algorithm = kwargs.get("rl_algorithm", args[2] if len(args) > 2 else "magrpo")
            RL_ALGORITHM.check(algorithm)
            cls = cls.variants[algorithm]
        return super().__call__(*args, **kwargs)


class MARLHF(CoMLRLModule, metaclass=_ByAlgorithm):
    """Joint reward model from preference pairs, then online RL against it (module docstring).

    Args:
        agents: one :class:`AgentSpec` (or model string) per agent, or one broadcast to ``num_agents``.
        num_agents: number of agents; default ``len(agents)``.
        rl_algorithm: phase 2's algorithm, one of :data:`RL_ALGORITHM`.
        reward_model: the reward model and its training (:class:`RewardModelConfig`).
        preference: how pairs are built from rollouts (:class:`~comlrl_lightning.preference.selection.PreferenceConfig`).
        pair_source: which prompts, or a user's pair file (:class:`PairSourceConfig`).
        rollout, advantage, loss, sampling, placement, critics, critic, learning_rate, val_sampling:
            phase 2's algorithm's own arguments, as in its config (None: its default); ``advantage``
            only for the MAGRPO family, ``critics``/``critic`` only for IAC/MAAC.
        optimizer, scheduler, env: see :class:`CoMLRLModule` (the agents' optimizers).

    Raises:
        ValueError: a bad value of any field (naming it), ``num_turns > 1``, or a pair file that is not
            valid or whose agent count differs, before any model is loaded.
        FileNotFoundError: ``pair_source.pairs_path`` does not exist.
    """

    rl_base: type[CoMLRLModule] = CoMLRLModule
    """The RL module this variant is (set by each ``MARLHF<algorithm>`` class)."""
    variants: dict[str, type[MARLHF]]
    """``rl_algorithm`` -> the class built (:data:`VARIANTS`; iterative MARLHF's own)."""

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_agents: int | None = None,
        rl_algorithm: RL_ALGORITHM.literal = "magrpo",
        reward_model: RewardModelConfig = _DEFAULTS[0],
        preference: PreferenceConfig = _DEFAULTS[1],
        pair_source: PairSourceConfig = _DEFAULTS[2],
        rollout: RolloutConfig | ActorCriticRolloutConfig | None = None,
        advantage: AdvantageConfig | None = None,
        loss: LossConfig | None = None,
        sampling: SamplingConfig | None = None,
        placement: PlacementConfig | None = None,
        critics: list[CriticSpec] | CriticSpec | None = None,
        critic: CriticConfig | None = None,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        learning_rate: float = 5e-6,
        val_sampling: bool = False,
        env: DecPOMDP | None = None,
    ) -> None:
        RL_ALGORITHM.check(rl_algorithm)
        if self.variants[rl_algorithm] is not type(self):
            raise ValueError(
                f"rl_algorithm: got {rl_algorithm!r} for {type(self).__name__}; build it as MARLHF(rl_algorithm=...)"
            )
        rcfg = config_group(RewardModelConfig, reward_model, "reward_model")
        pcfg = config_group(PreferenceConfig, preference, "preference")
        scfg = config_group(PairSourceConfig, pair_source, "pair_source")
        given = dict(rollout=rollout, advantage=advantage, loss=loss, sampling=sampling, placement=placement)
        given.update(critics=critics, critic=critic)
        taken = inspect.signature(self.rl_base.__init__).parameters
        for name, value in given.items():
            if value is not None and name not in taken:
                raise ValueError(
                    f"{name}: rl_algorithm={rl_algorithm!r} ({self.rl_base.__name__}) has no {name!r}; leave it "
                    f"out, or pick an rl_algorithm that has one ({_HAVE[name]})"
                )
        rl = {k: asdict(v) if is_dataclass(v) else v for k, v in given.items() if v is not None}
        knobs = dict(
            optimizer=optimizer, scheduler=scheduler, learning_rate=learning_rate, val_sampling=val_sampling
        )
        super().__init__(agents=agents, num_agents=num_agents, env=env, **knobs, **rl)
        if self.rollout_config.num_turns != 1:
            raise ValueError(
                f"rollout.num_turns: got {self.rollout_config.num_turns}; MARLHF's reward model scores one "
                "turn's joint action (CoMLRL allows num_turns=1 only): use 1"
            )
        if scfg.pairs_path is not None:
            if not os.path.isfile(scfg.pairs_path):
                raise FileNotFoundError(f"pair_source.pairs_path: no file at {scfg.pairs_path!r}")
            read_pairs(scfg.pairs_path, self.num_agents)  # a bad line fails here, before any model loads
        self.rl_algorithm, self.reward_config, self.preference_config = rl_algorithm, rcfg, pcfg
        self.pair_source = scfg
        self._joint_rm: RewardModelReward | None = None
        self._rm_index: int | None = None
        self._rl_env: tuple[DecPOMDP, DecPOMDP] | None = None  # (the task env, its learned-reward copy)
        self._reward_ready = False
        self._reward_dir: str | None = rcfg.reward_model_dir
        self.reward_info: dict[str, Any] = {}
        """After phase 1: the saved folder's ``marlhf.json`` (number of pairs, per-epoch metrics, ...)."""
        # what load_from_checkpoint rebuilds from: the RL module's saved arguments and MARLHF's own
        self._hparams = AttributeDict(
            {
                **self.hparams,
                "rl_algorithm": rl_algorithm,
                "reward_model": asdict(rcfg),
                "preference": asdict(pcfg),
            }
        )
        self._hparams_initial = copy.deepcopy(self._hparams)

    # ------------------------------------------------------------------ the reward model
    @property
    def joint_reward_model(self) -> RewardModelReward:
        """The learned reward as a reward function (its model is ``reward_models[j]``)."""
        if self._joint_rm is None:
            raise RuntimeError("MARLHF.joint_reward_model: configure_model has not run")
        return self._joint_rm

    def configure_model(self) -> None:
        """The RL module's models, then the reward model (a one-label sequence classifier from
        ``reward_model.reward_model``, default agent 0's model) appended to ``reward_models``."""
        super().configure_model()
        if self._joint_rm is not None:
            return
        cfg = self.reward_config
        source = cfg.reward_model or self.specs[0].model
        model, tok = load_reward_backbone(source)
        rm = RewardModelReward(
            model=source,
            kind="sequence_classification",
            template=cfg.reward_template,
            batch_size=cfg.reward_batch_size,
            max_length=position_limit(model, cfg.reward_max_length),
            name="joint_reward_model",
            observe=self._observe,
        )
        rm._model, rm._tokenizer = model, tok
        self._rm_index = len(self.reward_models)
        self.reward_models.append(model)
        self._joint_rm = rm

    def _observe(self, episode: Episode, agent: int) -> str:  # the prompts the reward model reads
        return self.env.observe(episode, agent)

    def rollout_env(self, evaluation: bool) -> DecPOMDP:
        """Training rollouts act in the env with the learned reward; validation keeps the task reward."""
        env = self.env
        if evaluation:
            return env
        if not self._reward_ready:
            raise RuntimeError("MARLHF: a training rollout before the reward model was trained")
        if self._rl_env is None or self._rl_env[0] is not env:  # one copy (and probe) per task env
            reward: Any = self.joint_reward_model
            if self.reward_config.log_task_reward:  # the task reward beside it, logged, never trained on
                reward = GoldRewardProbe(reward, env.reward_fn)
            self._rl_env = (env, DecPOMDP(env.formatters, reward, env.transition_fn))
        return self._rl_env[1]

    def training_step(self, batch: list[Episode], batch_idx: int) -> Any:
        """The RL module's step; with ``reward_model.log_task_reward`` also logs
        :data:`~comlrl_lightning.core.metrics.MARLHF_TASK_REWARD` (the task reward of its joint actions)."""
        out = super().training_step(batch, batch_idx)
        gold = (
            None if out is None else out.reward_components.get(f"{self.joint_reward_model.name}/{GOLD_KEY}")
        )
        if gold is not None and not gold.float().isnan().all():  # all NaN: the task reward failed throughout
            mean = gold.float().nanmean().to(self.device)
            self.log(M.MARLHF_TASK_REWARD, mean, batch_size=out.num_episodes, sync_dist=True)
        return out

    @property
    def reward_model_dir(self) -> str:
        """Where phase 1 saves the model (``reward_model.reward_model_dir``, else
        ``<trainer.log_dir>/reward_model``)."""
        if self._reward_dir is None:
            root = self.trainer.log_dir or self.trainer.default_root_dir
            self._reward_dir = os.path.join(root, "reward_model")
        return self._reward_dir

    def on_train_start(self) -> None:
        """The RL module's start (placement, RNG of a resumed run), then phase 1 unless done."""
        super().on_train_start()
        if not self._reward_ready:
            self.fit_reward_phase()
        self.reward_models[self._rm_index].eval().requires_grad_(False)

    def fit_reward_phase(self) -> None:
        """Phase 1 in :attr:`reward_model_dir`
        (:func:`~comlrl_lightning.preference.reward_model_folder.reward_phase`)."""
        rm, folder = self.joint_reward_model, self.reward_model_dir
        args = (
            self.reward_models[self._rm_index],
            rm._tokenizer,
            rm,
            self.reward_config,
            folder,
            self.preference_pairs,
        )
        with interruptible(self.trainer, _PHASE1, lambda: os.path.exists(os.path.join(folder, _STATE_FILE))):
            self.reward_info = reward_phase(
                *args, self._log_reward, self._after_reward_epoch, reward_recipe(self)
            )
        self._reward_ready = True

    def after_reward_epoch(self, epoch: int) -> None:
        """Called after each reward-model epoch, once its state is saved (a hook; default: nothing)."""

    def _after_reward_epoch(self, epoch: int) -> None:
        self.after_reward_epoch(epoch)
        self.stop_if_signalled()  # a SIGTERM / Ctrl+C in phase 1 stops the fit once the epoch is saved

    def _log_reward(self, metrics: dict[str, float], epoch: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step=epoch)

    def preference_pairs(self) -> list[PreferencePair]:
        """Phase 1's pairs (:func:`~comlrl_lightning.preference.pair_source.collect_pairs`)."""
        rows = getattr(getattr(self.trainer, "datamodule", None), "train_rows", None)
        return collect_pairs(
            self.pair_source, self.preference_config, self.env, rows, self.actors, self.num_agents
        )

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The RL module's checkpoint, plus the trained reward model's weights (``reward_models.<j>.*``)
        and ``checkpoint["marlhf"]`` (phase 1 done, ``reward_model_dir``, :attr:`reward_info`).

        Raises:
            FloatingPointError: as the RL module's, or the trained reward model holds NaN/inf.
        """
        super().on_save_checkpoint(checkpoint)
        checkpoint["marlhf"] = {
            "reward_phase_done": self._reward_ready,
            "reward_model_dir": self._reward_dir,
            "reward_info": self.reward_info,
        }
        if self._reward_ready:
            prefix = f"reward_models.{self._rm_index}."
            for name, value in self.reward_models[self._rm_index].state_dict().items():
                if value.is_floating_point() and not torch.isfinite(value).all():
                    raise FloatingPointError(
                        f"reward model: {name!r} holds NaN/inf; refusing to write a checkpoint"
                    )
                checkpoint["state_dict"][prefix + name] = value

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore as the RL module, then put the saved reward-model weights back (the base class
        replaces every ``reward_models.*`` entry with the loaded models' own)."""
        info = checkpoint.get("marlhf", {})
        state = checkpoint.get("state_dict") or {}
        prefix = f"reward_models.{self._rm_index}."
        done = bool(info.get("reward_phase_done"))
        saved = {k: v for k, v in state.items() if k.startswith(prefix)} if done else {}
        super().on_load_checkpoint(checkpoint)
        state.update(saved)
        self._reward_ready = done
        self._reward_dir = self.reward_config.reward_model_dir or info.get("reward_model_dir")
        self.reward_info = info.get("reward_info") or {}


class MARLHFMAGRPO(MARLHF, MAGRPO):
    """MARLHF whose phase 2 is :class:`MAGRPO` (``MARLHF(rl_algorithm="magrpo")``)."""

    rl_base = MAGRPO


class MARLHFMAREINFORCE(MARLHF, MAREINFORCE):
    """MARLHF whose phase 2 is :class:`MAREINFORCE`."""

    rl_base = MAREINFORCE


class MARLHFMARLOO(MARLHF, MARLOO):
    """MARLHF whose phase 2 is :class:`MARLOO`."""

    rl_base = MARLOO


class MARLHFMAReMax(MARLHF, MAReMax):
    """MARLHF whose phase 2 is :class:`MAReMax`."""

    rl_base = MAReMax


class MARLHFIAC(MARLHF, IAC):
    """MARLHF whose phase 2 is :class:`IAC`."""

    rl_base = IAC


class MARLHFMAAC(MARLHF, MAAC):
    """MARLHF whose phase 2 is :class:`MAAC`."""

    rl_base = MAAC


VARIANTS: dict[str, type[MARLHF]] = {
    "magrpo": MARLHFMAGRPO,
    "mareinforce": MARLHFMAREINFORCE,
    "marloo": MARLHFMARLOO,
    "maremax": MARLHFMAReMax,
    "iac": MARLHFIAC,
    "maac": MARLHFMAAC,
}
"""``rl_algorithm`` -> the class ``MARLHF(...)`` returns an instance of."""
MARLHF.variants = VARIANTS
