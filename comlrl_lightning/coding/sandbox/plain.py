"""Plain data: the only values that cross between untrusted code and the trusted judge.

A plain value is ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, or a
``list``/``tuple``/``dict``/``set``/``frozenset`` of plain values, each of *exactly* that type (a
subclass of a builtin, e.g. an ``int`` whose ``__eq__`` is always true, is refused).
:func:`encode` turns one into JSON-ready data (tuples as ``{"t": [...]}``, dicts as ``{"d":
[[key, value], ...]}``, sets as ``{"s": [...]}`` and frozensets as ``{"f": [...]}`` sorted by
their elements' JSON so equal sets encode alike, bytes as ``{"b": hex}``, lists as JSON arrays) and
:func:`decode` back, both with the same caps (:data:`LIMITS`). The sandbox side encodes; the
trusted side only ever *decodes* what arrived, so whatever the untrusted process does to its own
copy of this module, the judge sees fresh builtin objects within the caps or an error.

Standard library only: the sandbox worker loads this file by path.
"""

from __future__ import annotations

import json

LIMITS = {"nodes": 100_000, "depth": 64, "chars": 1_000_000, "int_bits": 8192}
"""Caps per value: container and scalar nodes, nesting depth, total characters of strings, bits
of any int. Sized far above any HumanEval input or output (the largest are a few thousand nodes)."""


class PlainDataError(ValueError):
    """A value is not plain data or exceeds :data:`LIMITS` (the message says which)."""


def _node(depth: int, budget: list[int], limits: dict[str, int]) -> None:
    """Count one node against the caps (both walkers)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > limits["depth"]:
        raise PlainDataError(f"value exceeds {limits['nodes']} nodes or depth {limits['depth']}")


def _chars(n: int, budget: list[int], limits: dict[str, int]) -> None:
    """Count ``n`` characters of a string or bytes against the caps (both walkers)."""
    budget[1] -= n
    if budget[1] < 0:
        raise PlainDataError(f"strings exceed {limits['chars']} characters")


_NOT_SCALAR = object()


def _scalar(v: object, budget: list[int], limits: dict[str, int]) -> object:
    """``v`` itself when it is a scalar that JSON carries unchanged (``None``, ``bool``, ``float``, ``int``
    within ``int_bits``, ``str`` within the characters left), else :data:`_NOT_SCALAR`: the part both
    walkers share, exact types only."""
    t = type(v)
    if v is None or t is bool or t is float:
        return v
    if t is int:
        if v.bit_length() > limits["int_bits"]:
            raise PlainDataError(f"int of {v.bit_length()} bits exceeds {limits['int_bits']}")
        return v
    if t is str:
        _chars(len(v), budget, limits)
        return v
    return _NOT_SCALAR


def encode(value: object, limits: dict[str, int] = LIMITS) -> object:
    """``value`` as JSON-ready data. Raises :class:`PlainDataError` for another type or a cap."""
    budget = [limits["nodes"], limits["chars"]]
    return _enc(value, 0, budget, limits)


def _enc(v: object, depth: int, budget: list[int], limits: dict[str, int]) -> object:
    _node(depth, budget, limits)
    if (s := _scalar(v, budget, limits)) is not _NOT_SCALAR:
        return s
    t = type(v)
    if t is list:
        return [_enc(x, depth + 1, budget, limits) for x in v]
    if t is tuple:
        return {"t": [_enc(x, depth + 1, budget, limits) for x in v]}
    if t is bytes:
        _chars(len(v), budget, limits)
        return {"b": v.hex()}
    if t is set or t is frozenset:
        items = [_enc(x, depth + 1, budget, limits) for x in v]
        items.sort(key=lambda x: json.dumps(x, sort_keys=True))
        return {"s" if t is set else "f": items}
    if t is dict:
        return {
            "d": [
                [_enc(k, depth + 1, budget, limits), _enc(x, depth + 1, budget, limits)] for k, x in v.items()
            ]
        }
    raise PlainDataError(
        f"type {t.__name__} is not plain data (None/bool/int/float/str/bytes/list/tuple/dict/set/frozenset)"
    )


def decode(data: object, limits: dict[str, int] = LIMITS) -> object:
    """Plain builtin objects from :func:`encode`'s output (as parsed by ``json.loads``).

    Raises:
        PlainDataError: malformed tags, an unhashable dict key, or a cap exceeded.
    """
    budget = [limits["nodes"], limits["chars"]]
    return _dec(data, 0, budget, limits)


def _dec(d: object, depth: int, budget: list[int], limits: dict[str, int]) -> object:
    _node(depth, budget, limits)
    if (s := _scalar(d, budget, limits)) is not _NOT_SCALAR:
        return s
    t = type(d)
    if t is list:
        return [_dec(x, depth + 1, budget, limits) for x in d]
    if t is dict and len(d) == 1 and type(d.get("t")) is list:
        return tuple(_dec(x, depth + 1, budget, limits) for x in d["t"])
    if t is dict and len(d) == 1 and type(d.get("b")) is str:
        _chars(len(d["b"]) // 2, budget, limits)
        try:
            return bytes.fromhex(d["b"])
        except ValueError:
            raise PlainDataError("malformed bytes") from None
    if t is dict and len(d) == 1 and (type(d.get("s")) is list or type(d.get("f")) is list):
        kind = set if "s" in d else frozenset
        try:
            return kind(_dec(x, depth + 1, budget, limits) for x in d["s" if kind is set else "f"])
        except TypeError:
            raise PlainDataError("unhashable set element") from None
    if t is dict and len(d) == 1 and type(d.get("d")) is list:
        out = {}
        for pair in d["d"]:
            if type(pair) is not list or len(pair) != 2:
                raise PlainDataError("malformed dict entry")
            key = _dec(pair[0], depth + 1, budget, limits)
            try:
                out[key] = _dec(pair[1], depth + 1, budget, limits)
            except TypeError:
                raise PlainDataError(f"unhashable dict key of type {type(key).__name__}") from None
        return out
    raise PlainDataError(f"malformed plain data of type {t.__name__}")


def dumps(value: object) -> str:
    """Compact JSON of ``encode(value)`` (also the lookup key of a call's arguments)."""
    return json.dumps(encode(value), separators=(",", ":"))


def loads(text: str | bytes, max_bytes: int = 8 << 20) -> object:
    """``decode(json.loads(text))``; any malformed, oversized or too deeply nested input raises
    :class:`PlainDataError` (never ``RecursionError`` or ``MemoryError``)."""
    if len(text) > max_bytes:
        raise PlainDataError(f"{len(text)} bytes exceed {max_bytes}")
    try:
        return decode(json.loads(text))
    except PlainDataError:
        raise
    except (ValueError, TypeError, RecursionError, MemoryError) as err:
        raise PlainDataError(f"malformed JSON: {type(err).__name__}") from None
