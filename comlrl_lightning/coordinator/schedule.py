"""Which learners train at which round: pure schedule policies.

A schedule maps ``(round, learner names)`` to the names that update at that round (0-based rounds).
Every policy is a pure function of its arguments, so the coordinator's round counter is the whole
schedule state a checkpoint needs, and a resumed run trains the same learners at the same rounds.
A learner that does not train at a round still answers its prompts: its responses feed the others
(a frozen partner), and its weights and optimizer state do not change.

Policies:
    - :class:`EveryRound`: every learner, every round (independent learners, trained together).
    - :class:`Alternate`: one learner at a time, in order, for ``period`` rounds each
      (``period=1`` is round-robin: A, B, C, A, B, C, …).
    - :class:`EveryN`: learner ``x`` trains every ``every[x]`` rounds, from round ``offset[x]``.
    - :class:`WarmupFreeze`: another policy, restricted to rounds ``start[x] <= r < stop[x]``
      (before ``start``: warm-up, the learner only plays; from ``stop``: frozen for good).
    - any callable ``fn(round, names) -> iterable of names`` (checked by :func:`scheduled`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@runtime_checkable
class Schedule(Protocol):
    """``schedule(round, names)``: the names of the learners that train at ``round`` (0-based)."""

    def __call__(self, round: int, names: Sequence[str]) -> Iterable[str]: ...


def _check_names(field_name: str, given: Iterable[str], names: Sequence[str]) -> None:
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"{field_name}: unknown learner(s) {unknown}; the learners are {list(names)}")


@dataclass(frozen=True)
class EveryRound:
    """Every learner trains at every round."""

    def __call__(self, round: int, names: Sequence[str]) -> frozenset[str]:
        return frozenset(names)


@dataclass(frozen=True)
class Alternate:
    """One learner trains at a time, in the order of ``names``, for ``period`` rounds each.

    Round ``r`` trains ``names[(r // period) % len(names)]``. With two learners and ``period=1``:
    A, B, A, B, …; with ``period=2``: A, A, B, B, ….
    """

    period: int = 1
    """Rounds in a row that each learner trains (>= 1)."""

    def __post_init__(self) -> None:
        if self.period < 1:
            raise ValueError(f"Alternate.period: got {self.period}, must be >= 1")

    def __call__(self, round: int, names: Sequence[str]) -> frozenset[str]:
        return frozenset([names[(round // self.period) % len(names)]])


RoundRobin = Alternate
"""Round-robin is :class:`Alternate` with ``period=1`` over any number of learners."""


@dataclass(frozen=True)
class EveryN:
    """Learner ``x`` trains at rounds ``offset[x], offset[x] + every[x], …``.

    Learners missing from ``every`` train every round; missing from ``offset`` start at round 0.
    """

    every: Mapping[str, int] = field(default_factory=dict)
    """Learner name -> rounds between two of its updates (>= 1)."""
    offset: Mapping[str, int] = field(default_factory=dict)
    """Learner name -> first round it trains (>= 0)."""

    def __post_init__(self) -> None:
        for name, n in self.every.items():
            if n < 1:
                raise ValueError(f"EveryN.every[{name!r}]: got {n}, must be >= 1")
        for name, o in self.offset.items():
            if o < 0:
                raise ValueError(f"EveryN.offset[{name!r}]: got {o}, must be >= 0")

    def __call__(self, round: int, names: Sequence[str]) -> frozenset[str]:
        _check_names("EveryN.every", self.every, names)
        _check_names("EveryN.offset", self.offset, names)
        out = []
        for name in names:
            start, n = self.offset.get(name, 0), self.every.get(name, 1)
            if round >= start and (round - start) % n == 0:
                out.append(name)
        return frozenset(out)


@dataclass(frozen=True)
class WarmupFreeze:
    """``inner``'s choice, restricted per learner to rounds ``start[x] <= round < stop[x]``.

    ``start`` is a warm-up (the learner only plays, e.g. a partner that must first become useful);
    ``stop`` freezes the learner from that round on. Missing entries: start 0, never stop.
    """

    inner: Schedule = field(default_factory=EveryRound)
    """The policy inside the window (default: every round)."""
    start: Mapping[str, int] = field(default_factory=dict)
    """Learner name -> first round it may train."""
    stop: Mapping[str, int] = field(default_factory=dict)
    """Learner name -> first round it is frozen for good."""

    def __post_init__(self) -> None:
        for name in set(self.start) & set(self.stop):
            if self.stop[name] <= self.start[name]:
                raise ValueError(
                    f"WarmupFreeze.stop[{name!r}]: got {self.stop[name]}, must be > "
                    f"start[{name!r}]={self.start[name]}"
                )

    def __call__(self, round: int, names: Sequence[str]) -> frozenset[str]:
        _check_names("WarmupFreeze.start", self.start, names)
        _check_names("WarmupFreeze.stop", self.stop, names)
        chosen = scheduled(self.inner, round, names)
        return frozenset(
            x
            for x in chosen
            if self.start.get(x, 0) <= round and (x not in self.stop or round < self.stop[x])
        )


def scheduled(
    schedule: Schedule | Callable[[int, Sequence[str]], Iterable[str]], round: int, names: Sequence[str]
) -> frozenset[str]:
    """The learners that train at ``round``, checked.

    Raises:
        ValueError: the schedule named a learner that does not exist.
        TypeError: it returned a bare string (whose characters would be read as names).
    """
    chosen = schedule(round, list(names))
    if isinstance(chosen, str):
        raise TypeError(f"schedule returned the string {chosen!r} at round {round}; return a list of names")
    chosen = frozenset(chosen)
    _check_names(f"schedule (round {round})", chosen, names)
    return chosen


def schedule_table(schedule: Schedule, names: Sequence[str], num_rounds: int) -> list[list[str]]:
    """``num_rounds`` rows: the learners (in ``names`` order) that train at each round."""
    return [[x for x in names if x in scheduled(schedule, r, names)] for r in range(num_rounds)]
