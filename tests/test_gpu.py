"""GPU placement and precision (marker ``gpu``, skipped without CUDA; ``make gpu-check`` runs them on a
GPU), and the generation-backend switch of ``SamplingConfig`` (CPU)."""

from __future__ import annotations

import collections

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning import MAGRPO, AgentParallelStrategy
from comlrl_lightning.core.config import LossConfig, RolloutConfig, SamplingConfig
from comlrl_lightning.core.generation import generate
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.team.agents import AgentSpec, load_agent

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)"
)


def _team(beta: float = 0.0) -> MAGRPO:
    return MAGRPO(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        rollout=RolloutConfig(num_generations=4),
        sampling=SamplingConfig(max_new_tokens=16),
        loss=LossConfig(beta=beta),
        learning_rate=1e-3,
    )


def _trainer(max_steps: int, **kw) -> pl.Trainer:
    defaults = dict(devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                    num_sanity_val_steps=0, limit_val_batches=0, enable_checkpointing=False)  # fmt: skip
    return pl.Trainer(max_steps=max_steps, **{**defaults, **kw})


def _devices(module: torch.nn.Module) -> collections.Counter:
    return collections.Counter(str(p.device) for p in module.parameters())


def _state_devices(optimizer: torch.optim.Optimizer) -> set[str]:
    """Devices of an optimizer's state tensors (AdamW's ``step`` counter lives on the CPU by design)."""
    return {
        str(v.device)
        for s in optimizer.state.values()
        for k, v in s.items()
        if torch.is_tensor(v) and k != "step"
    }


class _Snapshot(pl.Callback):
    """Where parameters and optimizer state are at the end of fit (before teardown moves them)."""

    def __init__(self) -> None:
        self.params: list[collections.Counter] = []
        self.state: list[set[str]] = []
        self.dtypes: list[set[torch.dtype]] = []
        self.references: list[set[str]] = []
        self.finite = True

    def on_train_end(self, trainer, pl_module):
        self.params = [_devices(a) for a in pl_module.agents]
        self.state = [_state_devices(o) for o in trainer.optimizers]
        self.dtypes = [{p.dtype for p in a.parameters()} for a in pl_module.agents]
        self.references = [set(_devices(r)) for r in pl_module.reference_models]
        self.finite = all(torch.isfinite(p).all() for a in pl_module.agents for p in a.parameters())


# --------------------------------------------------------------------------- GPU (marker gpu)
@pytest.mark.gpu
@needs_cuda
def test_tiny_team_trains_on_cuda_with_params_and_optimizer_state_there():
    pl.seed_everything(0)
    model, snap = _team(), _Snapshot()
    _trainer(4, accelerator="gpu", callbacks=[snap]).fit(
        model, LengthRatioDataModule(batch_size=2, num_train=16)
    )
    assert [set(c) for c in snap.params] == [{"cuda:0"}, {"cuda:0"}]
    assert snap.state == [{"cuda:0"}, {"cuda:0"}]
    assert snap.finite


@pytest.mark.gpu
@needs_cuda
def test_agent_parallel_cuda_and_cpu_keeps_each_agent_and_its_state_on_its_device_across_resume(tmp_path):
    expected = [{"cuda:0"}, {"cpu"}]
    restored: list[set[str]] = []

    class Restored(pl.Callback):  # runs after the checkpoint's optimizer state was loaded
        def on_train_start(self, trainer, pl_module):
            restored.extend(_state_devices(o) for o in trainer.optimizers)

    def fit(max_steps: int, ckpt_path: str | None, callbacks: list) -> None:
        pl.seed_everything(0)
        model = _team(beta=0.05)  # a KL reference model per agent, placed next to it
        ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=4, save_top_k=0)
        trainer = _trainer(max_steps, accelerator="gpu", strategy=AgentParallelStrategy(agent_devices=["cuda:0", "cpu"]),
                           enable_checkpointing=True, callbacks=[ckpt, *callbacks])  # fmt: skip
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=32), ckpt_path=ckpt_path)

    first = _Snapshot()
    fit(4, None, [first])
    assert (
        [set(c) for c in first.params] == expected
        and first.state == expected
        and first.references == expected
    )
    second = _Snapshot()
    fit(8, str(tmp_path / "last.ckpt"), [second, Restored()])
    assert restored == expected, "the resumed optimizer state must be loaded onto each agent's own device"
    assert [set(c) for c in second.params] == expected and second.state == expected and second.finite


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("precision", "param_dtype"), [("bf16-true", torch.bfloat16), ("bf16-mixed", torch.float32)]
)
def test_bf16_steps_change_the_weights_and_keep_them_finite(precision, param_dtype):
    pl.seed_everything(0)
    model, snap = _team(), _Snapshot()
    model.configure_model()
    before = [p.detach().float().cpu().clone() for p in model.agents[0].parameters()]
    _trainer(4, accelerator="gpu", precision=precision, callbacks=[snap]).fit(
        model, LengthRatioDataModule(batch_size=2, num_train=16)
    )
    assert snap.dtypes == [{param_dtype}, {param_dtype}]
    assert snap.finite
    after = [p.detach().float().cpu() for p in model.agents[0].parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)), (
        f"{precision}: no weight changed"
    )


# --------------------------------------------------------------------------- the sampling switch (CPU)
def test_unknown_generation_backend_is_refused_naming_the_field_and_the_choices():
    with pytest.raises(
        ValueError, match=r"generation_backend: got 'sglang', allowed: \['auto', 'dynamic'.*'vllm'\]"
    ):
        SamplingConfig(generation_backend="sglang")
    with pytest.raises(ValueError, match="generation_backend: got 'fast'"):
        MAGRPO(agents=[{"model": "builtin:tiny-gpt2", "generation": {"generation_backend": "fast"}}] * 2)


def test_auto_backend_keeps_the_dynamic_cache_path_on_cpu_and_cuda_until_measured():
    auto = SamplingConfig()
    assert auto.backend_for(torch.device("cpu")) == "dynamic"
    assert auto.backend_for(torch.device("cuda", 0)) == "dynamic"
    assert (
        SamplingConfig(generation_backend="static_compile").backend_for(torch.device("cpu"))
        == "static_compile"
    )


def test_per_agent_generation_backend_reaches_that_agents_sampling_config():
    model = MAGRPO(agents=[{"model": "builtin:tiny-gpt2", "generation": {"generation_backend": "static_compile"}},
                           {"model": "builtin:tiny-gpt2"}])  # fmt: skip
    assert [s.generation_backend for s in model.team.sampling] == ["static_compile", "auto"]


# continuous batching sizes its paged KV cache from the free memory: on the shared CPU machine the fast suite
# was OOM-killed in it, so that case runs on CUDA only (make gpu-check)
_CB = pytest.param("continuous_batching", "generate_batch", None, marks=[pytest.mark.gpu, needs_cuda])


@pytest.mark.parametrize(("backend", "entry", "marker"), [("static_compile", "generate", "static"), _CB])
def test_each_backend_takes_its_own_path_and_its_greedy_completions_match_the_dynamic_cache(
    backend, entry, marker
):
    torch.manual_seed(0)
    model, tok = load_agent(
        AgentSpec(model="builtin:tiny-llama-gpt2tok" if entry == "generate_batch" else "builtin:tiny-gpt2")
    )
    calls: list[dict] = []
    real = getattr(model, entry)

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    prompts = ["Short note on a cat:", "A longer note on the sea and the sky:"]
    ref = generate(
        model,
        tok,
        prompts,
        2,
        SamplingConfig(max_new_tokens=12, generation_backend="dynamic"),
        False,
        do_sample=False,
    )
    setattr(model, entry, spy)
    got = generate(
        model,
        tok,
        prompts,
        2,
        SamplingConfig(max_new_tokens=12, generation_backend=backend),
        False,
        do_sample=False,
    )
    # the knobs travel in a fresh generation config (never the model's own: see core/generation.py)
    assert len(calls) == 1 and calls[0]["generation_config"].cache_implementation == marker
    assert got.completion_ids.shape[0] == 4
    assert got.texts == ref.texts
    assert torch.equal(got.lengths, ref.lengths)


# --------------------------------------------------------------------------- the check script (CPU)
def _gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="pins the behaviour without CUDA")
def test_gpu_check_without_cuda_skips_each_gpu_part_with_its_reason_and_writes_both_reports(tmp_path):
    import json

    check = _gpu_check()
    assert check.main(["--out", str(tmp_path), "--only", "main_job,bench,generation,sharded"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {n: p["status"] for n, p in report["parts"].items()} == dict.fromkeys(
        ("main_job", "bench", "generation", "sharded"), "skipped"
    )
    assert all("no CUDA device" in p["reason"] for p in report["parts"].values())
    md = (tmp_path / "gpu_check.md").read_text()
    assert "**(b) main_job**: skipped: no CUDA device" in md and "**(d) generation**: skipped" in md
    assert "**(e) sharded**: skipped: no CUDA device" in md
    assert not (tmp_path / "gpu_results.md").exists(), "no GPU numbers may be written without a GPU"


def test_gpu_check_report_renders_each_ran_part_and_names_the_fastest_backend():
    check = _gpu_check()
    gen = {"model": "m", "rows": 64, "new_tokens": 256, "fastest": "static_compile",
           "dynamic": {"tokens_per_s": 1000.0, "median_s": 2.0, "warmup_s": 2.5},
           "static_compile": {"tokens_per_s": 3000.0, "median_s": 0.7, "warmup_s": 30.0},
           "continuous_batching": {"error": "ValueError: no"}}  # fmt: skip
    job = {"batches": 12, "wall_s": 130.0, "new_tokens": 256, "first_last": {"val/reward": [0.5, 0.9, 2]}}
    report = {"device": "NVIDIA H200", "date": "d", "wall_s": 250.0, "versions": {"torch": "2.11"},
              "parts": {"main_job": {"status": "ran", "wall_s": 130.0, "result": job},
                        "generation": {"status": "ran", "wall_s": 40.0, "result": gen},
                        "bench": {"status": "failed", "reason": "RuntimeError: x", "wall_s": 1.0},
                        "sharded": {"status": "ran", "wall_s": 60.0, "result": {
                            "devices": 1, "precision": "bf16-mixed", "full_s": 30.0, "resumed_s": 25.0,
                            "resume_max_abs_diff": 0.0, "exported": ["agent_0", "agent_1"]}}}}  # fmt: skip
    text = check.render(report)
    assert "- fsdp2 on 1 rank(s), bf16-mixed: 4 batches in 30 s; resumed from batch 2 in 25 s; largest weight " \
           "difference resumed vs uninterrupted 0; HF export: agent_0, agent_1" in text  # fmt: skip
    assert "- 12 batches in 130 s (bf16-true, K=4, 256 new tokens)" in text
    assert "- `val/reward`: first 0.500, last 0.900 (2 points)" in text
    assert (
        "| static_compile | 3000 | 0.70 | 30.00 |" in text
        and "| continuous_batching | failed: ValueError: no | | |" in text
    )
    assert "Fastest: `static_compile`." in text and "**(c) bench**: failed: RuntimeError: x" in text
    assert text.index("(b) main_job") < text.index("(c) bench") < text.index("(d) generation")
