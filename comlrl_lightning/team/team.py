"""The team: every agent's spec, model, reference model, tokenizer and sampling config, and the one
place where per-agent work runs in threads (:meth:`Team.map`).

When the agents span two or more devices and one is a GPU, per-agent work runs in one thread per
device: CUDA kernels of different devices overlap while Python drives them. Serial and threaded
execution go through the same :meth:`Team.map`; :meth:`Team.rounds` says which agents may run
together (agents sharing weights never do, so they cannot overwrite each other's gradients).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.core.generation import (
    Generation,
    context_length,
    fit_to_context,
    generate,
    has_chat_template,
    render_prompt,
)
from comlrl_lightning.core.records import Node, TeamAction, TurnState
from comlrl_lightning.core.rollout import independent_action
from comlrl_lightning.team.agents import GENERATION_KEYS, AgentSpec
from comlrl_lightning.team.kinds import AgentKind, check_kinds, kind_of, resolve_kind

if TYPE_CHECKING:
    from comlrl_lightning.team.engine_pool import EnginePool

BACKWARD_LOCK = threading.Lock()
"""Serialises ``manual_backward`` across agent threads (Lightning's hooks and precision plugin are not
thread-safe); CUDA launches are asynchronous, so the kernels of different devices still overlap."""


def _thread_state() -> Callable[[], ExitStack]:
    """A context factory that re-enters the calling thread's grad mode and autocast (both thread-local)
    in a worker thread."""
    grad = torch.is_grad_enabled()
    casts = [(d, torch.get_autocast_dtype(d)) for d in ("cuda", "cpu") if torch.is_autocast_enabled(d)]

    def enter() -> ExitStack:
        stack = ExitStack()
        stack.enter_context(torch.set_grad_enabled(grad))
        for device_type, dtype in casts:
            stack.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=False))
        return stack

    return enter


class Team:
    """N agents and what each needs to act: ``specs``, ``agents`` / ``reference_models`` (ModuleLists
    the owning LightningModule registers, so checkpoints and device moves see them), ``tokenizers``
    and per-agent ``sampling`` (the module's :class:`SamplingConfig` with ``AgentSpec.generation``
    overrides).

    Attributes:
        concurrent: None: threads when the agents span >= 2 devices, one of them a GPU; True/False:
            force (True on one device: one thread per distinct agent model, which only contends;
            useful for tests and benchmarks).
    """

    def __init__(self, specs: Sequence[AgentSpec], sampling: SamplingConfig) -> None:
        self.specs = list(specs)
        if self.specs and all(s.frozen for s in self.specs):
            raise ValueError("agents[*].frozen: every agent is frozen; at least one must train")
        self.sampling = []
        for i, s in enumerate(self.specs):
            try:  # the module's knobs passed already, so a failure is this agent's override: name it
                self.sampling.append(
                    SamplingConfig(
                        **{
                            **vars(sampling),
                            **{k: v for k, v in s.generation.items() if k in GENERATION_KEYS},
                        }
                    )
                )
            except ValueError as err:
                raise ValueError(f"agents[{i}].generation.{err}") from None
        for i, s in enumerate(self.specs):  # a bad import path names its agent before any model loads
            if s.kind is not None:
                resolve_kind(s.kind, f"agents[{i}].kind")
        self.kinds: list[AgentKind] = [self.agent_kind(s) for s in self.specs]
        """What each agent is (:mod:`~comlrl_lightning.team.kinds`): how it is built, what it trains,
        its reference model, what checkpoints hold of it."""
        check_kinds(self.specs, self.kinds)
        self.agents = nn.ModuleList()
        self.reference_models = nn.ModuleList()
        self.reference_owners: list[int] = []
        """``reference_owners[k]``: the agent whose frozen copy ``reference_models[k]`` is (agents whose
        kind needs no copy, e.g. LoRA, have none)."""
        self.tokenizers: list[Any] = []
        self.concurrent: bool | None = None
        self.rollout_context: Callable[[nn.Module], AbstractContextManager[Any]] = lambda model: nullcontext()
        """Entered around each agent's ``generate`` with its model: the sharded strategy sets
        :func:`~comlrl_lightning.infra.sharded.gathered` (one agent's full weights for its rollout)."""
        self._engine_pool: EnginePool | None = None

    @property
    def num_agents(self) -> int:
        return len(self.specs)

    def agent_kind(self, spec: AgentSpec) -> AgentKind:
        """The kind of the agent ``spec`` describes (the team factory's seam: override it, or
        ``CoMLRLModule.build_team``, to add a kind). Default :func:`~comlrl_lightning.team.kinds.kind_of`."""
        return kind_of(spec)

    def load(self, with_reference: bool) -> None:
        """Build every agent once, in order, through its kind (agents sharing weights get the same
        module and tokenizer; LoRA agents sharing a base get their own adapter over one base) and,
        with ``with_reference``, one frozen reference copy per distinct model whose kind needs one.
        Idempotent."""
        if len(self.agents):
            return
        for i, kind in enumerate(self.kinds):
            model, tok = kind.build(self, i)
            self.agents.append(model)
            self.tokenizers.append(tok)
        for i, (model, sampling) in enumerate(zip(self.agents, self.sampling)):
            try:  # refuse now, not at the first generate: max_new_tokens must leave room for a prompt
                fit_to_context(
                    torch.zeros(1, 0), torch.zeros(1, 0), context_length(model), sampling.max_new_tokens
                )
            except ValueError as err:
                raise ValueError(f"agents[{i}] ({self.specs[i].model}): {err}") from None
        if with_reference:
            refs: dict[int, nn.Module] = {}
            for i, m in enumerate(self.agents):
                if not self.kinds[i].needs_reference_copy:
                    continue
                if id(m) not in refs:
                    refs[id(m)] = copy.deepcopy(m).requires_grad_(False).eval()
                self.reference_models.append(refs[id(m)])
                self.reference_owners.append(i)

    # ------------------------------------------------------------ what each agent trains (the seam)
    def trainable_parameters(self, agent: int) -> list[nn.Parameter]:
        """The parameters ``agent``'s optimizer steps (its kind decides: every weight, or its adapter)."""
        return self.kinds[agent].trainable_parameters(self.agents[agent])

    def reference(self, agent: int) -> Any:
        """``agent``'s reference model for the KL (called like a model, ``.parameters()`` on its device):
        its frozen copy, or for a LoRA agent its own model with the adapter disabled; None for a kind
        that needs a copy when the team was loaded without references (``beta == 0``)."""
        k = self.reference_owners.index(agent) if agent in self.reference_owners else None
        if k is None and self.kinds[agent].needs_reference_copy:
            return None
        return self.kinds[agent].reference(
            self.agents[agent], None if k is None else self.reference_models[k]
        )

    def checkpoint_exclusions(self, prefix: str = "agents.") -> set[str]:
        """State-dict keys (``<prefix><i>.<key>``) a checkpoint leaves out: frozen bases (LoRA: the
        checkpoint holds adapters only), reloaded from their source when a run resumes."""
        return {
            f"{prefix}{i}.{key}"
            for i, kind in enumerate(self.kinds)
            for key in kind.frozen_state_keys(self.agents[i])
        }

    def load_saved(self, agent: int, folder: str) -> nn.Module:
        """``agent``'s model read back from ``folder`` (written by its ``save_pretrained``), in the agent's
        dtype; its kind decides how (:meth:`~comlrl_lightning.team.kinds.AgentKind.load_saved`)."""
        dtype = next(self.agents[agent].parameters()).dtype
        return self.kinds[agent].load_saved(agent, folder, dtype)

    def device(self, agent: int) -> torch.device:
        """The device of ``agent``'s parameters."""
        return next(self.agents[agent].parameters()).device

    # ------------------------------------------------------------ acting (the rollout's Actors protocol)
    def act(self, state: TurnState) -> TeamAction:
        """The default way a team acts: every agent renders its own history at each node and samples
        ``K`` completions of it, one batched ``generate`` per agent (see ``core/rollout.Actors``)."""
        return independent_action(self, state)

    def render(self, agent: int, node: Node) -> str:
        """The text ``agent`` conditions on at ``node``: its history, in its chat template if it has one."""
        tok, chat = self.tokenizers[agent], self.specs[agent].chat_template
        return render_prompt(tok, node.prompts[agent], node.completions[agent], chat)

    def generate(
        self, prompts: Sequence[Sequence[str]], num_generations: int, greedy: bool = False
    ) -> list[Generation]:
        """One batched ``generate`` per agent; ``prompts[i]`` are agent i's ``B`` prompt texts. Returns
        per agent a Generation of ``B·K`` rows (see :func:`comlrl_lightning.core.generation.generate`).

        Agents that share an inference engine (``generation_backend: vllm``: LoRA adapters on one base,
        agents sharing weights) roll out together in one engine call per engine
        (:meth:`~comlrl_lightning.team.engine_pool.EnginePool.generate_joint`, its seeds drawn in agent
        order), after the other agents, which roll out as without it (:meth:`map`)."""
        groups = self._engine_groups()
        singles = [i for i in range(self.num_agents) if not any(i in g for g in groups)]
        call = partial(self._generate, prompts=prompts, num_generations=num_generations, greedy=greedy)
        out = dict(zip(singles, self.map(call, singles)))
        for group in groups:
            texts, chat = [prompts[a] for a in group], [self._chat(a) for a in group]
            out.update(
                zip(group, self.engine_pool().generate_joint(group, texts, num_generations, chat, greedy))
            )
        return [out[i] for i in range(self.num_agents)]

    def _engine_groups(self) -> list[list[int]]:
        """The groups of agents that share an inference engine (none without ``generation_backend: vllm``)."""
        if all(s.generation_backend != "vllm" for s in self.sampling):
            return []
        return self.engine_pool().joint_groups()

    def _chat(self, agent: int) -> bool:
        """Whether ``agent``'s prompts are rendered in its chat template (it asks for one and has one)."""
        return bool(self.specs[agent].chat_template and has_chat_template(self.tokenizers[agent]))

    def _generate(
        self, agent: int, prompts: Sequence[Sequence[str]], num_generations: int, greedy: bool
    ) -> Generation:
        return self.generate_one(agent, prompts[agent], num_generations, greedy)

    def generate_one(
        self, agent: int, prompts: Sequence[str], num_generations: int, greedy: bool = False
    ) -> Generation:
        """Agent ``agent``'s ``num_generations`` completions of each of its ``B`` ``prompts`` (``B·K``
        rows): for actors where agents act one after another (no thread, see :meth:`generate`)."""
        tok, chat = self.tokenizers[agent], self._chat(agent)
        sampling = self.sampling[agent]
        if sampling.generation_backend == "vllm":  # the agent's inference engine (team/engine.py)
            return self.engine_pool().generate(agent, prompts, num_generations, chat, greedy)
        kind, model = self.kinds[agent], self.agents[agent]
        with self.rollout_context(model), kind.rollout_model(agent, model, sampling.adapter_rollouts) as gen:
            return generate(gen, tok, prompts, num_generations, sampling, chat, do_sample=not greedy)

    def engine_pool(self) -> EnginePool:
        """The team's inference engines (``generation_backend: vllm``), made at the first call."""
        if self._engine_pool is None:
            from comlrl_lightning.team.engine_pool import EnginePool

            self._engine_pool = EnginePool(self)
        return self._engine_pool

    def close_engines(self) -> None:
        """Shut the team's inference engines down if any were built (a later engine rollout builds them
        again). vLLM's shutdown also tears down the process's default process group (its own, in
        process): call it once the run's collective work is done."""
        if self._engine_pool is not None:
            self._engine_pool.close()

    # ------------------------------------------------------------ threads
    def _groups(self, agents: Sequence[int]) -> list[list[int]]:
        """``agents`` grouped by device (by distinct model when ``concurrent`` is True); agents sharing
        weights are always in one group."""
        groups: dict[Any, list[int]] = {}
        for i in agents:
            groups.setdefault(id(self.agents[i]) if self.concurrent else self.device(i), []).append(i)
        return list(groups.values())

    def _threaded(self, groups: list[list[int]]) -> bool:
        if len(groups) < 2 or self.concurrent is False:
            return False
        return bool(self.concurrent) or any(self.device(g[0]).type == "cuda" for g in groups)

    def rounds(self) -> list[list[int]]:
        """Agents that may be updated together: one per device group per round when threaded, else
        one agent per round in agent order; a frozen agent (``AgentSpec.frozen``) is in none."""
        trainable = [i for i in range(self.num_agents) if not self.specs[i].frozen]
        groups = self._groups(trainable)
        if not self._threaded(groups):
            return [[i] for i in trainable]
        return [[g[r] for g in groups if r < len(g)] for r in range(max(len(g) for g in groups))]

    def map(self, fn: Callable[[int], Any], agents: Sequence[int] | None = None) -> list[Any]:
        """``[fn(i) for i in agents]`` (default: every agent), in that order; one thread per device group
        when threaded (agents of a group run in order within their thread)."""
        agents = list(range(self.num_agents)) if agents is None else list(agents)
        groups = self._groups(agents)
        if not self._threaded(groups):
            return [fn(i) for i in agents]
        enter = _thread_state()

        def work(group: list[int]) -> list[tuple[int, Any]]:
            device = self.device(group[0])
            with enter(), torch.cuda.device(device) if device.type == "cuda" else nullcontext():
                return [(i, fn(i)) for i in group]

        results: dict[int, Any] = {}
        with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="comlrl-agent") as pool:
            for part in pool.map(work, groups):
                results.update(part)
        return [results[i] for i in agents]
