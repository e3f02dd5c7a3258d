import torch

from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.core.generation import generate, render_prompt, tokenize_prompts
from comlrl_lightning.team.agents import build_tiny_gpt2, byte_tokenizer


class ChatTok:
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + (
            "|assistant:" if add_generation_prompt else ""
        )


def test_history_is_rendered_as_alternating_chat_turns():
    text = render_prompt(ChatTok(), ["p0", "p1"], ["c0"], use_chat=True)
    assert text == "user:p0|assistant:c0|user:p1|assistant:"


def test_without_chat_template_turns_are_joined_with_blank_lines():
    assert render_prompt(byte_tokenizer(), ["p0", "p1"], ["c0"], use_chat=True) == "p0\n\nc0\n\np1"


def test_prompts_are_left_padded_without_a_trailing_eos_and_truncated_from_the_left():
    tok = byte_tokenizer()
    ids, mask = tokenize_prompts(tok, ["abcdef", "xy"], chat_rendered=False)
    assert mask.tolist() == [[1] * 6, [0] * 4 + [1] * 2]
    assert tok.decode(ids[1][mask[1].bool()]) == "xy"  # ByT5 appends EOS by default: not here
    ids, mask = tokenize_prompts(tok, ["abcdef", "xy"], chat_rendered=False, max_length=3)
    assert tok.decode(ids[0]) == "def" and mask[1].tolist() == [0, 1, 1]


def test_generate_returns_k_rows_per_prompt_with_eos_terminated_masks():
    torch.manual_seed(0)
    tok = byte_tokenizer()
    model = build_tiny_gpt2(tok)
    gen = generate(model, tok, ["ab", "cde"], 3, SamplingConfig(max_new_tokens=5), chat_rendered=False)
    assert gen.prompt_ids.shape[0] == gen.completion_ids.shape[0] == 6 and len(gen.texts) == 6
    assert torch.equal(gen.prompt_ids[0], gen.prompt_ids[2]) and not torch.equal(
        gen.prompt_ids[0], gen.prompt_ids[3]
    )
    for row, clipped in zip(range(6), gen.clipped.tolist()):
        n = int(gen.completion_mask[row].sum())
        if clipped:
            assert n == gen.completion_ids.shape[1]
        else:
            assert gen.completion_ids[row, n - 1] == tok.eos_token_id  # EOS is inside the mask
    assert model.training  # restored after generation
