"""The two checks every config group's ``__post_init__`` uses, so each error names the field, the value
and what is allowed (the house rule for bad input), worded the same in every group."""

from __future__ import annotations

from typing import Any


def require(field: str, value: Any, ok: bool, allowed: str) -> None:
    """Raises ValueError ``"<field>: got <value>, must be <allowed>"`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{field}: got {value!r}, must be {allowed}")


def refuse_both(field: str, value: Any, other: str, other_value: Any) -> None:
    """Raises ValueError: ``field`` and ``other`` are two names of one knob, given different values."""
    msg = f"{field}: got {value!r}, but {other}={other_value!r}; give one of the two (they are the same knob)"
    raise ValueError(msg)
