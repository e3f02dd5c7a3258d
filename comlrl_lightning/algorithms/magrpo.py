"""MAGRPO: multi-agent group-relative policy optimisation as a LightningModule.

Features:
    - N ≥ 1 agents (``num_agents=1`` is GRPO), each its own model and tokenizer, in an ``nn.ModuleList``;
    - manual optimisation, one optimizer (and optional LR scheduler) per agent, per-agent clipping;
    - one batched ``generate`` per agent per turn over episodes × K;
    - joint actions ``aligned`` (K per node) or ``cross`` (K^N per node);
    - tree rollouts over ``num_turns`` with ``discount`` and ``termination_threshold`` (see tree.py);
    - advantages ``mean`` | ``max`` | ``rloo`` | ``raw`` with optional group std scaling;
    - log-probs from ``logits / temperature``, EOS counted, padding masked, ``logits_to_keep``;
    - loss aggregation ``sequence_sum`` | ``sequence_mean`` | ``token_mean``;
    - ``num_iterations > 1``: PPO-style clipped ratio against log-probs from before the update;
    - ``beta > 0``: k3 KL to a frozen reference copy of each agent, as a loss term.

Not supported: value functions (see IAC/MAAC), vLLM generation, KL as reward shaping.

Step counting: Lightning counts every ``optimizer.step()`` in ``trainer.global_step``. One training
batch steps each of the N agents ``num_iterations`` times, so ``global_step`` grows by
``N · num_iterations`` per batch: ``Trainer(max_steps=S)`` trains ``S / (N · num_iterations)``
batches. Loggers' x-axis counts batches. :meth:`MAGRPO.max_steps_for` converts.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import nn

from comlrl_lightning.core.advantages import ADVANTAGE_MODES, JOINT_MODES, SCALE_MODES
from comlrl_lightning.team.agents import GENERATION_KEYS, AgentSpec, load_agent, validate_spec
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.envs.rewards import PASS_AT_1
from comlrl_lightning.core.losses import LOSS_AGGREGATIONS, aggregate, completion_logprobs, k3_kl, policy_loss_terms
from comlrl_lightning.core.generation import (Generation, SamplingConfig, context_length, fit_to_context, generate,
                                             has_chat_template, render_prompt)
from comlrl_lightning.team.parallel import BACKWARD_LOCK, AgentParallelMixin
from comlrl_lightning.infra.strategy import resolve_devices
from comlrl_lightning.core.rollout import Level, Node, compute_advantages, compute_returns, generations_per_episode, rollout_tree


def _choice(field: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ValueError(f"{field}: got {value!r}, allowed: {list(allowed)}")


PARALLEL_TRAINING = ("none", "mp")
def _normalize_agents(agents: Any, num_agents: int | None) -> list[AgentSpec]:
    if isinstance(agents, (str, AgentSpec, dict)):
        agents = [agents] * (num_agents or 1)
    specs = [AgentSpec(model=a) if isinstance(a, str) else AgentSpec(**a) if isinstance(a, dict) else a for a in agents]
    if num_agents is not None and len(specs) == 1 and num_agents > 1:
        specs = [copy.deepcopy(specs[0]) for _ in range(num_agents)]
    if not specs:
        raise ValueError("agents: got an empty list; give one AgentSpec (or model string) per agent, at least one")
    if num_agents is not None and len(specs) != num_agents:
        raise ValueError(f"agents: got {len(specs)} specs for num_agents={num_agents}; give one spec or num_agents")
    return specs


class MAGRPO(AgentParallelMixin, pl.LightningModule):
    """Multi-agent GRPO over a Dec-POMDP with a shared reward (Liu et al. 2025, arXiv 2508.04652).

    Args:
        agents: one :class:`AgentSpec` (or model string) per agent, or one broadcast to ``num_agents``.
        num_agents: number of agents; default ``len(agents)``.
        optimizer: per-agent optimizer factory (``OptimizerCallable``); default ``AdamW(lr=learning_rate)``.
        scheduler: optional per-agent LR scheduler factory, stepped after every optimizer step.
        learning_rate: learning rate of the default optimizer (CoMLRL ``agent_learning_rate``).
        num_generations: K samples per agent per node (≥ 2: the group baseline needs siblings).
        num_turns: turns per episode (> 1 needs the env's transition).
        joint_mode: ``"aligned"`` (K joint actions per node) or ``"cross"`` (K^N).
        advantage_mode: ``"mean"`` | ``"max"`` | ``"rloo"`` | ``"raw"`` (see advantages.py).
        scale_advantages: ``"group"`` (divide by group std + ``advantage_eps``) or ``"none"``.
        advantage_eps: std floor (≥ 1e-4).
        discount: γ in ``R_t = r_t + γ·mean(child returns)``.
        termination_threshold: a joint action with reward ≥ this ends its branch (None: never).
        max_generations_per_episode: budget guard; a larger full tree raises at construction.
        temperature, top_p, top_k, max_new_tokens: sampling (``AgentSpec.generation`` overrides per agent).
        max_prompt_length: prompts longer than this (tokens, history included) keep their last tokens;
            prompts are also cut from the left to fit the model's context with ``max_new_tokens``
            (with a warning).
        stop_after_code_block: end each completion after its first complete fenced code block
            (for coding prompts that ask for one block; see ``core/stopping.py``).
        loss_aggregation: ``"sequence_sum"`` (MAGRPO paper) | ``"sequence_mean"`` | ``"token_mean"``.
        num_iterations: optimisation passes per rollout batch (> 1 uses the clipped ratio).
        epsilon: lower clip ε of the ratio; epsilon_high: upper ε (default ``epsilon``).
        beta: weight of the k3 KL to the frozen reference model (0: no reference model is kept).
        max_grad_norm: per-agent gradient-norm clip (None: off).
        micro_batch_size: samples per forward/backward (gradients accumulate; one step per agent).
        val_sampling: validate with one sampled completion per agent (training's sampling knobs)
            instead of greedy decoding.
        parallel_training: ``"none"`` or ``"mp"`` (CoMLRL's name: one process, agent i on
            ``agent_devices[i]``). Under ``Trainer(strategy="agent_parallel")`` the strategy places the
            models; under a plain single-device strategy the module places them itself at fit start
            (after Lightning has moved the whole module to the root device, so prefer the strategy
            for models that do not fit on one device together). Multi-process strategies are refused.
        agent_devices: one device per agent (``["cuda:0", "cuda:1"]``), ``"auto"`` or None; required
            (a list of ``num_agents``) with ``"mp"``; read by the ``agent_parallel`` strategy when that
            strategy gets no devices of its own.
        env: the Dec-POMDP; default: the datamodule's ``env``.

    Concurrency: when the agents live on two or more devices and one of them is a GPU, rollout
    generation and the per-agent forward/backward run in one thread per device; optimizer steps stay
    in the main thread, in agent order (so ``global_step`` still grows by N per batch). Set the
    attribute ``concurrent_agents`` to True/False to force it (True on one device: one thread per
    distinct agent model, which only contends; useful for tests and benchmarks).

    Raises:
        ValueError: a bad config value, naming the field, before any model is loaded.
    """

    def __init__(
        self,
        agents: list[AgentSpec] | AgentSpec | list[str] | str,
        num_agents: int | None = None,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        learning_rate: float = 5e-6,
        num_generations: int = 4,
        num_turns: int = 1,
        joint_mode: str = "aligned",
        advantage_mode: str = "mean",
        scale_advantages: str = "group",
        advantage_eps: float = 1e-4,
        discount: float = 1.0,
        termination_threshold: float | None = None,
        max_generations_per_episode: int = 4096,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        max_new_tokens: int = 64,
        max_prompt_length: int | None = None,
        stop_after_code_block: bool = False,
        loss_aggregation: str = "sequence_sum",
        num_iterations: int = 1,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        max_grad_norm: float | None = 1.0,
        micro_batch_size: int | None = None,
        val_sampling: bool = False,
        parallel_training: str = "none",
        agent_devices: list[str] | str | None = None,
        env: DecPOMDP | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.specs = _normalize_agents(agents, num_agents)
        self.num_agents = len(self.specs)
        for i, spec in enumerate(self.specs):
            validate_spec(spec, i, self.num_agents)
        if num_generations < 2:
            raise ValueError(f"num_generations: got {num_generations}; the group baseline needs >= 2 samples")
        if num_turns < 1:
            raise ValueError(f"num_turns: got {num_turns}, must be >= 1")
        _choice("joint_mode", joint_mode, JOINT_MODES)
        _choice("advantage_mode", advantage_mode, ADVANTAGE_MODES)
        _choice("scale_advantages", scale_advantages, SCALE_MODES)
        _choice("loss_aggregation", loss_aggregation, LOSS_AGGREGATIONS)
        checks = [  # (field, value, ok, allowed)
            ("advantage_eps", advantage_eps, advantage_eps >= 1e-4, ">= 1e-4"),
            ("discount", discount, 0.0 <= discount <= 1.0, "in [0, 1]"),
            ("num_iterations", num_iterations, num_iterations >= 1, ">= 1"),
            ("epsilon", epsilon, epsilon > 0, "> 0"),
            ("beta", beta, beta >= 0, ">= 0"),
            ("learning_rate", learning_rate, learning_rate > 0, "> 0"),
            ("micro_batch_size", micro_batch_size, micro_batch_size is None or micro_batch_size >= 1, ">= 1 or None"),
        ]
        for name, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}: got {value!r}, must be {allowed}")
        _choice("parallel_training", parallel_training, PARALLEL_TRAINING)
        if parallel_training == "mp" and (isinstance(agent_devices, str) or agent_devices is None
                                          or len(agent_devices) != self.num_agents):  # fmt: skip
            raise ValueError(f"agent_devices: parallel_training='mp' needs a list of {self.num_agents} devices "
                             f"(one per agent), got {agent_devices!r}")  # fmt: skip
        # parse devices (and AgentSpec.device) and check shared agents' devices now, before any model loads
        owners = [i if s.share_weights_with is None else s.share_weights_with for i, s in enumerate(self.specs)]
        resolve_devices(agent_devices, self.num_agents, num_gpus=None, owners=owners, overrides=[s.device for s in self.specs])
        budget = generations_per_episode(self.num_agents, num_generations, num_turns, joint_mode)
        if budget > max_generations_per_episode:
            raise ValueError(
                f"num_generations={num_generations}, num_agents={self.num_agents}, num_turns={num_turns}, "
                f"joint_mode={joint_mode!r} make up to {budget} generations per episode, over "
                f"max_generations_per_episode={max_generations_per_episode}; lower K/turns, use 'aligned', "
                "set termination_threshold, or raise the limit"
            )
        self.save_hyperparameters(ignore=["agents", "env", "optimizer", "scheduler"])
        self.hparams["agents"] = [asdict(s) for s in self.specs]
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self._env = env
        self.agents = nn.ModuleList()
        self.reference_models = nn.ModuleList()
        self.tokenizers: list[Any] = []
        base = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                              max_prompt_length=max_prompt_length, stop_after_code_block=stop_after_code_block)  # fmt: skip
        base.check()
        # the module's knobs passed, so a failure below is the agent's own override: name that field
        self.sampling = [replace(base, **{k: v for k, v in s.generation.items() if k in GENERATION_KEYS})
                         for s in self.specs]  # fmt: skip
        for i, sampling in enumerate(self.sampling):
            sampling.check(prefix=f"agents[{i}].generation.")

    # ------------------------------------------------------------------ setup
    @property
    def env(self) -> DecPOMDP:
        """The Dec-POMDP: the one given to ``__init__``, else ``trainer.datamodule.env``."""
        if self._env is not None:
            return self._env
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or getattr(dm, "env", None) is None:
            raise RuntimeError("MAGRPO.env: pass env=... or fit with a DecPOMDPDataModule (which has .env)")
        return dm.env

    def setup(self, stage: str) -> None:
        if self.env.num_agents != self.num_agents:
            raise ValueError(
                f"data.formatters: the env has {self.env.num_agents} formatters (one per agent) but "
                f"model.num_agents={self.num_agents}; give one formatter per agent"
            )
        if self.hparams.num_turns > 1 and self.env.transition_fn is None:
            raise ValueError(f"num_turns={self.hparams.num_turns} needs an env transition (data.transition)")
        strategy = self.trainer.strategy
        if self.hparams.parallel_training == "mp" and not isinstance(strategy, SingleDeviceStrategy):
            raise ValueError(f"parallel_training='mp' runs the team in one process; the trainer's strategy is "
                             f"{type(strategy).__name__}: use strategy='agent_parallel' (or parallel_training='none')")  # fmt: skip
        distinct = sum(s.share_weights_with is None for s in self.specs)
        if isinstance(strategy, DDPStrategy) and distinct > 1 and not strategy._ddp_kwargs.get("find_unused_parameters"):
            raise ValueError("each agent's backward uses only that agent's parameters, so DDP needs "
                             "find_unused_parameters: use strategy='ddp_find_unused_parameters_true' "
                             "(or DDPStrategy(find_unused_parameters=True))")  # fmt: skip

    def configure_model(self) -> None:
        """Load every agent (and reference copy) once; idempotent across stages."""
        if len(self.agents):
            return
        models: list[nn.Module] = []
        for spec in self.specs:
            if spec.share_weights_with is not None:
                models.append(models[spec.share_weights_with])
                self.tokenizers.append(self.tokenizers[spec.share_weights_with])
                continue
            model, tok = load_agent(spec)
            models.append(model)
            self.tokenizers.append(tok)
        self.agents.extend(models)
        for i, (model, sampling) in enumerate(zip(models, self.sampling)):
            try:
                fit_to_context(torch.zeros(1, 0), torch.zeros(1, 0), context_length(model), sampling.max_new_tokens)
            except ValueError as err:
                raise ValueError(f"agents[{i}] ({self.specs[i].model}): {err}") from None
        if self.hparams.beta > 0:
            refs: dict[int, nn.Module] = {}
            for m in models:
                if id(m) not in refs:
                    refs[id(m)] = copy.deepcopy(m).requires_grad_(False).eval()
                self.reference_models.append(refs[id(m)])

    def configure_optimizers(self) -> list[dict[str, Any]]:
        out = []
        for i, (spec, model) in enumerate(zip(self.specs, self.agents)):
            params = [p for p in model.parameters() if p.requires_grad]
            opt = (
                self.optimizer_factory(params)
                if self.optimizer_factory is not None
                else torch.optim.AdamW(params, lr=self.hparams.learning_rate)
            )
            if spec.learning_rate is not None:
                for group in opt.param_groups:
                    group["lr"] = spec.learning_rate
                    group["initial_lr"] = spec.learning_rate
            entry: dict[str, Any] = {"optimizer": opt}
            if self.scheduler_factory is not None:
                entry["lr_scheduler"] = {"scheduler": self.scheduler_factory(opt), "name": f"lr/agent_{i}"}
            out.append(entry)
        return out

    @staticmethod
    def max_steps_for(num_batches: int, num_agents: int, num_iterations: int = 1) -> int:
        """``trainer.max_steps`` that trains ``num_batches`` batches (Lightning counts every optimizer step)."""
        return num_batches * num_agents * num_iterations

    # --------------------------------------------------------------- rollout
    def _render(self, agent: int, node: Node) -> str:
        spec, tok = self.specs[agent], self.tokenizers[agent]
        return render_prompt(tok, node.prompts[agent], node.completions[agent], spec.chat_template)

    def _chat_rendered(self, agent: int) -> bool:
        return self.specs[agent].chat_template and has_chat_template(self.tokenizers[agent])

    def generate_agents(self, prompts: Sequence[Sequence[str]], num_generations: int, greedy: bool = False) -> list[Generation]:
        """One batched ``generate`` per agent; ``prompts[i]`` are agent i's prompt texts. Agents on
        different devices generate concurrently (one thread per device, see ``concurrent_agents``)."""

        def one(i: int) -> Generation:
            return generate(self.agents[i], self.tokenizers[i], prompts[i], num_generations, self.sampling[i],
                            self._chat_rendered(i), do_sample=not greedy)  # fmt: skip

        groups = self._agent_groups()
        if not self._concurrent(groups):
            return [one(i) for i in range(self.num_agents)]
        return self._run_groups(groups, one)

    def rollout(self, episodes: Sequence[Episode], evaluation: bool = False) -> list[Level]:
        """Tree rollout of ``episodes`` with returns and advantages filled in. ``evaluation``: one
        completion per agent per turn (one path), greedy unless ``val_sampling``."""
        hp = self.hparams
        k = 1 if evaluation else hp.num_generations
        greedy = evaluation and not hp.val_sampling
        levels = rollout_tree(
            self.env, episodes, lambda p: self.generate_agents(p, k, greedy), self._render, k, hp.num_turns,
            "aligned" if evaluation else hp.joint_mode, hp.termination_threshold, step=self.global_step,
        )  # fmt: skip
        compute_returns(levels, hp.discount)
        compute_advantages(levels, self.num_agents, k, "aligned" if evaluation else hp.joint_mode,
                           hp.advantage_mode, hp.scale_advantages if k > 1 else "none", hp.advantage_eps)  # fmt: skip
        return levels

    # ---------------------------------------------------------------- update
    def _chunks(self, levels: list[Level], agent: int) -> list[tuple[Generation, torch.Tensor]]:
        size = self.hparams.micro_batch_size
        out = []
        for level in levels:
            gen, adv = level.generations[agent], level.advantages[agent]
            rows = torch.arange(len(gen.texts))
            for idx in rows.split(size or len(rows)):
                out.append((gen.rows(idx), adv[idx]))
        return out

    def _agent_batch(self, agent: int, levels: list[Level]) -> dict[str, Any]:
        """Agent ``agent``'s micro-batches, their totals, and (no-grad) old / reference log-probs."""
        hp = self.hparams
        model, temp = self.agents[agent], self.sampling[agent].temperature
        chunks = self._chunks(levels, agent)
        old, ref = [None] * len(chunks), [None] * len(chunks)
        with torch.no_grad():
            for c, (g, _) in enumerate(chunks):
                args = (g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, temp)
                if hp.num_iterations > 1:
                    old[c] = completion_logprobs(model, *args)
                if hp.beta > 0:
                    ref[c] = completion_logprobs(self.reference_models[agent], *args).to(self._agent_device(agent))
        return {
            "chunks": chunks, "old": old, "ref": ref,
            "num_rows": sum(len(g.texts) for g, _ in chunks),
            "num_tokens": int(sum(int(g.completion_mask.sum()) for g, _ in chunks)),
        }  # fmt: skip

    def _agent_backward(self, agent: int, batch: dict[str, Any], opt: Any) -> dict[str, float]:
        """``zero_grad``, then forward/backward over the agent's micro-batches; returns its stats.

        Thread-safe across agents on different models: ``manual_backward`` runs under a lock.
        """
        hp = self.hparams
        model, temp = self.agents[agent], self.sampling[agent].temperature
        chunks, old, ref = batch["chunks"], batch["old"], batch["ref"]
        num_rows, num_tokens = batch["num_rows"], batch["num_tokens"]
        eps_high = hp.epsilon if hp.epsilon_high is None else hp.epsilon_high
        opt.zero_grad()
        loss_sum = kl_sum = clipped_sum = 0.0
        for c, (g, adv) in enumerate(chunks):
            mask = g.completion_mask.to(self._agent_device(agent))
            logps = completion_logprobs(model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask, temp)
            per_tok, clipped = policy_loss_terms(logps, old[c], adv.to(logps.device), hp.epsilon, eps_high)
            if hp.beta > 0:
                kl = k3_kl(logps, ref[c])
                per_tok = per_tok + hp.beta * kl
                kl_sum += float(aggregate(kl.detach(), mask, "token_mean", num_rows, num_tokens))
            loss = aggregate(per_tok, mask, hp.loss_aggregation, num_rows, num_tokens)
            with BACKWARD_LOCK:
                self.manual_backward(loss)
            loss_sum += float(loss.detach())
            clipped_sum += float((clipped & mask.bool()).sum())
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        return {"loss": loss_sum, "kl": kl_sum, "clip_ratio": clipped_sum / max(num_tokens, 1), "grad_norm": grad_norm}

    def _agent_step(self, opt: Any, sch: Any) -> None:
        """Clip, ``optimizer.step()`` (counted by Lightning) and scheduler step; main thread only."""
        if self.hparams.max_grad_norm is not None:
            self.clip_gradients(opt, gradient_clip_val=self.hparams.max_grad_norm, gradient_clip_algorithm="norm")
        opt.step()
        # free this agent's gradients now, not at its next zero_grad: otherwise every other agent's
        # backward runs while they still hold memory (one parameter-sized buffer per agent)
        opt.zero_grad(set_to_none=True)
        if sch is not None:
            sch.step()

    def _update_agent(self, agent: int, levels: list[Level], opt: Any, sch: Any) -> dict[str, float]:
        """``num_iterations`` × (zero_grad, backward, step) for one agent."""
        batch = self._agent_batch(agent, levels)
        stats = {"loss": 0.0, "kl": 0.0, "clip_ratio": 0.0, "grad_norm": 0.0}
        for _ in range(self.hparams.num_iterations):
            stats = self._agent_backward(agent, batch, opt)
            self._agent_step(opt, sch)
        return stats

    def _update_agents(self, levels: list[Level], opts: list[Any], schs: list[Any]) -> list[dict[str, float]]:
        """Update every agent. Serial on one device; otherwise in rounds (one agent per device group
        per round, so agents sharing weights never overwrite each other's gradients): the round's
        forward/backward passes run in threads, then its optimizer steps run here, in agent order."""
        groups = self._agent_groups()
        if not self._concurrent(groups):
            return [self._update_agent(i, levels, opts[i], schs[i]) for i in range(self.num_agents)]
        stats: list[Any] = [None] * self.num_agents
        for r in range(max(len(g) for g in groups)):
            rnd = [[g[r]] for g in groups if r < len(g)]
            batches = self._run_groups(rnd, lambda i: self._agent_batch(i, levels))
            for _ in range(self.hparams.num_iterations):
                out = self._run_groups(rnd, lambda i: self._agent_backward(i, batches[i], opts[i]))
                for (i,) in sorted(rnd):
                    self._agent_step(opts[i], schs[i])
                    stats[i] = out[i]
        return stats

    def training_step(self, batch: list[Episode], batch_idx: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        levels = self.rollout(batch)
        t_rollout = time.perf_counter() - t0
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        schs = self.lr_schedulers()
        schs = (schs if isinstance(schs, list) else [schs]) if schs is not None else [None] * self.num_agents
        agent_stats = self._update_agents(levels, opts, schs)
        out = self._step_outputs(levels, batch, agent_stats)
        out["rollout_time_s"] = t_rollout
        out["step_time_s"] = time.perf_counter() - t0
        self._log_core(out, len(batch))
        return out

    # ---------------------------------------------------------------- report
    def _step_outputs(self, levels: list[Level], batch: list[Episode], agent_stats: list[dict[str, float]]) -> dict[str, Any]:
        rewards = torch.cat([lv.rewards.flatten() for lv in levels])
        node_std = torch.cat([lv.rewards.std(-1) if lv.rewards.shape[1] > 1 else torch.zeros(lv.rewards.shape[0]) for lv in levels])
        components: dict[str, torch.Tensor] = {}
        for lv in levels:
            for name, v in lv.components.items():
                components[name] = torch.cat([components[name], v.flatten()]) if name in components else v.flatten()
        first = levels[0]
        return {
            "loss": torch.tensor(sum(s["loss"] for s in agent_stats)),
            "rewards": rewards,
            "reward_std": node_std.mean(),
            "frac_reward_zero_std": (node_std == 0).float().mean(),
            "reward_components": components,
            "turn_rewards": [lv.rewards.flatten() for lv in levels],
            "turn_returns": [lv.returns.flatten() for lv in levels],
            "completion_lengths": [torch.cat([lv.generations[i].lengths for lv in levels]) for i in range(self.num_agents)],
            "clipped": [torch.cat([lv.generations[i].clipped for lv in levels]) for i in range(self.num_agents)],
            "agent_stats": agent_stats,
            "num_episodes": len(batch),
            "num_tokens": int(sum(lv.generations[i].completion_mask.sum() for lv in levels for i in range(self.num_agents))),
            "prompts": first.prompt_texts,
            "user_prompts": [[node.prompts[i][-1] for node in first.nodes] for i in range(self.num_agents)],
            "completions": [first.generations[i].texts for i in range(self.num_agents)],
            "turn0_rewards": first.rewards,
            "num_generations": self.hparams.num_generations,
        }

    def _log_core(self, out: dict[str, Any], batch_size: int) -> None:
        # sync_dist: under DDP every rank saw other episodes; the logged value is the mean over ranks
        # (a no-op in one process). Values go to self.device first: NCCL cannot reduce CPU tensors.
        dev = self.device
        self.log("reward", out["rewards"].mean().to(dev), prog_bar=True, batch_size=batch_size, sync_dist=True)
        self.log("reward_std", out["reward_std"].to(dev), batch_size=batch_size, sync_dist=True)
        self.log("frac_reward_zero_std", out["frac_reward_zero_std"].to(dev), batch_size=batch_size, sync_dist=True)
        lengths = torch.cat(out["completion_lengths"]).float()
        self.log("completions/mean_length", lengths.mean().to(dev), batch_size=batch_size, sync_dist=True)
        for i, s in enumerate(out["agent_stats"]):
            self.log(f"agent_{i}/loss", s["loss"], batch_size=batch_size, sync_dist=True)

    # ------------------------------------------------------------ validation
    def validation_step(self, batch: list[Episode], batch_idx: int) -> dict[str, Any]:
        """One completion per agent per turn (greedy unless ``val_sampling``); logs ``val/reward``, ``val/return``,
        ``val/rewards/<name>/mean`` and ``val/pass@1`` when a reward reports ``all_passed`` (turn 0),
        and ``val/turn_<t>/reward`` when ``num_turns > 1``."""
        levels = self.rollout(batch, evaluation=True)
        n, dev = len(batch), self.device
        self.log("val/reward", levels[0].rewards.mean().to(dev), prog_bar=True, batch_size=n, sync_dist=True)
        self.log("val/return", levels[0].returns.mean().to(dev), batch_size=n, sync_dist=True)
        for name, v in levels[0].components.items():
            self.log(f"val/rewards/{name}/mean", v.nanmean().to(dev), batch_size=n, sync_dist=True)
            if name.endswith(f"/{PASS_AT_1}"):  # one sample per problem: the fraction solved is pass@1
                self.log("val/pass@1", v.nanmean().to(dev), prog_bar=True, batch_size=n, sync_dist=True)
        if self.hparams.num_turns > 1:
            for lv in levels:
                self.log(f"val/turn_{lv.turn}/reward", lv.rewards.mean().to(dev), batch_size=lv.rewards.numel(), sync_dist=True)
        return {"levels": levels}

    # ------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add the global RNG states (python, numpy, torch CPU/CUDA) as ``checkpoint["rng_states"]``.

        Sampling draws from torch's global RNG, so exact resume needs them (Lightning saves agents,
        optimizers, schedulers, loops and the datamodule's data position itself).
        """
        from comlrl_lightning.infra.rng import collect_rng_states

        checkpoint["rng_states"] = collect_rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the saved RNG states until :meth:`on_train_start` applies them.

        Restoring here would be too early: code that runs between checkpoint loading and the first
        batch (``configure_optimizers``, callbacks' ``on_fit_start``, starting the train DataLoader)
        may still draw from the global RNG.
        """
        self._resume_rng_states = checkpoint.get("rng_states")

    def on_train_start(self) -> None:
        """Apply RNG states stashed by :meth:`on_load_checkpoint` (once), right before training resumes."""
        states = getattr(self, "_resume_rng_states", None)
        if states is not None:
            from comlrl_lightning.infra.rng import set_rng_states

            set_rng_states(states)
            self._resume_rng_states = None


class MAREINFORCE(MAGRPO):
    """MAGRPO with ``advantage_mode="raw"`` (no baseline; CoMLRL's MAREINFORCE)."""

    def __init__(self, *args: Any, advantage_mode: str = "raw", **kwargs: Any) -> None:
        super().__init__(*args, advantage_mode=advantage_mode, **kwargs)


class MARLOO(MAGRPO):
    """MAGRPO with ``advantage_mode="rloo"`` (leave-one-out baseline; CoMLRL's MARLOO)."""

    def __init__(self, *args: Any, advantage_mode: str = "rloo", **kwargs: Any) -> None:
        super().__init__(*args, advantage_mode=advantage_mode, **kwargs)


class MAReMax(MAGRPO):
    """MAGRPO with ``advantage_mode="max"`` (max baseline; CoMLRL's MAReMax)."""

    def __init__(self, *args: Any, advantage_mode: str = "max", **kwargs: Any) -> None:
        super().__init__(*args, advantage_mode=advantage_mode, **kwargs)
