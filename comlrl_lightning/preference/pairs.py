"""Joint-action preference pairs: the record MADPO trains on, MARLHF's reward model learns from, and
the iterative trainers replay, with its ``jsonl`` file format.

A pair is one episode's two joint actions, the preferred one (``chosen``) and the other
(``rejected``): per agent the completion it wrote (TRL's DPO names; CoMLRL's ``PreferencePair``
calls them ``winner_completions`` / ``loser_completions``). Pairs built from rollouts carry the task
reward of each side; pairs a user brings (human preferences) may leave them out.

File format (one JSON object per line, UTF-8; :func:`write_pairs` / :func:`read_pairs`)::

    {"prompts": ["<agent 0's prompt>", "<agent 1's prompt>"],
     "chosen": ["<agent 0's text>", "<agent 1's text>"],
     "rejected": ["<agent 0's text>", "<agent 1's text>"],
     "chosen_reward": 0.9, "rejected_reward": 0.1,      # optional
     "episode": {"prompt": "...", ...}}                  # optional: the dataset row

``prompts`` are each agent's observation text (``DecPOMDP.observe``), before any chat template: the
consumer renders them with the agent's own tokenizer, as a rollout does.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from comlrl_lightning.core.choices import Choice
from comlrl_lightning.infra.checkpoint_io import fsync_dir

PAIR_SELECTION = Choice(
    "pair_selection",
    {
        "reward_gap": "the `preference_pairs_per_sample` pairs with the largest reward gap first (CoMLRL's default)",
        "all": "every non-tied pair, in candidate order (`preference_pairs_per_sample` must be null)",
        "random": "`preference_pairs_per_sample` non-tied pairs drawn by a seeded generator (saved in checkpoints)",
        "comparator_reward": "iterative trainers only: pairs whose comparator sample has the highest reward "
        "first, then the largest gap (CoMLRL's iterative default)",
    },
)
"""Which preference pairs an episode contributes (CoMLRL ``pair_selection``; ties never pair): the one
declaration for one-shot MADPO / MARLHF (:mod:`comlrl_lightning.preference.selection`, which refuses
``comparator_reward``: it has no comparator) and the iterative trainers
(:mod:`comlrl_lightning.preference.comparator.pairing`)."""

_REQUIRED = ("prompts", "chosen", "rejected")
_OPTIONAL = ("chosen_reward", "rejected_reward", "episode")


@dataclass(frozen=True)
class PreferencePair:
    """One preference between two joint actions of the same episode (``N`` agents).

    Attributes:
        prompts: ``[N]`` each agent's observation text (before its chat template).
        chosen: ``[N]`` each agent's completion in the preferred joint action.
        rejected: ``[N]`` each agent's completion in the other joint action.
        chosen_reward: the shared reward of ``chosen`` (None: not known, e.g. a human label).
        rejected_reward: the shared reward of ``rejected``.
        episode: the episode's dataset row (reward templates read its fields); may be empty.

    Raises:
        ValueError: the three lists differ in length or are empty, a reward is not finite, or
            ``chosen_reward < rejected_reward``.
    """

    prompts: list[str]
    chosen: list[str]
    rejected: list[str]
    chosen_reward: float | None = None
    rejected_reward: float | None = None
    episode: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        if n == 0 or len(self.chosen) != n or len(self.rejected) != n:
            raise ValueError(
                f"PreferencePair: prompts, chosen and rejected need one entry per agent; got "
                f"{len(self.prompts)}, {len(self.chosen)} and {len(self.rejected)}"
            )
        for name in ("chosen_reward", "rejected_reward"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"PreferencePair.{name}: got {value!r}, must be finite or None")
        if self.reward_gap is not None and self.reward_gap < 0:  # a swapped pair would train the wrong way
            raise ValueError(
                f"PreferencePair.chosen_reward: got {self.chosen_reward!r}, below rejected_reward="
                f"{self.rejected_reward!r}; chosen is the preferred joint action: swap the two sides, or "
                "leave both rewards out"
            )

    @property
    def num_agents(self) -> int:
        return len(self.prompts)

    @property
    def reward_gap(self) -> float | None:
        """``chosen_reward − rejected_reward`` (None when either is unknown)."""
        if self.chosen_reward is None or self.rejected_reward is None:
            return None
        return self.chosen_reward - self.rejected_reward

    def to_json(self) -> dict[str, Any]:
        """The file form (:func:`write_pairs`): unknown rewards and an empty episode left out."""
        d = asdict(self)
        return {k: v for k, v in d.items() if k in _REQUIRED or v not in (None, {})}

    @classmethod
    def from_json(cls, d: Any, where: str = "pair") -> PreferencePair:
        """Parse the file form.

        Raises:
            ValueError: not an object, a required field missing, a field of the wrong type or an
                unknown field, naming ``where`` (e.g. ``"pairs.jsonl:3"``) and the field.
        """
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {list(_REQUIRED + _OPTIONAL)}")
        for key in _REQUIRED:
            value = d.get(key)
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise ValueError(
                    f"{where}: field {key!r} must be a list of strings (one per agent), got {value!r}"
                )
        for key in ("chosen_reward", "rejected_reward"):
            value = d.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{where}: field {key!r} must be a number or absent, got {value!r}")
        episode = d.get("episode", {})
        if not isinstance(episode, dict):
            raise ValueError(f"{where}: field 'episode' must be an object, got {episode!r}")
        try:
            return cls(
                list(d["prompts"]),
                list(d["chosen"]),
                list(d["rejected"]),
                None if d.get("chosen_reward") is None else float(d["chosen_reward"]),
                None if d.get("rejected_reward") is None else float(d["rejected_reward"]),
                dict(episode),
            )
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def write_pairs(path: str | os.PathLike[str], pairs: Iterable[PreferencePair]) -> int:
    """Write ``pairs`` as ``jsonl`` atomically (a temporary file beside ``path``, fsynced, renamed over
    it): a reader sees the old file or the whole new one. Returns the number of pairs written."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for pair in pairs:
                f.write(json.dumps(pair.to_json(), ensure_ascii=False) + "\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fsync_dir(folder)
    return n


def read_pairs(path: str | os.PathLike[str], num_agents: int | None = None) -> list[PreferencePair]:
    """Read a ``jsonl`` pair file (blank lines skipped).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a line that is not JSON or not a pair (naming ``path:line`` and the field), or a
            pair whose agent count differs from ``num_agents``.
    """
    path = os.fspath(path)
    pairs: list[PreferencePair] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            pair = PreferencePair.from_json(obj, where)
            if num_agents is not None and pair.num_agents != num_agents:
                raise ValueError(
                    f"{where}: the pair has {pair.num_agents} agents' completions, the team has {num_agents}"
                )
            pairs.append(pair)
    return pairs
