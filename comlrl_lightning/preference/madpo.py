"""MADPO: multi-agent direct preference optimisation as a LightningModule (CoMLRL ``preference/madpo.py``).

Per prompt the team samples ``preference_num_candidates`` joint responses (one batched ``generate``
per agent, through the ``actors`` seam), the task reward scores them, ``pair_selection`` picks
winner/loser pairs (:mod:`comlrl_lightning.preference.selection`), and every agent is trained with the
joint DPO loss ``ℓ(β·Σ_i Δ_i)``, its gradient through its own Δ_i only (:mod:`comlrl_lightning.preference.dpo`).

Two modes (``dpo.preference_mode``): ``one_shot`` (CoMLRL's: at the first training step every
training prompt is rolled out once by the initial policy, then ``num_train_epochs`` shuffled passes
over the pairs, one update per ``train_batch_size`` pairs, one update per Lightning batch; the run
stops itself after the last pass, so leave ``max_steps=-1`` or set it >= the number of updates times
``num_agents``) and ``online`` (each training batch's prompts are rolled out by the current policy,
its pairs trained on in one update).

Step counting: one update steps each of the N agents once, so ``global_step`` grows by N per batch
(a batch with no pair, every candidate tied, counts its N steps as skipped).

Checkpoints hold the one-shot pair set (records, token ids, the pass order and position) under
``checkpoint["preference_pairs"]``, so a resumed run trains on the same pairs in the same order.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from comlrl_lightning.algorithms.base import CoMLRLModule
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.choices import Choice
from comlrl_lightning.core.config import DEFAULTS, PlacementConfig, RolloutConfig, SamplingConfig
from comlrl_lightning.core.records import AgentStats, StepOutput
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.preference.dpo import DPOConfig, PairLogps, dpo_metrics, joint_dpo_losses
from comlrl_lightning.preference.pair_batch import PairTokens, agent_pair_logps, pair_step_output, pair_tokens
from comlrl_lightning.preference.pairs import PreferencePair
from comlrl_lightning.preference.selection import PreferenceConfig, build_preference_pairs
from comlrl_lightning.team.agents import AgentSpec, normalize_agents
from comlrl_lightning.team.centralized import CentralizedAdapter, JointActor, joint_actor_adapter

COLLABORATION_MODE = Choice(
    "collaboration_mode",
    {
        "decentralized": "one model per agent, each writing its own completion (CoMLRL's default)",
        "centralized": "one joint actor writing every role's part in one completion (CoMLRL's "
        "centralized adapter: `team/centralized.py`); `agents` is that one model, `num_roles` the roles",
    },
)
"""Who writes the team's joint response."""

_GROUP_TYPES: dict[str, type] = {
    "preference": PreferenceConfig,
    "dpo": DPOConfig,
    "rollout": RolloutConfig,
    "sampling": SamplingConfig,
    "placement": PlacementConfig,
}
_PREFERENCE, _DPO = PreferenceConfig(), DPOConfig()


class MADPO(CoMLRLModule):
    """Multi-agent DPO over a Dec-POMDP with a shared reward (CoMLRL's ``MADPOTrainer``).

    Args:
        agents: one :class:`AgentSpec` (or model string) per agent, or one broadcast to ``num_agents``.
        num_agents: number of agents; default ``len(agents)``.
        preference: how pairs are built (:class:`PreferenceConfig`: ``preference_num_candidates``,
            ``preference_pairs_per_sample``, ``pair_selection``).
        dpo: the update (:class:`DPOConfig`: ``dpo_beta``, ``loss_type``, ``reference_free``,
            ``preference_mode``, ...).
        rollout: validation knobs (``num_generations_eval``, ``eval_pass_at_k``); one turn, aligned,
            ``shared`` credit; its ``num_generations`` is ``preference_num_candidates``.
        collaboration_mode: one of :data:`COLLABORATION_MODE`. ``centralized``: ``agents`` is the one
            joint actor, trained on the pairs of its joint completions (one optimizer, one reference).
        num_roles: ``centralized``: the env's formatter count (CoMLRL's ``num_agents``), >= 1.
        adapter: ``centralized``: builds the joint prompt and parses role texts
            (:class:`~comlrl_lightning.team.centralized.CentralizedAdapter`; default ``TaggedAdapter``,
            CoMLRL's). Not saved in the hyperparameters: pass a custom one to ``load_from_checkpoint``.
        sampling, placement: see :class:`CoMLRLModule`.
        **kwargs: :class:`CoMLRLModule`'s ``optimizer``, ``scheduler``, ``learning_rate``,
            ``val_sampling``, ``env``.

    Raises:
        ValueError: a bad config value, naming the field, before any model is loaded.
    """

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_agents: int | None = None,
        preference: PreferenceConfig = _PREFERENCE,
        dpo: DPOConfig = _DPO,
        rollout: RolloutConfig = DEFAULTS["rollout"],
        sampling: SamplingConfig = DEFAULTS["sampling"],
        placement: PlacementConfig = DEFAULTS["placement"],
        collaboration_mode: COLLABORATION_MODE.literal = "decentralized",  # type: ignore[valid-type]
        num_roles: int = 2,
        adapter: CentralizedAdapter | None = None,
        **kwargs: Any,
    ) -> None:
        given = dict(preference=preference, dpo=dpo, rollout=rollout, sampling=sampling, placement=placement)
        groups = {
            k: _GROUP_TYPES[k](**cfg) if isinstance(cfg, dict) else replace(cfg) for k, cfg in given.items()
        }
        COLLABORATION_MODE.check(collaboration_mode)
        central = collaboration_mode == "centralized"
        groups["rollout"] = _candidate_rollout(groups["rollout"], groups["preference"])
        if central:
            adapter = _check_joint_actor(agents, num_agents, num_roles, adapter)
            agents, num_agents = agents[0] if isinstance(agents, (list, tuple)) else agents, 1
        specs = normalize_agents(agents, num_agents)
        super().__init__(specs, groups, **kwargs)
        self.preference: PreferenceConfig = groups["preference"]
        self.dpo: DPOConfig = groups["dpo"]
        self.collaboration_mode = collaboration_mode
        self.save_config(groups, ignore=["adapter"])
        self.num_roles = num_roles if central else self.num_agents
        self.joint_actor = JointActor(self.team, adapter, num_roles) if central else None
        """``centralized``: the one model writing every role's part (the rollout's ``actors``)."""
        if not central:
            self.hparams.pop("num_roles", None)
            self._hparams_initial.pop("num_roles", None)
        self.pairs: list[PreferencePair] | None = None
        """``one_shot``: the pair set (None until the first training step builds it)."""
        self.pair_tokens: list[list[PairTokens]] = []
        """``[P][N]`` the token ids of :attr:`pairs`."""
        self._order: list[int] = []
        self._epoch = self._cursor = 0
        self._pass_start: dict[str, Any] | None = None
        """The pass position (order, epoch, cursor) as a ``training_step`` in progress found it: a
        checkpoint written inside the step (``InterruptCheckpoint`` abandoning it) saves this one."""

    @property
    def uses_reference_model(self) -> bool:
        return not self.dpo.reference_free

    @property
    def actors(self) -> Any:
        """The team, or with ``collaboration_mode: centralized`` the joint actor."""
        return self.joint_actor if self.joint_actor is not None else super().actors

    @property
    def env_agents(self) -> tuple[int, str]:
        if self.joint_actor is not None:
            return self.num_roles, "model.num_roles"
        return super().env_agents

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.dpo.preference_mode == "one_shot" and self.trainer.world_size > 1:
            raise ValueError(
                f"preference_mode: got 'one_shot' with {self.trainer.world_size} processes; the one-shot "
                "pair set is built from the whole training set in one process: use 'online' under DDP"
            )

    # ------------------------------------------------------------------ the step
    def training_step(self, batch: list[Episode], batch_idx: int) -> StepOutput | None:
        out = self._step(batch)
        self._pass_start = None  # the step is done: a checkpoint saves the live position
        return out

    def pass_position(self) -> dict[str, Any]:
        """``{"order", "epoch", "cursor"}`` of the one-shot pair set's passes (a copy)."""
        return {"order": list(self._order), "epoch": self._epoch, "cursor": self._cursor}

    def _step(self, batch: list[Episode]) -> StepOutput | None:
        t0 = time.perf_counter()
        if self.dpo.preference_mode == "online":
            built = self._build(batch)
            pairs, tokens, turns = built.pairs, pair_tokens(built), [built.turn]
            if self.joint_actor is not None:
                splits = self.joint_actor.splits
                failed = sum(x.failed for x in splits) / max(len(splits), 1)
                self.log(M.PARSE_FAILURE, float(failed), batch_size=len(batch), sync_dist=True)
        else:
            if self.pairs is None:
                self._build_one_shot()
            self._pass_start = self.pass_position()  # what a checkpoint inside this step saves
            chosen = self._next_pairs()
            if chosen is None:  # every pass done (or no pair at all): nothing left to train
                self.trainer.should_stop = True
                return None
            pairs = [self.pairs[j] for j in chosen]
            tokens, turns = [self.pair_tokens[j] for j in chosen], None
        t_rollout = time.perf_counter() - t0
        stats, logged = self.update_agents(tokens)
        if turns is not None:
            out = StepOutput.from_turns(turns, stats, self.preference.preference_num_candidates)
        else:
            out = pair_step_output(pairs, tokens, stats)
            if self._epoch >= self.dpo.num_train_epochs:
                self.trainer.should_stop = True
        out.rollout_time_s, out.step_time_s = t_rollout, time.perf_counter() - t0
        self.log_step(out, logged, len(pairs))
        return out

    def _build(self, episodes: list[Episode]) -> Any:
        p = self.preference
        return build_preference_pairs(
            self.env,
            episodes,
            self.actors,
            p.preference_num_candidates,
            p.pair_selection,
            p.preference_pairs_per_sample,
            step=self.global_step,
        )

    def _build_one_shot(self) -> None:
        """Roll out every training prompt once with the current (initial) policy, in dataset order, a
        dataloader batch at a time (CoMLRL's ``_build_preference_dataset``)."""
        loader = self.trainer.train_dataloader
        dataset, size = loader.dataset, max(int(getattr(loader, "batch_size", 1) or 1), 1)
        episodes = [dataset[i] for i in range(len(dataset))]
        rank_zero_info(f"MADPO: building the one-shot preference pairs from {len(episodes)} training prompts x "
                       f"{self.preference.preference_num_candidates} joint responses (no update until they are built)")  # fmt: skip
        self.pairs, self.pair_tokens = [], []
        for start in range(0, len(episodes), size):
            built = self._build(episodes[start : start + size])
            self.pairs.extend(built.pairs)
            self.pair_tokens.extend(pair_tokens(built))
        self._order, self._epoch, self._cursor = list(range(len(self.pairs))), 0, 0
        if not self.pairs:
            rank_zero_warn("MADPO: every candidate of every prompt tied; no preference pair to train on")

    def _next_pairs(self) -> list[int] | None:
        """The next ``train_batch_size`` pair indices of the current pass (CoMLRL: ``random.shuffle``
        of the pair list at the start of every pass, then consecutive slices), or None when done."""
        if not self.pairs or self._epoch >= self.dpo.num_train_epochs:
            return None
        if self._cursor == 0:
            random.shuffle(self._order)
        size = self.dpo.train_batch_size
        chosen = self._order[self._cursor : self._cursor + size]
        self._cursor += size
        if self._cursor >= len(self._order):
            self._epoch, self._cursor = self._epoch + 1, 0
        return chosen

    # ------------------------------------------------------------------ the update
    def update_agents(self, tokens: list[list[PairTokens]]) -> tuple[list[AgentStats], dict[str, float]]:
        """One joint-DPO step of every agent on ``P`` pairs (``tokens[p][i]``): first every agent's
        no-grad log-probs (policy and reference: the other agents' Δ and the logged metrics), then per
        agent zero_grad, forward/backward over micro-batches, non-finite check, clip, step.

        Returns:
            Per agent its :class:`AgentStats` (``loss``, ``grad_norm``), and the DPO metrics
            (:func:`~comlrl_lightning.preference.dpo.dpo_metrics`; empty with no pair).
        """
        n = self.num_agents
        if not tokens:
            opts, _ = self.agent_optimizers()
            for opt in opts:  # nothing to learn from: the batch's steps count as skipped
                self._count_skipped_step(opt)
            return [AgentStats()] * n, {}
        parts = self.team.map(partial(self._logps, tokens=tokens), range(n))
        logps = PairLogps(*(torch.stack([p[k] for p in parts]) for k in range(4)))
        logged = dpo_metrics(logps, self.dpo.dpo_beta)
        stats: list[AgentStats] = [AgentStats()] * n
        for agents in self.team.rounds():
            fn = partial(self._backward, tokens=tokens, logps=logps)
            for i, s in zip(agents, self.team.map(fn, agents)):
                self.step_agent(i, s.loss, self.dpo)  # type: ignore[arg-type]  # reads on_nonfinite, max_grad_norm
                stats[i] = s
        return stats, logged

    def _chunks(self, num_pairs: int) -> list[slice]:
        size = self.dpo.micro_batch_size or num_pairs
        return [slice(s, s + size) for s in range(0, num_pairs, size)]

    @torch.no_grad()
    def _logps(self, agent: int, tokens: list[list[PairTokens]]) -> tuple[torch.Tensor, ...]:
        """``(chosen, rejected, ref_chosen, ref_rejected)``, each ``[P]`` on the CPU, of one agent."""
        mine, t = [row[agent] for row in tokens], self.team.sampling[agent].temperature
        mean = self.dpo.loss_type == "ipo"
        out: list[list[torch.Tensor]] = [[], [], [], []]
        for sl in self._chunks(len(mine)):
            c, r = agent_pair_logps(self.agents[agent], mine[sl], t, mean)
            out[0].append(c.float().cpu())
            out[1].append(r.float().cpu())
            if self.uses_reference_model:
                rc, rr = agent_pair_logps(self.team.reference(agent), mine[sl], t, mean)
                rc, rr = rc.float().cpu(), rr.float().cpu()
            else:
                rc = rr = torch.zeros_like(out[0][-1])
            out[2].append(rc)
            out[3].append(rr)
        return tuple(torch.cat(x) for x in out)

    def _backward(self, agent: int, tokens: list[list[PairTokens]], logps: PairLogps) -> AgentStats:
        opts, _ = self.agent_optimizers()
        opts[agent].zero_grad()
        mine, t = [row[agent] for row in tokens], self.team.sampling[agent].temperature
        others = logps.others(agent)
        ref_delta = logps.ref_chosen[agent] - logps.ref_rejected[agent]
        d, total = self.dpo, 0.0
        for sl in self._chunks(len(mine)):
            c, r = agent_pair_logps(self.agents[agent], mine[sl], t, d.loss_type == "ipo")
            own = c - r - ref_delta[sl].to(c)
            losses = joint_dpo_losses(own, others[sl], d.dpo_beta, d.loss_type, d.label_smoothing)
            loss = losses.sum() / len(mine)  # the mean over all P pairs, accumulated over chunks
            self.locked_backward(loss)
            total += float(loss.detach())
        grads = [p.grad for p in self.agents[agent].parameters() if p.grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        return AgentStats(loss=total, grad_norm=grad_norm)

    def log_step(self, out: StepOutput, logged: dict[str, float], num_pairs: int) -> None:
        """The module's scalars: the reward of the step's joint actions, the DPO metrics
        (:func:`~comlrl_lightning.preference.dpo.dpo_metrics`), the pair count, each agent's loss."""
        dev, n = self.device, out.num_episodes
        self.log(M.REWARD, out.rewards.mean().to(dev), prog_bar=True, batch_size=n, sync_dist=True)
        self.log(M.REWARD_STD, out.reward_std.to(dev), batch_size=n, sync_dist=True)
        self.log(M.NUM_PAIRS, float(num_pairs), batch_size=n, sync_dist=True)
        for name, value in logged.items():
            self.log(name, value, batch_size=n, sync_dist=True, prog_bar=name == M.DPO_MARGINS)
        for i, s in enumerate(out.agent_stats):
            self.log(M.agent(i, "loss"), s.loss, batch_size=n, sync_dist=True)
            self.log(M.agent(i, "grad_norm"), s.grad_norm, batch_size=n, sync_dist=True)

    # ------------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The base class's (RNG states, finite weights), plus the one-shot pair set and position."""
        super().on_save_checkpoint(checkpoint)
        if self.pairs is not None:
            checkpoint["preference_pairs"] = {
                "pairs": [p.to_json() for p in self.pairs],
                "tokens": [[t.to_state() for t in row] for row in self.pair_tokens],
                **(self._pass_start or self.pass_position()),
            }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("preference_pairs")
        if state is None:
            return
        self.pairs = [PreferencePair.from_json(d, "checkpoint") for d in state["pairs"]]
        self.pair_tokens = [[PairTokens.from_state(t) for t in row] for row in state["tokens"]]
        self._order, self._epoch, self._cursor = list(state["order"]), state["epoch"], state["cursor"]


def _check_joint_actor(agents: Any, num_agents: int | None, num_roles: int, adapter: Any) -> Any:
    """``collaboration_mode: centralized``: the adapter to use (default ``TaggedAdapter``).

    Raises:
        ValueError: more than one agent, ``num_agents`` other than None/1, or ``num_roles < 1``.
        TypeError: an adapter without callable ``build_prompt`` and ``parse_completion``.
    """
    if (isinstance(agents, (list, tuple)) and len(agents) != 1) or num_agents not in (None, 1):
        n = len(agents) if isinstance(agents, (list, tuple)) else num_agents
        raise ValueError(
            f"agents: got {n} agents with collaboration_mode='centralized'; it trains exactly one joint "
            "actor (the env's formatters are its roles: set num_roles)"
        )
    return joint_actor_adapter(num_roles, adapter)


def _candidate_rollout(rollout: RolloutConfig, preference: PreferenceConfig) -> RolloutConfig:
    """The rollout group with ``num_generations = preference_num_candidates`` (MADPO: one turn,
    aligned joint actions, ``shared`` credit; CoMLRL refuses the rest too).

    Raises:
        ValueError: ``num_turns > 1``, a non-aligned ``joint_mode``, another ``credit``, or a
            ``num_generations`` other than the default that differs from ``preference_num_candidates``.
    """
    k = preference.preference_num_candidates
    for field, value, ok in (
        ("num_turns", rollout.num_turns, 1),
        ("joint_mode", rollout.joint_mode, "aligned"),
        ("credit", rollout.credit, "shared"),
    ):
        if value != ok:
            raise ValueError(
                f"rollout.{field}: got {value!r}; MADPO pairs one-turn aligned joint actions: allowed {ok!r}"
            )
    if rollout.num_generations not in (RolloutConfig.num_generations, k):
        raise ValueError(
            f"rollout.num_generations: got {rollout.num_generations!r}, but preference.preference_num_candidates"
            f"={k}; MADPO samples preference_num_candidates per prompt: set that one (leave num_generations unset)"
        )
    return replace(rollout, num_generations=k)
