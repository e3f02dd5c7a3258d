"""Device planning for a team: where each agent, reference, critic and reward model lives, and the
moves that put them (and optimizer state) there.

Used by :class:`~comlrl_lightning.infra.strategy.AgentParallelStrategy` and by a module with
``parallel_training="mp"`` under a plain single-device strategy, so both paths place models the same
way. :data:`PARALLEL_TRAINING` declares the placement knob.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection, move_data_to_device
from lightning.pytorch.accelerators import CPUAccelerator
from torch import Tensor, nn
from torch.optim import Optimizer

from comlrl_lightning.core.choices import Choice

PARALLEL_TRAINING = Choice(
    "parallel_training",
    {
        "none": "Lightning places the module (one device, or its own strategy)",
        "mp": "one process, agent i on `agent_devices[i]` (the `agent_parallel` strategy, or the module "
        "itself under a plain single-device strategy); multi-process strategies are refused",
    },
)
"""Where the agents live (CoMLRL ``parallel_training``)."""

KINDS = ("agent", "reference", "critic", "reward")
MODEL_LISTS = {
    "agent": "agents",
    "reference": "reference_models",
    "critic": "critics",
    "reward": "reward_models",
}
"""Which ``nn.ModuleList`` attribute of the LightningModule holds each kind of model."""

DeviceSpec = str | Sequence[str] | None


@dataclass
class DevicePlan:
    """Where every model of a team lives (``torch.device`` per index and kind)."""

    root: torch.device
    agents: list[torch.device] = field(default_factory=list)
    references: list[torch.device] = field(default_factory=list)
    critics: list[torch.device] = field(default_factory=list)
    rewards: list[torch.device] = field(default_factory=list)

    def devices(self, kind: str) -> list[torch.device]:
        if kind not in KINDS:
            raise ValueError(f"kind: got {kind!r}, allowed: {list(KINDS)}")
        lists = {
            "agent": self.agents,
            "reference": self.references,
            "critic": self.critics,
            "reward": self.rewards,
        }
        return lists[kind]

    def device_for(self, kind: str, index: int) -> torch.device:
        """Device of model ``index`` of ``kind`` (``agent`` | ``reference`` | ``critic`` | ``reward``).

        Indices past the configured list fall back to the agent's device (reference/critic), else root.
        """
        devices = self.devices(kind)
        if index < len(devices):
            return devices[index]
        if kind in ("reference", "critic") and index < len(self.agents):
            return self.agents[index]
        if kind == "agent":
            raise IndexError(f"agent {index}: the plan has {len(self.agents)} agents")
        return self.root


def _parse(value: Any, where: str) -> torch.device:
    try:
        return value if isinstance(value, torch.device) else torch.device(str(value))
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: got {value!r}, not a device (e.g. 'cpu', 'cuda:0')") from err


def _check_available(device: torch.device, where: str, num_gpus: int | None) -> None:
    if num_gpus is None or device.type != "cuda":
        return
    index = 0 if device.index is None else device.index
    if index >= num_gpus:
        raise ValueError(
            f"{where}: {device} requested, but {num_gpus} CUDA device(s) are usable "
            "(none under accelerator='cpu')"
        )


def resolve_devices(
    spec: DeviceSpec,
    num: int,
    *,
    num_gpus: int | None,
    owners: Sequence[int] | None = None,
    overrides: Sequence[str | None] | None = None,
    field_name: str = "agent_devices",
) -> list[torch.device]:
    """One ``torch.device`` per model.

    Args:
        spec: ``"auto"``/``None``, one device string for all, or a list of ``num`` device strings.
        num: number of models.
        num_gpus: visible CUDA devices (``0``: CPU only; ``None``: do not check availability, ``"auto"``
            then means CPU).
        owners: ``owners[i]`` is the index of the model whose weights model ``i`` uses (``i`` itself when
            not shared); shared models get their owner's device.
        overrides: per-model device (``AgentSpec.device``) that beats ``spec``.
        field_name: named in error messages.

    Raises:
        ValueError: wrong list length, an unparsable or unavailable device, or a shared model given a
            device different from its owner's.
    """
    owners = list(range(num)) if owners is None else list(owners)
    overrides = [None] * num if overrides is None else list(overrides)
    explicit: list[torch.device | None] = [None] * num
    if spec is None or (isinstance(spec, str) and spec == "auto"):
        pass
    elif isinstance(spec, (str, torch.device)):
        explicit = [_parse(spec, field_name)] * num
    else:
        spec = list(spec)
        if len(spec) != num:
            raise ValueError(
                f"{field_name}: got {len(spec)} devices for {num} models; give one per model or 'auto'"
            )
        explicit = [_parse(d, f"{field_name}[{i}]") for i, d in enumerate(spec)]
    for i, dev in enumerate(overrides):
        if dev is not None:
            explicit[i] = _parse(dev, f"agents[{i}].device")
    distinct = sorted(set(owners))
    auto_dev = {
        o: torch.device("cuda", k % num_gpus) if num_gpus else torch.device("cpu")
        for k, o in enumerate(distinct)
    }
    out: list[torch.device] = []
    for i in range(num):
        owner = owners[i]
        if owner != i:
            dev = out[owner]
            if explicit[i] is not None and explicit[i] != dev:
                raise ValueError(
                    f"{field_name}[{i}]: {explicit[i]} differs from {dev} of model {owner}, whose weights it shares"
                )
        else:
            dev = explicit[i] if explicit[i] is not None else auto_dev[owner]
        _check_available(dev, f"{field_name}[{i}]", num_gpus)
        out.append(dev)
    return out


def _owners(models: Sequence[nn.Module]) -> list[int]:
    first: dict[int, int] = {}
    return [first.setdefault(id(m), i) for i, m in enumerate(models)]


def plan_devices(
    module: nn.Module,
    agent_devices: DeviceSpec = "auto",
    reference_devices: DeviceSpec = None,
    critic_devices: DeviceSpec = None,
    reward_devices: DeviceSpec = None,
    *,
    root: torch.device | str = "cpu",
    num_gpus: int | None = None,
) -> DevicePlan:
    """The :class:`DevicePlan` of ``module``'s team (its ``agents``, ``reference_models``, ``critics``,
    ``reward_models`` lists, when present). ``AgentSpec.device`` (``module.specs[i].device``) overrides
    ``agent_devices``; references default to their agent's device, critics to agent i's device (else
    root), reward models to root.
    """
    root = _parse(root, "root_device")
    models = {kind: list(getattr(module, attr, None) or []) for kind, attr in MODEL_LISTS.items()}
    agents = models["agent"]
    specs = getattr(module, "specs", None)
    overrides = (
        [getattr(s, "device", None) for s in specs]
        if specs is not None and len(specs) == len(agents)
        else None
    )
    plan = DevicePlan(root=root)
    plan.agents = resolve_devices(
        agent_devices, len(agents), num_gpus=num_gpus, owners=_owners(agents), overrides=overrides
    )

    def other(kind: str, spec: DeviceSpec, default_to_agent: bool) -> list[torch.device]:
        found = models[kind]
        if not found and spec is None:
            return []
        n = len(found) if found else (max(len(agents), 1) if isinstance(spec, str) else len(list(spec)))  # type: ignore[arg-type]
        if spec is None:
            owner = list(range(n))
            if kind == "reference":  # a team whose LoRA agents have no copy: reference k is agent owners[k]'s
                owners = list(getattr(getattr(module, "team", None), "reference_owners", None) or [])
                owner = owners if len(owners) == n else owner
            return [
                plan.agents[owner[i]] if default_to_agent and owner[i] < len(plan.agents) else root
                for i in range(n)
            ]
        return resolve_devices(
            spec, n, num_gpus=num_gpus, owners=_owners(found) if found else None, field_name=f"{kind}_devices"
        )

    plan.references = other("reference", reference_devices, default_to_agent=True)
    plan.critics = other("critic", critic_devices, default_to_agent=True)
    plan.rewards = other("reward", reward_devices, default_to_agent=False)
    return plan


def place_module(module: nn.Module, plan: DevicePlan) -> None:
    """Move each model of the team to its planned device and everything else to ``plan.root``.

    Models move one at a time, straight from where they are to their device: nothing is gathered on
    the root first. A module object that appears in two lists (shared weights) must get one device.

    Raises:
        ValueError: one module object planned on two devices.
    """
    placed: dict[int, tuple[torch.device, str]] = {}
    for kind, attr in MODEL_LISTS.items():
        for i, model in enumerate(getattr(module, attr, None) or []):
            dev = plan.device_for(kind, i)
            where = f"{attr}[{i}]"
            if id(model) in placed and placed[id(model)][0] != dev:
                raise ValueError(
                    f"{where} is the same module as {placed[id(model)][1]} but is planned on {dev}, "
                    f"not {placed[id(model)][0]}"
                )
            placed.setdefault(id(model), (dev, where))
            model.to(dev)
    for name, child in module.named_children():
        if name not in MODEL_LISTS.values():
            child.to(plan.root)
    for _, p in module.named_parameters(recurse=False):
        p.data = p.data.to(plan.root)
    for name, b in module.named_buffers(recurse=False):
        setattr(module, name, b.to(plan.root))
    if hasattr(module, "_device"):
        module._device = plan.root  # what LightningModule.device reports (used by self.log for floats)


def optimizer_state_to_param_devices(
    optimizer: Optimizer, device_of: Callable[[Tensor], torch.device] | None = None
) -> None:
    """Move every optimizer state tensor (e.g. Adam's ``exp_avg``) next to its parameter.

    Lightning's ``Strategy.load_optimizer_state_dict`` moves all state to the root device after a
    resume; with agents on several devices that breaks the first ``step()``. The ``step`` counter stays
    where ``torch.optim`` put it (CPU unless capturable/fused), as in Lightning's own helper.

    Args:
        device_of: parameter → target device (default: ``p.device``); injectable for tests.
    """
    optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps the real one
    for p, state in optimizer.state.items():
        dev = device_of(p) if device_of is not None else p.device
        if not isinstance(state, MutableMapping):
            optimizer.state[p] = apply_to_collection(
                state, Tensor, move_data_to_device, dev, allow_frozen=True
            )
            continue
        for key, value in state.items():
            if key != "step":
                state[key] = move_data_to_device(value, dev)


def default_root_device(accelerator: Any = None) -> torch.device:
    """``cpu`` for a CPU accelerator, else ``cuda:0`` when CUDA is available, else ``cpu``."""
    if isinstance(accelerator, CPUAccelerator) or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", 0)


def visible_gpus(accelerator: Any = None) -> int:
    """CUDA devices that ``"auto"`` may use: none under a CPU accelerator."""
    if isinstance(accelerator, CPUAccelerator) or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()
