"""Engine/trainer mismatch without an engine: the log-prob gap, the truncated importance-sampling
weight on hand values and in the loss, and the ``vllm`` backend's refusals before any model loads
(these hold with or without vLLM installed)."""

import math

import pytest
import torch

from comlrl_lightning import MAGRPO
from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.core.engine_correction import (
    LogprobGap,
    engine_terms,
    logprob_gap,
    truncated_importance_weights,
)
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.loss import BatchTotals, agent_loss
from comlrl_lightning.core.loss_config import LossConfig
from comlrl_lightning.team.engine import VLLM_INSTALL, vllm_installed

LOG = math.log
# trainer / engine probabilities of three tokens; the third row position is padding
TRAINER = torch.tensor([[LOG(0.5), LOG(0.2), LOG(0.9)]])
ENGINE = torch.tensor([[LOG(0.25), LOG(0.4), LOG(0.3)]])
MASK = torch.tensor([[1, 1, 0]])


def test_tis_weight_is_the_probability_ratio_truncated_at_the_cap_and_zero_on_padding():
    w = truncated_importance_weights(TRAINER, ENGINE, torch.ones(1, 3), cap=2.5)
    assert w.flatten().tolist() == pytest.approx([2.0, 0.5, 2.5])  # 0.5/0.25, 0.2/0.4, 0.9/0.3 = 3 -> 2.5
    masked = truncated_importance_weights(TRAINER, ENGINE, MASK, cap=2.5)
    assert masked.flatten().tolist() == pytest.approx([2.0, 0.5, 0.0])
    capped_at_one = truncated_importance_weights(TRAINER, ENGINE, MASK, cap=1.0)
    assert capped_at_one.flatten().tolist() == pytest.approx([1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="vllm_importance_sampling_cap: got 0.5, must be >= 1"):
        truncated_importance_weights(TRAINER, ENGINE, MASK, cap=0.5)


def test_logprob_gap_is_the_mean_and_max_absolute_difference_over_unmasked_tokens():
    gap = logprob_gap(TRAINER, ENGINE, MASK)
    assert gap.tokens == 2
    assert gap.mean == pytest.approx((LOG(2) + LOG(2)) / 2)
    assert gap.abs_max == pytest.approx(LOG(2))
    both = gap + LogprobGap(abs_sum=3.0, abs_max=3.0, tokens=1)
    assert (both.tokens, both.abs_max, both.mean) == (3, 3.0, pytest.approx((2 * LOG(2) + 3) / 3))
    assert LogprobGap().mean == 0.0
    with pytest.raises(ValueError, match="must have one shape"):
        logprob_gap(TRAINER, ENGINE[:, :2], MASK)


def test_tis_weights_scale_each_tokens_policy_term_and_its_gradient():
    """On-policy, ``sequence_sum``: the per-token term is ``−A·ρ`` with ρ = 1 in value, so the loss is
    ``−A·Σ_t w_t`` and the gradient on token t is ``−A·w_t``."""
    cfg = LossConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_cap=2.5)
    logps = TRAINER.clone().requires_grad_(True)
    totals = BatchTotals(num_rows=1, num_tokens=2)
    _, w = engine_terms(logps, None, ENGINE, MASK, cfg.engine_correction_cap())
    terms = agent_loss(logps, None, None, torch.tensor([1.5]), MASK, cfg, totals, is_weights=w)
    assert float(terms.loss.detach()) == pytest.approx(-1.5 * (2.0 + 0.5))
    terms.loss.backward()
    assert logps.grad.flatten().tolist() == pytest.approx([-1.5 * 2.0, -1.5 * 0.5, 0.0])
    plain = agent_loss(
        TRAINER.clone().requires_grad_(True), None, None, torch.tensor([1.5]), MASK, cfg, totals
    )
    assert float(plain.loss.detach()) == pytest.approx(-1.5 * 2)


def test_engine_terms_take_the_pre_update_log_probs_when_given_and_weigh_only_when_asked():
    off = LossConfig()
    assert off.vllm_importance_sampling_correction is False  # TRL turns it on; here it is opt-in
    gap, w = engine_terms(TRAINER, None, ENGINE, MASK, off.engine_correction_cap())
    assert w is None and gap.abs_max == pytest.approx(LOG(2))
    on = LossConfig(vllm_importance_sampling_correction=True)  # cap 2.0, TRL's default
    assert off.engine_correction_cap() is None and on.engine_correction_cap() == 2.0
    old = torch.tensor([[LOG(0.25), LOG(0.4), LOG(0.3)]])  # the pre-update policy equals the engine here
    gap, w = engine_terms(TRAINER, old, ENGINE, MASK, on.engine_correction_cap())
    assert gap.abs_max == pytest.approx(0.0, abs=1e-6) and w.flatten().tolist() == pytest.approx(
        [1.0, 1.0, 0.0]
    )
    assert engine_terms(TRAINER, None, None, MASK, on.engine_correction_cap()) == (
        None,
        None,
    )  # not an engine's rollout


def test_generation_rows_keep_the_engine_log_probs_of_the_rows_they_take():
    ids = torch.tensor([[5, 6, 2], [7, 2, 0], [8, 9, 4]])
    gen = Generation(
        prompt_ids=torch.ones(3, 2, dtype=torch.long), prompt_mask=torch.ones(3, 2, dtype=torch.long),
        completion_ids=ids, completion_mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]]), texts=["a", "b", "c"],
        clipped=torch.tensor([False, False, True]), engine_logprobs=torch.tensor([[-1.0, -2, -3], [-4, -5, 0], [-6, -7, -8]]),
    )  # fmt: skip
    sub = gen.rows(torch.tensor([1]))
    assert sub.engine_logprobs.tolist() == [[-4.0, -5.0]]  # trimmed with the completion padding


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"vllm_gpu_memory_utilization": 0.0}, "vllm_gpu_memory_utilization: got 0.0, must be in (0, 1]"),
        ({"vllm_max_model_length": 64}, "vllm_max_model_length: got 64, must be > max_new_tokens or None"),
        ({"vllm_cpu_kv_cache_gib": 0}, "vllm_cpu_kv_cache_gib: got 0, must be > 0"),
    ],
)
def test_engine_memory_knobs_are_refused_naming_field_value_and_allowed(knobs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SamplingConfig(max_new_tokens=64, **knobs)
    with pytest.raises(ValueError, match=r"vllm_importance_sampling_cap: got 0.9, must be >= 1"):
        LossConfig(vllm_importance_sampling_cap=0.9)


VLLM = {"generation_backend": "vllm", "max_new_tokens": 8}
AGENT = {"model": "builtin:tiny-gpt2"}


@pytest.mark.parametrize(
    ("agents", "extra", "message"),
    [
        ([AGENT], {"sampling": {**VLLM, "stop_after_code_block": True}},
         r"agents\[0\].generation.stop_after_code_block: got True with generation_backend='vllm'; allowed: false"),
        ([{**AGENT, "device": "cpu"}], {"sampling": VLLM},
         r"agents\[0\].device: got 'cpu' with generation_backend='vllm'; allowed: None"),
        ([{**AGENT, "adapter": {"r": 4, "use_dora": True}}], {"sampling": VLLM},
         r"agents\[0\].adapter.use_dora: got True with generation_backend='vllm'; allowed: False"),
        ([AGENT, {**AGENT, "generation": {"generation_backend": "vllm", "stop_after_code_block": True}}], {},
         r"agents\[1\].generation.stop_after_code_block: got True"),
        ([AGENT, AGENT], {"sampling": VLLM, "placement": {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]}},
         r"placement.parallel_training: got 'mp' with generation_backend='vllm'; allowed: 'none'"),
    ],
)  # fmt: skip
def test_what_the_engine_does_not_do_is_refused_before_any_model_loads(agents, extra, message):
    with pytest.raises(ValueError, match=message):  # at construction: models load at fit start
        MAGRPO(agents=agents, **extra)


@pytest.mark.skipif(vllm_installed(), reason="vllm is installed here")
def test_vllm_asked_for_but_not_installed_names_the_install_command():
    with pytest.raises(ValueError) as err:
        MAGRPO(agents=[AGENT], sampling=VLLM)
    assert "the vllm package is not installed" in str(err.value) and VLLM_INSTALL in str(err.value)
