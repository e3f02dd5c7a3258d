"""Generation: turning an agent's prompt history into text, and one batched ``generate`` per agent.

Shapes: ``B`` prompts, ``K`` samples each (``num_generations``), ``P`` padded prompt tokens,
``C`` padded completion tokens (at most ``max_new_tokens``).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, StoppingCriteriaList

from comlrl_lightning.core.choices import Choice
from comlrl_lightning.core.stopping import CodeBlockEnd, apply_stops
from comlrl_lightning.core.validation import refuse_both, require

GENERATION_BACKEND = Choice(
    "generation_backend",
    {
        "auto": "`AUTO_BACKEND` for the model's device type",
        "dynamic": "HF `generate`, dynamic KV cache",
        "static_compile": '`cache_implementation="static"`, compiled by transformers on CUDA',
        "continuous_batching": "transformers' `generate_batch`, paged KV cache",
        "vllm": "a vLLM engine in this process (the `vllm` extra; `comlrl_lightning.team.engine`)",
    },
)
"""How :func:`generate` produces tokens (only the sampler changes: the loss's log-probs still come
from the training forward)."""

AUTO_BACKEND = {"cpu": "dynamic", "cuda": "dynamic"}
"""What ``generation_backend="auto"`` picks per device type. CUDA stays on today's path until a GPU
measurement (``make gpu-check``, generation throughput) shows another one faster; none has run yet."""

ADAPTER_ROLLOUTS = Choice(
    "adapter_rollouts",
    {
        "auto": "`merged` on CPU, `unmerged` on other devices (where an extra copy of the adapted weights "
        "costs scarce accelerator memory and the adapter's matmuls are cheap; not measured there yet)",
        "merged": "a LoRA agent samples with its adapter merged into a copy of the adapted weights "
        "(base + scale * B @ A, rewritten before each rollout; one copy per base, kept between rollouts): "
        "near a full model's speed, one more copy of the adapted weights in memory",
        "unmerged": "a LoRA agent samples through PEFT's adapter layers: no extra memory, two more matmuls "
        "per adapted linear per token",
    },
)
"""How an agent with a LoRA adapter generates its rollouts (its log-probs always come from the training
forward through PEFT's layers). Agents without an adapter ignore it."""


GenerationBackend = GENERATION_BACKEND.literal
AdapterRollouts = ADAPTER_ROLLOUTS.literal


@dataclass
class SamplingConfig:
    """Sampling knobs (TRL/CoMLRL names); ``AgentSpec.generation`` overrides them per agent. Declared
    beside the generation it configures; :mod:`comlrl_lightning.core.config` re-exports it with the
    other groups."""

    temperature: float = 1.0
    """Softmax temperature (> 0); the loss's log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int | None = None
    """Keep the k most likely tokens; 0 or None disables."""
    max_new_tokens: int = 64
    """Completion budget in tokens (>= 1). CoMLRL name."""
    max_completion_length: int | None = None
    """TRL's name for ``max_new_tokens``; when given it sets ``max_new_tokens`` (both given must agree)."""
    max_prompt_length: int | None = None
    """Prompts longer than this (tokens, history included) keep their last tokens; None: all. TRL name.
    Prompts are also cut from the left to fit the model's context with ``max_new_tokens`` (warned)."""
    stop_after_code_block: bool = False
    """End a completion right after its first complete fenced code block, as if the model had written
    EOS there (:mod:`comlrl_lightning.core.stopping`): for prompts that ask for one code block."""
    generation_backend: GenerationBackend = "auto"
    """How ``generate`` produces tokens: one of :data:`GENERATION_BACKEND`
    (``auto``: :data:`AUTO_BACKEND` for the model's device type)."""
    adapter_rollouts: AdapterRollouts = "auto"
    """How a LoRA agent (``AgentSpec.adapter``) generates: one of
    :data:`ADAPTER_ROLLOUTS` (``auto``: ``merged`` on CPU).
    ``merged`` samples from base + scale * B @ A written before each rollout into one copy of the adapted
    weights per base (kept between rollouts: allocating it afresh each time cost as much as the merge
    saved); the base and the adapter are never modified. ``unmerged`` samples through PEFT's layers
    (no extra memory). Adapters ``merged`` cannot express exactly (DoRA, ``modules_to_save``, trainable
    token rows, sharded weights) generate ``unmerged``. Log-probs always come from PEFT's layers."""
    vllm_gpu_memory_utilization: float = 0.3
    """``vllm`` on a GPU: the fraction of the GPU's memory, in (0, 1], the engine may take for its
    weights and KV cache (the trainer keeps the rest). TRL's name and default (colocate mode)."""
    vllm_max_model_length: int | None = None
    """``vllm``: the engine's context in tokens (prompt + completion; vLLM's ``max_model_len``);
    prompts are cut from the left to fit it with ``max_new_tokens``. None: the model's own. TRL name."""
    vllm_cpu_kv_cache_gib: float = 1.0
    """``vllm`` on CPU: the KV cache in GiB (vLLM's ``kv_cache_memory_bytes``, which its CPU backend
    otherwise reads from ``VLLM_CPU_KVCACHE_SPACE``), > 0; one engine per distinct model holds one.
    SmolLM2-135M in fp32 keeps about 23,000 tokens in 1 GiB."""

    def backend_for(self, device: Any) -> str:
        """The backend ``generate`` uses on ``device`` (``"auto"`` resolved through :data:`AUTO_BACKEND`)."""
        if self.generation_backend != "auto":
            return self.generation_backend
        return AUTO_BACKEND.get(device.type, "dynamic")

    def __post_init__(self) -> None:
        GENERATION_BACKEND.check(self.generation_backend)
        ADAPTER_ROLLOUTS.check(self.adapter_rollouts)
        if self.max_completion_length is not None:
            if self.max_new_tokens not in (self.max_completion_length, 64):
                n_new = self.max_new_tokens
                refuse_both("max_completion_length", self.max_completion_length, "max_new_tokens", n_new)
            self.max_new_tokens, self.max_completion_length = self.max_completion_length, None
        require("temperature", self.temperature, self.temperature > 0, "> 0")
        require("top_p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]")
        top_k_ok = self.top_k is None or (isinstance(self.top_k, int) and self.top_k >= 0)
        require("top_k", self.top_k, top_k_ok, "an integer >= 0 or None (0 and None: off)")
        stop_ok = isinstance(self.stop_after_code_block, bool)
        require("stop_after_code_block", self.stop_after_code_block, stop_ok, "true or false")
        require("max_new_tokens", self.max_new_tokens, self.max_new_tokens >= 1, ">= 1")
        prompt_ok = self.max_prompt_length is None or self.max_prompt_length >= 1
        require("max_prompt_length", self.max_prompt_length, prompt_ok, ">= 1 or None")
        util_ok = 0 < self.vllm_gpu_memory_utilization <= 1
        require("vllm_gpu_memory_utilization", self.vllm_gpu_memory_utilization, util_ok, "in (0, 1]")
        len_ok = self.vllm_max_model_length is None or self.vllm_max_model_length > self.max_new_tokens
        require("vllm_max_model_length", self.vllm_max_model_length, len_ok, "> max_new_tokens or None")
        require("vllm_cpu_kv_cache_gib", self.vllm_cpu_kv_cache_gib, self.vllm_cpu_kv_cache_gib > 0, "> 0")


@dataclass
class Generation:
    """Completions of ``B·K`` rows (row ``b·K + k`` is sample ``k`` of prompt ``b``).

    Attributes:
        prompt_ids: ``[B·K, P]`` left-padded prompt tokens.
        prompt_mask: ``[B·K, P]`` 1 for real prompt tokens.
        completion_ids: ``[B·K, C]`` generated tokens, right-padded.
        completion_mask: ``[B·K, C]`` 1 for tokens up to and including the first EOS.
        texts: ``B·K`` decoded completions (special tokens removed).
        clipped: ``[B·K]`` True where no EOS was produced within ``max_new_tokens``.
        engine_logprobs: ``[B·K, C]`` float32 log-probs the sampler gave its own tokens (0 on padding),
            under ``logits / temperature``; only from an inference engine (``vllm``), else None.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    texts: list[str]
    clipped: torch.Tensor
    engine_logprobs: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """``[B·K]`` completion lengths in tokens (EOS included)."""
        return self.completion_mask.sum(-1)

    def rows(self, index: torch.Tensor) -> Generation:
        """A sub-batch of the rows in ``index`` (``[R]`` long), extra prompt/completion padding trimmed."""
        pm, cm = self.prompt_mask[index], self.completion_mask[index]
        p0 = self.prompt_ids.shape[1] - int(pm.sum(-1).max())
        c_keep = max(int(cm.sum(-1).max()), 1)
        return Generation(
            prompt_ids=self.prompt_ids[index][:, p0:],
            prompt_mask=pm[:, p0:],
            completion_ids=self.completion_ids[index][:, :c_keep],
            completion_mask=cm[:, :c_keep],
            texts=[self.texts[i] for i in index.tolist()],
            clipped=self.clipped[index],
            engine_logprobs=None if self.engine_logprobs is None else self.engine_logprobs[index][:, :c_keep],
        )


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: Any, prompts: Sequence[str], completions: Sequence[str], use_chat: bool) -> str:
    """The text an agent conditions on at a turn: its prompts and its own earlier completions.

    With a chat template (and ``use_chat``) the history is ``user, assistant, user, ...`` ending in a
    generation prompt; otherwise the turns are joined with blank lines (``p0 c0\\n\\np1 ...``).

    Args:
        prompts: this agent's prompts for turns ``0..t`` (``t + 1`` strings).
        completions: this agent's completions for turns ``0..t-1`` (``t`` strings).
    """
    if len(prompts) != len(completions) + 1:
        raise ValueError(
            f"render_prompt: need one more prompt than completions, got {len(prompts)}/{len(completions)}"
        )
    if use_chat and has_chat_template(tokenizer):
        messages: list[dict[str, str]] = []
        for i, p in enumerate(prompts):
            messages.append({"role": "user", "content": p})
            if i < len(completions):
                messages.append({"role": "assistant", "content": completions[i]})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = []
    for i, p in enumerate(prompts):
        parts.append(p)
        if i < len(completions):
            parts.append(completions[i])
    return "\n\n".join(parts) if len(parts) > 1 else parts[0]


def _special_tokens_ok(tokenizer: Any) -> bool:
    """False for tokenizers (e.g. ByT5) that append EOS to every encoding: a prompt must not end in EOS.
    Probed once per tokenizer (the answer is kept on it)."""
    ok = getattr(tokenizer, "_comlrl_special_tokens_ok", None)
    if ok is None:
        sample = tokenizer("a", add_special_tokens=True)["input_ids"]
        ok = not (sample and sample[-1] == tokenizer.eos_token_id)
        tokenizer._comlrl_special_tokens_ok = ok
    return ok


def tokenize_prompts(
    tokenizer: Any, texts: Sequence[str], chat_rendered: bool, max_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(input_ids, attention_mask)``, each ``[B, P]`` (long); with ``max_length``
    only the last ``max_length`` tokens of each prompt are kept."""
    add_special = not chat_rendered and _special_tokens_ok(tokenizer)
    enc = tokenizer(
        list(texts), padding=True, padding_side="left", add_special_tokens=add_special, return_tensors="pt"
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if (
        max_length is not None and ids.shape[1] > max_length
    ):  # left padding: the tail holds every prompt's end
        ids, mask = ids[:, -max_length:], mask[:, -max_length:]
    return ids, mask


def completion_mask_from_ids(
    completion_ids: torch.Tensor, eos_token_id: int | Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row was clipped.

    Args:
        completion_ids: ``[R, C]`` generated tokens (after the first EOS, generate pads).
        eos_token_id: one id or several (any ends a completion).

    Returns:
        ``(mask [R, C] long, clipped [R] bool)``; a row without EOS keeps all ``C`` tokens.
    """
    eos_ids = torch.as_tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    is_eos = torch.isin(completion_ids, eos_ids.to(completion_ids.device))
    has_eos = is_eos.any(-1)
    first = torch.where(
        has_eos,
        is_eos.float().argmax(-1),
        torch.full_like(has_eos, completion_ids.shape[1], dtype=torch.long),
    )
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    mask = (positions[None, :] <= first[:, None]) & (positions[None, :] < completion_ids.shape[1])
    return mask.long(), ~has_eos


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` uses: ``cumsum(mask) - 1`` clamped at 0."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def sampling_config(knobs: dict[str, Any]) -> GenerationConfig:
    """A fresh ``GenerationConfig`` holding only ``knobs`` (None values dropped)."""
    return GenerationConfig(**{k: v for k, v in knobs.items() if v is not None})


_MODEL_LOCKS: dict[int, threading.Lock] = {}
"""One lock per model (by id): agents that share weights share the model, and two threads swapping
its ``generation_config`` at once would leave one thread's stand-in on it."""


@contextmanager
def only_configured_knobs(model: nn.Module) -> Iterator[None]:
    """Let ``model.generate`` see no generation config of the model's own while the block runs.

    transformers fills every knob a passed ``generation_config`` leaves unset (None) from
    ``model.generation_config``, i.e. a checkpoint's generation_config.json: ``repetition_penalty``,
    ``no_repeat_ngram_size``, ``suppress_tokens``, ``forced_eos_token_id``, ... Those bend the sampling
    distribution away from ``softmax(logits / temperature)``, the one the loss scores completions
    under, and several have no "off" value a config could pass instead, so the model's config is
    swapped for an empty one and put back afterwards.
    """
    with _MODEL_LOCKS.setdefault(id(model), threading.Lock()):
        own = model.generation_config
        model.generation_config = GenerationConfig()
        try:
            yield
        finally:
            model.generation_config = own


def _continuous_batching(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, kwargs: dict[str, Any]
) -> torch.Tensor:
    """``[R, C]`` completions from transformers' ``generate_batch`` (unpadded prompts in, rows padded
    with ``pad_token_id`` out), in the order of ``ids``' rows."""
    if not hasattr(model, "generate_batch"):
        raise ValueError(
            f"generation_backend: 'continuous_batching' needs transformers' generate_batch, "
            f"which {type(model).__name__} lacks; use 'dynamic' or 'static_compile'"
        )
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    max_new = kwargs.pop("max_new_tokens")
    config = sampling_config(dict(kwargs, max_new_tokens=max_new))
    out = model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    # request ids are "req_<n>", numbered in the order the prompts were given
    rows = [out[key].generated_tokens for key in sorted(out, key=lambda k: int(k.rsplit("_", 1)[-1]))]
    if len(rows) != len(prompts):
        raise RuntimeError(f"continuous batching returned {len(rows)} of {len(prompts)} completions")
    width = max(1, max(len(r) for r in rows))
    padded = torch.full((len(rows), width), kwargs["pad_token_id"], dtype=torch.long)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return padded


def context_length(model: nn.Module) -> int | None:
    """The model's context window in tokens (``max_position_embeddings`` / ``n_positions``), if it says."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_to_context(
    ids: torch.Tensor, mask: torch.Tensor, context: int | None, max_new_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the last ``context - max_new_tokens`` tokens of left-padded prompts ``[B, P]``, with a warning.

    Prompt plus completion must fit the model's context: past it, absolute position embeddings
    (GPT-2) raise ``IndexError`` and rotary ones degrade silently. Truncating from the left keeps the
    end of each prompt (the question and the generation prompt of a chat template), as TRL's
    ``max_prompt_length`` does.

    Raises:
        ValueError: ``max_new_tokens >= context`` (no room for any prompt token).
    """
    if context is None:
        return ids, mask
    budget = context - max_new_tokens
    if budget < 1:
        raise ValueError(
            f"max_new_tokens: got {max_new_tokens}, but the model's context is {context} tokens; "
            f"must be < {context} to leave room for the prompt"
        )
    if ids.shape[1] > budget:
        cut = int((mask.sum(-1) > budget).sum())
        warnings.warn(
            f"{cut} of {ids.shape[0]} prompts are longer than the model's context ({context} tokens) minus "
            f"max_new_tokens ({max_new_tokens}): their first tokens are dropped (set max_prompt_length "
            "to choose the cut yourself)",
            stacklevel=3,
        )
        ids, mask = ids[:, -budget:], mask[:, -budget:]
    return ids, mask


@torch.no_grad()
def generate(
    model: nn.Module,
    tokenizer: Any,
    prompt_texts: Sequence[str],
    num_generations: int,
    sampling: SamplingConfig,
    chat_rendered: bool,
    do_sample: bool = True,
) -> Generation:
    """One batched ``generate`` call: ``K = num_generations`` samples for each of ``B`` prompts.

    The sampler is ``sampling.backend_for(device)`` (see :class:`SamplingConfig`). The model is put in
    eval mode (KV cache on) and restored afterwards. Tensors come back on CPU.

    Only the configured knobs reach the sampler (a fresh ``GenerationConfig``,
    :func:`only_configured_knobs`): the model's own ``generation_config`` (a checkpoint's
    generation_config.json: ``repetition_penalty``, ``no_repeat_ngram_size``, ...) is not applied;
    only its ``eos_token_id`` is read.

    Prompts that do not fit the model's context with ``max_new_tokens`` lose their first tokens,
    with a warning (:func:`fit_to_context`). ``sampling.stop_after_code_block`` ends completions at
    their first closed code block (:mod:`comlrl_lightning.core.stopping`; not with
    ``continuous_batching``, which takes no stopping criteria).

    Raises:
        ValueError: ``continuous_batching`` on a model without transformers' ``generate_batch``, or
            ``max_new_tokens`` not below the model's context length.
    """
    device = next(model.parameters()).device
    backend = sampling.backend_for(device)
    if backend == "vllm":  # the engine lives on the team (one per model, weights synced after each step)
        raise ValueError(
            "generation_backend: 'vllm' samples through a team's engines (Team.generate_one), not this "
            "function; allowed here: 'auto', 'dynamic', 'static_compile', 'continuous_batching'"
        )
    ids, mask = tokenize_prompts(tokenizer, prompt_texts, chat_rendered, sampling.max_prompt_length)
    ids, mask = fit_to_context(ids, mask, context_length(model), sampling.max_new_tokens)
    ids = ids.repeat_interleave(num_generations, 0)
    mask = mask.repeat_interleave(num_generations, 0)
    was_training = model.training
    model.eval()
    eos = model.generation_config.eos_token_id
    eos = tokenizer.eos_token_id if eos is None else eos
    kwargs: dict[str, Any] = dict(
        max_new_tokens=sampling.max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos
    )
    if do_sample:
        kwargs.update(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0
        )
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    stopper = CodeBlockEnd(tokenizer, ids.shape[1]) if sampling.stop_after_code_block else None
    if stopper is not None and backend != "continuous_batching":
        kwargs["stopping_criteria"] = StoppingCriteriaList([stopper])
    try:
        with torch.inference_mode(), only_configured_knobs(model):
            if backend == "continuous_batching":
                completion_ids = _continuous_batching(model, ids, mask, kwargs)
            else:
                if (
                    backend == "static_compile"
                ):  # transformers compiles the decode step for a static cache on CUDA
                    kwargs["cache_implementation"] = "static"
                stopping = kwargs.pop(
                    "stopping_criteria", None
                )  # an object generate takes, not a config knob
                out = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    generation_config=sampling_config(dict(kwargs, use_cache=True)),
                    stopping_criteria=stopping,
                )
                completion_ids = out[:, ids.shape[1] :].cpu()
    finally:
        model.train(was_training)
    completion_ids = completion_ids.clone()  # a normal tensor: inference tensors cannot enter autograd
    if completion_ids.shape[1] == 0:  # nothing generated (max_new_tokens=0 or immediate stop)
        completion_ids = torch.full((ids.shape[0], 1), tokenizer.pad_token_id, dtype=torch.long)
    completion_mask, clipped = completion_mask_from_ids(completion_ids, eos)
    completion_mask, clipped = apply_stops(completion_mask, clipped, stopper and stopper.stop_lengths)
    texts = tokenizer.batch_decode(
        completion_ids * completion_mask + tokenizer.pad_token_id * (1 - completion_mask),
        skip_special_tokens=True,
    )
    return Generation(ids, mask, completion_ids, completion_mask, texts, clipped)
