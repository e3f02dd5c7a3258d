"""Cooperative coding on HumanEval: a helper agent writes ``aux``, a main agent writes the entry point.

The setup of the MAGRPO paper ("LLM Collaboration With Multi-Agent Reinforcement Learning",
arXiv 2508.04652): agent 0 writes a helper function ``aux(...)``, agent 1 writes the problem's
entry-point function, which may call ``aux``; both agents get one level-gated shared reward
(:class:`CooperativeCodeReward`). ``num_agents=1`` uses :class:`SinglePrompt` and
:class:`SingleAgentCodeReward` (pass rate).

Every level past the static ones is earned from what ran, judged outside the process that ran
it (:mod:`comlrl_lightning.coding.judge`): the candidate's program is called on the inputs
the problem's tests use and returns plain outputs; the trusted judge replays the tests on them.
The cooperation bonus is decided counterfactually, from fresh runs of the same program with the
helper's values replaced by a trusted stand-in (:mod:`comlrl_lightning.coding.standin`),
judged like the real run from plain outputs only, so a dead or decorative call, a gate on the
helper's type or ``None``-ness, a constant helper used as a gate, or anything the candidate's process
says about its helper, earns nothing (limits: docs/attacks.md). The main agent's code cannot replace names the prompt or the helper define (its
top-level definitions of them are dropped, and they are restored after it loads). Parsing,
cleaning and static checks never raise: a pathological completion (deep nesting, 100k
characters, NUL bytes, invalid UTF-8, huge literals) scores the static levels it reached and
counts an ``error_<reason>`` metric.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from comlrl_lightning.coding.code_text import (  # noqa: F401 - ERROR_REASONS, guarded: public here too
    ERROR_REASONS,
    MAX_COMPLETION_CHARS,
    _bound_names,
    clean_completion,
    compiles,
    defines,
    find_function,
    guarded,
    parse_code,
    prompt_preamble,
    strip_fences,
    textual_return,
    without_definitions_of,
)
from comlrl_lightning.coding.data import (  # noqa: F401 - re-exported (public names of this module)
    AUX,
    HUMANEVAL_FIELDS,
    _Rename,
    extract_tests,
    helper_as_aux,
    humaneval_path,
    load_humaneval_rows,
    split_tests,
    train_val_split,
)
from comlrl_lightning.coding.judge import Judge
from comlrl_lightning.coding.prompts import HelperPrompt, MainPrompt, SinglePrompt  # noqa: F401
from comlrl_lightning.coding.recorder import recording_for
from comlrl_lightning.coding.sandbox import plain
from comlrl_lightning.coding.sandbox.api import SandboxConfig, SandboxPool, TestJob, TestReport
from comlrl_lightning.coding.standin import (
    STAND_INS,
    fails_not_by_time,
    helper_did_work,
    is_wrapper,
    stand_in_fields,
)
from comlrl_lightning.coding.verdict import evaluate
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult


def _default_config() -> SandboxConfig:
    return SandboxConfig(timeout_s=4.0, test_timeout_s=1.0)


def visible_tests(num_tests: int) -> list[int]:
    """Indices of the tests feedback may quote: the first half (at least one); the rest are hidden.
    A single-test problem's test is visible, but feedback then gives only pass/fail and the type."""
    return list(range(max(1, num_tests // 2))) if num_tests else []


@dataclass
class _Plan:
    """What the static phase decided for one joint action: levels so far, what to run."""

    components: dict[str, float] = field(default_factory=dict)
    program: str | None = None  # main's process: the preamble (+ the helper when it has no `aux`)
    main: str = ""
    preamble: str = ""
    helper: str = ""
    protected: tuple[str, ...] = ()
    calls_aux: bool = False
    trivial: bool = True
    redefined: bool = False
    helper_program: str | None = None  # preamble + helper, run in its own sandbox (coding/sandbox/split.py)
    kind: str = "real"  # the values main gets from the helper (standin.py)
    budgets: tuple[float, ...] = ()  # a stand-in run's per-call limits, from the real run
    answers: tuple[dict, ...] = ()  # the real run's helper outputs (the `reversed` stand-in's values)
    error: str | None = None


class _CodeRewardBase:
    """Shared machinery: the judge, a thread pool over sandbox runs, a cache of judged reports."""

    CACHE_SIZE = 4096
    LEVELS: tuple[str, ...] = ()

    def __init__(self, config: SandboxConfig | None, max_workers: int | None) -> None:
        self.config = config or _default_config()
        self.max_workers = max_workers
        self._executor: ThreadPoolExecutor | None = None
        self._judge: Judge | None = None
        self._reports: OrderedDict[tuple, list[TestReport]] = OrderedDict()

    def plan(self, joint_action: Sequence[str], row: dict[str, Any]) -> _Plan:
        """The static phase of one joint action (never raises)."""
        raise NotImplementedError

    def report_for(self, joint_action: Sequence[str], row: dict[str, Any]) -> TestReport | None:
        """The judged report of a joint action (cached from the last reward calls, else run now);
        ``None`` when it does not get as far as running."""
        p = self.plan(joint_action, row)
        return None if p.program is None else self._evaluate([p], [row])[0]

    @property
    def judge(self) -> Judge:
        """The trusted judge (its processes start on first use)."""
        if self._judge is None:
            self._judge = Judge(timeout_s=max(1.0, self.config.test_timeout_s * 2))
        return self._judge

    def _evaluate(self, plans: list[_Plan], rows: list[dict[str, Any]]) -> list[TestReport | None]:
        keys = [
            None
            if p.program is None
            else (str(r.get("task_id", r["entry_point"])), p.program, p.main, p.helper_program, p.kind)
            for p, r in zip(plans, rows)
        ]
        todo = sorted(
            {i for i, k in enumerate(keys) if k is not None and k not in self._reports},
            key=lambda i: keys.index(keys[i]),
        )
        todo = [i for i in todo if keys.index(keys[i]) == i]  # each distinct program once
        if todo:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.max_workers or SandboxPool().max_workers, thread_name_prefix="reward"
                )
            futures = [
                self._executor.submit(
                    evaluate,
                    rows[i],
                    plans[i].program,
                    self.judge,
                    self.config,
                    main=plans[i].main,
                    protected=plans[i].protected,
                    helper=plans[i].helper_program,
                    kind=plans[i].kind,
                    budgets=plans[i].budgets,
                    answers=plans[i].answers,
                )
                for i in todo
            ]
            for i, fut in zip(todo, futures):
                self._reports[keys[i]] = fut.result()
            while len(self._reports) > self.CACHE_SIZE:
                self._reports.popitem(last=False)
        return [None if k is None else self._reports[k] for k in keys]

    def _score(self, plans: list[_Plan], rows: list[dict[str, Any]], turn: int = 0) -> RewardResult:
        reports = self._evaluate(plans, rows)
        levels = [self._finish(p, rep, turn) for p, rep in zip(plans, reports)]
        attribute = [
            i
            for i, (p, rep) in enumerate(zip(plans, reports))
            if p.calls_aux and p.helper_program and rep is not None and rep.all_passed
        ]
        if attribute:  # the counterfactual: fresh split runs with the helper's values replaced
            limit = self.config.test_timeout_s
            flat = self._evaluate(  # every stand-in run of the call at once (one thread pool)
                [
                    dataclasses.replace(plans[i], kind=kind, **stand_in_fields(reports[i], limit))
                    for kind in STAND_INS
                    for i in attribute
                ],
                [rows[i] for _ in STAND_INS for i in attribute],
            )
            n = len(attribute)
            runs = {kind: flat[s * n : (s + 1) * n] for s, kind in enumerate(STAND_INS)}
            for k, i in enumerate(attribute):
                real = reports[i]  # every test passed in `real`
                if (
                    real.entries == 1
                    and helper_did_work(real.aux_calls)
                    and all(fails_not_by_time(runs[kind][k]) for kind in STAND_INS)
                ):
                    levels[i]["coop_calls_aux"] = 0.5
                    inputs = [plain.loads(key)[0] for key in recording_for(rows[i]).keys]
                    wrapper = plans[i].trivial or is_wrapper(
                        real.outputs, runs["perturbed"][k].outputs, inputs
                    )
                    levels[i]["coop_nontrivial"] = 0.0 if wrapper else 0.5
        metrics = {k: [c[k] for c in levels] for k in self.LEVELS}
        metrics[PASS_AT_1] = [float(r is not None and r.all_passed) for r in reports]
        for name, idx in (("tests_visible_passed", True), ("tests_hidden_passed", False)):
            metrics[name] = [
                0.0
                if r is None
                else float(
                    sum(t.passed for j, t in enumerate(r.tests) if (j in visible_tests(r.num_tests)) == idx)
                )
                for r in reports
            ]
        for reason in ERROR_REASONS:
            metrics[f"error_{reason}"] = [float(p.error == reason) for p in plans]
        metrics["main_redefined_protected"] = [float(p.redefined) for p in plans]
        return RewardResult([sum(c.values()) for c in levels], metrics)

    def _finish(self, plan: _Plan, report: TestReport | None, turn: int = 0) -> dict[str, float]:
        """The levels of one plan; the test term is ``TEST_WEIGHT`` times the fraction passed of all
        tests at turn 0 and of the *hidden* tests only on revisions (turn >= 1: the visible ones
        were quoted in feedback, so answering them pays nothing; no hidden test, no test term)."""
        c = dict(plan.components)
        if report is not None and "tests" in c:
            if turn < 1:
                c["tests"] = self.TEST_WEIGHT * report.fraction_passed
            else:
                shown = set(visible_tests(report.num_tests))
                hidden = [t.passed for j, t in enumerate(report.tests) if j not in shown]
                c["tests"] = self.TEST_WEIGHT * sum(hidden) / len(hidden) if hidden else 0.0
        return c

    TEST_WEIGHT = 1.5

    def close(self) -> None:
        """Stop the worker threads and the judge processes."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._judge is not None:
            self._judge.close()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_executor": None, "_judge": None, "_reports": OrderedDict()}


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


class CooperativeCodeReward(_CodeRewardBase):
    """Level-gated shared reward for the helper/main coding team (max 4.0).

    After the MAGRPO paper's coding reward (arXiv 2508.04652); each level is reached only if the
    one before was. With ``aux`` the cleaned helper, ``main`` the cleaned entry-point code:

    1. structure: ``+0.4`` if ``aux`` defines ``def aux`` with a ``return`` (independent of main);
       ``+0.6`` if ``main`` defines the entry point, else stop.
    2. syntax: ``+0.5`` if ``preamble + aux + main`` compiles (no code is run), else stop.
    3. tests: ``+1.5 * fraction`` of the problem's tests passed, as judged by the trusted judge
       (visible and hidden tests alike at turn 0; on revisions, turn >= 1, the hidden tests only,
       since the visible ones were quoted in feedback; both counts are logged).
    4. cooperation (only when every test passed and the entry point calls ``aux``; ``aux`` and
       the entry point run in two sandboxes joined by plain-value calls, and five more runs
       replace the helper's values by trusted stand-ins, :mod:`~comlrl_lightning.coding.standin`):
       ``+0.5`` if the helper did work (its outputs are not one template of its arguments) and
       some test fails, by value and not by time, under each stand-in (*perturbed*, *first*
       answer replayed, *identity*, *constant*, *reversed* real answers); ``+0.5`` more if the entry point is not a
       wrapper (a sole ``return aux(...)``, or outputs that changed to the perturbed real
       output up to casts and a simple invertible encoding). On a bool output any change is
       that one, so there an aggregating main earns the first half only.

    Before running, the main part's top-level definitions of the preamble's names and of ``aux``
    are dropped (``main_redefined_protected`` counts it). The joint actions of a call run in
    parallel. The result's metrics hold each level's value, :data:`PASS_AT_1`,
    ``tests_visible_passed``/``tests_hidden_passed`` and the ``error_<reason>`` counters.

    Small models often ignore the name they were asked for: with ``rename_helper`` (default) a
    helper that defines no ``aux`` has its last top-level function renamed ``aux`` (calls inside
    it too) before scoring; ``rename_helper=False`` is the strict reward of the paper.

    Args:
        config: sandbox limits (default: 4 s per program, 1 s per call).
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
        return self._score([self.plan(ja, row) for ja, row in zip(joint_actions, rows)], rows, turn)

    def program_for(self, joint_action: Sequence[str], row: dict[str, Any]) -> str | None:
        """The whole program a joint action makes (``None`` if it does not get as far as compiling)."""
        p = self.plan(joint_action, row)
        return None if p.program is None else p.program + "\n\n" + p.main + "\n"

    def score_joint_action(self, aux_text: str, main_text: str, row: dict[str, Any]) -> dict[str, float]:
        """Per-level components of one joint action (their sum is the reward)."""
        metrics = self(([aux_text, main_text],), (Episode(0, row),), 0).metrics
        return {k: metrics[k][0] for k in self.LEVELS}

    def plan(self, joint_action: Sequence[str], row: dict[str, Any]) -> _Plan:
        plan, err = guarded(self._plan, joint_action[0], joint_action[1], row)
        return plan if err is None else _Plan(components=dict.fromkeys(self.LEVELS, 0.0), error=err)

    def _plan(self, aux_text: str, main_text: str, row: dict[str, Any]) -> _Plan:
        st = _Plan(components=dict.fromkeys(self.LEVELS, 0.0))
        del st.components["tests"]  # set only once the program ran
        aux, main, entry = clean_completion(aux_text), clean_completion(main_text), row["entry_point"]
        if self.rename_helper:
            aux = helper_as_aux(aux)
        fn = find_function(aux, AUX)
        has_return = fn is not None and any(
            isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn)
        )
        if fn is None and parse_code(aux) is None:  # unparseable helper: textual check
            has_return = textual_return(aux, AUX)
        st.components["aux_defined"] = 0.4 if has_return else 0.0
        if not defines(main, entry):
            return self._filled(st)
        st.components["main_defined"] = 0.6
        preamble = prompt_preamble(row["prompt"], entry)
        protected = set().union(
            *[_bound_names(n) for n in (parse_code(preamble) or ast.Module([], [])).body], {AUX}
        )
        protected.discard(entry)
        main, st.redefined = without_definitions_of(main, protected)
        program = "\n\n".join(p for p in (preamble, aux) if p.strip()) + "\n"
        if not compiles(program + "\n\n" + main + "\n"):
            return self._filled(st)
        st.components["syntax"] = 0.5
        if find_function(aux, AUX) is not None:  # two interpreters: main reaches aux by a call only
            st.helper_program = program
            st.program = preamble + "\n" if preamble.strip() else ""
        else:
            st.program = program
        st.main, st.protected = main, tuple(sorted(protected))
        st.preamble, st.helper = preamble, aux
        main_fn = find_function(main, entry)
        if main_fn is not None:
            st.calls_aux = any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == AUX
                for n in ast.walk(main_fn)
            )
            body = [
                s for s in main_fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            ret = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
            st.trivial = isinstance(ret, ast.Call) and isinstance(ret.func, ast.Name) and ret.func.id == AUX
        st.components["tests"] = 0.0
        return st

    def _filled(self, st: _Plan) -> _Plan:
        st.components = {k: st.components.get(k, 0.0) for k in self.LEVELS}
        return st


__all__ = [
    "AUX",
    "CooperativeCodeReward",
    "HelperPrompt",
    "MainPrompt",
    "SinglePrompt",
    "load_humaneval_rows",
    "train_val_split",
    "split_tests",
    "extract_tests",
    "humaneval_path",
    "helper_as_aux",
    "visible_tests",
    "TestJob",
]
