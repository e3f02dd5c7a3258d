"""Multi-agent recursive self-improvement: a coordinator of one trainer per agent.

The reference library's FAQ describes it (and ships nothing for it): *each agent works in its own
trainer, and the system coordinates these trainers. At each round the system sends different
prompts to one or more trainers to collect their agents' responses, and triggers the training of
each trainer at its scheduled steps, for example alternating between agents.*

Features:
    - K learners, each a full single-agent MAGRPO (``num_agents=1``) with its own optimizer, LR
      scheduler, precision, device, TensorBoard folder and checkpoint folder (:mod:`.learner`);
    - rounds (:mod:`.rounds`): stages route prompts to learners, later stages see earlier responses,
      K responses per prompt, joint responses ``aligned`` (default) or ``cross``, one shared reward
      per joint response, each learner's experience stored with its own group-baseline advantages;
    - schedules (:mod:`.schedule`): alternate / round-robin, every-n per learner, warm-up/freeze,
      every round, or any callable; learners that do not train still answer (frozen partners);
    - placement: the device plan of :func:`~comlrl_lightning.infra.strategy.resolve_devices`
      (one GPU per distinct model when there are enough; learners sharing one model share its
      device and keep separate optimizer state);
    - checkpoint and exact resume of the whole system (every learner's weights, optimizer and
      scheduler; the round; the RNG states; the buffered experience; the data position, which is a
      function of the round): an interrupted-then-resumed run equals an uninterrupted one;
    - user callbacks through Fabric (``on_round_end(coordinator, output)``), a tqdm progress bar,
      TensorBoard for the system (``<run>/coordinator``) and for every learner (``<run>/learners/<name>``);
    - held-out evaluation (:mod:`.evaluation`): :meth:`Coordinator.evaluate`, and with
      ``eval_every`` during ``fit``; greedy, one pass through the stages per episode, logged as
      ``val/reward`` and ``val/pass@1`` like the Lightning modules, kept in ``eval_history``.

Not supported: multi-turn episodes inside a round (a round is one pass through the stages),
multi-process strategies (DDP).

Why Fabric per learner, not a Trainer per learner: a ``Trainer`` owns the loop. K learners whose
updates interleave at scheduled rounds would need K fit loops that take turns, which Lightning
cannot pause and resume in one process without re-running ``fit`` (which rebuilds optimizers and
counts steps anew). Fabric keeps the parts of Lightning a learner needs (device placement,
precision and autocast, ``backward`` and gradient clipping, loggers, callbacks, checkpoint
save/load of modules, optimizers and schedulers) and leaves the loop to the coordinator, whose
round is the unit of the schedule. The learner stays a normal LightningModule: under Fabric its
``manual_backward``, ``clip_gradients`` and ``log`` go through its own Fabric.

Checkpoint layout (``<run>`` = ``root_dir``)::

    <run>/coordinator/events.out.tfevents.*            shared reward, seconds per round
    <run>/coordinator/checkpoints/round-000004.pt      round, RNG, experience buffers, history
    <run>/learners/<name>/events.out.tfevents.*        that learner's reward, loss, updates
    <run>/learners/<name>/checkpoints/round-000004.ckpt  weights, optimizer, scheduler, update count
    <run>/learners/<name>/agent/                       Hugging Face folder at the end (save_agents)

Learner files are written first and the coordinator file last (each atomically), so a coordinator
file names a complete system state.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.loggers import TensorBoardLogger
from lightning.fabric.utilities.seed import seed_everything
from tqdm.auto import tqdm

from comlrl_lightning.coordinator.evaluation import EvalOutput, evaluate_episodes
from comlrl_lightning.coordinator.learner import Learner, LearnerConfig, check_learners
from comlrl_lightning.coordinator.rounds import (
    EpisodeSource,
    JointMode,
    RoundOutput,
    Stage,
    check_stage_fields,
    check_stages,
    play_round,
)
from comlrl_lightning.coordinator.schedule import Alternate, Schedule, scheduled
from comlrl_lightning.core import metrics as M
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import RewardFunction, WeightedReward, as_weighted_reward
from comlrl_lightning.infra.checkpoint_io import atomic_torch_save
from comlrl_lightning.infra.rng import collect_rng_states, set_rng_states
from comlrl_lightning.infra.strategy import resolve_devices

ACCELERATORS = ("auto", "cpu", "gpu")


class Coordinator:
    """K single-agent learners, a round protocol and a schedule (see the module docstring).

    Args:
        learners: one :class:`LearnerConfig` per learner (names unique).
        stages: the round's routing, in order (each learner answers in at least one stage).
        reward: the shared reward of a joint response (one response per stage, in stage order).
        episodes: the training episodes (:class:`EpisodeSource`).
        schedule: which learners train at which round (default: :class:`Alternate`).
        joint_mode: ``"aligned"`` (K joint responses per episode) or ``"cross"`` (``Π K_s``).
        num_rounds: rounds to play in all (a resumed run plays the rest).
        batch_size: episodes per round; each epoch visits every episode once, in an order shuffled
            with ``seed`` and the epoch.
        seed: seeds Python, NumPy and torch before the learners are built (so ``builtin:`` models
            built from a config start equal) and the episode order.
        root_dir: the run folder (see the layout in the module docstring).
        checkpoint_every: write a system checkpoint every this many rounds (0: only after the last).
        keep_last: system checkpoints kept (older ones are deleted, learners' files included).
        ckpt_path: resume from this coordinator checkpoint, or ``"last"`` (the newest in ``root_dir``;
            a fresh start when there is none); None: fresh start.
        accelerator: ``"cpu"``, ``"gpu"`` or ``"auto"`` (GPUs when visible) for the device plan.
        save_agents: after the last round, save every learner as a Hugging Face folder.
        callbacks: objects with an optional ``on_round_end(coordinator, output)`` (called by Fabric).
        progress_bar: show a tqdm bar over rounds.
        eval_episodes: the held-out episodes of :meth:`evaluate` (never trained on); None: none.
        eval_every: during ``fit``, evaluate ``eval_episodes`` after every this many rounds (>= 0;
            0: never during ``fit``; needs ``eval_episodes`` when > 0). Evaluation draws nothing
            from the training RNG streams, so it changes no training sample.

    Raises:
        ValueError: a bad value (named), before any model loads.
    """

    def __init__(
        self,
        learners: list[LearnerConfig],
        stages: list[Stage],
        reward: RewardFunction | WeightedReward | list[RewardFunction],
        episodes: EpisodeSource,
        schedule: Schedule | Callable[[int, Sequence[str]], Iterable[str]] | None = None,
        joint_mode: JointMode = "aligned",
        num_rounds: int = 4,
        batch_size: int = 2,
        seed: int = 0,
        root_dir: str = "runs/coordinator",
        checkpoint_every: int = 0,
        keep_last: int = 1,
        ckpt_path: str | None = None,
        accelerator: str = "auto",
        save_agents: bool = True,
        callbacks: list[Any] | None = None,
        progress_bar: bool = True,
        eval_episodes: EpisodeSource | None = None,
        eval_every: int = 0,
    ) -> None:
        names = check_learners(learners)
        checks = [  # (field, value, ok, allowed)
            ("num_rounds", num_rounds, num_rounds >= 1, ">= 1"),
            ("batch_size", batch_size, batch_size >= 1, ">= 1"),
            ("checkpoint_every", checkpoint_every, checkpoint_every >= 0, ">= 0"),
            ("keep_last", keep_last, keep_last >= 1, ">= 1"),
            ("accelerator", accelerator, accelerator in ACCELERATORS, f"one of {list(ACCELERATORS)}"),
            ("eval_every", eval_every, eval_every >= 0, ">= 0"),
            ("eval_every", eval_every, not eval_every or eval_episodes, "0 when eval_episodes is None"),
        ]
        for name, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}: got {value!r}, must be {allowed}")
        check_stages(stages, {c.name: c for c in learners}, joint_mode)
        if ckpt_path not in (None, "last") and not os.path.isfile(ckpt_path):
            raise FileNotFoundError(
                f"ckpt_path: no coordinator checkpoint {os.path.abspath(ckpt_path)!r}; give a "
                f"round-*.pt file of <root_dir>/coordinator/checkpoints, or 'last'"
            )
        self.configs, self.names, self.stages = learners, names, stages
        self.reward = as_weighted_reward(reward)
        self.schedule = schedule if schedule is not None else Alternate()
        self.joint_mode, self.num_rounds = joint_mode, num_rounds
        self.batch_size, self.seed = batch_size, seed
        self.root_dir, self.checkpoint_every, self.keep_last = root_dir, checkpoint_every, keep_last
        self.ckpt_path, self.accelerator, self.save_agents = ckpt_path, accelerator, save_agents
        self.progress_bar = progress_bar
        self.fabric = Fabric(
            accelerator="cpu",
            devices=1,
            callbacks=callbacks or [],
            loggers=TensorBoardLogger(os.path.join(root_dir, "coordinator"), name="", version=""),
        )
        self._episodes_source, self._eval_source, self.eval_every = episodes, eval_episodes, eval_every
        self.eval_history: list[dict[str, Any]] = []  # per evaluation: EvalOutput.record()
        self.learners: dict[str, Learner] = {}
        self.round = 0
        self.history: list[dict[str, Any]] = []  # per round: trained learners, rewards, seconds

    # ------------------------------------------------------------------ setup
    def device_plan(self, num_gpus: int | None = None) -> list[torch.device]:
        """One device per learner (``AgentSpec.device`` pins one; learners sharing a model share its device).

        Args:
            num_gpus: GPUs to plan for (default: the visible ones; none under ``accelerator="cpu"``).

        Raises:
            ValueError: ``accelerator="gpu"`` without a GPU, or a pinned device that is not there.
        """
        gpus = torch.cuda.device_count() if num_gpus is None else num_gpus
        gpus = 0 if self.accelerator == "cpu" else gpus
        if self.accelerator == "gpu" and gpus == 0:
            raise ValueError("accelerator: got 'gpu', but no CUDA device is visible")
        owners = [
            self.names.index(c.share_weights_with) if c.share_weights_with else i
            for i, c in enumerate(self.configs)
        ]
        return resolve_devices(
            "auto",
            len(self.configs),
            num_gpus=gpus,
            owners=owners,
            overrides=[c.module.specs[0].device for c in self.configs],
            field_name="learners[].module.agents.device",
        )

    def setup(self) -> None:
        """Seed, build every learner on its device and (with ``ckpt_path``) restore the system. Idempotent."""
        if self.learners:
            return
        devices = self.device_plan()
        seed_everything(self.seed, verbose=False)
        self.episodes = self._episodes_source.episodes()
        self.eval_episodes = self._eval_source.episodes() if self._eval_source else None
        for eps in (self.episodes, self.eval_episodes or []):  # every row, before any learner loads
            check_stage_fields(self.stages, eps)
        path = self._latest() if self.ckpt_path == "last" else self.ckpt_path
        resumed_round = (
            int(torch.load(path, map_location="cpu", weights_only=False)["round"]) if path else None
        )
        for c, dev in zip(self.configs, devices):
            shared = self.learners[c.share_weights_with] if c.share_weights_with else None
            self.learners[c.name] = Learner(c, dev, os.path.join(self.root_dir, "learners", c.name), shared)
        if path:
            # the rounds after the checkpoint are played again: TensorBoard drops their earlier points
            for logger in self.fabric.loggers + [
                lg for x in self.learners.values() for lg in x.fabric.loggers
            ]:
                purge_from(logger, resumed_round)
            self.load(path)

    def episodes_for(self, round: int) -> list[Episode]:
        """The round's ``batch_size`` episodes: positions ``round·B …`` of the per-epoch shuffled order."""
        n, out = len(self.episodes), []
        for pos in range(round * self.batch_size, (round + 1) * self.batch_size):
            epoch, offset = divmod(pos, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
            out.append(self.episodes[int(order[offset])])
        return out

    # ------------------------------------------------------------------- loop
    def play(self, round: int) -> RoundOutput:
        """One round: play the stages, store experience, update the scheduled learners, log."""
        t0 = time.perf_counter()
        out = play_round(
            round, self.stages, self.episodes_for(round), self.learners, self.reward, self.joint_mode
        )
        for name, learner in self.learners.items():
            learner.store(out.experiences[name])
        out.trained = [x for x in self.names if x in scheduled(self.schedule, round, self.names)]
        for name in out.trained:
            out.learner_stats[name] = self.learners[name].update()
        out.seconds = time.perf_counter() - t0
        self._log(out)
        self.history.append(
            {
                "round": round,
                "trained": out.trained,
                "reward": float(out.rewards.mean()),
                "learner_reward": {x: _mean_return(out, x) for x in self.names},
                "seconds": out.seconds,
            }
        )
        self.fabric.call("on_round_end", coordinator=self, output=out)
        return out

    def fit(self) -> list[dict[str, Any]]:
        """Play rounds ``self.round … num_rounds - 1`` (checkpointing as configured); returns the history."""
        self.setup()
        bar = tqdm(total=self.num_rounds, initial=self.round, desc="rounds", disable=not self.progress_bar)
        while self.round < self.num_rounds:
            out = self.play(self.round)
            self.round += 1
            if self.eval_every and self.round % self.eval_every == 0:
                self.evaluate()  # before the checkpoint, which keeps eval_history
            bar.update(1)
            bar.set_postfix(reward=f"{float(out.rewards.mean()):.3f}", trained=",".join(out.trained) or "-")
            last = self.round == self.num_rounds
            if last or (self.checkpoint_every and self.round % self.checkpoint_every == 0):
                self.save()
        bar.close()
        if self.save_agents:
            for learner in self.learners.values():
                learner.save_pretrained(os.path.join(learner.log_dir, "agent"))
        for logger in self.fabric.loggers + [lg for x in self.learners.values() for lg in x.fabric.loggers]:
            logger.finalize("success")
        return self.history

    def _log(self, out: RoundOutput) -> None:
        metrics = {
            M.REWARD: float(out.rewards.mean()),
            M.REWARD_STD: float(out.rewards.std()) if out.rewards.numel() > 1 else 0.0,
            "seconds_per_round": out.seconds,
            "num_trained": float(len(out.trained)),
        }
        for name, v in out.components.items():
            metrics[M.reward_fn(name)] = float(v.nanmean())
        self.fabric.log_dict(metrics, step=out.round)
        for name, learner in self.learners.items():
            gens = [e.generation for e in out.experiences[name]]
            lengths, clipped = torch.cat([g.lengths for g in gens]), torch.cat([g.clipped for g in gens])
            m = {
                M.REWARD: _mean_return(out, name),
                **M.length_metrics(lengths, clipped),
                "trained": float(name in out.trained),
                "num_updates": float(learner.num_updates),
            }
            m.update({k: float(v) for k, v in out.learner_stats.get(name, {}).items()})
            learner.log(m, out.round)

    def evaluate(
        self, episodes: Sequence[Episode] | EpisodeSource | None = None, **kwargs: Any
    ) -> EvalOutput:
        """Play ``episodes`` (default ``eval_episodes``) once through the stages, greedily, train
        nothing; log ``val/*`` at x = ``self.round``, append to ``eval_history``, call the callbacks'
        ``on_evaluate_end(coordinator, output)``. ``kwargs``: :func:`.evaluation.evaluate_episodes`'s
        ``num_generations_eval``, ``pass_at_k``, ``val_sampling``, ``batch_size``.

        Raises:
            ValueError: no episodes given and no ``eval_episodes``, or a bad ``kwargs`` value.
        """
        self.setup()
        episodes = self.eval_episodes if episodes is None else episodes
        episodes = episodes.episodes() if isinstance(episodes, EpisodeSource) else episodes
        if not episodes:
            raise ValueError("evaluate: no episodes; pass some or set the coordinator's eval_episodes")
        out = evaluate_episodes(self.round, self.stages, episodes, self.learners, self.reward, **kwargs)
        self.fabric.log_dict(out.metrics, step=self.round)
        self.eval_history.append(out.record())
        self.fabric.call("on_evaluate_end", coordinator=self, output=out)
        return out

    # ------------------------------------------------------------ checkpoint
    def checkpoint_path(self, round: int) -> str:
        return os.path.join(self.root_dir, "coordinator", "checkpoints", f"round-{round:06d}.pt")

    def save(self) -> str:
        """Checkpoint the whole system after ``self.round`` rounds: learners first, then the coordinator."""
        path = self.checkpoint_path(self.round)
        folder = os.path.dirname(path)  # paths relative to it: a moved run folder resumes
        paths = {name: os.path.relpath(lr.save(self.round), folder) for name, lr in self.learners.items()}
        state = {
            "round": self.round,
            "rng_states": collect_rng_states(),
            "history": self.history,
            "eval_history": self.eval_history,
            "buffers": {x: lr.buffer for x, lr in self.learners.items()},
            "learner_checkpoints": paths,
            "names": self.names,
            "episodes_seen": self.round * self.batch_size,
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_torch_save(state, path)
        self._prune()
        return path

    def load(self, path: str) -> None:
        """Restore the system from a coordinator checkpoint (learner files are found next to it)."""
        state = torch.load(path, map_location="cpu", weights_only=False)  # ours: buffers are dataclasses
        if state["names"] != self.names:
            raise ValueError(f"ckpt_path: {path} holds learners {state['names']}, this run has {self.names}")
        for name, learner in self.learners.items():  # next to the coordinator file (relative in newer files)
            saved = state.get("learner_checkpoints", {}).get(name)
            near = os.path.join(os.path.dirname(path), saved) if saved and not os.path.isabs(saved) else None
            learner.load(near if near and os.path.exists(near) else learner.checkpoint_path(state["round"]))
            learner.buffer = state["buffers"][name]
        self.round, self.history = state["round"], state["history"]
        self.eval_history = state.get("eval_history", [])  # files from before evaluation: none
        for e in [e for e in self.eval_history if e["round"] >= self.round]:  # logged at a purged step
            self.fabric.log_dict({k: v for k, v in e.items() if k.startswith("val/")}, step=e["round"])
        set_rng_states(state["rng_states"])

    def _checkpoints(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.root_dir, "coordinator", "checkpoints", "round-*.pt")))

    def _latest(self) -> str | None:
        found = self._checkpoints()
        return found[-1] if found else None

    def _prune(self) -> None:
        for old in self._checkpoints()[: -self.keep_last]:
            round = int(os.path.basename(old)[len("round-") : -len(".pt")])
            os.remove(old)  # the coordinator file first: a half-pruned state is never named
            for learner in self.learners.values():
                if os.path.exists(learner.checkpoint_path(round)):
                    os.remove(learner.checkpoint_path(round))


def purge_from(logger: Any, step: int | None) -> None:
    """Make a Fabric ``TensorBoardLogger`` whose writer is not open yet drop the events at ``step``
    and later from earlier runs in its folder (``SummaryWriter(purge_step=...)``)."""
    if step is not None and isinstance(logger, TensorBoardLogger) and logger._experiment is None:
        logger._kwargs["purge_step"] = step


def _mean_return(out: RoundOutput, name: str) -> float:
    """Mean return of ``name``'s responses in ``out`` (its reward curve's point)."""
    return float(torch.cat([e.returns.flatten() for e in out.experiences[name]]).mean())
