"""Replay of earlier rounds' preference pairs (the iterative trainers; CoMLRL 1.4.3
``MADPOIterTrainer._select_iteration_preference_pairs``).

Every round's pairs are written to ``preference_replay_dir/round_<r>.jsonl`` (atomically, by
:func:`~comlrl_lightning.preference.pairs.write_pairs`; an empty round writes an empty shard). The pairs a
round trains on are then, by ``preference_replay_mode``:

- ``current``: this round's pairs, as they are (no sampling);
- ``nearest_k``: a sample from the ``preference_replay_k`` most recent rounds, each round equally likely;
- ``all_history``: a sample from every round so far, each equally likely;
- ``lambda_decay``: a sample where a round of age ``a`` (0: this round) has weight ``λ^a`` (normalised;
  CoMLRL's ``(1 − λ)·λ^a`` normalises to the same), λ = ``preference_replay_lambda``.

Sampling (as CoMLRL): ``preference_replay_sample_size`` draws (default: this round's pair count, or the
newest non-empty round's) each pick a round by the weights; a round picked ``c`` times gives ``c`` of
its pairs without replacement (whole shuffled passes first when ``c`` exceeds its size); the result is
shuffled. Rounds without pairs take no draws (the weights of the others are renormalised). All draws
come from one ``random.Random(seed)`` whose state :meth:`PreferenceReplay.state_dict` returns, so a
resumed run draws the same pairs.

Where this differs from CoMLRL: a round's age counts rounds (an empty round still ages the ones before
it, and ``nearest_k`` means the last k rounds); CoMLRL never lists an empty round, so its ages and its
``nearest_k`` count non-empty rounds only. ``tests/test_vs_comlrl_iterative.py`` shows both.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from comlrl_lightning.core.choices import Choice
from comlrl_lightning.preference.pairs import PreferencePair, read_pairs, write_pairs

PREFERENCE_REPLAY_MODE = Choice(
    "preference_replay_mode",
    {
        "current": "train on this round's pairs only (CoMLRL default)",
        "nearest_k": "sample from the `preference_replay_k` most recent rounds, uniformly over rounds",
        "all_history": "sample from every round so far, uniformly over rounds",
        "lambda_decay": "sample with round weights `preference_replay_lambda^age` (age 0: this round)",
    },
    aliases={"latest": "current", "last_k": "nearest_k", "recent_k": "nearest_k", "lambda": "lambda_decay"},
)
"""Which rounds' pairs a round trains on (CoMLRL ``preference_replay_mode``)."""
PreferenceReplayMode = PREFERENCE_REPLAY_MODE.literal


def _refuse(field: str, value: Any, why: str) -> None:
    raise ValueError(f"{field}: got {value!r}, {why}")


@dataclass
class ReplayConfig:
    """Preference replay across rounds (CoMLRL 1.4.3 names and defaults; see the module docstring).

    Raises:
        ValueError: a bad value, or a knob given for a mode it does not apply to, naming the field.
    """

    preference_replay_mode: PreferenceReplayMode = "current"
    """One of :data:`PREFERENCE_REPLAY_MODE`. CoMLRL name and default."""
    preference_replay_k: int | None = None
    """``nearest_k``: how many recent rounds (>= 1; required there, refused elsewhere). CoMLRL name."""
    preference_replay_lambda: float | None = None
    """``lambda_decay``: λ in [0, 1] (0: this round only; 1: uniform; required there). CoMLRL name."""
    preference_replay_sample_size: int | None = None
    """Pairs drawn per round by the sampling modes (>= 1); None: this round's pair count (or the newest
    non-empty round's). Refused with ``current``. CoMLRL name."""
    preference_replay_dir: str | None = None
    """Folder of the ``round_<r>.jsonl`` shards; None: ``<default_root_dir>/preference_replay``. CoMLRL name."""

    def __post_init__(self) -> None:
        mode = self.preference_replay_mode = PREFERENCE_REPLAY_MODE.canonical(self.preference_replay_mode)
        k, lam, size = (
            self.preference_replay_k,
            self.preference_replay_lambda,
            self.preference_replay_sample_size,
        )
        if mode == "nearest_k":
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                _refuse("preference_replay_k", k, "preference_replay_mode='nearest_k' needs an integer >= 1")
        elif k is not None and not (mode == "current" and k == 1):
            _refuse(
                "preference_replay_k",
                k,
                f"only applies to preference_replay_mode='nearest_k' (it is {mode!r})",
            )
        if mode == "lambda_decay":
            ok = not isinstance(lam, bool) and isinstance(lam, (int, float)) and 0.0 <= lam <= 1.0
            if not ok:
                _refuse(
                    "preference_replay_lambda",
                    lam,
                    "preference_replay_mode='lambda_decay' needs a number in [0, 1]",
                )
            self.preference_replay_lambda = float(lam)
        elif lam is not None:
            _refuse(
                "preference_replay_lambda",
                lam,
                f"only applies to preference_replay_mode='lambda_decay' (it is {mode!r})",
            )
        if size is not None:
            if mode == "current":
                _refuse(
                    "preference_replay_sample_size",
                    size,
                    "does not apply to preference_replay_mode='current'",
                )
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                _refuse("preference_replay_sample_size", size, "must be an integer >= 1 or None")


def replay_weights(config: ReplayConfig, rounds: Sequence[int], current_round: int) -> list[float]:
    """Each listed round's sampling weight (sums to 1 over the rounds with a weight, or all 0).

    Args:
        rounds: the rounds that have pairs, oldest first.
        current_round: this round (ages are ``current_round − r``).
    """
    mode = config.preference_replay_mode
    ages = [current_round - r for r in rounds]
    if mode == "current":
        raw = [1.0 if a == 0 else 0.0 for a in ages]
    elif mode == "nearest_k":
        raw = [1.0 if a < int(config.preference_replay_k or 1) else 0.0 for a in ages]
    elif mode == "all_history":
        raw = [1.0] * len(ages)
    else:
        lam = float(config.preference_replay_lambda or 0.0)
        raw = [lam**a if a > 0 else 1.0 for a in ages]  # 0**0 is 1: age 0 always counts
    total = math.fsum(raw)
    return [w / total for w in raw] if total > 0 else [0.0] * len(raw)


class PreferenceReplay:
    """The shards on disk and the seeded draws from them (see the module docstring).

    Args:
        config: the replay config.
        directory: the shards' folder (``preference_replay_dir``, or the module's default).
        seed: seeds the draws.
        num_agents: checked against every pair read back (None: not checked).
    """

    def __init__(
        self, config: ReplayConfig, directory: str, seed: int, num_agents: int | None = None
    ) -> None:
        self.config, self.directory, self.num_agents = config, os.fspath(directory), num_agents
        self.rng = random.Random(int(seed))
        self.shards: dict[int, int] = {}
        """Round -> its pair count, for every round written."""

    def path(self, round_index: int) -> str:
        return os.path.join(self.directory, f"round_{round_index}.jsonl")

    def add_round(self, round_index: int, pairs: Sequence[PreferencePair]) -> None:
        """Write round ``round_index``'s pairs as its shard (again on a resumed round: same pairs)."""
        self.shards[round_index] = write_pairs(self.path(round_index), pairs)

    def sample_size(self, round_index: int) -> int:
        """The draws of a sampling mode: ``preference_replay_sample_size``, else this round's count,
        else the newest non-empty round's, else 0."""
        if self.config.preference_replay_sample_size is not None:
            return int(self.config.preference_replay_sample_size)
        for r in sorted((r for r in self.shards if r <= round_index), reverse=True):
            if self.shards[r] > 0:
                return self.shards[r]
        return 0

    def select(self, round_index: int, current: Sequence[PreferencePair]) -> list[PreferencePair]:
        """The pairs round ``round_index`` trains on; ``current`` are its own (already added)."""
        if self.config.preference_replay_mode == "current":
            return list(current)
        rounds = sorted(r for r, n in self.shards.items() if n > 0 and r <= round_index)
        weights = replay_weights(self.config, rounds, round_index)
        eligible = [(r, w) for r, w in zip(rounds, weights) if w > 0]
        size = self.sample_size(round_index)
        if not eligible or size <= 0:
            return []
        counts = dict.fromkeys((r for r, _ in eligible), 0)
        for _ in range(size):
            counts[self.rng.choices([r for r, _ in eligible], weights=[w for _, w in eligible], k=1)[0]] += 1
        sampled: list[PreferencePair] = []
        for r, c in counts.items():
            if c > 0:
                sampled += self._draw(read_pairs(self.path(r), self.num_agents), c)
        self.rng.shuffle(sampled)
        return sampled

    def _draw(self, pairs: list[PreferencePair], count: int) -> list[PreferencePair]:
        """``count`` of ``pairs`` without replacement, whole shuffled passes first (CoMLRL ``_sample_replay_records``)."""
        if count <= len(pairs):
            return self.rng.sample(pairs, k=count)
        out: list[PreferencePair] = []
        while count > 0:
            if count >= len(pairs):
                batch = list(pairs)
                self.rng.shuffle(batch)
                out += batch
                count -= len(batch)
            else:
                out += self.rng.sample(pairs, k=count)
                count = 0
        return out

    def counts(self) -> tuple[int, int]:
        """``(rounds written, pairs in all shards)``."""
        return len(self.shards), sum(self.shards.values())

    def state_dict(self) -> dict[str, Any]:
        """The generator's state and the shard list (the shards themselves are on disk)."""
        version, internal, gauss = self.rng.getstate()
        return {
            "rng": [version, list(internal), gauss],
            "shards": dict(self.shards),
            "directory": self.directory,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            FileNotFoundError: a recorded shard is missing.
            ValueError: a shard's pair count differs from the recorded one.
        """
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.directory = state["directory"]
        self.shards = {int(r): int(n) for r, n in state["shards"].items()}
        for r, n in self.shards.items():
            got = len(read_pairs(self.path(r)))
            if got != n:
                raise ValueError(
                    f"preference_replay_dir: {self.path(r)} holds {got} pairs, the checkpoint recorded {n}"
                )
