"""Rollouts through an inference engine: vLLM colocated with the trainer (``generation_backend: vllm``).

Features:
- One ``vllm.LLM`` in the trainer's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here: no
  second process, no ``__main__`` guard), built lazily at an agent's first rollout: one per distinct
  full-fine-tuning model (agents sharing weights share it), and one per LoRA base, every adapter on
  it served as its own ``LoRARequest`` (the base held once). Agents on one engine roll out in one
  call (:meth:`~comlrl_lightning.team.engine_pool.EnginePool.generate_joint`); on the CPU its LoRA
  layers go through :mod:`comlrl_lightning.team.engine_lora_ops` and its KV blocks are
  ``CPU_BLOCK_SIZE`` tokens, so the K samples of a prompt share its prefill (a block-aligned prompt's
  too: :mod:`comlrl_lightning.team.engine_prefill`).
- Weights reach the engine before each rollout that follows a change: a full model through vLLM's
  in-place reload (``collective_rpc("reload_weights")``: the layer-wise path that redoes the CPU
  kernels' weight packing, where a bare ``model.load_weights`` fails with ``'Parameter' object has no
  attribute 'weight_loader'``), an adapter saved and reloaded in place (``load_inplace``). A change is
  seen from the parameters' version counters, so optimizer steps, checkpoint loads and any other
  in-place write count. The prefix cache is reset after a sync (its keys hold no weight version).
- The engine returns token ids and the log-probs it sampled them with (``logprobs_mode=
  processed_logprobs``: after ``temperature``, as the trainer scores them); the trainer re-scores every
  token, and :mod:`comlrl_lightning.core.engine_correction` compares the two (gap metric, TIS).
- Sampling knobs come from the agent's ``SamplingConfig`` only (``generation_config="vllm"``: a
  checkpoint's generation_config.json is not applied, as on the HF path); the engine's seed per call
  is drawn from torch's RNG, so a seeded run, and a resumed one, draw the same completions.
- Memory: ``vllm_cpu_kv_cache_gib`` (CPU) or ``vllm_gpu_memory_utilization`` (GPU), per engine, and
  ``vllm_max_model_length``.

Not supported (refused before any model loads by :func:`check_engine_team`): ``stop_after_code_block``,
agents placed on their own devices (``parallel_training: mp`` or ``AgentSpec.device``), and LoRA
options vLLM does not serve (DoRA, ``modules_to_save``, trained biases, ``target_parameters``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from comlrl_lightning.infra.rng import collect_rng_states, set_rng_states
from comlrl_lightning.team.agents import AgentSpec

if TYPE_CHECKING:
    from comlrl_lightning.core.config import PlacementConfig, SamplingConfig

VLLM_INSTALL = "make setup-vllm (a separate venv, .venv-vllm; see docs/generation.md)"
"""How to install the engine, quoted when ``vllm`` is asked for and missing."""

UNSERVED_LORA_OPTIONS = {
    "use_dora": False,
    "modules_to_save": None,
    "bias": "none",
    "target_parameters": None,
    "trainable_token_indices": None,
}
"""LoRA options vLLM cannot serve, with the only value it takes."""


CPU_BLOCK_SIZE = 32
"""KV-cache block size (tokens) of an engine on the CPU: vLLM's CPU attention takes multiples of 32."""


def vllm_installed() -> bool:
    """Whether the ``vllm`` package can be imported here (looked up, not imported)."""
    return importlib.util.find_spec("vllm") is not None


def check_engine_team(
    specs: Sequence[AgentSpec], sampling: Sequence[SamplingConfig], placement: PlacementConfig | None
) -> None:
    """Refuse, before any model loads, what the engine does not do for the agents that use it.

    Raises:
        ValueError: ``vllm`` not installed (naming the install command); ``stop_after_code_block`` with
            ``vllm``; agents on their own devices; a LoRA option vLLM does not serve. Each message
            names the field, the value and what is allowed.
    """
    users = [i for i, s in enumerate(sampling) if s.generation_backend == "vllm"]
    if not users:
        return
    if placement is not None and placement.parallel_training != "none":
        raise ValueError(
            f"placement.parallel_training: got {placement.parallel_training!r} with generation_backend='vllm'; "
            "allowed: 'none' (the engine is colocated on the trainer's one device)"
        )
    for i in users:
        where, spec = f"agents[{i}]", specs[i]
        if sampling[i].stop_after_code_block:
            raise ValueError(
                f"{where}.generation.stop_after_code_block: got True with generation_backend='vllm'; allowed: "
                "false (the engine takes no stopping criteria), or generation_backend 'dynamic'"
            )
        if spec.device is not None:
            raise ValueError(
                f"{where}.device: got {spec.device!r} with generation_backend='vllm'; allowed: None "
                "(the engine and the trainer share one device)"
            )
        options = {} if spec.adapter is None else {**spec.adapter.options}
        for key, allowed in UNSERVED_LORA_OPTIONS.items():
            if key in options and options[key] != allowed and options[key] not in (None, False, [], {}):
                raise ValueError(
                    f"{where}.adapter.{key}: got {options[key]!r} with generation_backend='vllm'; allowed: "
                    f"{allowed!r} (vLLM's LoRA does not serve it), or generation_backend 'dynamic'"
                )
    if not vllm_installed():  # last: the refusals above hold wherever the config is checked
        raise ValueError(
            "generation_backend: got 'vllm', but the vllm package is not installed in this environment; "
            f"install it with {VLLM_INSTALL}, or use one of 'auto', 'dynamic', 'static_compile', "
            "'continuous_batching'"
        )


def _vllm() -> Any:
    """``vllm``, imported for in-process use."""
    # the engine core runs in this process, beside the trainer (no pickling of the model, no guard)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # its warnings are about its server's features (chat-template warm-up without a tokenizer, a rotary
    # table with no weights to reload), not the user's to act on; VLLM_LOGGING_LEVEL set by hand wins
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm

    return vllm


def _fingerprint(params: Sequence[nn.Parameter]) -> tuple[tuple[int, int], ...]:
    """Each parameter's storage and in-place version: any optimizer step or ``copy_`` changes it."""
    return tuple((p.data_ptr(), p._version) for p in params)


@dataclass
class EngineStats:
    """Time spent by a team's engines (seconds; summed over engines and calls)."""

    build_s: float = 0.0
    """Building the engines (saving the weights they start from, loading them, the KV cache)."""
    first_call_s: float = 0.0
    """Each engine's first ``generate`` (warm-up)."""
    sync_s: float = 0.0
    """Pushing changed weights or adapters to the engines."""
    syncs: int = 0
    """How many weight or adapter pushes."""
    generate_s: float = 0.0
    """``generate`` calls after the first."""
    tokens: int = 0
    """Completion tokens generated (EOS included)."""


class ColocatedEngine:
    """One ``vllm.LLM`` over a model folder, in this process.

    Args:
        folder: a Hugging Face model folder (config + safetensors) to start from.
        dtype: the weights' dtype (the agent's).
        sampling: memory knobs (``vllm_*``) of the first agent that uses it.
        max_model_len: the context in tokens.
        lora_rank: the largest adapter rank it serves (None: no LoRA).
        max_loras: adapters served at once.
    """

    def __init__(
        self,
        folder: str,
        dtype: torch.dtype,
        sampling: SamplingConfig,
        max_model_len: int,
        lora_rank: int | None = None,
        max_loras: int = 1,
    ) -> None:
        vllm = _vllm()
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        kwargs: dict[str, Any] = dict(
            model=folder,
            dtype=str(dtype).removeprefix("torch."),
            max_model_len=max_model_len,
            skip_tokenizer_init=True,  # token ids in and out; the agent's own tokenizer decodes
            generation_config="vllm",  # no defaults from the checkpoint's generation_config.json
            logprobs_mode="processed_logprobs",  # log-probs after temperature, as the trainer's
            seed=0,
            enforce_eager=on_cpu,  # the CPU build's compiled graphs cost minutes per new batch shape
        )
        if on_cpu:
            kwargs["kv_cache_memory_bytes"] = int(sampling.vllm_cpu_kv_cache_gib * 2**30)
            # the smallest KV block the CPU attention takes (its default is 128): the prefix cache shares
            # only whole blocks, so the K samples of a prompt of a few dozen tokens share its prefill
            kwargs["block_size"] = CPU_BLOCK_SIZE
            from comlrl_lightning.team import engine_prefill

            engine_prefill.install()  # and those of a block-aligned prompt recompute one token, not a block
        else:
            kwargs["gpu_memory_utilization"] = sampling.vllm_gpu_memory_utilization
        if lora_rank is not None:
            if on_cpu:  # vLLM's CPU LoRA ops copy the adapter per token; ours group tokens by adapter
                from comlrl_lightning.team import engine_lora_ops

                engine_lora_ops.install()
            ranks = [r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= lora_rank]
            kwargs.update(
                enable_lora=True, max_loras=max_loras, max_lora_rank=ranks[0] if ranks else lora_rank
            )
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        rng = collect_rng_states()  # vLLM seeds the process's global RNGs with its `seed` at start-up
        try:
            # outside inference mode whatever the caller's (Lightning validates under it, and an engine built
            # by a validation rollout would hold inference tensors that no later weight push may write)
            with torch.inference_mode(False):
                self.llm = vllm.LLM(**kwargs)
        except ValueError as err:  # vLLM names its own knobs; say which of ours set them
            memory = "vllm_cpu_kv_cache_gib" if on_cpu else "vllm_gpu_memory_utilization"
            raise ValueError(
                f"sampling.{memory} / vllm_max_model_length (max_model_len={max_model_len}): the engine "
                f"could not start: {err}"
            ) from err
        finally:
            # vLLM's CPU worker drops torch to one thread "for serving" and turns set_num_threads into a
            # no-op for the whole process; the trainer runs in this process too, with its own threads
            torch.set_num_threads = set_threads
            set_threads(threads)
            # the trainer's streams go on as if no engine had started: a run that builds its engine at
            # the first batch and its resume, which builds it at the first batch after the checkpoint,
            # draw the same numbers (tests/test_vllm_engine.py, the resume test)
            set_rng_states(rng)

    def generate(
        self, prompts: list[list[int]], params: list[dict[str, Any]], lora: list[Any]
    ) -> list[list[tuple[list[int], list[float]]]]:
        """Per prompt, its ``params[i]["n"]`` completions as ``(token ids, their log-probs)``, in sample order.

        Args: prompts: token ids without padding; params: per prompt its ``vllm.SamplingParams`` fields;
        lora: per prompt a ``LoRARequest`` or None (the base model). One call schedules every prompt
        together, whichever adapter it names.
        """
        vllm = _vllm()
        sp = [vllm.SamplingParams(**p, logprobs=0) for p in params]
        items = [{"prompt_token_ids": p} for p in prompts]
        outs = self.llm.generate(items, sp, lora_request=lora, use_tqdm=False)
        result = []
        for out in outs:
            rows = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                rows.append((ids, [float(d[t].logprob) for d, t in zip(c.logprobs or [], ids)]))
            result.append(rows)
        return result

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the engine's weights with ``state`` (Hugging Face names) through vLLM's in-place reload."""
        items = iter(state.items())
        with torch.inference_mode(False):  # a push from a validation rollout must leave normal tensors too
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True}
            )
        self.llm.reset_prefix_cache()

    def load_adapter(self, request: Any) -> None:
        """Load (or, with ``load_inplace``, reload) the adapter ``request`` names into its slot now."""
        with torch.inference_mode(False):  # a push from a validation rollout must leave normal tensors too
            self.llm.llm_engine.add_lora(request)

    def close(self) -> None:
        """Shut the engine down (its weights and KV cache are freed once nothing refers to it). vLLM's
        shutdown also tears down its in-process distributed state: close every engine of a process
        together (:meth:`~comlrl_lightning.team.engine_pool.EnginePool.close`)."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm

    def reset_prefix_cache(self) -> None:
        """Drop cached prompt KV (computed under weights that changed)."""
        self.llm.reset_prefix_cache()
