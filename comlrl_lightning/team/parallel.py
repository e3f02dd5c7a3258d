"""Running a team across devices: placement hooks and per-device agent threads (a MAGRPO mixin).

With ``parallel_training="mp"`` and no :class:`~comlrl_lightning.infra.strategy.AgentParallelStrategy`,
the module places the team itself (same planning functions as the strategy). When the agents span
two or more devices and one is a GPU, per-agent work runs in one thread per device: CUDA kernels of
different devices overlap while Python drives them. ``manual_backward`` is serialised (Lightning's
hooks are not thread-safe) and optimizer steps always run in the main thread, so ``global_step``
still grows by N per batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, nullcontext
from typing import Any

import torch

from comlrl_lightning.infra.strategy import (
    AgentParallelStrategy, optimizer_state_to_param_devices, place_module, plan_devices, visible_gpus,
)  # fmt: skip

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


class AgentParallelMixin:
    """Placement and per-device concurrency for a module with ``agents``, ``num_agents`` and
    ``hparams.parallel_training`` / ``hparams.agent_devices``."""

    def _agent_device(self, agent: int) -> torch.device:
        return next(self.agents[agent].parameters()).device

    def _self_placed(self) -> bool:
        """``parallel_training="mp"`` under a strategy that does not place agents itself."""
        return (self.hparams.parallel_training == "mp" and self._trainer is not None
                and not isinstance(self.trainer.strategy, AgentParallelStrategy))  # fmt: skip

    def _place_team(self) -> None:
        if not self._self_placed():
            return
        strategy = self.trainer.strategy
        plan = plan_devices(self, self.hparams.agent_devices, root=strategy.root_device,
                            num_gpus=visible_gpus(strategy.accelerator))  # fmt: skip
        place_module(self, plan)
        for opt in self.trainer.optimizers:
            optimizer_state_to_param_devices(opt)

    def on_fit_start(self) -> None:
        """``parallel_training="mp"`` without the agent-parallel strategy: place the team now."""
        self._place_team()

    def on_train_epoch_start(self) -> None:
        """``"mp"`` without the agent-parallel strategy: after a resume, Lightning put the optimizer
        state on the root device; move it back next to each agent's parameters (idempotent)."""
        self._place_team()

    def on_validation_start(self) -> None:
        self._place_team()

    concurrent_agents: bool | None = None
    """None: threads when the agents span >= 2 devices, one of them a GPU; True/False: force."""

    def _agent_groups(self) -> list[list[int]]:
        """Agent indices grouped by device (one group per distinct model when ``concurrent_agents`` is
        True); agents sharing weights are always in one group."""
        groups: dict[Any, list[int]] = {}
        for i in range(self.num_agents):
            key = id(self.agents[i]) if self.concurrent_agents else self._agent_device(i)
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def _concurrent(self, groups: list[list[int]]) -> bool:
        if len(groups) < 2 or self.concurrent_agents is False:
            return False
        return bool(self.concurrent_agents) or any(self._agent_device(g[0]).type == "cuda" for g in groups)

    def _run_groups(self, groups: list[list[int]], fn: Callable[[int], Any]) -> list[Any]:
        """``[fn(i) for every agent i]``, one thread per group (agents of a group run in order)."""
        enter = _thread_state()

        def work(group: list[int]) -> list[tuple[int, Any]]:
            device = self._agent_device(group[0])
            with enter(), torch.cuda.device(device) if device.type == "cuda" else nullcontext():
                return [(i, fn(i)) for i in group]

        results: list[Any] = [None] * self.num_agents
        with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="comlrl-agent") as pool:
            for part in pool.map(work, groups):
                for i, value in part:
                    results[i] = value
        return results
