"""How close each tolerance-based check of a test run came to failing (``COMLRL_TOLERANCE_AUDIT=FILE``).

The conftest installs this when the variable is set: every ``torch.allclose``,
``torch.testing.assert_close`` and ``pytest.approx`` comparison of a floating value then appends one
JSON line to FILE (``test``, ``where``, ``ratio``): ``ratio`` = max over elements of
``|actual - expected| / (atol + rtol * |expected|)``, so a passing check has ratio <= 1 and a ratio
above 0.25 leaves less than a 4x margin for another CPU's kernels. ``python tests/tolerance_audit.py
FILE [FILE ...]`` lists the checks by their largest ratio over the runs given (e.g. one run per
``ATEN_CPU_CAPABILITY`` and ``MKL_CBWR`` setting). Reading only: no check's outcome changes.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

import torch

_DEFAULT_CLOSE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5)}
"""torch.testing.assert_close's default (rtol, atol) per dtype; float64 and others: (1e-7, 1e-7)."""


def _where() -> str:
    for frame in reversed(traceback.extract_stack()[:-3]):
        if os.sep + "tests" + os.sep in frame.filename and "tolerance_audit" not in frame.filename:
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "?"


def _ratio(actual, expected, rtol: float, atol: float) -> float | None:
    try:
        a = torch.as_tensor(actual, dtype=torch.float64).detach().cpu()
        e = torch.as_tensor(expected, dtype=torch.float64).detach().cpu()
        a, e = torch.broadcast_tensors(a, e)
    except (TypeError, ValueError, RuntimeError):
        return None
    finite = torch.isfinite(a) & torch.isfinite(e)
    if not bool(finite.any()):
        return None
    allowed = atol + rtol * e[finite].abs()
    err = (a[finite] - e[finite]).abs()
    return float(torch.where(allowed > 0, err / allowed, torch.where(err > 0, math.inf, 0.0)).max())


def install(path: str) -> None:
    """Wrap the three comparisons so each appends its ratio to ``path`` (then behaves as before)."""
    from _pytest.approx import ApproxScalar

    def record(ratio: float | None) -> None:
        if ratio is None:
            return
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": test, "where": _where(), "ratio": ratio}) + "\n")

    allclose = torch.allclose

    def audited_allclose(input, other, rtol=1e-5, atol=1e-8, equal_nan=False):  # noqa: A002 - torch's names
        if input.is_floating_point():
            record(_ratio(input, other, rtol, atol))
        return allclose(input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)

    assert_close = torch.testing.assert_close

    def audited_assert_close(actual, expected, *args, rtol=None, atol=None, **kwargs):
        if isinstance(actual, torch.Tensor) and actual.is_floating_point():
            default = _DEFAULT_CLOSE.get(actual.dtype, (1e-7, 1e-7))
            record(
                _ratio(
                    actual,
                    expected,
                    default[0] if rtol is None else rtol,
                    default[1] if atol is None else atol,
                )
            )
        return assert_close(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)

    scalar_eq = ApproxScalar.__eq__

    def audited_eq(self, actual):
        try:
            if isinstance(self.expected, float | int) and not isinstance(self.expected, bool):
                tol = self.tolerance
                if tol > 0 and math.isfinite(tol):
                    record(abs(float(actual) - float(self.expected)) / tol)
        except (TypeError, ValueError):
            pass
        return scalar_eq(self, actual)

    torch.allclose = audited_allclose
    torch.testing.assert_close = audited_assert_close
    ApproxScalar.__eq__ = audited_eq


def report(paths: list[str], floor: float = 0.05) -> list[tuple[float, str, str]]:
    """``(largest ratio, where, test)`` per check site over the runs in ``paths``, largest first, those above ``floor``."""
    worst: dict[str, tuple[float, str, str]] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                key = r["where"] + " " + r["test"]
                if r["ratio"] >= worst.get(key, (-1.0,))[0]:
                    worst[key] = (r["ratio"], r["where"], r["test"])
    return sorted((w for w in worst.values() if w[0] > floor), reverse=True)


if __name__ == "__main__":
    for ratio, where, test in report(sys.argv[1:]):
        print(f"{ratio:8.3f}  {where:40s} {test}")
