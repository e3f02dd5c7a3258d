"""Agents: `AgentSpec` (what to load) and loading a causal LM plus its tokenizer.

``AgentSpec.model`` accepts a hub id (``"HuggingFaceTB/SmolLM2-135M-Instruct"``), a local folder, or
``builtin:<name>`` for models that need no network: ``builtin:tiny-gpt2`` (a ~0.1M-parameter GPT-2
built from a config over a byte-level vocabulary, for tests and the toy task),
``builtin:tiny-llama-gpt2tok`` (a ~3.3M-parameter Llama built from a config over the GPT-2 BPE
vocabulary of ``builtin:gpt2-tokenizer``, with a small chat template: another architecture, size and
tokenizer, for heterogeneous-team tests) and the names in
:mod:`comlrl_lightning.team.builtin` (e.g. ``builtin:smollm2-135m-instruct``).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from comlrl_lightning.team.adapter import AdapterConfig

BUILTIN_PREFIX = "builtin:"


@dataclass
class AgentSpec:
    """How to build one agent.

    Attributes:
        model: hub id, local path, or ``builtin:<name>``.
        tokenizer: tokenizer source if different from ``model`` (same forms as ``model``).
        dtype: parameter dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: device for this agent under the agent-parallel strategy (``None``: the strategy decides).
        share_weights_with: index of an earlier agent whose weights this agent uses (one copy of the
            weights, its own optimizer state). With ``adapter``: an earlier agent with an adapter
            whose frozen base this agent's own adapter sits on (the base held once).
        generation: per-agent overrides of the module's sampling knobs (``temperature``, ``top_p``,
            ``top_k``, ``max_new_tokens``, ``max_prompt_length``, ``generation_backend``: see
            ``comlrl_lightning.core.config.SamplingConfig``).
        chat_template: wrap prompts in the tokenizer's chat template when it has one.
        learning_rate: overrides the optimizer's learning rate for this agent.
        frozen: the agent acts (generates, is scored) but is never updated: no loss forward, no
            optimizer step (a fixed partner, e.g. an untrained teammate another agent trains against).
            Lightning's ``global_step`` then counts the other agents' steps only. Default False.
        model_kwargs: extra keyword arguments for ``from_pretrained`` (or config fields for
            ``builtin:tiny-gpt2``, e.g. ``{"n_layer": 2, "n_embd": 64}``).
        adapter: a LoRA adapter (:class:`~comlrl_lightning.team.adapter.AdapterConfig`): ``r``,
            ``lora_alpha``, ``target_modules``, ``lora_dropout`` and any other ``peft.LoraConfig``
            field (``use_dora``, ``use_rslora``, ``bias``, ``modules_to_save``, ...; TRL's
            ``peft_config``), each checked before any model loads (``target_modules`` against the
            model's module names). The agent trains only the adapter; its base stays frozen and,
            with ``beta > 0``, is the reference (adapter disabled, no copy). A dict is accepted.
            Default None: full fine-tuning. Needs the ``lora`` extra (``peft``).
        kind: import path (``package.module.Class``) of an
            :class:`~comlrl_lightning.team.kinds.AgentKind` subclass, built with no arguments: what
            the agent is, from YAML, with no change to the library (``docs/agents.md``, "Adding a
            kind"). Default None: the shipped kind the other fields choose (``adapter``: LoRA;
            ``share_weights_with``: shared weights; else full fine-tuning), and not together with
            either of those. Resolved and checked before any model loads; the module must be
            importable by the process (the CLI does not put the working directory on the path:
            ``PYTHONPATH=.``).
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "float32"
    device: str | None = None
    share_weights_with: int | None = None
    generation: dict[str, Any] = field(default_factory=dict)
    chat_template: bool = True
    learning_rate: float | None = None
    frozen: bool = False
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    adapter: dict[str, Any] | AdapterConfig | None = None
    kind: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.adapter, dict):  # YAML / asdict / hparams spelling
            self.adapter = AdapterConfig.from_dict(self.adapter)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GENERATION_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "max_prompt_length",
    "generation_backend",
    "stop_after_code_block",
)


def validate_spec(spec: AgentSpec, index: int, num_agents: int) -> None:
    """Check an AgentSpec without loading anything.

    Raises:
        ValueError: naming the field (``agents[i].<field>``), the bad value and what is allowed.
    """
    where = f"agents[{index}]"
    if not isinstance(spec.model, str) or not spec.model:
        raise ValueError(
            f"{where}.model: give a hub id, a local path or 'builtin:<name>', got {spec.model!r}"
        )
    if spec.dtype not in _DTYPES:
        raise ValueError(f"{where}.dtype: got {spec.dtype!r}, allowed: {sorted(_DTYPES)}")
    bad = sorted(set(spec.generation) - set(GENERATION_KEYS))
    if bad:
        raise ValueError(f"{where}.generation: unknown keys {bad}, allowed: {list(GENERATION_KEYS)}")
    if spec.share_weights_with is not None and not 0 <= spec.share_weights_with < index:
        raise ValueError(
            f"{where}.share_weights_with: must be the index of an earlier agent (0..{index - 1}), "
            f"got {spec.share_weights_with}"
        )
    if spec.kind is not None:
        for other in ("adapter", "share_weights_with"):
            if getattr(spec, other) is not None:
                raise ValueError(
                    f"{where}.kind: got {spec.kind!r} with {where}.{other}; the kind alone says what the "
                    f"agent is (the shipped kinds read {other}): give one of them"
                )
    if spec.adapter is not None:
        spec.adapter.check(f"{where}.adapter")
    if spec.frozen and spec.share_weights_with is not None and spec.adapter is None:
        raise ValueError(
            f"{where}.frozen: an agent that shares agent {spec.share_weights_with}'s weights cannot be "
            "frozen alone (its weights move with that agent's updates); freeze agent "
            f"{spec.share_weights_with} or give this agent its own weights"
        )
    if spec.learning_rate is not None and spec.learning_rate <= 0:
        raise ValueError(f"{where}.learning_rate: must be > 0, got {spec.learning_rate}")
    for key in ("model", "tokenizer"):
        check_source(getattr(spec, key), f"{where}.{key}")
    if spec.model.startswith(BUILTIN_PREFIX):
        name = spec.model[len(BUILTIN_PREFIX) :]
        from comlrl_lightning.team.builtin import BUILTIN_MODELS

        known = sorted([*_TINY, *BUILTIN_MODELS])
        if name not in known:
            raise ValueError(f"{where}.model: unknown builtin {name!r}, known: {known}")


def check_source(source: str | None, field: str) -> None:
    """Raises ValueError ``"<field>: ..."`` when ``source`` (a model or tokenizer) cannot load, when
    that is known without loading it (see :func:`_unavailable`); for agents and reward models alike."""
    problem = _unavailable(source)
    if problem:
        raise ValueError(f"{field}: {problem}")


def _unavailable(source: str | None) -> str | None:
    """Why ``source`` cannot be loaded, when that is known without loading it: a local path
    (``/``, ``./``, ``../``, ``~``) that does not exist, or a hub id missing from the cache while
    ``HF_HUB_OFFLINE`` is set. ``None`` when it may load (``from_pretrained`` has the last word)."""
    if source is None or source.startswith(BUILTIN_PREFIX):
        return None
    path = os.path.expanduser(source)
    if source.startswith(("/", "./", "../", "~")) or os.path.isabs(path):
        return (
            None
            if os.path.isdir(path)
            else f"no local folder {os.path.abspath(path)!r} (give a hub id or an existing folder)"
        )
    if os.path.isdir(path):
        return None
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(source, "config.json"), str):
        return (
            f"{source!r} is neither a local folder nor in the Hugging Face cache ({constants.HF_HUB_CACHE}), "
            "and HF_HUB_OFFLINE=1 forbids downloading it; download it first, give a local folder, or "
            "use a builtin:<name>"
        )
    return None


@contextlib.contextmanager
def load_errors_named(field: str, source: str) -> Iterator[None]:
    """Re-raises an OSError or ValueError of loading ``source`` in the block as
    ``OSError("<field>: cannot load '<source>' (<why>)")``: a reward model is named as one, not as an agent."""
    try:
        yield
    except (OSError, ValueError) as err:
        cause = err.__cause__ or err  # load_agent's own OSError wraps transformers' error
        why = (str(cause).strip().splitlines() or [""])[0]
        raise OSError(f"{field}: cannot load {source!r} ({type(cause).__name__}: {why})") from err


def _load_failed(spec: AgentSpec, source: str, err: Exception) -> OSError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return OSError(f"agent model {spec.model!r}: cannot load {source!r} ({type(err).__name__}: {first})")


def byte_tokenizer() -> Any:
    """A byte-level tokenizer built without files (ByT5's: 384 ids, pad 0, eos 1, no chat template)."""
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


def _tiny(
    config_cls: Any, model_cls: Any, tokenizer: Any, defaults: dict[str, Any], overrides: dict[str, Any]
) -> nn.Module:
    config = config_cls(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**defaults, **overrides},
    )
    return model_cls(config)


def build_tiny_gpt2(tokenizer: Any, **overrides: Any) -> nn.Module:
    """A randomly initialised GPT-2 sized for CPU tests (2 layers, width 64: ~0.14M parameters)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return _tiny(
        GPT2Config,
        GPT2LMHeadModel,
        tokenizer,
        dict(n_positions=512, n_embd=64, n_layer=2, n_head=2),
        overrides,
    )


TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant:\n{% endif %}"
)
"""Chat template of ``builtin:tiny-llama-gpt2tok`` (plain text markers, no special tokens)."""


def build_tiny_llama(tokenizer: Any, **overrides: Any) -> nn.Module:
    """A randomly initialised Llama sized for CPU tests (2 layers, width 64, tied embeddings: ~3.3M
    parameters with the 50257-token GPT-2 vocabulary)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    defaults = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return _tiny(LlamaConfig, LlamaForCausalLM, tokenizer, defaults, overrides)


def _gpt2_bpe_chat_tokenizer() -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_resolve_source(BUILTIN_PREFIX + "gpt2-tokenizer"))
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


_TINY: dict[str, tuple[Any, Any]] = {
    "tiny-gpt2": (byte_tokenizer, build_tiny_gpt2),
    "tiny-llama-gpt2tok": (_gpt2_bpe_chat_tokenizer, build_tiny_llama),
}
"""Builtins built from a config (random weights): name -> (tokenizer factory, model builder)."""


def _resolve_source(source: str) -> str:
    from comlrl_lightning.team.builtin import resolve_model_spec

    return resolve_model_spec(source)


def load_tokenizer(spec: AgentSpec) -> Any:
    """Load the agent's tokenizer; sets ``pad_token = eos_token`` when it has no pad token."""
    source = spec.tokenizer or spec.model
    tiny = _TINY.get(source.removeprefix(BUILTIN_PREFIX)) if source.startswith(BUILTIN_PREFIX) else None
    if tiny is not None:
        tok = tiny[0]()
    else:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(_resolve_source(source))
        except (
            OSError,
            ValueError,
        ) as err:  # transformers: OSError for missing files, ValueError for no config
            raise _load_failed(spec, source, err) from err
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_agent(spec: AgentSpec) -> tuple[nn.Module, Any]:
    """Load ``(model, tokenizer)`` for one spec, on CPU, in ``spec.dtype``.

    Raises:
        ValueError: unknown builtin name.
        OSError: the hub id or path cannot be found (transformers' error; offline without a cache).
    """
    tok = load_tokenizer(spec)
    dtype = _DTYPES[spec.dtype]
    tiny = (
        _TINY.get(spec.model.removeprefix(BUILTIN_PREFIX)) if spec.model.startswith(BUILTIN_PREFIX) else None
    )
    if tiny is not None:
        model = tiny[1](tok, **spec.model_kwargs).to(dtype)
    else:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(
                _resolve_source(spec.model), dtype=dtype, **spec.model_kwargs
            )
        except (
            OSError,
            ValueError,
        ) as err:  # transformers: OSError for missing files, ValueError for no config
            raise _load_failed(spec, spec.model, err) from err
    if getattr(model.generation_config, "pad_token_id", None) is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    disable_dropout(model)
    return model, tok


_DROPOUT_CONFIG_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout",
)


def disable_dropout(model: nn.Module) -> nn.Module:
    """Zero every dropout (modules and config fields) and put the model in train mode.

    RL log-probs must come from the same distribution the completions were sampled from (eval
    mode); TRL does the same (``disable_dropout``). Train mode is kept so that gradient
    checkpointing (active only in training) and Lightning's mode checks behave as usual.
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for key in _DROPOUT_CONFIG_KEYS:
        if config is not None and isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)
    return model.train()


def normalize_agents(agents: Any, num_agents: int | None) -> list[AgentSpec]:
    """One :class:`AgentSpec` per agent from specs, dicts or model strings (one is broadcast).

    Raises:
        ValueError: the number of specs does not match ``num_agents``.
    """
    if isinstance(agents, (str, AgentSpec, dict)):
        agents = [agents] * (num_agents or 1)
    specs = [
        AgentSpec(model=a) if isinstance(a, str) else AgentSpec(**a) if isinstance(a, dict) else a
        for a in agents
    ]
    if num_agents is not None and len(specs) == 1 and num_agents > 1:
        specs = [copy.deepcopy(specs[0]) for _ in range(num_agents)]
    if not specs:
        raise ValueError(
            "agents: got an empty list; give one AgentSpec (or model string) per agent, at least one"
        )
    if num_agents is not None and len(specs) != num_agents:
        raise ValueError(
            f"agents: got {len(specs)} specs for num_agents={num_agents}; give one spec or num_agents"
        )
    return specs
