"""Multi-turn coding: after a turn the sandbox runs the team's program and every agent is told
what failed (error type, failing assertion), so the team can revise (MAGRPO paper, multi-turn
coding with external feedback)."""

from __future__ import annotations

from collections.abc import Sequence

from comlrl_lightning.envs.base import Episode
from comlrl_lightning.tasks.coding.reward import AUX, CooperativeCodeReward, SingleAgentCodeReward
from comlrl_lightning.sandbox.api import TestReport

_ROLE = {0: "the helper function `aux`", 1: "the function `{entry_point}`"}


class CodingFeedbackTransition:
    """Next prompts carrying the test feedback of the joint action just taken.

    The joint action's program is tested in the sandbox (the reward's cached report is reused, so
    no program runs twice). Each agent's next prompt says how many tests passed and quotes the
    first failure (error type and assertion), then asks it to revise its own part. The episode
    ends early when every test passed.

    Args:
        reward: the episode's coding reward (its cache and program construction are used); a
            :class:`CooperativeCodeReward` (2 agents) or :class:`SingleAgentCodeReward` (1 agent).
        max_failures: how many failing tests to quote.
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
        """A short description of a test report (what a student would be told)."""
        if report is None:
            return "The team's code does not define the required functions or does not compile."
        if not report.program_loaded:
            p = report.program
            return f"The program failed to load: {p.error_type or p.status}: {p.message[: self.max_chars]}"
        lines = [f"{report.num_passed}/{report.num_tests} tests passed."]
        failures = [t for t in report.tests if not t.passed][: self.max_failures]
        for t in failures:
            kind = t.error_type or t.status
            lines.append(f"- {kind}: {t.message[: self.max_chars]}")
        return "\n".join(lines)

    def __call__(
        self, episode: Episode, turn: int, prompts: Sequence[Sequence[str]], completions: Sequence[Sequence[str]]
    ) -> Sequence[str] | None:
        n = len(completions)
        reward = self._reward(n)
        joint = [c[-1] for c in completions]
        report = reward.report_for(joint, episode.data)
        if report is not None and report.all_passed:
            return None
        fb = self.feedback(report)
        entry = episode.data["entry_point"]
        out = []
        for i in range(n):
            role = "the function `{entry}`".format(entry=entry) if n == 1 else _ROLE[i].format(entry_point=entry)
            extra = f" You may call `{AUX}` written by your teammate." if n == 2 and i == 1 else ""
            out.append(f"Test feedback on your team's code:\n{fb}\n\nRevise {role}.{extra} "
                       "Answer with one ```python code block.")  # fmt: skip
        return out
