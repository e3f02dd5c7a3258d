"""What an agent is: how the team builds it from its :class:`~comlrl_lightning.team.agents.AgentSpec`,
what its optimizer trains, what its reference model is, and what a checkpoint must hold of it.

:class:`AgentKind` is the seam; :class:`~comlrl_lightning.team.team.Team` asks each agent's kind
(:meth:`Team.agent_kind`, overridable) and the rest of the library asks the team
(``Team.trainable_parameters(i)``, ``Team.reference(i)``, ``Team.checkpoint_exclusions()``), never the
kind or the spec. Three kinds ship: :class:`FullFineTuning` (its own weights, every parameter
trained), :class:`SharedWeights` (``share_weights_with``: an earlier agent's module, its own
optimizer state) and :class:`LoraAdapter` (``adapter``: a PEFT LoRA adapter on a frozen base, its
own or shared). A new kind (another PEFT method, a quantised base, ...) subclasses :class:`AgentKind`
and is returned by an overridden ``Team.agent_kind``; no algorithm changes.
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from torch import nn

from comlrl_lightning.team.adapter_targets import check_adapter_on_model
from comlrl_lightning.team.agents import AgentSpec, load_agent


class Members(Protocol):
    """What a kind reads of the team building it (:class:`~comlrl_lightning.team.team.Team` is one):
    every agent's spec and kind, and the agents built so far with their tokenizers (``agents[j]``,
    ``tokenizers[j]`` for ``j`` < the agent being built)."""

    specs: list[AgentSpec]
    kinds: list[AgentKind]
    agents: Sequence[nn.Module]
    tokenizers: list[Any]


class AgentKind:
    """One kind of agent (the default: full fine-tuning of its own weights)."""

    needs_reference_copy = True
    """Whether ``beta > 0`` needs a frozen copy of the agent as its reference model (the team makes one
    per distinct module, in ``Team.reference_models``)."""

    owns_parameters = True
    """Whether the agent trains parameters no other agent trains (False: :class:`SharedWeights`); DDP
    needs ``find_unused_parameters`` when two or more agents do (each backward reaches only its own)."""

    def build(self, team: Members, agent: int) -> tuple[nn.Module, Any]:
        """``(model, tokenizer)`` of agent ``agent``; earlier agents are built (``team.agents[:agent]``).

        Raises:
            OSError: the model cannot be loaded (see :func:`~comlrl_lightning.team.agents.load_agent`).
        """
        return load_agent(team.specs[agent])

    def trainable_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """What the agent's optimizer steps (default: every parameter that requires a gradient)."""
        return [p for p in model.parameters() if p.requires_grad]

    def reference(self, model: nn.Module, copy: nn.Module | None) -> Any:
        """The agent's reference model for the KL (called like the model; ``.parameters()`` gives its
        device): the frozen ``copy`` the team made, None when there is none."""
        return copy

    def frozen_state_keys(self, model: nn.Module) -> list[str]:
        """Keys of ``model.state_dict()`` a checkpoint leaves out (a frozen base reloaded from its
        source at resume); default none."""
        return []

    @contextmanager
    def rollout_model(self, agent: int, model: nn.Module, adapter_rollouts: str) -> Iterator[nn.Module]:
        """The module agent ``agent``'s rollout generates with, for the length of the ``with`` block
        (``adapter_rollouts``: ``SamplingConfig.adapter_rollouts``); default ``model`` itself."""
        yield model

    def load_saved(self, agent: int, folder: str, dtype: torch.dtype) -> nn.Module:
        """A model read back from ``folder``, which the agent's ``save_pretrained`` wrote (the iterative
        trainers' comparator history): by default a causal LM in ``dtype``.

        Raises:
            OSError: ``folder`` holds no model.
        """
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)


class FullFineTuning(AgentKind):
    """Its own weights, all trained (``AgentSpec`` with neither ``adapter`` nor ``share_weights_with``)."""


class SharedWeights(AgentKind):
    """An earlier agent's module and tokenizer (``share_weights_with``), its own optimizer state."""

    owns_parameters = False

    def build(self, team: Members, agent: int) -> tuple[nn.Module, Any]:
        owner = team.specs[agent].share_weights_with
        assert owner is not None, "kind_of gives SharedWeights only with share_weights_with"
        return team.agents[owner], team.tokenizers[owner]


def share_clone(model: nn.Module) -> nn.Module:
    """A new module tree over the same parameter and buffer objects (no tensor copied): a PEFT adapter
    injected into it leaves ``model``'s modules, and every other clone's, untouched."""
    memo: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


class _AdapterDisabled:
    """A LoRA agent's reference: its own PeftModel with the adapter disabled for each call (each agent
    has its own adapter layers, so one agent's thread never switches another's adapter)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def parameters(self) -> Any:
        return self.model.parameters()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)


class LoraAdapter(AgentKind):
    """A PEFT LoRA adapter (``AgentSpec.adapter``) on a frozen base: the agent's own base, or with
    ``share_weights_with`` the base of that earlier adapter agent (held once: one
    :func:`share_clone` per agent, so each is its own ``PeftModel`` with one adapter named
    ``default``). Only the adapter trains; the reference is the base with the adapter disabled (no
    copy); checkpoints hold the adapter only; ``save_pretrained`` writes PEFT's folder layout."""

    needs_reference_copy = False

    def __init__(self) -> None:
        self._bases: dict[int, nn.Module] = {}  # owner agent -> its pristine (adapter-free) base clone
        self._merged_clones: dict[int, nn.Module] = {}  # agent -> the module tree merged rollouts use
        # layer name -> its merged weight's storage, rewritten in place at each rollout (a fresh allocation
        # of every adapted weight per rollout cost as much as the merge saved); one set per base, its lock
        # held for a whole merged rollout (concurrent agents on one base generate one after another)
        self._merged_buffers: dict[str, torch.Tensor] = {}
        self._merge_lock = threading.Lock()

    def build(self, team: Members, agent: int) -> tuple[nn.Module, Any]:
        from peft import get_peft_model

        spec = team.specs[agent]
        owner = spec.share_weights_with
        if owner is None:
            base, tok = load_agent(spec)
        else:
            base, tok = share_clone(team.kinds[owner].pristine_base(owner)), team.tokenizers[owner]
        self._bases[agent] = share_clone(base)  # before PEFT injects this agent's adapter into base
        if owner is not None:
            self._merged_buffers = team.kinds[owner]._merged_buffers
            self._merge_lock = team.kinds[owner]._merge_lock
        assert spec.adapter is not None, "kind_of gives LoraAdapter only with adapter"
        with warnings.catch_warnings():  # PEFT's own notes, not the user's to act on (main thread)
            warnings.filterwarnings(
                "ignore", message="fan_in_fan_out is set to False"
            )  # GPT-2 Conv1D: PEFT sets it
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(base, spec.adapter.peft_config())
        return model.train(), tok

    def pristine_base(self, agent: int) -> nn.Module:
        """Agent ``agent``'s base without any adapter (sharing its parameters)."""
        return self._bases[agent]

    def trainable_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        # what PEFT left trainable: the adapter, and with the adapter's options also its
        # modules_to_save copies, biases (bias='all' / 'lora_only') or trainable token rows
        return [p for p in model.parameters() if p.requires_grad]

    def reference(self, model: nn.Module, copy: nn.Module | None) -> Any:
        return _AdapterDisabled(model)

    def frozen_state_keys(self, model: nn.Module) -> list[str]:
        trained = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
        return [k for k in model.state_dict() if k not in trained]

    @contextmanager
    def rollout_model(self, agent: int, model: nn.Module, adapter_rollouts: str) -> Iterator[nn.Module]:
        """``merged`` (``auto`` on CPU): a clone of the agent's pristine base (:meth:`pristine_base`, its
        own module tree over the shared tensors, made once) whose adapted linears hold ``W + scale * B @ A``
        (written into the base's merge buffers) for the length of the block, then the shared ``W`` again:
        the rollout samples from the adapted model at near a plain model's cost, and neither the base nor
        the adapter is written. Falls back to ``model`` (PEFT's unmerged layers) for ``unmerged`` and
        for what a delta cannot express (:func:`mergeable_layers`)."""
        if adapter_rollouts == "auto":
            adapter_rollouts = "merged" if next(model.parameters()).device.type == "cpu" else "unmerged"
        layers = mergeable_layers(model) if adapter_rollouts == "merged" else None
        if layers is None:
            yield model
            return
        clone = self._merged_clones.get(agent)
        if clone is None:
            clone = self._merged_clones[agent] = share_clone(self.pristine_base(agent))
        targets = dict(clone.named_modules())
        swapped = []
        with self._merge_lock:
            try:
                # normal tensors even under Lightning's validation (inference mode): buffers made there
                # could not be rewritten by a training rollout (in-place update to an inference tensor)
                with torch.inference_mode(False), torch.no_grad():
                    for name, layer in layers:
                        target = targets[name]
                        base = target._parameters["weight"]
                        merged = _merged_weight(base, layer, self._merged_buffers.get(name))
                        self._merged_buffers[name] = merged
                        target._parameters["weight"] = nn.Parameter(merged, requires_grad=False)
                        swapped.append((target, base))
                yield clone
            finally:
                for target, base in swapped:  # the clone holds the shared weights again between rollouts
                    target._parameters["weight"] = base

    def load_saved(self, agent: int, folder: str, dtype: torch.dtype) -> nn.Module:
        """The saved adapter (PEFT's folder layout) on a clone of this agent's frozen base: the base is
        held once still, and the live agent's adapter is untouched."""
        from peft import PeftModel

        return PeftModel.from_pretrained(share_clone(self.pristine_base(agent)), folder)


def _merged_weight(base: torch.Tensor, layer: nn.Module, out: torch.Tensor | None) -> torch.Tensor:
    """``base + scale * B @ A`` in one fused ``addmm``, written into ``out`` when given (PEFT's
    ``get_delta_weight`` makes the delta and then the sum: twice the memory traffic of a step whose
    cost is memory-bound). ``fan_in_fan_out`` (GPT-2's ``Conv1D``, weight ``[in, out]``) adds its transpose."""
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    scale = float(layer.scaling["default"])
    lhs, rhs = (a.T, b.T) if layer.fan_in_fan_out else (b, a)
    lhs, rhs = lhs.to(base.dtype), rhs.to(base.dtype)
    if out is None:
        return torch.addmm(base, lhs, rhs, alpha=scale)
    return torch.addmm(base, lhs, rhs, alpha=scale, out=out)


def mergeable_layers(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """``(name in the base model, layer)`` of every LoRA layer of a PEFT ``model`` when its adapter
    ``default`` is a plain low-rank delta on linear weights, so base + delta is the adapted model
    exactly up to rounding; None otherwise: DoRA or another LoRA variant, an adapted embedding or
    convolution, ``modules_to_save`` or trainable token rows (trained parameters that are not
    ``lora_A`` / ``lora_B``), or weights that are not plain tensors (sharded)."""
    from peft.tuners.lora import Linear, LoraLayer

    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    if not all(".lora_A." in n or ".lora_B." in n for n in trained):
        return None
    layers = []
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        plain = type(module) is Linear and not module.use_dora.get("default", False)
        plain = plain and not getattr(module, "lora_variant", {}) and type(module.weight) is nn.Parameter
        if not plain or list(module.active_adapters) != ["default"]:
            return None
        layers.append((name.removeprefix("base_model.model."), module))
    return layers


def resolve_kind(path: str, where: str = "kind") -> type[AgentKind]:
    """The :class:`AgentKind` subclass an ``AgentSpec.kind`` import path names.

    Raises:
        ValueError: ``path`` is not ``package.module.Class``, does not import, or names something
            that is not an ``AgentKind`` subclass (``where`` names the field).
    """
    import importlib

    module, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
    try:
        cls = getattr(importlib.import_module(module), name) if module and name else None
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"{where}: got {path!r}, which does not import ({err}); the module must be on the process's "
            "path (PYTHONPATH=. for a module in the working directory)"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, AgentKind)):
        raise ValueError(
            f"{where}: got {path!r}; give the import path of an AgentKind subclass "
            "(package.module.Class, e.g. comlrl_lightning.team.kinds.FullFineTuning)"
        )
    return cls


def kind_of(spec: AgentSpec) -> AgentKind:
    """The kind for ``spec``: the class ``kind`` names (:func:`resolve_kind`), else the shipped one:
    LoRA with ``adapter``, else shared with ``share_weights_with``, else full fine-tuning."""
    if spec.kind is not None:
        return resolve_kind(spec.kind)()
    if spec.adapter is not None:
        return LoraAdapter()
    if spec.share_weights_with is not None:
        return SharedWeights()
    return FullFineTuning()


def check_kinds(specs: Sequence[AgentSpec], kinds: Sequence[AgentKind]) -> None:
    """Refuse, before any model loads, agents whose kinds do not fit together.

    Raises:
        ValueError: an adapter agent sharing the weights of an agent without an adapter (its base
            would train under it), or a full agent sharing an adapter agent's; an adapter agent
            whose ``model`` / ``dtype`` differ from the agent whose base it shares, or either of them
            training the base's biases (``bias``); an adapter whose module names do not fit the
            agent's model (:func:`~comlrl_lightning.team.adapter_targets.check_adapter_on_model`).
    """
    for i, (spec, kind) in enumerate(zip(specs, kinds)):
        if isinstance(kind, LoraAdapter):
            check_adapter_on_model(spec, f"agents[{i}].adapter")
        owner = spec.share_weights_with
        if owner is None or not 0 <= owner < i:
            continue
        lora, owner_lora = isinstance(kind, LoraAdapter), isinstance(kinds[owner], LoraAdapter)
        if lora != owner_lora:
            raise ValueError(
                f"agents[{i}].share_weights_with: got {owner}, but agent {i} "
                f"{'has' if lora else 'has no'} adapter and agent {owner} {'has' if owner_lora else 'has no'} "
                "one; allowed: an earlier agent of the same kind (both with adapters share a frozen base)"
            )
        if lora and (spec.model, spec.dtype) != (specs[owner].model, specs[owner].dtype):
            raise ValueError(
                f"agents[{i}].model/dtype: got {spec.model!r}/{spec.dtype} but it shares agent {owner}'s "
                f"base ({specs[owner].model!r}/{specs[owner].dtype}); allowed: the same model and dtype"
            )
        for j in (i, owner) if lora else ():
            bias = specs[j].adapter.options.get("bias", "none")  # type: ignore[union-attr]
            if bias != "none":  # PEFT trains the base's own bias tensors, which both agents hold
                raise ValueError(
                    f"agents[{j}].adapter.bias: got {bias!r}, but agents {owner} and {i} share one base, "
                    "whose biases this would train for both; allowed: 'none' on a shared base (or give "
                    f"agent {i} its own base: no share_weights_with)"
                )
