"""What every algorithm shares: the team, the rollout, placement, validation, and the RNG states a
checkpoint needs for an exact resume (one optimizer per agent: the parent class, ``optimization.py``).

An algorithm subclasses :class:`CoMLRLModule`, passes its config groups to ``__init__``, and writes
``training_step`` (the corridor: :meth:`CoMLRLModule.rollout` → its own values or advantages → one
update per agent → :class:`~comlrl_lightning.core.records.StepOutput`). The rollout is shared: the
tree of turns acted by :attr:`CoMLRLModule.actors` (the seam that says who generates what), returns,
then the algorithm's :meth:`CoMLRLModule.score_turns`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from comlrl_lightning.algorithms.checkpointing import CheckpointHooks
from comlrl_lightning.algorithms.optimization import AgentOptimization
from comlrl_lightning.core.evaluation import repeat_episodes, validation_metrics
from comlrl_lightning.core.records import Turn
from comlrl_lightning.core.rollout import Actors, RolloutPlan, compute_returns, rollout_tree
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.envs.reward_model import reward_models_of
from comlrl_lightning.infra import resume_config, run_lock
from comlrl_lightning.infra.placement import (
    optimizer_state_to_param_devices,
    place_module,
    plan_devices,
    resolve_devices,
    visible_gpus,
)
from comlrl_lightning.infra.rng import (
    set_rng_states,
)
from comlrl_lightning.infra.strategy import AgentParallelStrategy
from comlrl_lightning.team.agents import AgentSpec, validate_spec
from comlrl_lightning.team.engine import check_engine_team
from comlrl_lightning.team.team import Team


class CoMLRLModule(CheckpointHooks, AgentOptimization):
    """Base LightningModule of a cooperative multi-agent algorithm (manual optimisation).

    Args:
        specs: one :class:`AgentSpec` per agent (see :func:`~comlrl_lightning.team.agents.normalize_agents`).
        groups: the algorithm's config groups by init-argument name; ``rollout`` (kept as
            :attr:`rollout_config`, its budget checked), ``sampling`` (the team's sampling knobs,
            ``AgentSpec.generation`` overriding per agent) and ``placement`` (where the agents live)
            are read here.
        optimizer: per-agent optimizer factory; default ``AdamW(lr=learning_rate)``.
        scheduler: optional per-agent LR scheduler factory, stepped after every optimizer step.
        learning_rate: learning rate of the default optimizer (> 0; CoMLRL ``agent_learning_rate``).
        val_sampling: validate with one sampled completion per agent instead of greedy decoding.
        env: the Dec-POMDP; default: the datamodule's ``env``.

    Raises:
        ValueError: a bad spec, device, budget or learning rate, before any model is loaded.
    """

    def __init__(
        self,
        specs: list[AgentSpec],
        groups: dict[str, Any],
        *,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        learning_rate: float = 5e-6,
        val_sampling: bool = False,
        env: DecPOMDP | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        for i, spec in enumerate(specs):
            validate_spec(spec, i, len(specs))
        if learning_rate <= 0:
            raise ValueError(f"learning_rate: got {learning_rate!r}, must be > 0")
        rollout, sampling, placement = groups["rollout"], groups["sampling"], groups["placement"]
        rollout.check_budget(len(specs))
        placement.check(len(specs))
        # parse devices (and AgentSpec.device) and check shared agents' devices now, before any model loads
        owners = [i if s.share_weights_with is None else s.share_weights_with for i, s in enumerate(specs)]
        overrides = [s.device for s in specs]
        resolve_devices(
            placement.agent_devices, len(specs), num_gpus=None, owners=owners, overrides=overrides
        )
        self.team = self.build_team(specs, sampling)
        check_engine_team(self.team.specs, self.team.sampling, placement)  # generation_backend: vllm
        self.rollout_config, self.sampling_config, self.placement = rollout, sampling, placement
        self.learning_rate, self.val_sampling = learning_rate, val_sampling
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self._env = env
        self.skipped_steps: list[int] = [0] * len(specs)
        """Per agent, optimizer steps skipped for non-finite loss or gradients (see :meth:`step_agent`)."""
        self.fabric_schedulers: list[Any] | None = None
        """Per-agent LR schedulers when a Fabric drives this module (see :meth:`agent_optimizers`)."""
        # registered here so checkpoints, device moves and strategies see them (the team holds the same lists)
        self.agents = self.team.agents
        self.reference_models = self.team.reference_models
        self.reward_models = nn.ModuleList()
        """The env's frozen reward models (:func:`~comlrl_lightning.envs.reward_model.reward_models_of`),
        loaded by :meth:`configure_model` so the strategy places them (``reward_devices``). Never
        written into a Lightning checkpoint: :meth:`on_save_checkpoint` drops them and a resumed run
        reloads them from their source (``RewardModelReward.model``)."""

    # ------------------------------------------------------------------ the team
    def build_team(self, specs: list[AgentSpec], sampling: Any) -> Team:
        """The team factory: a :class:`Team` of ``specs`` (each agent built by its kind,
        :meth:`Team.agent_kind`). Override to return a Team subclass with other kinds of agents;
        runs in ``__init__``, before any model loads (nothing is loaded here)."""
        return Team(specs, sampling)

    @property
    def num_agents(self) -> int:
        return self.team.num_agents

    @property
    def specs(self) -> list[AgentSpec]:
        return self.team.specs

    @property
    def tokenizers(self) -> list[Any]:
        return self.team.tokenizers

    @property
    def concurrent_agents(self) -> bool | None:
        """See :attr:`Team.concurrent`."""
        return self.team.concurrent

    @concurrent_agents.setter
    def concurrent_agents(self, value: bool | None) -> None:
        self.team.concurrent = value

    def save_config(self, groups: dict[str, Any], ignore: Sequence[str]) -> None:
        """``save_hyperparameters`` with the agents and config groups as plain dicts (YAML-safe and
        accepted back by ``__init__``, so ``load_from_checkpoint`` rebuilds the same module)."""
        self.save_hyperparameters(ignore=["agents", "env", "optimizer", "scheduler", *ignore])
        self.hparams["agents"] = [asdict(s) for s in self.specs]
        # forwarded through **kwargs, a default is not among the init args Lightning collects
        self.hparams.update(learning_rate=self.learning_rate, val_sampling=self.val_sampling)
        for name, cfg in groups.items():
            self.hparams[name] = asdict(cfg)
        # what loggers write (hparams.yaml) sees them too
        self._hparams_initial = copy.deepcopy(self._hparams)

    @property
    def uses_reference_model(self) -> bool:
        """Whether :meth:`configure_model` also keeps a frozen reference copy of each agent."""
        return False

    @property
    def env(self) -> DecPOMDP:
        """The Dec-POMDP: the one given to ``__init__``, else ``trainer.datamodule.env``."""
        if self._env is not None:
            return self._env
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or getattr(dm, "env", None) is None:
            raise RuntimeError(
                f"{type(self).__name__}.env: pass env=... or fit with a DecPOMDPDataModule (which has .env)"
            )
        return dm.env

    @property
    def env_agents(self) -> tuple[int, str]:
        """``(formatters the env must have, the setting that says so)``: one per agent
        (``model.num_agents``); a centralized module's roles (``model.num_roles``) instead."""
        return self.num_agents, "model.num_agents"

    def setup(self, stage: str) -> None:
        expected, name = self.env_agents
        if self.env.num_agents != expected:
            raise ValueError(
                f"data.formatters: the env has {self.env.num_agents} formatters (one per agent) but "
                f"{name}={expected}; give one formatter per agent"
            )
        strategy = self.trainer.strategy
        if hasattr(strategy, "check_team"):  # the sharded strategy (fsdp2): refusals before any model loads
            strategy.check_team(self)
        if self.placement.parallel_training == "mp" and not isinstance(strategy, SingleDeviceStrategy):
            raise ValueError(
                f"parallel_training='mp' runs the team in one process; the trainer's strategy is "
                f"{type(strategy).__name__}: use strategy='agent_parallel' (or parallel_training='none')"
            )
        distinct = sum(
            kind.owns_parameters for kind in self.team.kinds
        )  # agents training their own parameters
        if (
            isinstance(strategy, DDPStrategy)
            and distinct > 1
            and not strategy._ddp_kwargs.get("find_unused_parameters")
        ):
            raise ValueError(
                "each agent's backward uses only that agent's parameters, so DDP needs "
                "find_unused_parameters: use strategy='ddp_find_unused_parameters_true' "
                "(or DDPStrategy(find_unused_parameters=True))"
            )
        if stage == "fit":  # one run per checkpoint folder (infra/run_lock.py), before any model loads
            run_lock.hold_checkpoint_folders(self.trainer)

    def teardown(self, stage: str) -> None:
        run_lock.release_run_folders()  # after an exception the locks stay with the process until it ends

    def configure_model(self) -> None:
        """Load every agent (and reference copy) and every reward model of the env's reward (listed
        in :attr:`reward_models` for the strategy to place) once; idempotent across stages."""
        self.team.load(with_reference=self.uses_reference_model)
        env = (
            self._env
            if self._env is not None
            else getattr(getattr(self._trainer, "datamodule", None), "env", None)
        )
        if env is not None and not len(self.reward_models):
            self.reward_models.extend(rm.load() for rm in reward_models_of(env.reward_fn))

    # ------------------------------------------------------------------ placement
    def _place_team(self) -> None:
        """``parallel_training="mp"`` under a strategy that does not place agents itself: place the team
        (the strategy's planning functions) and move optimizer state next to each agent's parameters
        (after a resume Lightning put it on the root device). Idempotent."""
        if self.placement.parallel_training != "mp" or self._trainer is None:
            return
        strategy = self.trainer.strategy
        if isinstance(strategy, AgentParallelStrategy):
            return
        plan = plan_devices(
            self,
            self.placement.agent_devices,
            root=strategy.root_device,
            num_gpus=visible_gpus(strategy.accelerator),
        )
        place_module(self, plan)
        for opt in self.trainer.optimizers:
            optimizer_state_to_param_devices(opt)

    def on_fit_start(self) -> None:
        """Check ``max_steps``, place the team, then flag the frozen reference copies and reward models
        as training until :meth:`on_train_start`: Lightning warns about every module in eval mode
        between the two hooks (``Found N module(s) in eval mode``), and these are in eval mode by
        design (no dropout while they score); a module a user leaves in eval mode is still reported."""
        self._check_max_steps()
        self._place_team()
        self._given_learning_rates = resume_config.capture_learning_rates(self.trainer)  # before a restore
        self.reference_models.train()
        self.reward_models.train()

    def on_train_epoch_start(self) -> None:
        self._place_team()

    def configure_callbacks(self) -> list[Callback]:
        """A ``FitSummary`` and a ``TeamFirstLayout`` (:mod:`~comlrl_lightning.callbacks`), each when the
        trainer has none: every fit ends with its key scalars' start -> end, the team's curves first."""
        from comlrl_lightning.callbacks.fit_summary import FitSummary
        from comlrl_lightning.callbacks.scalar_layout import TeamFirstLayout

        have = self.trainer.callbacks if self._trainer is not None else []
        return [cls() for cls in (FitSummary, TeamFirstLayout) if not any(isinstance(c, cls) for c in have)]

    def stop_if_signalled(self) -> None:
        """Raise Lightning's ``SIGTERMException`` if the trainer noted a SIGTERM (with
        ``InterruptCheckpoint``, a Ctrl+C too): for long work outside a batch, where Lightning does not
        look (it checks at batch ends), e.g. MARLHF's reward phase between its epochs."""
        if self._trainer is not None and self.trainer.received_sigterm:
            raise SIGTERMException

    def on_validation_start(self) -> None:
        self._place_team()

    # ------------------------------------------------------------------ the rollout (the team's seam)
    @property
    def actors(self) -> Actors:
        """Who generates what in a rollout (:class:`~comlrl_lightning.core.rollout.Actors`): the team,
        each agent sampling K completions of its own history. Override to change how the team acts."""
        return self.team

    def rollout(self, episodes: Sequence[Episode], evaluation: bool = False) -> list[Turn]:
        """Tree rollout of ``episodes`` by :attr:`actors` with returns filled in, then :meth:`score_turns`
        (MAGRPO: advantages). ``evaluation``: one completion per agent per turn (one path per episode:
        ``validation_step`` repeats each episode ``num_generations_eval`` times), greedy when
        :attr:`greedy_validation`."""
        plan = RolloutPlan.of(self.rollout_config, evaluation, greedy=evaluation and self.greedy_validation)
        turns = rollout_tree(self.rollout_env(evaluation), episodes, self.actors, plan, step=self.global_step)
        compute_returns(turns, plan.discount, plan.credit, plan.solved_return)
        self.score_turns(turns, plan, evaluation)
        return turns

    def rollout_env(self, evaluation: bool) -> DecPOMDP:
        """The Dec-POMDP a rollout acts in: :attr:`env` (MARLHF trains against its learned reward)."""
        return self.env

    def score_turns(self, turns: list[Turn], plan: RolloutPlan, evaluation: bool) -> None:
        """What the algorithm adds to the rolled-out turns before its update (default: nothing)."""

    @property
    def num_generations_eval(self) -> int:
        """Validation paths per problem (``rollout.num_generations_eval``)."""
        return self.rollout_config.num_generations_eval

    @property
    def eval_ks(self) -> list[int]:
        """The k of the logged ``val/pass@k`` (``rollout.eval_ks()``)."""
        return self.rollout_config.eval_ks()

    @property
    def greedy_validation(self) -> bool:
        """Validation decodes greedily: one path per problem and no ``val_sampling``."""
        return not self.val_sampling and self.num_generations_eval == 1

    def validation_step(self, batch: list[Episode], batch_idx: int) -> dict[str, Any]:
        """``num_generations_eval`` paths per problem, one completion per agent per turn (greedy when
        there is one path, unless ``val_sampling``). Logs ``val/reward``, ``val/return``,
        ``val/rewards/<name>/mean`` (means over every path), ``val/pass@k`` for each
        ``rollout.eval_pass_at_k`` when a reward reports :data:`~comlrl_lightning.envs.rewards.PASS_AT_1`
        (turn 0, unbiased estimator over the problem's paths: :mod:`comlrl_lightning.core.evaluation`),
        and with several turns ``val/final/pass@k`` (the last joint action of each path) and
        ``val/turn_<t>/reward``."""
        n_eval = self.num_generations_eval
        turns = self.rollout(repeat_episodes(batch, n_eval), evaluation=True)
        for m in validation_metrics(turns, len(batch), n_eval, self.eval_ks, self.num_turns > 1):
            self.log(
                m.name, m.value.to(self.device), prog_bar=m.prog_bar, batch_size=m.weight, sync_dist=True
            )
        return {"turns": turns}

    @property
    def num_turns(self) -> int:
        """Turns per episode (1 unless the algorithm rolls out more)."""
        return 1

    def on_train_start(self) -> None:
        """Put the reference copies and reward models back in eval mode (see :meth:`on_fit_start`),
        re-place the team and its optimizer state (Lightning loads optimizer state onto the root device
        after :meth:`on_fit_start`, and skips ``on_train_epoch_start`` on a resumed epoch), then apply
        RNG states stashed by :meth:`on_load_checkpoint` (once), right before training resumes."""
        self.reference_models.eval()
        self.reward_models.eval()
        self._place_team()
        resume_config.apply_given_learning_rates(self.trainer, getattr(self, "_given_learning_rates", None))
        states = getattr(self, "_resume_rng_states", None)
        if states is not None:
            set_rng_states(states)
            self._resume_rng_states = None
