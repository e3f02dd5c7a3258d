"""Multi-turn coding: after a turn the team's program is judged and every agent is told what failed
in the *visible* tests, so the team can revise (MAGRPO paper, multi-turn coding with external
feedback).

Each problem's tests are split (:func:`~comlrl_lightning.coding.reward.visible_tests`):
feedback quotes failing assertions of the visible split only, while the reward counts the hidden
split too (both counts are logged), so hard-coding the quoted asserts does not pay. A problem
with a single test (a looping ``check``) gets only pass/fail and the failure type, never the
assertion. Failure types are the judge's categories (failed assertion, exception, timeout,
unsupported output), never an exception's name or message: those are the candidate's choice and
could carry what it found in its process (every call input, hidden tests' included).
"""

from __future__ import annotations

from collections.abc import Sequence

from comlrl_lightning.coding.reward import AUX, CooperativeCodeReward, visible_tests
from comlrl_lightning.coding.sandbox.api import TestReport
from comlrl_lightning.coding.single_agent import SingleAgentCodeReward
from comlrl_lightning.envs.base import SOLVED, Episode, _Solved


def _kind(name: str | None, status: str) -> str:
    """A failure's category for the prompt, from the judge's own categories only: a failed
    assertion, a timeout, an unsupported output or an exception. Never an exception's type name:
    the candidate chooses which (even builtin) exception it raises, and it can read every call
    input, hidden tests' included, so a chosen name would carry hidden information."""
    if status == "failed":
        return "a failed assertion"
    if status == "timeout":
        return "a timeout"
    if name == "UnsupportedOutput":
        return "an unsupported output"
    return "an exception"


_ROLE = {0: "the helper function `aux`", 1: "the function `{entry_point}`"}


class CodingFeedbackTransition:
    """Next prompts carrying the visible-test feedback of the joint action just taken.

    The joint action's program is judged once (the reward's cached report is reused). Each
    agent's next prompt says how many visible tests passed and quotes the first visible failures
    (failure category and, for a failed assertion, the assert), then asks it to revise its own part. The episode ends early, as
    :data:`~comlrl_lightning.envs.base.SOLVED` (an absorbing solved state), when every test (visible
    and hidden) passed.

    Args:
        reward: the episode's coding reward (its cache and program construction are used); a
            :class:`CooperativeCodeReward` (2 agents) or :class:`SingleAgentCodeReward` (1 agent).
        max_failures: how many failing visible tests to quote.
        max_chars: bound on each quoted failure message (characters).
    """

    def __init__(
        self,
        reward: CooperativeCodeReward | SingleAgentCodeReward | None = None,
        max_failures: int = 2,
        max_chars: int = 200,
    ) -> None:
        self.reward = reward
        self.max_failures, self.max_chars = max_failures, max_chars

    def _reward(self, num_agents: int) -> CooperativeCodeReward | SingleAgentCodeReward:
        if self.reward is None:
            self.reward = CooperativeCodeReward() if num_agents == 2 else SingleAgentCodeReward()
        return self.reward

    def feedback(self, report: TestReport | None) -> str:
        """A short description of the visible part of a test report (what a student would be told)."""
        if report is None:
            return "The team's code does not define the required functions or does not compile."
        if not report.program_loaded:
            return f"The program failed to load: {_kind(report.program.error_type, report.program.status)}."
        if report.num_tests == 1:
            t = report.tests[0]
            return "The test passed." if t.passed else f"The test failed ({_kind(t.error_type, t.status)})."
        visible = [report.tests[i] for i in visible_tests(report.num_tests)]
        lines = [f"{sum(t.passed for t in visible)}/{len(visible)} visible tests passed."]
        for t in [t for t in visible if not t.passed][: self.max_failures]:
            detail = f": {t.message[: self.max_chars]}" if t.status == "failed" else ""
            lines.append(f"- {_kind(t.error_type, t.status)}{detail}")
        return "\n".join(lines)

    def __call__(
        self,
        episode: Episode,
        turn: int,
        prompts: Sequence[Sequence[str]],
        completions: Sequence[Sequence[str]],
    ) -> Sequence[str] | _Solved:
        n = len(completions)
        reward = self._reward(n)
        joint = [c[-1] for c in completions]
        report = reward.report_for(joint, episode.data)
        if report is not None and report.all_passed:
            return SOLVED
        fb = self.feedback(report)
        entry = episode.data["entry_point"]
        out = []
        for i in range(n):
            role = f"the function `{entry}`" if n == 1 else _ROLE[i].format(entry_point=entry)
            extra = f" You may call `{AUX}` written by your teammate." if n == 2 and i == 1 else ""
            out.append(
                f"Test feedback on your team's code:\n{fb}\n\nRevise {role}.{extra} "
                "Answer with one ```python code block."
            )
        return out
