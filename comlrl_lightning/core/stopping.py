"""Stopping generation where the answer ends: after the first complete fenced code block.

Coding prompts ask for "one ```python code block". Without a stop, a small model keeps writing
after the closing fence (explanations, tests, a second block) until ``max_new_tokens``: most of the
step's generation time is spent on text the reward ignores, and the completion counts as clipped.
HF's ``stop_strings`` cannot express this (the opening fence is the same string as the closing one,
and ``"\\n```"`` also matches an opening fence after a line of prose), so this is a
``StoppingCriteria`` over each row's decoded completion.

The stop is part of the environment, like an EOS: the tokens after it were never sampled, so the
completion mask ends at the stop (:func:`apply_stops`) and log-probs cover exactly the sampled
tokens; a stopped completion is not clipped.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers import StoppingCriteria

CODE_BLOCK = re.compile(r"```[^\n`]*\n.*?```", re.DOTALL)
"""An opening fence (with an optional language tag) and its closing fence."""


class CodeBlockEnd(StoppingCriteria):
    """Marks a row done once its completion holds a complete fenced code block.

    Args:
        tokenizer: decodes the completion tokens.
        prompt_length: ``P``, the padded prompt length: completion tokens start at column ``P`` of
            the ``input_ids`` that ``generate`` passes.

    Attributes:
        stop_lengths: ``[R]`` long, the completion length (tokens) at which each row was stopped;
            ``-1`` for rows never stopped. Filled while ``generate`` runs.
    """

    def __init__(self, tokenizer: Any, prompt_length: int) -> None:
        self.tokenizer, self.prompt_length = tokenizer, prompt_length
        self.stop_lengths: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        rows, length = input_ids.shape[0], input_ids.shape[1] - self.prompt_length
        if self.stop_lengths is None:
            self.stop_lengths = torch.full((rows,), -1, dtype=torch.long)
        done = self.stop_lengths >= 0
        last = self.tokenizer.batch_decode(input_ids[:, -1:].tolist())
        for r in range(rows):
            # a block can only have just closed if the newest token holds a backtick
            if done[r] or "`" not in last[r]:
                continue
            text = self.tokenizer.decode(
                input_ids[r, self.prompt_length :].tolist(), skip_special_tokens=True
            )
            if CODE_BLOCK.search(text):
                self.stop_lengths[r] = length
                done[r] = True
        return done.to(input_ids.device)


def apply_stops(
    mask: torch.Tensor, clipped: torch.Tensor, stop_lengths: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """End each stopped row's completion mask at its stop; a stopped row is not clipped.

    Args:
        mask: ``[R, C]`` long completion mask (up to and including the first EOS).
        clipped: ``[R]`` bool, no EOS within ``max_new_tokens``.
        stop_lengths: ``[R]`` long from :class:`CodeBlockEnd` (``-1``: not stopped), or None.

    Returns:
        ``(mask, clipped)``; rows whose EOS came before their stop are unchanged. The padding that
        ``generate`` writes after a stop (often the EOS id) is masked out, so it is never scored as
        if the model had sampled it.
    """
    if stop_lengths is None:
        return mask, clipped
    natural = mask.sum(-1)
    stopped = (stop_lengths >= 0) & (stop_lengths <= natural)
    positions = torch.arange(mask.shape[1])
    keep = positions[None, :] < stop_lengths[:, None]
    mask = torch.where(stopped[:, None], keep.long(), mask)
    return mask, clipped & ~stopped
