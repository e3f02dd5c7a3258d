"""Record, once per problem, the inputs a HumanEval ``check`` calls the solution with.

Step 1 of the design in :mod:`comlrl_lightning.coding.judge`: the canonical solution is
wrapped in a recorder and every test of the problem runs in a sandbox after
``random.seed(seed)``; the recording (call inputs per test, plus what the canonical solution
returned) is cached in memory per problem (key: a hash of the problem's fields and the seed).
"""

from __future__ import annotations

import ast
import hashlib
import threading
from dataclasses import dataclass
from typing import Any

from comlrl_lightning.coding.code_text import prompt_preamble
from comlrl_lightning.coding.data import parse_check
from comlrl_lightning.coding.sandbox.api import SandboxConfig, SandboxError, run_record


def split_check(test_code: str) -> tuple[str, list[str]]:
    """HumanEval ``test`` code -> ``(setup, tests)`` with ``candidate`` as the function's name.

    ``setup`` is the module-level code other than ``check`` (``METADATA``, imports, helpers).
    When ``check``'s body is flat, each ``assert`` is one test, preceded by the non-assert
    statements before it; when an assert sits in a loop or branch, the one test is
    ``check(candidate)`` and ``def check`` joins the setup.

    Raises:
        ValueError: the code does not parse or has no ``def check(candidate)``.
    """
    check, setup, param, body = parse_check(test_code, "split_check")
    nested = any(
        isinstance(n, ast.Assert) for s in body if not isinstance(s, ast.Assert) for n in ast.walk(s)
    )
    if nested:
        return "\n\n".join(setup + [ast.get_source_segment(test_code, check) or ast.unparse(check)]), [
            "check(candidate)"
        ]
    tests, prefix = [], [] if param == "candidate" else [f"{param} = candidate"]
    for stmt in body:
        src = ast.get_source_segment(test_code, stmt) or ast.unparse(stmt)
        if isinstance(stmt, ast.Assert):
            tests.append("\n".join(prefix + [src]))
        else:
            prefix.append(src)
    return "\n\n".join(setup), tests


@dataclass(frozen=True)
class Recording:
    """What the judge needs for one problem (trusted data, never sent to a candidate's sandbox).

    Attributes:
        entry_point: the function the tests call.
        setup: judge-side setup: the prompt's preamble (imports, helpers such as ``poly``) and the
            test module's code other than the test statements.
        tests: test statements calling ``candidate``.
        calls: per test, the call inputs (``plain.dumps([args, kwargs])``) in call order.
        expected: per test, the canonical solution's results (``{"o": ...}`` / ``{"x": ...}``).
        statuses: per test, the canonical solution's status in the recording run.
        seed: the ``random.seed`` of every test (recording and judging).
    """

    entry_point: str
    setup: str
    tests: tuple[str, ...]
    calls: tuple[tuple[str, ...], ...]
    expected: tuple[tuple[dict, ...], ...]
    statuses: tuple[str, ...]
    seed: int

    @property
    def keys(self) -> list[str]:
        """Every distinct call input over all tests, in first-call order (what the candidate gets)."""
        return list(dict.fromkeys(k for test in self.calls for k in test))


_cache: dict[str, Recording] = {}
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def recording_for(row: dict[str, Any], seed: int = 0, config: SandboxConfig | None = None) -> Recording:
    """The cached :class:`Recording` of a HumanEval row (recorded in a sandbox on first use).

    Raises:
        SandboxError: the sandbox failed, or the canonical solution does not load.
        ValueError: the row's test code cannot be split (see :func:`split_check`).
    """
    fields = (row["prompt"], row["canonical_solution"], row["test"], row["entry_point"], str(seed))
    key = hashlib.sha256("\0".join(fields).encode("utf-8", "surrogatepass")).hexdigest()
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        if key not in _cache:
            _cache[key] = _record(row, seed, config or SandboxConfig(timeout_s=30.0, test_timeout_s=10.0))
        return _cache[key]


def _record(row: dict[str, Any], seed: int, config: SandboxConfig) -> Recording:
    entry = row["entry_point"]
    test_setup, tests = split_check(row["test"])
    program = row["prompt"] + row["canonical_solution"]
    result, recs = run_record(program, test_setup, tests, entry, seed=seed, config=config)
    if not result.passed:
        raise SandboxError(
            f"recording {row.get('task_id', entry)}: the canonical solution does not load: "
            f"{result.error_type}: {result.message}"
        )
    preamble = prompt_preamble(row["prompt"], entry)
    setup = "\n\n".join(p for p in (preamble, test_setup) if p.strip())
    return Recording(
        entry_point=entry,
        setup=setup,
        tests=tuple(tests),
        calls=tuple(tuple(k for k, _ in r["calls"]) for r in recs),
        expected=tuple(tuple(o for _, o in r["calls"]) for r in recs),
        statuses=tuple(r["s"] for r in recs),
        seed=seed,
    )
