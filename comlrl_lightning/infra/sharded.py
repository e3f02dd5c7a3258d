"""`ShardedTeamStrategy` (``trainer.strategy: fsdp2``): every agent, reference model and critic
sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``) over the data-parallel ranks.

Built on Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` (a 1-D mesh: all
ranks data parallel, no tensor parallelism). Each rank holds ``1/world`` of every parameter, gradient
and optimizer state; a layer's full weights exist only while it runs (FSDP2 all-gathers per
transformer block, then reduce-scatters its gradients). Episodes are split over ranks as under DDP
(the rank-aware ``ResumableSampler``); the training loop is unchanged: manual optimisation, one
optimizer per agent, each agent's gradients synchronised by its own backward.

What the module sees:

- :meth:`ShardedTeamStrategy.check_team` (from ``CoMLRLModule.setup``, before any model loads)
  refuses what does not combine with sharding, naming the field;
- :meth:`ShardedTeamStrategy.shard_team` (first thing in the strategy's ``setup``, i.e. right after
  ``configure_model`` loaded the team, so models a subclass adds there are sharded too) shards each
  model once: every block named in the model's ``_no_split_modules``, then the model; frozen reward
  models stay whole on every rank;
- a rollout gathers one agent's full weights at a time (:func:`gathered`, set as
  ``Team.rollout_context``): generation then runs with no collective per token, so ranks may
  generate different numbers of tokens (benchmarks/speed/sharded.py measures both options).

Checkpoints are Lightning's for this strategy: a folder written with torch distributed checkpoint
(one shard file per rank plus ``meta.pt``) and ``sharding.json``; it loads under another world size
(DCP reshards), except a mid-epoch one (:func:`check_resume`). ``AgentCheckpoint`` exports each
agent's full weights as a Hugging Face folder (:func:`full_state_dict`).

Config::

    trainer:
      strategy: fsdp2             # registered name, or:
      strategy:
        class_path: comlrl_lightning.infra.sharded.ShardedTeamStrategy
        init_args: {reshard_after_forward: true}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import nn

from comlrl_lightning.core.generation import GENERATION_BACKEND
from comlrl_lightning.infra.placement import MODEL_LISTS

SHARDED_KINDS = ("agent", "reference", "critic")
"""The kinds of model (``placement.MODEL_LISTS``) that are sharded; reward models stay whole."""


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The ``fully_shard``-ed modules inside ``model`` (itself included), outermost first."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def block_names(model: nn.Module) -> set[str]:
    """Class names of ``model``'s transformer blocks: the ``_no_split_modules`` of every Hugging Face
    model inside it (a critic's trunk, too); empty for a plain module (sharded as one unit)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return names


def shard_model(model: nn.Module, mesh: Any, mp_policy: Any, reshard_after_forward: bool) -> None:
    """``fully_shard`` each transformer block of ``model`` (see :func:`block_names`), then ``model``.

    Args:
        model: an agent, reference model or critic; its parameters become ``DTensor`` shards.
        mesh: the 1-D data-parallel ``DeviceMesh``.
        mp_policy: ``MixedPrecisionPolicy`` or None (full precision).
        reshard_after_forward: free each block's gathered weights after its forward (ZeRO-3); False
            keeps them until backward (ZeRO-2-like: faster, more memory).
    """
    from torch.distributed.fsdp import fully_shard

    kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    blocks = block_names(model)
    for m in list(model.modules()):
        if m is not model and type(m).__name__ in blocks:
            fully_shard(m, **kw)
    fully_shard(model, **kw)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """``model``'s full (unsharded) state dict on CPU for a Hugging Face export; None when ``model``
    is not sharded (save it as it is). A collective: every rank must call it; rank 0 gets the
    tensors, the other ranks an empty dict. Memory: the whole model in host RAM on rank 0."""
    if not fsdp_modules(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


@contextmanager
def gathered(model: nn.Module, reshard_after_forward: bool = True) -> Iterator[None]:
    """All-gather ``model``'s full weights on every rank for the body (one collective per block),
    keep them through every forward inside it, and reshard after.

    Used around one agent's rollout: ``generate`` then runs no collective per token, so ranks need
    not generate the same number of tokens. Memory: one agent's full parameters (in their
    ``param_dtype``) on top of the shards while the body runs. A model that is not sharded passes
    through unchanged. Every rank must enter it for the same model (it is a collective).

    Args:
        model: a model sharded by :func:`shard_model` (its outermost unit is the model itself).
        reshard_after_forward: what the blocks go back to afterwards (the value they were sharded
            with); the model's own unit goes back to FSDP2's root default, no reshard after forward.
    """
    units = fsdp_modules(model)
    for unit in units:  # public FSDP2 calls only: keep gathered weights through every forward
        unit.set_reshard_after_forward(False, recurse=False)
    # the gathered buffers are reused by later training steps: never let them be inference tensors
    # (generate runs under inference_mode, and so may the caller: Lightning's validation loop)
    with torch.inference_mode(False):
        for unit in units:
            unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(reshard_after_forward and unit is not model, recurse=False)
        with torch.inference_mode(False):
            for unit in units:
                unit.reshard()


SHARDING_FILE = "sharding.json"
"""Written by rank 0 into a sharded checkpoint folder: ``{"world_size": int, "mid_epoch": bool}``."""


def check_resume(path: Path, world_size: int) -> None:
    """Refuse a sharded checkpoint that cannot resume exactly under ``world_size`` ranks.

    A checkpoint folder loads under any world size (torch distributed checkpoint reshards), but a
    mid-epoch one holds a data position per rank (each rank's share of the epoch's permutation), so it
    needs the world size it was written under; an epoch-end one (or a single-file checkpoint) does not.
    Called by the CLI's ``before_fit`` (before any model loads) and by
    :meth:`ShardedTeamStrategy.load_checkpoint` (a ``trainer.fit(ckpt_path=...)`` from Python).

    Raises:
        ValueError: a mid-epoch checkpoint written under another world size, naming both.
    """
    info_file = path / SHARDING_FILE
    if not path.is_dir() or not info_file.is_file():
        return
    info = json.loads(info_file.read_text())
    if info.get("mid_epoch") and info.get("world_size") != world_size:
        raise ValueError(
            f"ckpt_path {path}: written mid-epoch under world_size={info['world_size']}, resumed under "
            f"world_size={world_size}; each rank's position in the epoch only holds under the same world "
            f"size: resume with {info['world_size']} ranks (trainer.devices × trainer.num_nodes), or from "
            "a checkpoint written at an epoch end"
        )


class ShardedTeamStrategy(ModelParallelStrategy):
    """FSDP2 over all ranks for every agent, reference model and critic (module docstring).

    Args:
        reshard_after_forward: free each block's gathered weights after its forward (default True:
            least memory); False keeps them until the backward (one all-gather fewer per block).
        mixed_precision: ``"auto"`` (default): a ``MixedPrecisionPolicy`` with bf16 compute and fp32
            gradient reduction when the trainer's precision is ``bf16-mixed``, none otherwise;
            ``"bf16"`` forces it; ``"none"`` disables it.
        save_distributed_checkpoint, process_group_backend, timeout: as Lightning's
            ``ModelParallelStrategy`` (default: a sharded torch distributed checkpoint folder).

    Raises:
        ValueError: ``mixed_precision`` not one of ``"auto"``, ``"bf16"``, ``"none"``.
    """

    strategy_name = "fsdp2"
    MIXED_PRECISION = ("auto", "bf16", "none")

    def __init__(
        self,
        reshard_after_forward: bool = True,
        mixed_precision: str = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        if mixed_precision not in self.MIXED_PRECISION:
            raise ValueError(
                f"ShardedTeamStrategy.mixed_precision: got {mixed_precision!r}, allowed: {list(self.MIXED_PRECISION)}"
            )
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.reshard_after_forward = reshard_after_forward
        self.mixed_precision = mixed_precision

    def setup_environment(self) -> None:
        """One data-parallel mesh dimension over every rank (no tensor parallelism)."""
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def setup(self, trainer: Any) -> None:
        """Shard the team (:meth:`shard_team`), then Lightning's ``ModelParallelStrategy.setup``
        (optimizers are built over the shards)."""
        assert self.lightning_module is not None
        self.shard_team(self.lightning_module)
        super().setup(trainer)

    @property
    def data_parallel_mesh(self) -> Any:
        """The 1-D ``DeviceMesh`` the team is sharded over (all ranks)."""
        return self.device_mesh["data_parallel"]

    def mp_policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` for ``mixed_precision`` (None: parameters compute in their dtype)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        bf16_mixed = (
            isinstance(self.precision_plugin, MixedPrecision)
            and self.precision_plugin.precision == "bf16-mixed"
        )
        if self.mixed_precision == "bf16" or (self.mixed_precision == "auto" and bf16_mixed):
            return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return None

    def check_team(self, module: nn.Module) -> None:
        """Refuse, before any model loads, what sharding cannot serve.

        Raises:
            ValueError: naming the field and value: ``parallel_training='mp'`` or ``agent_devices``
                (one device per agent in one process) ; an ``AgentSpec.device``; agents sharing
                weights (``share_weights_with``); LoRA adapters (``adapter``); a critic that is a value head on its agent's trunk
                (``critics[c].model: null``); ``concurrent_agents=True`` (agent threads would
                interleave collectives); ``generation_backend: vllm`` (no engine over shards).
        """
        placement = getattr(module, "placement", None)
        if placement is not None and placement.parallel_training == "mp":
            raise ValueError(
                "parallel_training: got 'mp' with strategy 'fsdp2'; 'mp' puts each agent on its own "
                "device in one process, fsdp2 shards every agent over all ranks: allowed with fsdp2: 'none'"
            )
        if placement is not None and placement.agent_devices is not None:
            raise ValueError(
                f"agent_devices: got {placement.agent_devices!r} with strategy 'fsdp2', which puts every "
                "agent on every rank's device; allowed: null"
            )
        for i, spec in enumerate(getattr(module, "specs", [])):
            if spec.device is not None:
                raise ValueError(
                    f"agents[{i}].device: got {spec.device!r} with strategy 'fsdp2' (every agent is "
                    "sharded over all ranks); allowed: null"
                )
            if getattr(spec, "adapter", None) is not None:
                raise ValueError(
                    f"agents[{i}].adapter: got {spec.adapter} with strategy 'fsdp2'; LoRA adapters are not "
                    "sharded yet (allowed: null): use strategy 'agent_parallel' or 'ddp_find_unused_parameters_true'"
                )
            if spec.share_weights_with is not None:
                raise ValueError(
                    f"agents[{i}].share_weights_with: got {spec.share_weights_with} with strategy 'fsdp2'; "
                    "shared weights are not sharded yet (allowed: null): use strategy "
                    "'ddp_find_unused_parameters_true' or separate agents"
                )
        for c, spec in enumerate(getattr(module, "critic_specs", None) or []):
            if not spec.separate:
                raise ValueError(
                    f"critics[{c}].model: got None (a value head on agent {c}'s trunk) with strategy 'fsdp2'; "
                    "the head reads the trunk outside the agent's sharded forward: give the critic a model "
                    "of its own (critics[c].model)"
                )
        if getattr(module, "concurrent_agents", None):
            raise ValueError(
                "concurrent_agents: got True with strategy 'fsdp2'; agent threads would interleave the "
                "ranks' collectives: allowed: None or False"
            )
        team = getattr(module, "team", None)
        for i, sampling in enumerate(getattr(team, "sampling", None) or []):
            if sampling.generation_backend == "vllm":
                raise ValueError(
                    f"sampling.generation_backend (agent {i}'s, with agents[{i}].generation): got 'vllm' with "
                    "strategy 'fsdp2'; the engine would need each agent's full weights gathered from the shards "
                    "after every step, which is not built: allowed with fsdp2: "
                    f"{[n for n in GENERATION_BACKEND.names if n != 'vllm']}"
                )

    def shard_team(self, module: nn.Module, rollout_context: Callable[..., Any] | None = None) -> None:
        """``fully_shard`` every agent, reference model and critic of ``module`` once (idempotent), and
        make the team's rollout gather one agent at a time (:func:`gathered`).

        Raises:
            ValueError: a trainable parameter outside the sharded models (it would not be synchronised
                across ranks), named.
        """
        from torch.distributed.tensor import DTensor

        mesh, policy = self.data_parallel_mesh, self.mp_policy()
        done: set[int] = set()
        for kind in SHARDED_KINDS:
            for model in getattr(module, MODEL_LISTS[kind], None) or []:
                if id(model) not in done and not fsdp_modules(model):
                    shard_model(model, mesh, policy, self.reshard_after_forward)
                done.add(id(model))
        for name, p in module.named_parameters():
            if p.requires_grad and not isinstance(p, DTensor):
                raise ValueError(
                    f"{name}: a trainable parameter outside the agents, reference models and critics; "
                    "strategy 'fsdp2' would not synchronise it across ranks"
                )
        team = getattr(module, "team", None)
        if team is not None:
            team.rollout_context = rollout_context or partial(
                gathered, reshard_after_forward=self.reshard_after_forward
            )

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Lightning's (a torch distributed checkpoint folder, or one file with
        ``save_distributed_checkpoint=False``), plus ``sharding.json`` in a folder: the world size and
        whether it was written mid-epoch, read by :meth:`load_checkpoint` before any tensor."""
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        mid_epoch = False
        if trainer is not None and trainer.num_training_batches not in (0, float("inf")):
            done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            mid_epoch = bool(done % trainer.num_training_batches)
        super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(filepath))
        if self.global_rank == 0 and path.is_dir():
            info = {"world_size": self.world_size, "mid_epoch": mid_epoch}
            (path / SHARDING_FILE).write_text(json.dumps(info))
        self.barrier()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's loading (DCP reshards every parameter and optimizer state to this world size),
        after :func:`check_resume` and, for a folder, the model config check of a single-file
        checkpoint (:func:`~comlrl_lightning.infra.resume_config.check_folder_config`): DCP would
        otherwise meet another team as ``Missing key in checkpoint state_dict``, or another group size
        only after loading every shard."""
        path = Path(self.broadcast(checkpoint_path))
        check_resume(path, self.world_size)
        if path.is_dir() and self.lightning_module is not None:
            from comlrl_lightning.infra.resume_config import check_folder_config

            check_folder_config(str(path), dict(self.lightning_module.hparams))
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__.splitlines()[0])


ShardedTeamStrategy.register_strategies(StrategyRegistry)
