"""Global RNG states (python ``random``, numpy, torch CPU and CUDA) for exact resume.

Sampling completions draws from torch's global RNG, so a resumed run only equals an uninterrupted
one if the RNG continues where the checkpoint left it. The states are stored as tensors, ints and
lists only, so a checkpoint stays loadable with ``torch.load(weights_only=True)`` (the default from
torch 2.6 on); numpy's ``ndarray`` key would not be.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def collect_rng_states() -> dict[str, Any]:
    """The current global RNG states.

    Returns:
        ``{"python": tuple, "numpy": tuple, "torch": ByteTensor, "torch.cuda": list[ByteTensor]}``;
        ``"torch.cuda"`` is empty when CUDA is unavailable.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
        "torch.cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore states from :func:`collect_rng_states`.

    CUDA states are restored when CUDA is available and the device count matches the saved one;
    otherwise they are skipped (a CPU resume of a GPU run, or a different number of GPUs).

    Raises:
        KeyError: ``states`` lacks the ``"python"``, ``"numpy"`` or ``"torch"`` entry.
    """
    random.setstate(_as_tuple(states["python"]))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(states["torch"].cpu())
    cuda = states.get("torch.cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def _as_tuple(state: Any) -> Any:
    # a checkpoint round trip may turn python's nested state tuple into lists; random.setstate wants tuples
    return tuple(_as_tuple(s) for s in state) if isinstance(state, (list, tuple)) else state


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_ranks_rng_states(states: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's ``states`` (:func:`collect_rng_states`), in rank order: a collective when several
    processes run (every rank must call it), None in one process. A checkpoint is written by rank 0,
    so without this every rank would resume with rank 0's RNG and sample other completions than an
    uninterrupted run."""
    rank, world = _world()
    if world == 1:
        return None
    out: list[Any] = [None] * world
    dist.all_gather_object(out, states)
    return out


def this_ranks_rng_states(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The RNG states this rank saved (``checkpoint["rng_states_per_rank"][rank]``) when the world
    size is the one the checkpoint was written under, else ``checkpoint["rng_states"]`` (rank 0's)."""
    rank, world = _world()
    per_rank = checkpoint.get("rng_states_per_rank")
    if per_rank and len(per_rank) == world:
        return per_rank[rank]
    return checkpoint.get("rng_states")
