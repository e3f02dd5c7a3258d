"""Single-agent coding (``num_agents=1``): one completion is the whole function (or its body); the
reward is the fraction of the problem's tests that pass, judged as for the cooperative reward."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from comlrl_lightning.coding.code_text import (
    clean_completion,
    compiles,
    defines,
    guarded,
    prompt_preamble,
    strip_fences,
)
from comlrl_lightning.coding.judge import Judge
from comlrl_lightning.coding.reward import _check_agents, _CodeRewardBase, _default_config, _Plan
from comlrl_lightning.coding.sandbox.api import SandboxConfig
from comlrl_lightning.coding.verdict import evaluate
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import RewardResult


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
    :func:`single_agent_program`); tests are judged as for :class:`CooperativeCodeReward`. The
    result's metrics hold :data:`PASS_AT_1`, the visible/hidden counts and the error counters.

    Args:
        config: sandbox limits (default: 4 s per program, 1 s per call).
        max_workers: parallel sandboxes (default ``os.cpu_count()``).
    """

    name = "pass_rate"
    LEVELS = ("tests",)
    TEST_WEIGHT = 1.0

    def __init__(self, config: SandboxConfig | None = None, max_workers: int | None = None) -> None:
        super().__init__(config, max_workers)

    def program_for(self, joint_action: Sequence[str], row: dict[str, Any]) -> str | None:
        """The program of a single-agent completion (``None`` if it cannot be analysed)."""
        return self.plan(joint_action, row).program

    def plan(self, joint_action: Sequence[str], row: dict[str, Any]) -> _Plan:
        program, err = guarded(single_agent_program, joint_action[0], row)
        return _Plan(components={"tests": 0.0}, program=program, error=err)

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> RewardResult:
        _check_agents(joint_actions, episodes, 1, self.name)
        rows = [ep.data for ep in episodes]
        res = self._score([self.plan(ja, row) for ja, row in zip(joint_actions, rows)], rows, turn)
        return RewardResult(res.values, {k: v for k, v in res.metrics.items() if k != "tests"})


def all_tests_pass(program: str, row: dict[str, Any], config: SandboxConfig | None = None) -> bool:
    """Whether ``program`` passes every test of the problem ``row`` (judged; pass@1 of one sample)."""
    judge = Judge()
    try:
        report = evaluate(row, program, judge, config or _default_config())
    finally:
        judge.close()
    return report.all_passed
