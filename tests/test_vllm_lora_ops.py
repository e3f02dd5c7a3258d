"""The grouped LoRA ops the engine serves adapters with on the CPU (``comlrl_lightning/team/engine_lora_ops.py``)
against a per-token reference and against vLLM's own torch ops, on random adapters: one adapter per
batch, two in runs, many interleaved, and tokens without an adapter (``-1``). Needs the ``vllm`` extra
(``make setup-vllm``; skipped without it); seconds."""

import pytest
import torch

pytest.importorskip("vllm")

from vllm.lora.ops.torch_ops import lora_ops as upstream  # noqa: E402
from vllm.lora.punica_wrapper import punica_cpu  # noqa: E402
from vllm.lora.punica_wrapper.utils import compute_meta  # noqa: E402

from comlrl_lightning.team import engine_lora_ops as ops  # noqa: E402

SLOTS, RANK, IN = 3, 8, 24
SLICES = (24, 8, 8)  # a fused q/k/v projection's output slices
CASES = {
    "one adapter": [1] * 10,
    "two runs": [0] * 6 + [2] * 4,
    "interleaved": [0, 1, 2, 1, 0] * 4,  # 20 runs > MAX_RUNS
    "with no-adapter tokens": [-1, -1, 1, 1, 1, -1, 0, 0],
    "none": [-1] * 5,
}


@pytest.fixture(autouse=True)
def _installed():
    ops.install()


def _weights(gen: torch.Generator) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Per slice, every slot's ``A`` ``[L, 1, r, in]`` and ``B`` ``[L, 1, size, r]`` (vLLM's stacked layout)."""
    a = tuple(torch.randn(SLOTS, 1, RANK, IN, generator=gen) for _ in SLICES)
    b = tuple(torch.randn(SLOTS, 1, size, RANK, generator=gen) for size in SLICES)
    return a, b


def _reference(x, a, b, slots, scale):
    """``y[t, slice i] = scale * x[t] @ A_i[slot].T @ B_i[slot].T``, token by token; no delta for -1."""
    y = torch.zeros(x.shape[0], sum(SLICES), dtype=torch.float64)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        col = 0
        for a_i, b_i, size in zip(a, b, SLICES):
            y[t, col : col + size] = scale * x[t].double() @ a_i[slot, 0].double().T @ b_i[slot, 0].double().T
            col += size
    return y


def _via_ops(mod, x, a, b, slots, scale, prefill):
    """The layer's LoRA output through ``mod``'s shrink/expand ops, per slice, as PunicaWrapperCPU calls them."""
    idx = torch.tensor(slots)
    y = torch.zeros(x.shape[0], sum(SLICES))
    col = 0
    for a_i, b_i, size in zip(a, b, SLICES):
        h = torch.zeros(x.shape[0], RANK)
        if prefill:  # the per-sequence form, as vLLM builds it (consecutive tokens on one slot merged)
            meta = compute_meta(idx)[:6]
            mod.sgmv_shrink(x, a_i, h, *meta, scale)
            mod.sgmv_expand_slice(h, b_i, y, *meta, col, size, True)
        else:
            mod.bgmv_shrink(x, a_i, h, idx, scale)
            mod.bgmv_expand_slice(h, b_i, y, idx, col, size, True)
        col += size
    return y


@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_grouped_ops_equal_the_per_token_reference(case, prefill):
    gen = torch.Generator().manual_seed(0)
    slots = CASES[case]
    a, b = _weights(gen)
    x = torch.randn(len(slots), IN, generator=gen)
    want = _reference(x, a, b, slots, 0.5)
    got = _via_ops(ops, x, a, b, slots, 0.5, prefill)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    if -1 not in slots:  # vLLM's own ops agree where they are right (they give -1 the last slot's adapter)
        torch.testing.assert_close(
            _via_ops(upstream, x, a, b, slots, 0.5, prefill), got, rtol=1e-5, atol=1e-4
        )


class _Wrapper(punica_cpu.PunicaWrapperCPU):
    """A PunicaWrapperCPU holding one step's slots, as the engine's model runner sets them."""

    def __init__(self, slots: list[int], prefill: bool) -> None:  # no buffers: the properties below
        self._slots = torch.tensor(slots)
        self._meta = compute_meta(self._slots)
        self.is_prefill, self.no_lora = prefill, self._meta[6]

    @property
    def token_lora_indices(self):
        return self._slots

    @property
    def prefill_metadata(self):
        return self._meta[:6]


@pytest.fixture(params=["dense", "by runs"])
def form(request, monkeypatch):
    """The fused layer op's two forms for steps of several runs: these small layers take the dense one
    only when its share and run length are unbounded, and never at a share of 0."""
    dense = request.param == "dense"
    monkeypatch.setattr(ops, "DENSE_MAX_SHARE", float("inf") if dense else 0.0)
    monkeypatch.setattr(ops, "DENSE_MAX_RUN", 10**6 if dense else 4)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_layer_op_equals_the_reference_and_adds_to_the_base_output(case, prefill, dtype, form):
    gen = torch.Generator().manual_seed(1)
    slots = CASES[case]
    a, b = _weights(gen)
    a, b = tuple(w.to(dtype) for w in a), tuple(w.to(dtype) for w in b)
    x = torch.randn(len(slots), IN, generator=gen).to(dtype)
    base = torch.randn(len(slots), sum(SLICES), generator=gen).to(dtype)
    y = base.clone()
    wrapper = _Wrapper(slots, prefill)
    assert punica_cpu.PunicaWrapperCPU.add_lora_linear is ops.add_lora_linear  # installed
    wrapper.add_lora_linear(y, x, a, b, 1.0, SLICES)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 0.25}
    torch.testing.assert_close((y.double() - base.double()), _reference(x, a, b, slots, 1.0), **tol)


@pytest.mark.parametrize("case", ["two runs", "interleaved"])
def test_an_output_wider_than_its_slices_is_written_from_column_0_and_no_further(case, form):
    # upstream's semantics: the slices from offset 0; the columns past them keep what they held
    gen = torch.Generator().manual_seed(3)
    slots = CASES[case]
    a, b = _weights(gen)
    x = torch.randn(len(slots), IN, generator=gen)
    y = torch.zeros(len(slots), sum(SLICES) + 5)
    _Wrapper(slots, False).add_lora_linear(y, x, a, b, 1.0, SLICES)
    torch.testing.assert_close(
        y[:, : sum(SLICES)].double(), _reference(x, a, b, slots, 1.0), rtol=1e-5, atol=1e-4
    )
    assert torch.equal(y[:, sum(SLICES) :], torch.zeros(len(slots), 5))


@pytest.mark.parametrize("case", ["one adapter", "two runs"])
def test_the_fused_layer_op_follows_an_adapter_written_into_its_slot(case, form):
    # the engine reloads a trained adapter into the same slot in place: the fused copy must not go stale
    gen = torch.Generator().manual_seed(2)
    slots = [1] * 4 if case == "one adapter" else [1, 1, 0, 0]
    a, b = _weights(gen)
    x = torch.randn(len(slots), IN, generator=gen)
    wrapper = _Wrapper(slots, False)
    first = torch.zeros(len(slots), sum(SLICES))
    wrapper.add_lora_linear(first, x, a, b, 1.0, SLICES)
    for w in (*a, *b):
        w[1].copy_(torch.randn(w[1].shape, generator=gen))  # as vLLM's set_lora writes a slot
    second = torch.zeros(len(slots), sum(SLICES))
    wrapper.add_lora_linear(second, x, a, b, 1.0, SLICES)
    torch.testing.assert_close(second.double(), _reference(x, a, b, slots, 1.0), rtol=1e-5, atol=1e-4)
    assert not torch.allclose(first, second)


def test_a_non_finite_adapter_in_one_slot_leaves_the_other_slots_tokens_alone(form):
    # the dense form multiplies every slot's columns (masked) for every token: 0 * nan would be nan
    gen = torch.Generator().manual_seed(4)
    slots = [0, 1, -1, 0, 1, -1]
    a, b = _weights(gen)
    for w in (*a, *b):
        w[2].fill_(float("nan"))  # a diverged adapter in slot 2, which no token of the step uses
    x = torch.randn(len(slots), IN, generator=gen)
    y = torch.zeros(len(slots), sum(SLICES))
    _Wrapper(slots, False).add_lora_linear(y, x, a, b, 1.0, SLICES)
    torch.testing.assert_close(y.double(), _reference(x, a, b, slots, 1.0), rtol=1e-5, atol=1e-4)


def test_the_main_jobs_lora_team_takes_the_dense_form_and_many_large_adapters_do_not():
    # SmolLM2-135M (hidden 576, q/k/v 576 -> 960, gate/up 576 -> 2 x 1536, down 1536 -> 576), 2 slots, r=8
    assert ops.dense_affordable(2, 3 * 8, 576, 960)
    assert ops.dense_affordable(2, 2 * 8, 576, 3072)
    assert ops.dense_affordable(2, 8, 1536, 576)
    assert not ops.dense_affordable(8, 3 * 64, 576, 960)  # 8 agents at r=64: ~17x the budget, by runs
