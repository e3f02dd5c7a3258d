"""Value heads for causal LMs and where a critic reads its value (actor-critic: IAC, MAAC).

A critic maps a token sequence to one scalar per row: the last hidden state of a causal LM's trunk
at one position, through a small head. ``critic_type="v"`` reads ``V(h)`` at the last prompt token
(the history alone); ``"q"`` reads ``Q(h, a)`` at the last completion token (history and action).
The trunk is either the critic's own model (:class:`ValueModel`, a separate critic with its own
tokenizer) or the actor's (a bare :class:`ValueHead` applied to the actor's hidden states, so the
value loss also trains the actor's trunk). CoMLRL: ``comlrl/models/actor_critic.py``.

Shapes: ``R`` rows, ``P`` left-padded prompt tokens, ``C`` right-padded completion tokens, ``L`` =
``P + C`` sequence positions, ``H`` the trunk's hidden size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from comlrl_lightning.core.generation import position_ids_from_mask
from comlrl_lightning.core.td import CRITIC_TYPE

CriticType = CRITIC_TYPE.literal
VALUE_HEAD_FILE = "value_head.pt"
"""The head's weights inside a critic's Hugging Face folder (the trunk is saved by ``save_pretrained``)."""
VALUE_HEAD_CONFIG = "value_head.json"


class ValueHead(nn.Module):
    """Hidden state → scalar: ``Linear(H, D) → Tanh → Linear(D, 1)``, or ``Linear(H, 1)`` without a hidden layer.

    The output layer starts at zero (weight and bias), so every value is exactly 0 before the first
    update and the first policy gradients see the plain return as advantage (CoMLRL draws it from
    N(0, 0.02); zero keeps an untrained critic from injecting noise into the advantages).

    Args:
        hidden_size: ``H``, the trunk's hidden size.
        hidden_dim: ``D``, width of the optional hidden layer (CoMLRL ``value_head_hidden_dim``); None: none.

    Raises:
        ValueError: ``hidden_size`` or ``hidden_dim`` below 1.
    """

    def __init__(self, hidden_size: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size: got {hidden_size}, must be >= 1")
        if hidden_dim is not None and hidden_dim < 1:
            raise ValueError(f"value_head_hidden_dim: got {hidden_dim}, must be >= 1 or None")
        self.hidden_size, self.hidden_dim = hidden_size, hidden_dim
        self.hidden = (
            nn.Sequential(nn.Linear(hidden_size, hidden_dim), nn.Tanh()) if hidden_dim else nn.Identity()
        )
        self.out = nn.Linear(hidden_dim or hidden_size, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` → ``[...]`` float32 values (computed in the head's dtype)."""
        return self.out(self.hidden(hidden.to(self.out.weight.dtype))).squeeze(-1).float()


def read_positions(
    prompt_mask: torch.Tensor, completion_mask: torch.Tensor | None, critic_type: str
) -> torch.Tensor:
    """Where the critic reads in ``prompt ⊕ completion`` (prompt left-padded, completion right-padded).

    ``"v"``: the last prompt token, index ``P − 1`` for every row (left padding puts every prompt's
    end there). ``"q"``: the last completion token (EOS included), ``P − 1 + len(completion)``; an empty
    completion falls back to the last prompt token.

    Args:
        prompt_mask: ``[R, P]``.
        completion_mask: ``[R, C]`` (1 for real completion tokens); may be None for ``"v"``.
        critic_type: ``"v"`` or ``"q"``.

    Returns:
        ``[R]`` long positions.

    Raises:
        ValueError: unknown ``critic_type``, or ``"q"`` without a completion mask.
    """
    CRITIC_TYPE.check(critic_type)
    last_prompt = torch.full((prompt_mask.shape[0],), prompt_mask.shape[1] - 1, dtype=torch.long)
    if critic_type == "v":
        return last_prompt
    if completion_mask is None:
        raise ValueError("critic_type='q' reads the last completion token: give completion_mask")
    return last_prompt + completion_mask.sum(-1).long().cpu()


def trunk_of(model: nn.Module) -> nn.Module:
    """The transformer body of a Hugging Face causal LM (``model.base_model``: no LM head, so no logits)."""
    return getattr(model, "base_model", model)


def values_at(
    trunk: nn.Module,
    head: ValueHead,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Values read from ``trunk``'s last hidden state at ``positions``.

    Args:
        trunk: a Hugging Face transformer body returning ``last_hidden_state`` (see :func:`trunk_of`).
        head: the value head.
        input_ids, attention_mask: ``[R, L]`` (left-padded prompt, right-padded continuation).
        positions: ``[R]`` read positions (see :func:`read_positions`).

    Returns:
        ``[R]`` float32 values, on the trunk's device; gradients flow into ``head`` and ``trunk``.
    """
    device = next(trunk.parameters()).device
    attention_mask = attention_mask.to(device)
    hidden = trunk(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state
    rows = torch.arange(hidden.shape[0], device=device)
    picked = hidden[rows, positions.to(device)]  # [R, H]
    return head(picked.to(next(head.parameters()).device))


def hidden_size_of(model: nn.Module) -> int:
    """The hidden size from a Hugging Face config (``hidden_size``, GPT-2's ``n_embd``, ...).

    Raises:
        ValueError: the config names none of them.
    """
    config = getattr(model, "config", None)
    for key in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    raise ValueError(
        f"{type(model).__name__}: its config has no hidden_size/n_embd/d_model; cannot size a value head"
    )


def save_value_head(head: ValueHead, path: str | Path, state_dict: dict[str, Any] | None = None) -> None:
    """Write ``value_head.pt`` (weights: ``state_dict``, default the head's own) and ``value_head.json``
    (sizes) into the folder ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(head.state_dict() if state_dict is None else state_dict, path / VALUE_HEAD_FILE)
    (path / VALUE_HEAD_CONFIG).write_text(
        json.dumps({"hidden_size": head.hidden_size, "hidden_dim": head.hidden_dim})
    )


class ValueModel(nn.Module):
    """A separate critic: its own causal LM's trunk plus a :class:`ValueHead`.

    Args:
        backbone: a Hugging Face causal LM (loaded like an agent; its LM head is never run).
        hidden_dim: the head's optional hidden layer width.
    """

    def __init__(self, backbone: nn.Module, hidden_dim: int | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = ValueHead(hidden_size_of(backbone), hidden_dim)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """``[R, L]`` tokens → ``[R]`` values at ``positions`` (see :func:`values_at`)."""
        return values_at(trunk_of(self.backbone), self.value_head, input_ids, attention_mask, positions)

    def save_pretrained(
        self, path: str | Path, tokenizer: Any = None, state_dict: dict[str, Any] | None = None
    ) -> None:
        """Write a Hugging Face folder: the backbone (``save_pretrained``), ``value_head.pt`` and
        ``value_head.json``, and the tokenizer when given. ``state_dict``: this model's full state
        (``backbone.*``, ``value_head.*`` keys) when its own parameters are shards (``fsdp2``)."""
        path = Path(path)
        parts: dict[str, dict[str, Any] | None] = {"backbone.": None, "value_head.": None}
        if state_dict is not None:
            parts = {p: {k[len(p) :]: v for k, v in state_dict.items() if k.startswith(p)} for p in parts}
        self.backbone.save_pretrained(path, state_dict=parts["backbone."])
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        save_value_head(self.value_head, path, parts["value_head."])

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> ValueModel:
        """Load a folder written by :meth:`save_pretrained`.

        Raises:
            FileNotFoundError: the folder has no ``value_head.pt``/``value_head.json``.
        """
        from transformers import AutoModelForCausalLM

        path = Path(path)
        for name in (VALUE_HEAD_FILE, VALUE_HEAD_CONFIG):
            if not (path / name).is_file():
                raise FileNotFoundError(
                    f"{path}: no {name}; not a critic folder written by ValueModel.save_pretrained"
                )
        head = json.loads((path / VALUE_HEAD_CONFIG).read_text())
        model = cls(AutoModelForCausalLM.from_pretrained(path, dtype=dtype), head["hidden_dim"])
        model.value_head.load_state_dict(torch.load(path / VALUE_HEAD_FILE, weights_only=True))
        return model
