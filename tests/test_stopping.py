"""Generation stops after the first complete code block; the mask ends there (issue 12 §5)."""

import torch

from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.core.generation import completion_mask_from_ids, generate
from comlrl_lightning.core.stopping import CodeBlockEnd, apply_stops
from comlrl_lightning.team.agents import AgentSpec, byte_tokenizer, load_agent

ANSWER = "Sure:\n```python\ndef aux(x):\n    return x\n```"
TAIL = "\nThis function returns x.\n```python\nprint(1)\n```"


def feed(tok, texts, prompt_len=3):
    """Calls the criterion once per generated token, as ``generate`` does; returns its verdicts."""
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    rows = [r + [tok.pad_token_id] * (width - len(r)) for r in rows]
    ids = torch.cat([torch.full((len(rows), prompt_len), 7), torch.tensor(rows)], 1)
    stopper = CodeBlockEnd(tok, prompt_len)
    verdicts = [stopper(ids[:, : prompt_len + t], None) for t in range(1, width + 1)]
    return stopper, torch.stack(verdicts), ids[:, prompt_len:]


def test_a_row_stops_at_the_token_that_closes_its_first_code_block():
    tok = byte_tokenizer()  # one token per byte
    stopper, verdicts, _ = feed(tok, [ANSWER + TAIL, "no code here at all, just ``` one fence"])
    closed_at = len(ANSWER.encode())
    assert stopper.stop_lengths.tolist() == [closed_at, -1]
    assert not verdicts[closed_at - 2, 0] and verdicts[closed_at - 1, 0]  # not one token early
    assert not verdicts[:, 1].any()  # an opening fence alone never stops


def test_the_mask_ends_at_the_stop_and_a_stopped_row_is_not_clipped():
    tok = byte_tokenizer()
    stopper, _, completion = feed(tok, [ANSWER + TAIL, "x" * 60])
    # what generate returns after a stop: the row is padded, here with the EOS id (SmolLM2: pad == eos)
    completion[0, len(ANSWER.encode()) :] = tok.eos_token_id
    mask, clipped = completion_mask_from_ids(completion, tok.eos_token_id)
    assert int(mask[0].sum()) == len(ANSWER.encode()) + 1  # without the stop: one pad counted as EOS
    mask, clipped = apply_stops(mask, clipped, stopper.stop_lengths)
    assert int(mask[0].sum()) == len(ANSWER.encode()) and not clipped[0]
    assert int(mask[1].sum()) == completion.shape[1] and clipped[1]  # never stopped: unchanged
    assert tok.decode(completion[0][mask[0].bool()]) == ANSWER


def test_the_stop_leaves_sampling_unchanged_when_no_block_closes():
    import pytest

    model, tok = load_agent(AgentSpec("builtin:tiny-gpt2"))  # random weights: no code fences
    runs = []
    for flag in (False, True):
        torch.manual_seed(0)
        runs.append(generate(model, tok, ["a", "bb"], 2, SamplingConfig(max_new_tokens=16, stop_after_code_block=flag),
                             False))  # fmt: skip
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert torch.equal(runs[0].completion_mask, runs[1].completion_mask)
    with pytest.raises(ValueError, match="stop_after_code_block: got 'yes', must be true or false"):
        SamplingConfig(stop_after_code_block="yes").check()
