"""What a reward function returns, read as numbers: shared ``[J]`` or per agent ``[J, N]``.

:func:`as_values` reads one return value (plain numbers only, shape named in every refusal);
:func:`check_orientation` tells a per-agent ``[J, N]`` from its transpose when ``J = N`` hides it.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch


class RewardError(RuntimeError):
    """A reward function raised, returned the wrong number or kind of values, or returned NaN/inf."""


def as_values(out: object, n: int, num_agents: int) -> torch.Tensor:
    """``[n]`` (shared) or ``[n, num_agents]`` (per agent) float32 from a reward's return value.

    Only plain real numbers are accepted: a ``torch.Tensor`` (whose graph and device would be dropped
    unsaid: the protocol returns numbers), a dict (whose keys would be iterated) or numeric strings
    (which ``float`` would coerce) raise, as does any other shape (named in the message).

    Raises:
        RewardError: naming what was returned and what is expected.
    """
    if isinstance(out, torch.Tensor):
        raise RewardError(
            f"returned a torch.Tensor (shape {list(out.shape)}); a reward returns plain numbers: a list "
            f"of {n} floats (or {n} rows of {num_agents}, one per agent), e.g. tensor.tolist(), or a "
            "RewardResult"
        )
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
        raise RewardError(
            f"returned a {type(out).__name__}; expected a sequence of {n} numbers or a RewardResult"
        )
    rows = list(out)
    if rows and all(
        hasattr(r, "__len__") and not isinstance(r, (str, bytes, dict, torch.Tensor)) for r in rows
    ):
        flat = [v for r in rows for v in r]
        shape: tuple[int, ...] = (len(rows), len(rows[0])) if len({len(r) for r in rows}) == 1 else (-1,)
    else:
        flat, shape = rows, (len(rows),)
    bad = [v for v in flat if not isinstance(v, (numbers.Real, torch.Tensor))]
    if bad:
        raise RewardError(
            f"returned a non-numeric value {bad[0]!r} ({type(bad[0]).__name__}); expected {n} numbers"
        )
    if shape == (-1,):
        raise RewardError(
            f"returned rows of different lengths {[len(r) for r in rows]}; expected [{n}] "
            f"(shared) or [{n}, {num_agents}] (one per agent)"
        )
    values = torch.as_tensor([float(v) for v in flat], dtype=torch.float32).view(shape)
    if values.dim() == 1 and values.numel() == n:
        return values
    if values.shape == (n, num_agents):
        return values
    if values.dim() == 1:
        raise RewardError(f"returned {values.numel()} values for {n} joint actions")
    raise RewardError(
        f"returned shape {list(values.shape)} for {n} joint actions of {num_agents} agents; expected "
        f"[{n}] (shared) or [{n}, {num_agents}] (one per agent)"
    )


def check_orientation(
    score: Callable[[Sequence[Sequence[str]], Sequence[Any]], Any],
    joint_actions: Sequence[Sequence[str]],
    episodes: Sequence[Any],
) -> None:
    """Refuse a per-agent reward whose rows are its agents, seen through a square call.

    With ``J`` joint actions of ``J`` agents, ``[J, N]`` and its transpose ``[N, J]`` have one shape:
    read as rows of joint actions, a transposed reward would give agent ``i``'s rewards to joint
    action ``i``. ``score(joint_actions, episodes)`` (the function's values) is called once more on
    ``J + 1`` joint actions (the first one again), whose shape tells the two apart.

    Raises:
        RewardError: the ``J + 1`` call returns ``[N, J + 1]`` (rows per agent) or another shape.
    """
    n, num_agents = len(joint_actions) + 1, len(joint_actions[0])
    out = score([*joint_actions, joint_actions[0]], [*episodes, episodes[0]])
    try:
        as_values(out, n, num_agents)
    except RewardError as err:
        if f"returned shape [{num_agents}, {n}]" in str(err):
            raise RewardError(
                f"returns one row per agent ([agents, joint actions] = [{num_agents}, {n}] for {n} joint "
                f"actions; its [{num_agents}, {num_agents}] for {num_agents} joint actions was read the same "
                f"way, transposed); a per-agent reward returns one row per joint action: [J, N]"
            ) from None
        raise RewardError(
            f"returned [{num_agents}, {num_agents}] for {num_agents} joint actions of {num_agents} agents, "
            f"but for {n} joint actions it {err}"
        ) from None
