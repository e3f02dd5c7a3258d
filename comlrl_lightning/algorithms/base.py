"""What every algorithm shares: the team, one optimizer (and scheduler) per agent, placement,
validation, and the RNG states a checkpoint needs for an exact resume.

An algorithm subclasses :class:`CoMLRLModule` and writes ``rollout`` (the tree of turns with returns
and advantages) and ``training_step`` (the corridor: rollout → returns → advantages → one update per
agent → :class:`~comlrl_lightning.core.records.StepOutput`). Everything else is here, in the open:
no mixins.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities import rank_zero_warn

from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.config import OnNonfinite, PlacementConfig, SamplingConfig
from comlrl_lightning.core.evaluation import repeat_episodes, validation_metrics
from comlrl_lightning.core.records import Turn
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.infra.resume import canonical_loop_state
from comlrl_lightning.infra.rng import collect_rng_states, set_rng_states
from comlrl_lightning.infra.strategy import (
    AgentParallelStrategy,
    optimizer_state_to_param_devices,
    place_module,
    plan_devices,
    resolve_devices,
    visible_gpus,
)  # fmt: skip
from comlrl_lightning.team.agents import AgentSpec, validate_spec
from comlrl_lightning.team.team import BACKWARD_LOCK, Team


def normalize_agents(agents: Any, num_agents: int | None) -> list[AgentSpec]:
    """One :class:`AgentSpec` per agent from specs, dicts or model strings (one is broadcast).

    Raises:
        ValueError: the number of specs does not match ``num_agents``.
    """
    if isinstance(agents, (str, AgentSpec, dict)):
        agents = [agents] * (num_agents or 1)
    specs = [
        AgentSpec(model=a) if isinstance(a, str) else AgentSpec(**a) if isinstance(a, dict) else a
        for a in agents
    ]
    if num_agents is not None and len(specs) == 1 and num_agents > 1:
        specs = [copy.deepcopy(specs[0]) for _ in range(num_agents)]
    if not specs:
        raise ValueError(
            "agents: got an empty list; give one AgentSpec (or model string) per agent, at least one"
        )
    if num_agents is not None and len(specs) != num_agents:
        raise ValueError(
            f"agents: got {len(specs)} specs for num_agents={num_agents}; give one spec or num_agents"
        )
    return specs


class CoMLRLModule(pl.LightningModule):
    """Base LightningModule of a cooperative multi-agent algorithm (manual optimisation).

    Args:
        specs: one :class:`AgentSpec` per agent (see :func:`normalize_agents`).
        sampling: the team's sampling knobs (``AgentSpec.generation`` overrides per agent).
        placement: where the agents live.
        optimizer: per-agent optimizer factory; default ``AdamW(lr=learning_rate)``.
        scheduler: optional per-agent LR scheduler factory, stepped after every optimizer step.
        learning_rate: learning rate of the default optimizer (> 0; CoMLRL ``agent_learning_rate``).
        val_sampling: validate with one sampled completion per agent instead of greedy decoding.
        env: the Dec-POMDP; default: the datamodule's ``env``.

    Raises:
        ValueError: a bad spec, device or learning rate, before any model is loaded.
    """

    def __init__(
        self,
        specs: list[AgentSpec],
        sampling: SamplingConfig,
        placement: PlacementConfig,
        optimizer: OptimizerCallable | None,
        scheduler: LRSchedulerCallable | None,
        learning_rate: float,
        val_sampling: bool,
        env: DecPOMDP | None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        for i, spec in enumerate(specs):
            validate_spec(spec, i, len(specs))
        if learning_rate <= 0:
            raise ValueError(f"learning_rate: got {learning_rate!r}, must be > 0")
        placement.check(len(specs))
        # parse devices (and AgentSpec.device) and check shared agents' devices now, before any model loads
        owners = [i if s.share_weights_with is None else s.share_weights_with for i, s in enumerate(specs)]
        resolve_devices(placement.agent_devices, len(specs), num_gpus=None, owners=owners,
                        overrides=[s.device for s in specs])  # fmt: skip
        self.team = Team(specs, sampling)
        self.sampling_config, self.placement = sampling, placement
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

    # ------------------------------------------------------------------ the team
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
        for name, cfg in groups.items():
            self.hparams[name] = asdict(cfg)
        self._hparams_initial = copy.deepcopy(
            self._hparams
        )  # what loggers write (hparams.yaml) sees them too

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

    def setup(self, stage: str) -> None:
        if self.env.num_agents != self.num_agents:
            raise ValueError(
                f"data.formatters: the env has {self.env.num_agents} formatters (one per agent) but "
                f"model.num_agents={self.num_agents}; give one formatter per agent"
            )
        strategy = self.trainer.strategy
        if self.placement.parallel_training == "mp" and not isinstance(strategy, SingleDeviceStrategy):
            raise ValueError(f"parallel_training='mp' runs the team in one process; the trainer's strategy is "
                             f"{type(strategy).__name__}: use strategy='agent_parallel' (or parallel_training='none')")  # fmt: skip
        distinct = sum(s.share_weights_with is None for s in self.specs)
        if (
            isinstance(strategy, DDPStrategy)
            and distinct > 1
            and not strategy._ddp_kwargs.get("find_unused_parameters")
        ):
            raise ValueError("each agent's backward uses only that agent's parameters, so DDP needs "
                             "find_unused_parameters: use strategy='ddp_find_unused_parameters_true' "
                             "(or DDPStrategy(find_unused_parameters=True))")  # fmt: skip

    def configure_model(self) -> None:
        """Load every agent (and reference copy) once; idempotent across stages."""
        self.team.load(with_reference=self.uses_reference_model)

    # ------------------------------------------------------------------ optimizers
    def configure_optimizers(self) -> list[dict[str, Any]]:
        out = []
        for i, (spec, model) in enumerate(zip(self.specs, self.agents)):
            params = [p for p in model.parameters() if p.requires_grad]
            opt = (self.optimizer_factory(params) if self.optimizer_factory is not None
                   else torch.optim.AdamW(params, lr=self.learning_rate))  # fmt: skip
            if spec.learning_rate is not None:
                for group in opt.param_groups:
                    group["lr"] = spec.learning_rate
                    group["initial_lr"] = spec.learning_rate
            entry: dict[str, Any] = {"optimizer": opt}
            if self.scheduler_factory is not None:
                entry["lr_scheduler"] = {"scheduler": self.scheduler_factory(opt), "name": f"lr/agent_{i}"}
            out.append(entry)
        return out

    def agent_optimizers(self) -> tuple[list[Any], list[Any]]:
        """``(optimizers, schedulers)``, one of each per agent (scheduler None when there is none).

        Under Lightning Fabric (the coordinator's learners) Lightning keeps no scheduler configs, so
        the schedulers are the ones the driver put in :attr:`fabric_schedulers`.
        """
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        if self.fabric is not None:
            return opts, list(self.fabric_schedulers or [None] * self.num_agents)
        schs = self.lr_schedulers()
        schs = (schs if isinstance(schs, list) else [schs]) if schs is not None else [None] * self.num_agents
        return opts, schs

    def _batch_position(self) -> str:
        """Where training is, for messages: epoch and batch under a Trainer, else the global step."""
        if self._trainer is None:
            return f"global_step={self.global_step}"
        loop = self.trainer.fit_loop
        return (
            f"epoch {self.current_epoch}, batch {loop.epoch_loop.batch_idx}, global_step={self.global_step}"
        )

    def step_agent(self, agent: int, max_grad_norm: float | None, loss: float | None = None,
                   on_nonfinite: OnNonfinite = "skip") -> bool:  # fmt: skip
        """Clip, ``optimizer.step()`` (counted by Lightning) and scheduler step; main thread only, so
        ``global_step`` grows by one per agent step in agent order.

        First the agent's ``loss`` and gradients are checked (:meth:`finite_or_skip`): if any is
        NaN/inf, ``on_nonfinite`` (:attr:`LossConfig.on_nonfinite`) either skips the step (gradients
        dropped, counted in :attr:`skipped_steps` and logged as ``agent_<i>/skipped_steps``) or raises.

        Returns:
            Whether the optimizer stepped.

        Raises:
            FloatingPointError: non-finite loss or gradients with ``on_nonfinite="stop"``.
        """
        opts, schs = self.agent_optimizers()
        if not self.finite_or_skip(opts[agent], f"agent {agent}", loss, on_nonfinite, self.skipped_steps, agent,
                                   M.agent(agent, "skipped_steps")):  # fmt: skip
            return False
        if max_grad_norm is not None:
            self.clip_gradients(opts[agent], gradient_clip_val=max_grad_norm, gradient_clip_algorithm="norm")
        opts[agent].step()
        # free this agent's gradients now, not at its next zero_grad: otherwise every other agent's
        # backward runs while they still hold memory (one parameter-sized buffer per agent)
        opts[agent].zero_grad(set_to_none=True)
        if schs[agent] is not None:
            schs[agent].step()
        return True

    def finite_or_skip(self, optimizer: torch.optim.Optimizer, who: str, loss: float | None,
                       on_nonfinite: OnNonfinite, counts: list[int], slot: int, metric: str) -> bool:  # fmt: skip
        """Whether ``loss`` and the gradients of ``optimizer``'s parameters are all finite; if not,
        skip (drop the gradients, ``counts[slot] += 1``, warn) or raise. Logs ``counts[slot]`` as ``metric``.

        Args:
            optimizer: the optimizer about to step.
            who: how messages name its owner (``"agent 1"``, ``"critic 0"``).
            loss: the loss that made the gradients (None: not checked).
            on_nonfinite: :attr:`LossConfig.on_nonfinite`.
            counts, slot: the skip counter to increase (saved in checkpoints).
            metric: the logged name of ``counts[slot]``.

        Raises:
            FloatingPointError: non-finite values with ``on_nonfinite="stop"``, naming ``who`` and the batch.
        """
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0  # NaN/inf iff any entry is
        finite = math.isfinite(grad_norm) and (loss is None or math.isfinite(loss))
        if self._trainer is not None:  # one decision for every rank (a rank-local loss can differ)
            finite = bool(self.trainer.strategy.reduce_boolean_decision(finite, all=True))
        if not finite:
            what = (
                f"{who}: non-finite loss ({loss}) or gradient norm ({grad_norm}) at {self._batch_position()}"
            )
            if on_nonfinite == "stop":
                raise FloatingPointError(
                    f"{what}; stopping (LossConfig.on_nonfinite='stop'; 'skip' skips the step)"
                )
            counts[slot] += 1
            rank_zero_warn(f"{what}; its optimizer step is skipped (LossConfig.on_nonfinite='skip'; "
                           f"{counts[slot]} skipped so far)")  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
        if self._trainer is not None:
            self.log(metric, float(counts[slot]))
        return finite

    def locked_backward(self, loss: torch.Tensor) -> None:
        """``manual_backward`` under :data:`~comlrl_lightning.team.team.BACKWARD_LOCK` (agent threads)."""
        with BACKWARD_LOCK:
            self.manual_backward(loss)

    @staticmethod
    def max_steps_for(num_batches: int, num_agents: int, num_iterations: int = 1) -> int:
        """``trainer.max_steps`` that trains ``num_batches`` batches (Lightning counts every optimizer
        step; one batch steps each agent ``num_iterations`` times; see :meth:`LossConfig.max_steps_for`)."""
        return num_batches * num_agents * num_iterations

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
        plan = plan_devices(self, self.placement.agent_devices, root=strategy.root_device,
                            num_gpus=visible_gpus(strategy.accelerator))  # fmt: skip
        place_module(self, plan)
        for opt in self.trainer.optimizers:
            optimizer_state_to_param_devices(opt)

    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps one training batch takes, i.e. how much ``trainer.global_step`` grows per
        batch: one per agent here; algorithms that step more often override it."""
        return self.num_agents

    def steps_per_batch_terms(self) -> str:
        """How :attr:`steps_per_batch` is made up, for messages."""
        return f"num_agents={self.num_agents}"

    def _check_max_steps(self) -> None:
        """Warn when ``trainer.max_steps`` is not a whole number of batches: Lightning checks it only
        between batches, so the last batch runs all its steps and ``global_step`` overshoots."""
        max_steps, per = self.trainer.max_steps, self.steps_per_batch
        if max_steps > 0 and max_steps % per:
            batches = -(-max_steps // per)
            whole = " or ".join(str(n) for n in ((max_steps // per) * per, batches * per) if n > 0)
            rank_zero_warn(f"max_steps={max_steps} is not a multiple of the {per} optimizer steps one batch takes "
                           f"({self.steps_per_batch_terms()}): training runs {batches} batches and stops at "
                           f"global_step={batches * per}; set max_steps={whole} (max_steps_for converts batches "
                           "to steps)")  # fmt: skip

    def on_fit_start(self) -> None:
        self._check_max_steps()
        self._place_team()

    def on_train_epoch_start(self) -> None:
        self._place_team()

    def on_validation_start(self) -> None:
        self._place_team()

    # ------------------------------------------------------------------ validation
    def rollout(self, episodes: Sequence[Episode], evaluation: bool = False) -> list[Turn]:
        """The algorithm's rollout: turns with returns (and, in training, advantages) filled in."""
        raise NotImplementedError

    @property
    def num_generations_eval(self) -> int:
        """Validation paths per problem (``rollout.num_generations_eval``; 1 for an algorithm without it)."""
        cfg = getattr(self, "rollout_config", None)
        return 1 if cfg is None else cfg.num_generations_eval

    @property
    def eval_ks(self) -> list[int]:
        """The k of the logged ``val/pass@k`` (``rollout.eval_ks()``; [1] for an algorithm without it)."""
        cfg = getattr(self, "rollout_config", None)
        return [1] if cfg is None else cfg.eval_ks()

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

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add the global RNG states (python, numpy, torch CPU/CUDA) as ``checkpoint["rng_states"]``,
        after checking every agent's weights are finite.

        Sampling draws from torch's global RNG, so exact resume needs them (Lightning saves agents,
        optimizers, schedulers, loops and the datamodule's data position itself).

        Raises:
            FloatingPointError: an agent's parameter holds NaN/inf (named with the agent); a checkpoint
                of such weights could only poison the run resumed from it.
        """
        for who, model in self.trained_modules():
            for name, p in model.named_parameters():
                if not torch.isfinite(p).all():
                    raise FloatingPointError(f"{who}: parameter {name!r} holds NaN/inf at {self._batch_position()}; "
                                             "refusing to write a checkpoint with non-finite weights")  # fmt: skip
        checkpoint["rng_states"] = collect_rng_states()
        checkpoint["skipped_steps"] = self.skip_counts()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the saved RNG states until :meth:`on_train_start` applies them: code that runs between
        checkpoint loading and the first batch (``configure_optimizers``, callbacks' ``on_fit_start``,
        starting the train DataLoader) may still draw from the global RNG. Restore the skip counters,
        and rewrite the loop state of a checkpoint written at an epoch end or after ``fit`` into
        the batch-end form Lightning resumes exactly from
        (:func:`~comlrl_lightning.infra.resume.canonical_loop_state`, Lightning #19617)."""
        self._resume_rng_states = checkpoint.get("rng_states")
        canonical_loop_state(checkpoint)  # epoch-end / after-fit checkpoints resume exactly (infra/resume.py)
        for name, saved in checkpoint.get("skipped_steps", {}).items():
            counts = self.skip_counts().get(name)
            if counts is None or len(saved) != len(counts):  # e.g. an IAC checkpoint in MAGRPO (strict=False)
                rank_zero_warn(f"checkpoint: skipped_steps[{name!r}] has {len(saved)} entries, this module has "
                               f"{0 if counts is None else len(counts)}; those counters start at 0")  # fmt: skip
                continue
            counts[:] = saved

    def trained_modules(self) -> list[tuple[str, torch.nn.Module]]:
        """``(name, module)`` of everything an optimizer steps, as messages name it (``"agent 0"``, ...):
        what :meth:`on_save_checkpoint` checks for non-finite weights."""
        return [(f"agent {i}", m) for i, m in enumerate(self.agents)]

    def skip_counts(self) -> dict[str, list[int]]:
        """The counters of skipped non-finite steps, by owner kind (saved in checkpoints, so a resumed
        run's ``agent_<i>/skipped_steps`` goes on from the saved count)."""
        return {"agents": self.skipped_steps}

    def on_train_start(self) -> None:
        """Re-place the team and its optimizer state (Lightning loads optimizer state onto the root
        device after :meth:`on_fit_start`, and skips ``on_train_epoch_start`` on a resumed epoch), then
        apply RNG states stashed by :meth:`on_load_checkpoint` (once), right before training resumes."""
        self._place_team()
        states = getattr(self, "_resume_rng_states", None)
        if states is not None:
            set_rng_states(states)
            self._resume_rng_states = None
