"""`AgentParallelStrategy`: one process, each agent (and its reference / critic / reward model) on its own device.

Lightning has no built-in "one model per GPU in one process" strategy (see lightning-notes §2). This is a
:class:`~lightning.pytorch.strategies.SingleDeviceStrategy` whose *root* device (``cuda:0`` when the
accelerator is a GPU, else ``cpu``) holds everything that is not a model of the team, while

- ``module.agents[i]`` goes to ``agent_devices[i]`` (``AgentSpec.device`` overrides per agent);
- ``module.reference_models[i]`` to ``reference_devices[i]`` (default: agent i's device);
- ``module.critics[i]`` / ``module.reward_models[i]``, when a module has them, to ``critic_devices[i]``
  (default: agent i's device, else root) / ``reward_devices[i]`` (default: root).

``agent_devices="auto"`` gives one GPU per distinct agent model when there are enough, round-robin over
the GPUs when there are fewer, and CPU when there are none (or the accelerator is ``cpu``). Agents that
share weights (``AgentSpec.share_weights_with``) are one module, so they always sit on one device.

Config forms (YAML)::

    trainer:
      strategy: agent_parallel            # registered name; devices from model.agent_devices or "auto"
    trainer:
      strategy:
        class_path: comlrl_lightning.infra.strategy.AgentParallelStrategy
        init_args: {agent_devices: [cuda:0, cuda:1]}

The device plan is resolved in :meth:`AgentParallelStrategy.model_to_device` (after ``configure_model``)
and queried with :meth:`AgentParallelStrategy.device_for`. :func:`plan_devices` and :func:`place_module`
are also used by ``MAGRPO(parallel_training="mp")`` under a plain single-device strategy, so both paths
place models the same way.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.init import _EmptyInit
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn

from comlrl_lightning.envs.base import Episode
from comlrl_lightning.infra.placement import (
    KINDS,
    DevicePlan,
    DeviceSpec,
    default_root_device,
    optimizer_state_to_param_devices,
    place_module,
    plan_devices,
    resolve_devices,
    visible_gpus,
)

__all__ = [
    "KINDS",
    "AgentParallelStrategy",
    "DevicePlan",
    "DeviceSpec",
    "default_root_device",
    "optimizer_state_to_param_devices",
    "place_module",
    "plan_devices",
    "resolve_devices",
    "visible_gpus",
]


def _is_episode_batch(batch: Any) -> bool:
    return isinstance(batch, (list, tuple)) and all(isinstance(e, Episode) for e in batch)


class AgentParallelStrategy(SingleDeviceStrategy):
    """One process; each agent, reference, critic and reward model on the device the config names.

    Args:
        agent_devices: ``"auto"``, one device for all, or a list with one device per agent
            (``["cuda:0", "cuda:1"]``). ``None``: the module's ``agent_devices`` (MAGRPO init arg) if set,
            else ``"auto"``. ``AgentSpec.device`` overrides per agent.
        reference_devices: one per reference model (default: its agent's device).
        critic_devices: one per critic (default: agent i's device, else root).
        reward_devices: one per reward model (default: root).
        root_device: device of everything else (default: ``cuda:0`` under a GPU accelerator, else ``cpu``).

    Raises:
        ValueError: at ``trainer.fit``, a device list of the wrong length, an unavailable device, or
            shared-weight agents placed on different devices.
    """

    strategy_name = "agent_parallel"

    def __init__(
        self,
        agent_devices: list[str] | str | None = None,
        reference_devices: list[str] | str | None = None,
        critic_devices: list[str] | str | None = None,
        reward_devices: list[str] | str | None = None,
        root_device: str | None = None,
        accelerator: pl.accelerators.Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        super().__init__(
            device=root_device or "cpu",
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._root_explicit = root_device is not None
        self.agent_devices = agent_devices
        self.reference_devices = reference_devices
        self.critic_devices = critic_devices
        self.reward_devices = reward_devices
        self.plan: DevicePlan | None = None

    @property
    def root_device(self) -> torch.device:
        return self._root_device if self._root_explicit else default_root_device(self._accelerator)

    def resolve_plan(self) -> DevicePlan:
        """Resolve (and keep) the device plan for the connected LightningModule."""
        module = self.lightning_module
        assert module is not None, "connect a LightningModule first"
        agent_devices = self.agent_devices
        if agent_devices is None:
            agent_devices = getattr(getattr(module, "placement", None), "agent_devices", None) or "auto"
        self.plan = plan_devices(
            module,
            agent_devices,
            self.reference_devices,
            self.critic_devices,
            self.reward_devices,
            root=self.root_device,
            num_gpus=visible_gpus(self._accelerator),
        )
        return self.plan

    def device_for(self, kind: str, index: int) -> torch.device:
        """Device of model ``index`` of ``kind`` (``"agent"``, ``"reference"``, ``"critic"``, ``"reward"``)."""
        if self.plan is None:
            if self.lightning_module is None:
                raise RuntimeError(
                    "AgentParallelStrategy.device_for: no module connected yet (call trainer.fit)"
                )
            self.resolve_plan()
        assert self.plan is not None
        return self.plan.device_for(kind, index)

    def model_to_device(self) -> None:
        """Each model of the team to its device, the rest to root; never the whole module to root."""
        assert self.lightning_module is not None
        place_module(self.lightning_module, self.resolve_plan())

    def setup(self, trainer: pl.Trainer) -> None:
        """``Strategy.setup`` without moving optimizer state to the root device."""
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        assert self.model is not None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.model = self._setup_model(self.model)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            for opt in self.optimizers:
                optimizer_state_to_param_devices(opt)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Load each optimizer's state, keeping every state tensor on its parameter's device."""
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            optimizer.load_state_dict(state)
            optimizer_state_to_param_devices(optimizer)

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Episode batches stay on CPU (each agent moves its own token tensors); others go to root."""
        if _is_episode_batch(batch):
            return batch
        return super().batch_to_device(batch, device, dataloader_idx)

    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        """No default device: ``configure_model`` builds on CPU, :meth:`model_to_device` then places."""
        with _EmptyInit(enabled=bool(empty_init)), self.precision_plugin.tensor_init_context():
            yield

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__.splitlines()[0])


AgentParallelStrategy.register_strategies(StrategyRegistry)
