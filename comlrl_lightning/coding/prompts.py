"""Prompts of the coding task: the helper's, the main agent's and the single agent's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
