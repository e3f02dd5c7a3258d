"""A centralized (joint) actor: one model writes every role's response in one completion.

The env's ``N`` formatters are *roles*. A :class:`CentralizedAdapter` builds one joint prompt from
the roles' prompts and parses the joint completion back into ``N`` role texts for the shared reward
(CoMLRL 1.4.3 ``preference/centralized.py``, ``preference/collaboration.py``). :class:`TaggedAdapter`
is CoMLRL's ``TaggedCentralizedComparatorAdapter``: the same joint-prompt text and the same parse
(``<agent_i> ... </agent_i>`` sections). :class:`JointActor` is the rollout's
:class:`~comlrl_lightning.core.rollout.Actors` for such a model (``CentralizedMAGRPO``'s);
:func:`joint_prompt` and :func:`split_roles` are what another trainer of a joint policy (MADPO's
``collaboration_mode: centralized``) calls.

A parse failure is a defined outcome, never a crash (CoMLRL's rule): when the adapter finds no role
section (it returns None or raises a ``ValueError``, e.g. :class:`CentralizedParseError` or CoMLRL's
``CentralizedComparatorParseError``), every role gets the empty text and the joint action is scored
as such by the env's reward; a role whose section is missing gets the empty text. Both are counted
(:class:`RoleSplit`, logged as ``centralized/parse_failure`` and ``centralized/empty_role``).

This module imports no algorithm or trainer: a module that trains a joint policy imports it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from comlrl_lightning.core.records import TeamAction, TurnState

if TYPE_CHECKING:
    from comlrl_lightning.team.team import Team


class CentralizedParseError(ValueError):
    """An adapter found no role section in a joint completion (a parse failure, not a bug)."""


class CentralizedAdapter(Protocol):
    """How a joint actor's prompt is built and its completion split (CoMLRL's adapter signatures)."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """One prompt asking for every role's output (``agent_prompts[i]``: role i's formatter text)."""
        ...

    def parse_completion(
        self, completion: str, batch_item: dict[str, Any], num_agents: int
    ) -> Sequence[str] | None:
        """The ``num_agents`` role texts of ``completion``; None or a ``ValueError``: parse failure."""
        ...


_PROMPT = """You are a centralized coordinator producing the separate outputs of {n} agents.

Each output must satisfy its corresponding original prompt. Keep the outputs separate;
do not merge them or add commentary outside the required tags.

{prompts}

Return exactly one section for each agent in this format:
{sections}
"""


# TaggedAdapter's methods carry the protocol's exact signatures: LightningCLI (jsonargparse) accepts
# a class_path for `adapter` only when they match.
@dataclass(frozen=True)
class TaggedAdapter:
    """CoMLRL 1.4.3's ``TaggedCentralizedComparatorAdapter``: role i's output is the text between
    ``<agent_i>`` and ``</agent_i>``.

    Parse rules (CoMLRL's): per role the *first* ``<agent_i> ... </agent_i>`` pair anywhere in the
    completion (the roles' order in the text, text outside the tags and later repeats do not
    matter), tags case-insensitive with spaces allowed inside (``< /Agent_0 >``), the section
    stripped of surrounding whitespace; a role without a closed section gets ``""``; no section of
    any role: :class:`CentralizedParseError`.
    """

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """The joint prompt: the coordinator instruction, each role's prompt, the tag format."""
        prompts = "\n\n".join(f"Agent {i} original prompt:\n{p}" for i, p in enumerate(agent_prompts))
        sections = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(len(agent_prompts)))
        return _PROMPT.format(n=len(agent_prompts), prompts=prompts, sections=sections)

    def parse_completion(
        self, completion: str, batch_item: dict[str, Any], num_agents: int
    ) -> Sequence[str] | None:
        """The ``num_agents`` role texts. Raises :class:`CentralizedParseError`: no role section."""
        outputs, found = [], False
        for i in range(num_agents):
            match = re.search(
                rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>",
                str(completion),
                flags=re.IGNORECASE | re.DOTALL,
            )
            found = found or match is not None
            outputs.append(match.group(1).strip() if match is not None else "")
        if not found:
            raise CentralizedParseError("the joint completion contains no <agent_i> ... </agent_i> section")
        return outputs


@dataclass(frozen=True)
class RoleSplit:
    """One joint completion split into role texts.

    Attributes:
        roles: the ``N`` role texts the env's reward sees (all ``""`` after a parse failure).
        failed: the adapter found no role section (CoMLRL: every role's output is empty).
    """

    roles: list[str]
    failed: bool

    @property
    def empty(self) -> int:
        """How many role texts are empty (a failure, a missing section or an empty one)."""
        return sum(not r for r in self.roles)


def joint_prompt(adapter: CentralizedAdapter, batch_item: dict[str, Any], role_prompts: Sequence[str]) -> str:
    """The adapter's joint prompt for one node (before the model's chat template).

    Raises:
        ValueError: the adapter built an empty or non-string prompt (CoMLRL refuses it too).
    """
    prompt = adapter.build_prompt(batch_item, list(role_prompts))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(
            f"{type(adapter).__name__}.build_prompt must return a non-empty string, got {prompt!r}"
        )
    return prompt


def split_roles(
    adapter: CentralizedAdapter, completion: str, batch_item: dict[str, Any], num_roles: int
) -> RoleSplit:
    """``completion`` split into ``num_roles`` role texts (CoMLRL ``CentralizedCollaboration.split``):
    a parse failure (None returned or a ``ValueError`` raised) gives every role ``""``.

    Raises:
        TypeError: the adapter returned a string or a non-string role text (an adapter bug).
        ValueError: it returned a number of texts other than ``num_roles`` (an adapter bug).
    """
    try:
        outputs = adapter.parse_completion(completion, batch_item, num_roles)
    except ValueError:
        outputs = None
    if outputs is None:
        return RoleSplit([""] * num_roles, True)
    if isinstance(outputs, (str, bytes)):
        raise TypeError(
            f"{type(adapter).__name__}.parse_completion must return a sequence of strings, got a string"
        )
    outputs = list(outputs)
    if len(outputs) != num_roles:
        raise ValueError(
            f"{type(adapter).__name__}.parse_completion returned {len(outputs)} role texts; expected {num_roles}"
        )
    if not all(isinstance(o, str) for o in outputs):
        raise TypeError(f"{type(adapter).__name__}.parse_completion must return strings, got {outputs!r}")
    return RoleSplit(outputs, False)


class JointActor:
    """One model (the team's only agent) writes every role's part: at each node it renders the joint
    prompt of the roles' prompts (:func:`joint_prompt`, then the model's chat template), samples
    ``K`` completions (one batched ``generate``), and splits each into the roles' texts.

    ``act`` returns ``TeamAction(prompts=[[G] joint prompts], generations=[the model's G·K rows],
    completions=[N][G·K] role texts)``: the env rewards the role texts, the loss trains on the joint
    completion. :attr:`joint_prompts` keeps the last ``act``'s ``G`` joint prompts before the chat
    template and :attr:`splits` its ``G·K`` :class:`RoleSplit` (for logs and metrics).

    Raises (from ``act``):
        ValueError: ``state.turn > 0`` (the joint prompt is built from the roles' turn-0 prompts;
            multi-turn centralized rollouts are not built), or :func:`joint_prompt`'s.
    """

    rollout_limits = {
        "joint_mode": (
            ("aligned",),
            "one joint completion holds every role's text, so there are no separate samples to combine",
        ),
        "credit": (
            ("shared",),
            "credit modes re-score combinations of separate samples, and a joint actor's roles share one completion",
        ),
    }
    """The rollouts it cannot act in (:func:`~comlrl_lightning.core.rollout.refuse_unsupported`)."""

    def __init__(self, team: Team, adapter: CentralizedAdapter, num_roles: int) -> None:
        self.team, self.adapter, self.num_roles = team, adapter, num_roles
        self.joint_prompts: list[str] = []
        self.splits: list[RoleSplit] = []

    def act(self, state: TurnState) -> TeamAction:
        if state.turn > 0:
            raise ValueError(
                f"JointActor: turn {state.turn}; a centralized actor acts at turn 0 only (num_turns=1)"
            )
        self.joint_prompts = [
            joint_prompt(self.adapter, node.episode.data, [p[-1] for p in node.prompts])
            for node in state.nodes
        ]
        rendered = [
            self.team.render(0, replace(node, prompts=[[text]], completions=[[]]))
            for node, text in zip(state.nodes, self.joint_prompts)
        ]
        gen = self.team.generate_one(0, rendered, state.num_generations, state.greedy)
        k = state.num_generations
        self.splits = [
            split_roles(self.adapter, text, state.nodes[r // k].episode.data, self.num_roles)
            for r, text in enumerate(gen.texts)
        ]
        completions = [[s.roles[i] for s in self.splits] for i in range(self.num_roles)]
        return TeamAction([rendered], [gen], completions)


def joint_actor_adapter(num_roles: Any, adapter: Any) -> Any:
    """The adapter a joint actor of ``num_roles`` roles uses (default :class:`TaggedAdapter`), checked
    (CentralizedMAGRPO and MADPO's ``collaboration_mode: centralized``), before any model loads.

    Raises:
        ValueError: ``num_roles`` not an integer >= 1.
        TypeError: an adapter without callable ``build_prompt`` and ``parse_completion``.
    """
    if not isinstance(num_roles, int) or isinstance(num_roles, bool) or num_roles < 1:
        raise ValueError(f"num_roles: got {num_roles!r}, must be an integer >= 1 (the env's formatter count)")
    adapter = TaggedAdapter() if adapter is None else adapter
    for name in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, name, None)):
            raise TypeError(f"adapter: {type(adapter).__name__}.{name} must be callable")
    return adapter
