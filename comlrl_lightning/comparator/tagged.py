"""The tagged joint format of a centralized comparator: one prompt that asks one model for every
role, and the split of its completion back into per-agent texts.

A transcription of CoMLRL 1.4.3 ``preference/centralized.py`` ``TaggedCentralizedComparatorAdapter``
(prompt text and tag pattern verbatim, so a comparator served for CoMLRL answers the same). The
centralized *actor* (centralized MAGRPO, being built) has its own tagged adapter; when it lands,
this module becomes that adapter's two functions and its tests stay.

Where this differs from CoMLRL on purpose: a completion with none of the tags is a defined outcome
(every role ``""``, ``parsed=False``; the pair is then ordered by what the reward makes of empty
responses) instead of CoMLRL's ``CentralizedComparatorParseError``, which stops the run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


def build_tagged_prompt(agent_prompts: Sequence[str]) -> str:
    """One prompt asking for every agent's output in ``<agent_i>...</agent_i>`` sections.

    Args:
        agent_prompts: ``[N]`` each agent's observation text.
    """
    sections = "\n\n".join(f"Agent {i} original prompt:\n{p}" for i, p in enumerate(agent_prompts))
    tags = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(len(agent_prompts)))
    return f"""You are a centralized coordinator producing the separate outputs of {len(agent_prompts)} agents.

Each output must satisfy its corresponding original prompt. Keep the outputs separate;
do not merge them or add commentary outside the required tags.

{sections}

Return exactly one section for each agent in this format:
{tags}
"""


def parse_tagged_completion(completion: str, num_agents: int) -> tuple[list[str], bool]:
    """Split a tagged completion into ``[num_agents]`` texts (a missing section: ``""``).

    Returns:
        ``(texts, parsed)``: ``parsed`` is False when no section was found (every text ``""``).
    """
    texts, found = [], False
    for i in range(num_agents):
        match = re.search(
            rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", str(completion), re.IGNORECASE | re.DOTALL
        )
        found = found or match is not None
        texts.append(match.group(1).strip() if match is not None else "")
    return texts, found
