"""Episode datasets and a resumable, rank-aware sampler.

Batches are plain lists of :class:`~comlrl_lightning.envs.base.Episode` (no tensors), so Lightning's
``batch_to_device`` leaves them on CPU and each agent moves its own token tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

from comlrl_lightning.envs.base import Episode


class EpisodeDataset(Dataset):
    """Wraps rows (a ``datasets.Dataset`` or a list of dicts); item ``i`` is ``Episode(i, row_i)``."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Episode:
        return Episode(index=int(index), data=dict(self.rows[int(index)]))


def collate_episodes(episodes: Sequence[Episode]) -> list[Episode]:
    """A batch is the list of its episodes."""
    return list(episodes)


class ResumableSampler(DistributedSampler):
    """A seeded (per-epoch) permutation, sharded over ranks, that can start part-way into an epoch.

    It subclasses ``DistributedSampler`` so Lightning keeps it under DDP (it does not wrap samplers
    that already are distributed). In one process it is a plain seeded shuffle. ``skip(n)`` drops the
    first ``n`` indices of this rank's next epoch pass: that is how a mid-epoch resume continues
    exactly where the interrupted run stopped.
    """

    def __init__(
        self, dataset: Dataset, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        super().__init__(
            dataset,
            num_replicas=dist.get_world_size() if distributed else 1,
            rank=dist.get_rank() if distributed else 0,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self._skip = 0

    def skip(self, num_indices: int) -> None:
        """Skip the first ``num_indices`` indices of the next pass (once)."""
        self._skip = max(0, int(num_indices))

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])

    def __len__(self) -> int:
        return self.num_samples
