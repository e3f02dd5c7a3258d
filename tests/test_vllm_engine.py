"""Rollouts through a colocated vLLM engine (``generation_backend: vllm``), on SmolLM2-135M in fp32:
greedy equals HF greedy token for token, and the engine samples from the trainer's current weights
after every optimizer step (full fine-tuning and a LoRA team on one engine), which it would not without
the sync. Needs the ``vllm`` extra (``make setup-vllm``; skipped without it); minutes on 2 cores."""

import lightning.pytorch as pl
import pytest
import torch

pytest.importorskip("vllm")

import comlrl_lightning.team.engine_pool as engine_pool  # noqa: E402
from comlrl_lightning import MAGRPO  # noqa: E402
from comlrl_lightning.core import metrics as M  # noqa: E402
from comlrl_lightning.core.generation import render_prompt  # noqa: E402
from comlrl_lightning.datamodules import LengthRatioDataModule  # noqa: E402

pytestmark = pytest.mark.slow

SMOL = "builtin:smollm2-135m-instruct"
ADAPTER = {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}
GAP_TOLERANCE = 1e-3
"""Largest per-token |log π_trainer − log π_engine| (nats) allowed in fp32: measured up to ~1e-4 (the
engine's CPU kernels sum in another order); one stale optimizer step moves it by far more."""

PROMPTS = [
    "Name three colours.",
    "What is 2 + 3?",
    "Write one sentence about the sea.",
    "List two prime numbers.",
    "Say hello in French.",
    "What comes after Monday?",
]


def team_of(backend: str, agents: list[dict], max_new_tokens: int = 24):
    module = MAGRPO(agents=agents, sampling={"max_new_tokens": max_new_tokens, "generation_backend": backend})
    module.team.load(with_reference=False)
    return module.team


def test_greedy_through_the_engine_equals_hf_greedy_token_for_token_in_fp32():
    hf, engine = team_of("dynamic", [{"model": SMOL}]), team_of("vllm", [{"model": SMOL}])
    texts = [render_prompt(hf.tokenizers[0], [p], [], use_chat=True) for p in PROMPTS]  # chat template
    want, got = hf.generate_one(0, texts, 1, greedy=True), engine.generate_one(0, texts, 1, greedy=True)
    for r in range(len(PROMPTS)):
        w = want.completion_ids[r][want.completion_mask[r].bool()].tolist()
        g = got.completion_ids[r][got.completion_mask[r].bool()].tolist()
        assert g == w, f"prompt {r}: engine {g} != HF {w}"
    assert got.texts == want.texts
    assert torch.equal(got.prompt_ids, want.prompt_ids)  # the same prompt tokens, left-padded alike


class Gaps(pl.Callback):
    """Per step, the largest engine/trainer log-prob gap over the agents."""

    def __init__(self) -> None:
        self.steps: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append(max(s.engine_gap.abs_max for s in outputs.agent_stats))


def fit_gaps(
    agents: list[dict], learning_rate: float, loss: dict, batches: int = 3
) -> tuple[list[float], int, int]:
    """Per step the largest gap, the number of engines, the number of weight pushes."""
    pl.seed_everything(0)
    module = MAGRPO(
        agents=agents,
        loss=loss,
        rollout={"num_generations": 2},
        sampling={
            "max_new_tokens": 8,
            "generation_backend": "vllm",
            "vllm_cpu_kv_cache_gib": 0.25,
            "vllm_max_model_length": 512,
        },
        learning_rate=learning_rate,
    )
    gaps = Gaps()
    trainer = pl.Trainer(
        max_steps=batches * len(agents), accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[gaps],
    )  # fmt: skip
    trainer.fit(module, LengthRatioDataModule(batch_size=2, num_train=2 * batches))
    logged = trainer.callback_metrics  # the gap reaches the logs under TRL's names
    assert float(logged[M.SAMPLING_LOGP_DIFFERENCE_MAX]) == pytest.approx(gaps.steps[-1], rel=1e-5)
    assert float(logged[M.agent(0, M.SAMPLING_LOGP_DIFFERENCE_MEAN)]) <= gaps.steps[-1]
    pool = module.team.engine_pool()
    engines, syncs = len(pool.engines), pool.stats.syncs
    pool.close()  # before the next fit builds its own: two teams' engines and optimizers do not fit in 24 GB
    return gaps.steps, engines, syncs


def _without_sync(monkeypatch) -> None:
    # the counterfactual: the pool sees no change in the weights, so it never pushes them
    monkeypatch.setattr(engine_pool, "_fingerprint", lambda params: ())


@pytest.mark.parametrize(
    ("agents", "learning_rate", "engines", "loss"),
    [
        ([{"model": SMOL}, {"model": SMOL}], 1e-3, 2, {}),  # full fine-tuning: one engine per agent model
        # a LoRA team on one engine, with the TIS correction on (its weights ~1 when the engine is current)
        ([{"model": SMOL, "adapter": ADAPTER}, {"model": SMOL, "adapter": ADAPTER, "share_weights_with": 0}], 5e-2, 1,
         {"vllm_importance_sampling_correction": True}),
    ],
    ids=["full", "lora"],
)  # fmt: skip
def test_the_engine_samples_from_the_current_weights_after_every_step(
    monkeypatch, agents, learning_rate, engines, loss
):
    synced, built, pushes = fit_gaps(agents, learning_rate, loss)
    assert built == engines
    assert max(synced) < GAP_TOLERANCE, synced
    assert pushes >= 2 * len(agents)  # after every batch's steps (LoRA: the first adapter load too)
    _without_sync(monkeypatch)
    stale, _, _ = fit_gaps(agents, learning_rate, loss)
    assert stale[0] < GAP_TOLERANCE  # before any step both sample from the same weights
    assert min(stale[1:]) > 10 * GAP_TOLERANCE, stale  # after a step the engine's weights are old


def _fit_engine(batches: int, tmp_path, ckpt_path=None, save_every: int = 0):
    """Full fine-tuning of two SmolLM2 agents through the engine for ``batches`` batches (resumed from
    ``ckpt_path`` if given; a checkpoint every ``save_every`` steps into ``tmp_path``); the agents' weights."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from comlrl_lightning.infra.checkpoint_io import AtomicCheckpointIO

    pl.seed_everything(0)
    module = MAGRPO(
        agents=[{"model": SMOL}, {"model": SMOL}],
        rollout={"num_generations": 2},
        sampling={"max_new_tokens": 8, "generation_backend": "vllm", "vllm_cpu_kv_cache_gib": 0.25,
                  "vllm_max_model_length": 512},
        learning_rate=1e-3,
    )  # fmt: skip
    saver = (
        [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=save_every, save_top_k=-1)]
        if save_every
        else []
    )
    trainer = pl.Trainer(
        max_steps=MAGRPO.max_steps_for(batches, 2), accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=saver,
        enable_checkpointing=bool(save_every), plugins=[AtomicCheckpointIO()],
    )  # fmt: skip
    trainer.fit(module, LengthRatioDataModule(batch_size=2, num_train=8), ckpt_path=ckpt_path)
    module.team.engine_pool().close()  # one team's engines at a time (24 GB)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_a_run_resumed_with_the_engine_equals_the_uninterrupted_run_bit_for_bit(tmp_path):
    import os

    straight = _fit_engine(2, tmp_path / "straight")
    _fit_engine(1, tmp_path / "a", save_every=MAGRPO.max_steps_for(1, 2))
    (ckpt,) = os.listdir(tmp_path / "a")
    resumed = _fit_engine(2, tmp_path / "b", ckpt_path=str(tmp_path / "a" / ckpt))
    first = _fit_engine(1, tmp_path / "c")
    assert straight.keys() == resumed.keys()
    differ = {
        k: float((straight[k] - resumed[k]).abs().max())
        for k in straight
        if not torch.equal(straight[k], resumed[k])
    }
    assert not differ, f"{len(differ)} of {len(straight)} tensors differ, e.g. {list(differ.items())[:3]}"
    # the second batch moved the weights: equality above is not two copies of the checkpoint
    assert any(not torch.equal(straight[k], first[k]) for k in straight)


def test_a_cli_fit_of_a_team_with_two_engines_exits_without_a_traceback(tmp_path):
    # the CLI destroys the default process group at its end; the engines' own groups went with it, and
    # each engine's exit handler then printed "ValueError: Invalid process group specified"
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, "-m", "comlrl_lightning", "fit", "--config", f"{root}/configs/coop_coordination.yaml",
         f"--trainer.max_steps={MAGRPO.max_steps_for(1, 2)}", f"--trainer.default_root_dir={tmp_path}",
         "--validate_before_fit=false", "--trainer.limit_val_batches=0",
         "--model.init_args.sampling.generation_backend=vllm",
         "--model.init_args.sampling.vllm_cpu_kv_cache_gib=0.25",
         "--model.init_args.sampling.vllm_max_model_length=512"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": root},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "`Trainer.fit` stopped" in run.stdout + run.stderr  # it trained
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


def test_an_engine_first_used_by_a_validation_rollout_takes_weight_pushes_after_it():
    # Lightning validates under torch.inference_mode; the main job validates before it trains, so its
    # engines started there: the first push after the first optimizer step failed with "Inplace update
    # to inference tensor outside InferenceMode" (seen in benchmarks/learning/engine_fit.py's first run)
    team = team_of("vllm", [{"model": SMOL}], max_new_tokens=4)
    prompts = [render_prompt(team.tokenizers[0], [PROMPTS[0]], [], team.specs[0].chat_template)]
    try:
        with torch.inference_mode():
            team.generate_one(0, prompts, 1, greedy=True)  # builds the engine (a validation rollout)
        for inference in (False, True, False):  # a push in training, in validation, then in training again
            with torch.no_grad():
                next(team.agents[0].parameters()).add_(1e-3)
            with torch.inference_mode(inference):
                team.generate_one(0, prompts, 1, greedy=True)
        assert team.engine_pool().stats.syncs == 3
    finally:
        team.engine_pool().close()


def test_a_lora_team_rolls_out_in_one_engine_call_as_it_would_agent_by_agent(monkeypatch):
    # two adapters on one base, made different (a fresh adapter's B is zero: both would be the base);
    # the joint call schedules both agents' requests together, each with its own adapter and seed
    team = team_of("vllm", [{"model": SMOL, "adapter": ADAPTER},
                            {"model": SMOL, "adapter": ADAPTER, "share_weights_with": 0}], max_new_tokens=12)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(2):
            for name, p in team.agents[i].named_parameters():
                if "lora_B" in name:  # each agent is its own PeftModel with one adapter
                    p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    pool = team.engine_pool()
    texts = [render_prompt(team.tokenizers[0], [p], [], True) for p in PROMPTS]
    # each agent's call gets the seed of its turn (agent 0: 11, agent 1: 22), jointly or apart (one call per
    # agent would draw agent 1's seed after vLLM's own use of torch's generator in agent 0's call)
    seeds, sampling_params = [], engine_pool._sampling_params
    monkeypatch.setattr(
        engine_pool, "_sampling_params", lambda *a: {**sampling_params(*a), "seed": seeds.pop(0)}
    )
    try:
        assert pool.joint_groups() == [[0, 1]]
        for k, greedy in ((1, True), (2, False)):  # sampled: each request's seed decides its tokens
            seeds[:] = [11, 22]
            joint = team.generate([texts, texts], k, greedy=greedy)
            pool.engine(0).reset_prefix_cache()  # the calls below compute their prompts again
            seeds[:] = [11, 22]
            apart = [team.generate_one(i, texts, k, greedy=greedy) for i in range(2)]
            for i in range(2):
                assert joint[i].texts == apart[i].texts, (k, i)
                assert torch.equal(joint[i].completion_ids, apart[i].completion_ids)
                # batched with the other agent's rows the kernels sum in another order: within the fp32 gap
                torch.testing.assert_close(
                    joint[i].engine_logprobs, apart[i].engine_logprobs, atol=GAP_TOLERANCE, rtol=0
                )
            assert (
                joint[0].texts != joint[1].texts
            )  # the same prompts: each agent decoded through its own adapter
    finally:
        pool.close()


def test_the_samples_of_a_block_aligned_prompt_share_its_prefill_and_score_as_the_trainer_does(monkeypatch):
    # K samples of one prompt are K requests sharing its KV blocks; a prompt of whole blocks used to recompute
    # its last block per sample (vLLM's hit stops one token short, rounded down to a block): engine_prefill
    # lets the later samples compute their last token alone, writing it into the shared block
    from vllm.v1.core.sched.scheduler import Scheduler

    from comlrl_lightning.core.loss import completion_logprobs
    from comlrl_lightning.team.engine import CPU_BLOCK_SIZE

    team, k = team_of("vllm", [{"model": SMOL}], max_new_tokens=6), 4
    tok = team.tokenizers[0]

    def of_length(word: str, tokens: int) -> str:
        return next(
            t for n in range(200) if len(tok(t := f"{word}:" + f" {word}" * n)["input_ids"]) == tokens
        )

    # a prompt of exactly one KV block, one of exactly two, without a common prefix
    texts = [of_length("one", CPU_BLOCK_SIZE), of_length("two", 2 * CPU_BLOCK_SIZE)]
    steps, schedule = [], Scheduler.schedule

    def counted(self, *args, **kwargs):
        out = schedule(self, *args, **kwargs)
        steps.append(out.total_num_scheduled_tokens)
        return out

    monkeypatch.setattr(Scheduler, "schedule", counted)
    try:
        torch.manual_seed(0)
        gen = team.generate_one(0, texts, k)
        first_call = list(steps)
        # the later samples write the shared slot in the same step as the first: the same call draws the
        # same tokens and log-probs bit for bit (a seeded run and its resume sample alike)
        team.engine_pool().engine(0).reset_prefix_cache()
        torch.manual_seed(0)
        again = team.generate_one(0, texts, k)
    finally:
        team.engine_pool().close()
    steps = first_call
    assert torch.equal(again.completion_ids, gen.completion_ids)
    assert torch.equal(again.engine_logprobs, gen.engine_logprobs)
    assert gen.prompt_mask.sum(1).tolist() == [CPU_BLOCK_SIZE] * k + [2 * CPU_BLOCK_SIZE] * k
    # the first step: each prompt once, then one token per further sample (vLLM's rule: 4 x 32 + 64 + 3 x 32)
    assert steps[0] == 3 * CPU_BLOCK_SIZE + 2 * (k - 1), steps
    # the recomputed last token's K/V went where every sample reads it: each sample's tokens score as the
    # trainer scores them (a stale or missing slot there moves the log-probs by far more than the fp32 gap)
    with torch.no_grad():
        trainer = completion_logprobs(
            team.agents[0], gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask,
            temperature=team.sampling[0].temperature,
        )  # fmt: skip
    assert gen.completion_mask.sum() >= 2 * k  # every sample has tokens to compare
    gap = (trainer - gen.engine_logprobs).abs() * gen.completion_mask
    assert float(gap.max()) < GAP_TOLERANCE, gap.max()
    assert len(set(gen.texts)) > 1  # sampled, not one completion K times
