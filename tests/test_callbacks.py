"""Callbacks: RewardLogger, CompletionLogger, GradientCheckpointing, AgentCheckpoint; the shipped config."""

import copy
import glob
import html
import os
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
import yaml
from experiments import experiment
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import AgentCheckpoint, CompletionLogger, GradientCheckpointing, RewardLogger
from comlrl_lightning.callbacks.agent_checkpoint import save_agents
from comlrl_lightning.callbacks.completion_logger import completion_report
from comlrl_lightning.callbacks.gradient_checkpointing import (
    enable_gradient_checkpointing,
    is_gradient_checkpointing,
)
from comlrl_lightning.callbacks.reward_logger import step_metrics
from comlrl_lightning.core.loss import completion_logprobs
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.team.agents import build_tiny_gpt2, byte_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def tiny_magrpo(**kwargs):
    kwargs = {"max_new_tokens": 12, **kwargs}
    return MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, learning_rate=1e-3, **kwargs)


def fake_output(rewards, lengths, clipped, k=2, turns=None, components=None, stats=None, texts=None):
    """A training-step output dict (2 agents, E episodes, aligned joint actions) with chosen values."""
    rewards = torch.tensor(rewards)
    e = len(rewards) // k
    return {
        "rewards": rewards,
        "reward_std": torch.tensor(0.5),
        "frac_reward_zero_std": torch.tensor(0.0),
        "reward_components": components or {"fmt": torch.tensor([1.0, float("nan")] * e), "len": rewards * 2},
        "turn_rewards": turns[0] if turns else [rewards],
        "turn_returns": turns[1] if turns else [rewards],
        "completion_lengths": [torch.tensor(x) for x in lengths],
        "clipped": [torch.tensor(x) for x in clipped],
        "agent_stats": stats or [{"loss": 0.1, "kl": 0.01, "clip_ratio": 0.2, "clip_ratio_low": 0.05,
                                  "clip_ratio_high": 0.15, "grad_norm": 3.0, "entropy": 1.5},
                                 {"loss": 0.2, "kl": 0.02, "clip_ratio": 0.4, "clip_ratio_low": 0.25,
                                  "clip_ratio_high": 0.15, "grad_norm": 4.0, "entropy": 0.5}],
        "num_episodes": e,
        "num_tokens": int(sum(sum(x) for x in lengths)),
        "prompts": [[f"p{i} ep{j}" for j in range(e)] for i in range(2)],
        "completions": texts or [[f"a{i}-{r}" for r in range(e * k)] for i in range(2)],
        "turn0_rewards": rewards.view(e, k),
        "num_generations": k,
        "rollout_time_s": 0.1,
        "step_time_s": 0.2,
    }  # fmt: skip


# ------------------------------------------------------------------ RewardLogger
def test_step_metrics_match_values_computed_by_hand():
    out = fake_output(
        rewards=[0.0, 1.0, 0.5, 0.5], lengths=[[3, 5, 7, 9], [10, 2, 4, 4]],
        clipped=[[False, False, True, False], [True, True, False, False]],
        turns=([torch.tensor([0.0, 1.0, 0.5, 0.5]), torch.tensor([2.0, 4.0])],
               [torch.tensor([1.0, 3.0, 1.5, 1.5]), torch.tensor([2.0, 4.0])]),
    )  # fmt: skip
    m = step_metrics(out, {"beta": 0.1, "num_iterations": 2}, wall_s=2.0)
    assert m["rewards/fmt/mean"] == 1.0  # NaN entries ignored
    assert m["rewards/len/mean"] == 1.0
    assert m["turn_0/reward"] == 0.5 and m["turn_1/reward"] == 3.0
    assert m["turn_0/return"] == 1.75 and m["turn_1/return"] == 3.0
    assert [m[f"z_agent_0/completions/{k}_length"] for k in ("mean", "min", "max")] == [6, 3, 9]
    assert (m["z_agent_1/completions/min_length"], m["z_agent_1/completions/max_length"]) == (2, 10)
    assert (m["z_agent_0/completions/clipped_ratio"], m["z_agent_1/completions/clipped_ratio"]) == (0.25, 0.5)
    assert m["completions/clipped_ratio"] == 3 / 8
    assert (m["z_agent_0/kl"], m["z_agent_1/clip_ratio/region_mean"]) == (0.01, 0.4)
    assert m["z_agent_1/grad_norm"] == 4.0
    assert (m["z_agent_0/clip_ratio/low_mean"], m["z_agent_1/clip_ratio/high_mean"]) == (0.05, 0.15)
    # TRL's team-level names beside the per-agent ones: means over agents, min / max over agents
    assert m["entropy"] == 1.0 and m["kl"] == pytest.approx(0.015)
    assert m["clip_ratio/region_mean"] == pytest.approx(0.3)
    assert m["clip_ratio/low_mean"] == pytest.approx(0.15) and m["clip_ratio/low_min"] == 0.05
    assert m["clip_ratio/high_mean"] == pytest.approx(0.15) and m["clip_ratio/high_max"] == 0.15
    assert (m["completions/min_length"], m["completions/max_length"]) == (2, 10)
    # not clipped: agent 0's 3, 5, 9 and agent 1's 4, 4
    assert m["completions/mean_terminated_length"] == pytest.approx(25 / 5)
    assert m["z_agent_0/completions/mean_terminated_length"] == pytest.approx(17 / 3)
    assert m["tokens_per_second"] == (24 + 20) / 2.0 and m["episodes_per_second"] == 1.0
    # beta = 0, one turn: no KL, no per-turn metrics; the clip ratios are logged (0 on-policy), as in TRL
    single_turn = fake_output([0.0, 1.0], [[1, 2], [3, 4]], [[False] * 2] * 2)
    plain = step_metrics(single_turn, {"beta": 0.0, "num_iterations": 1}, 1.0)
    assert not [k for k in plain if k.endswith("kl") or k.startswith("turn_")]
    assert "z_agent_1/grad_norm" in plain and "clip_ratio/region_mean" in plain


class ListLogger(Logger):
    """Keeps every ``log_metrics`` call in memory."""

    def __init__(self):
        super().__init__()
        self.rows = []

    name = "list"
    version = 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


class Replay(pl.LightningModule):
    """Returns pre-built training-step outputs; no model, no optimizer."""

    def __init__(self, outputs, beta=0.0, num_iterations=1):
        super().__init__()
        self.save_hyperparameters(ignore=["outputs"])
        self.outputs = outputs
        self.automatic_optimization = False
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(len(self.outputs)), batch_size=1)

    def training_step(self, batch, batch_idx):
        return self.outputs[batch_idx]

    def configure_optimizers(self):
        return None


def replay_fit(outputs, callbacks, loggers, **hp):
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=1, logger=loggers, callbacks=callbacks, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Replay(outputs, **hp))
    return trainer


def test_reward_logger_logs_each_step_and_aggregates_the_epoch(tmp_path):
    outs = [
        fake_output([0.0, 1.0, 0.5, 0.5], [[3, 5, 7, 9], [10, 2, 4, 4]],
                    [[False, False, True, False], [True, True, False, False]]),
        fake_output([1.0, 1.0], [[1, 20], [6, 6]], [[True, True], [False, False]]),
    ]  # fmt: skip
    outs[1]["reward_std"] = torch.tensor(0.0)
    logger = ListLogger()
    replay_fit(outs, [RewardLogger()], [logger], beta=0.5)
    steps = {step: row for step, row in logger.rows if "z_agent_0/completions/min_length" in row}
    assert sorted(steps) == [0, 1]  # x-axis: batches
    assert steps[0]["z_agent_0/completions/min_length"] == 3
    assert steps[1]["z_agent_0/completions/max_length"] == 20
    assert steps[1]["z_agent_1/kl"] == pytest.approx(0.02)
    epoch = {k: v for _, row in logger.rows for k, v in row.items() if k.startswith("epoch/")}
    assert epoch["epoch/z_agent_0/completions/min_length"] == 1  # min over both steps
    assert epoch["epoch/z_agent_0/completions/max_length"] == 20
    assert epoch["epoch/z_agent_1/completions/mean_length"] == pytest.approx((20 + 12) / 6)
    assert epoch["epoch/reward"] == pytest.approx(4.0 / 6)  # mean over all 6 joint actions
    assert epoch["epoch/reward_std"] == pytest.approx(0.5 * 2 / 3)  # per-step std weighted by episodes (2, 1)
    assert epoch["epoch/completions/clipped_ratio"] == pytest.approx(5 / 12)
    assert epoch["epoch/rewards/fmt/mean"] == 1.0  # NaNs ignored


# --------------------------------------------------------------- CompletionLogger
def table_rows(text):
    lines = text.split("\n")
    assert lines[0] == "| episode | joint action | turn | agent | prompt | completion | reward |"
    assert lines[1] == "|---|---|---|---|---|---|---|"
    return [line[2:-2].split(" | ") for line in lines[2:]]


def test_completion_report_is_a_table_of_episode_turn_agent_prompt_completion_reward():
    out = fake_output([0.1, 0.2, 0.3, 0.4], [[1] * 4] * 2, [[False] * 4] * 2,
                      texts=[["x|y", "if a:\n    b<2", "c", "d"], ["A" * 50, "B", "C", "D"]])  # fmt: skip
    out["prompts"] = [["<|im_start|>user\nq0<|im_end|>"] * 2] * 2  # rendered: must not be shown
    out["user_prompts"] = [["helper for\nq0", "helper for q1"], ["main q0", "main q1"]]
    text = completion_report(out, max_rows=3, max_chars=20)
    assert "im_start" not in text
    rows = table_rows(text)
    assert len(rows) == 3 * 2  # max_rows joint actions, one row per agent
    rows = [[cell.removeprefix("<pre>").removesuffix("</pre>") for cell in row] for row in rows]  # every cell
    assert rows[0] == ["0", "0", "0", "agent&#95;0", "helper for<br>q0", "x&#124;y", "0.1"]
    assert rows[1] == ["0", "0", "0", "agent&#95;1", "main q0", "A" * 20 + "…", "0.1"]
    # the prompt only in the episode's first joint action; a completion keeps its indentation, escaped
    assert rows[2] == ["0", "1", "0", "agent&#95;0", "", "if a:<br>    b&lt;2", "0.2"]
    assert rows[4][:5] == ["1", "0", "0", "agent&#95;0", "helper for q1"] and rows[4][6] == "0.3"


def test_tensorboards_own_renderer_makes_the_report_an_html_table():
    from tensorboard.plugin_util import markdown_to_safe_html

    out = fake_output([0.5, 1.0], [[1, 2], [3, 4]], [[False] * 2] * 2,
                      texts=[["<b>x</b>", "a | b"], ["if a:\n  b", "c\rd\u2028e\x0bf"]])  # fmt: skip
    rendered = markdown_to_safe_html(completion_report(out, 10, 100))
    assert (
        rendered.startswith("<table>") and rendered.count("<tr>") == 1 + 2 * 2
    )  # header + N rows per joint action
    assert "<td><pre>&lt;b&gt;x&lt;/b&gt;</pre></td>" in rendered  # a completion's HTML is shown, not run
    assert "<td><pre>a &#124; b</pre></td>" in rendered and "<pre>if a:<br>  b</pre>" in rendered
    assert "<pre>c<br>d<br>e<br>f</pre>" in rendered  # any line boundary stays inside its cell


def test_a_completion_is_shown_in_full_as_unformatted_monospace_code():
    # before the fix the logger cut it at 300 characters, and markdown made __init__ bold and *args italic
    from tensorboard.plugin_util import markdown_to_safe_html

    code = (
        "class A:\n    def __init__(self, *args, **kw):\n        self.x = [a_1 * 2 for a_1 in args]  # `x`\n"
    )
    code += "\n".join(f"    v{i} = {i}" for i in range(60))  # ~700 characters
    out = fake_output([0.5, 1.0], [[1, 2], [3, 4]], [[False] * 2] * 2, texts=[[code, "b"], ["c", "d"]])
    assert CompletionLogger().max_chars is None
    rendered = markdown_to_safe_html(completion_report(out, 10, CompletionLogger().max_chars))
    # the sixth cell of the first row: episode, joint action, turn, agent, prompt, completion
    cell = rendered.split("<td><pre>")[6].split("</pre></td>")[0]
    assert html.unescape(cell.replace("<br>", "\n")) == code  # every character, indentation included
    assert "<strong>" not in rendered and "<em>" not in rendered and "<code>" not in rendered


def test_completion_report_cross_mode_pairs_every_sample_of_each_agent():
    out = fake_output([0.0, 0.1, 0.2, 0.3], [[1, 1], [1, 1]], [[False] * 2] * 2, k=2)
    out["turn0_rewards"] = torch.tensor([[0.0, 0.1, 0.2, 0.3]])  # one episode, K^N = 4 joint actions
    out["completions"] = [["a0", "a1"], ["b0", "b1"]]
    rows = table_rows(completion_report(out, 10, 100))
    pairs = [(rows[2 * r][5], rows[2 * r + 1][5]) for r in range(4)]
    assert pairs == [(f"<pre>{a}</pre>", f"<pre>{b}</pre>") for a, b in
                     [("a0", "b0"), ("a0", "b1"), ("a1", "b0"), ("a1", "b1")]]  # fmt: skip


def test_completion_logger_writes_text_on_the_batch_axis_from_rank_zero(tmp_path):
    outs = [fake_output([0.0, 1.0], [[1, 2], [3, 4]], [[False] * 2] * 2) for _ in range(4)]
    tb = TensorBoardLogger(str(tmp_path), name="t")
    replay_fit(outs, [CompletionLogger(every_n_steps=2, max_rows=1)], [tb])
    acc = EventAccumulator(tb.log_dir, size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("completions/text_summary")
    assert [e.step for e in events] == [1, 3]  # batches 2 and 4, scalars' x-axis
    text = events[0].tensor_proto.string_val[0].decode()
    rows = table_rows(text)
    assert [r[5] for r in rows] == ["<pre>a0-0</pre>", "<pre>a1-0</pre>"]  # max_rows=1
    assert rows[0][6] == "<pre>0</pre>"
    with pytest.raises(ValueError, match="every_n_steps"):
        CompletionLogger(every_n_steps=0)


# ----------------------------------------------------------- GradientCheckpointing
def _logprob_grads(model, inputs):
    saved, params = {}, {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):  # bytes of the non-parameter tensors autograd keeps for backward
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch.manual_seed(5)  # same dropout masks in both runs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logps = completion_logprobs(model, *inputs, temperature=0.7)
    logps.sum().backward()
    return {n: p.grad for n, p in model.named_parameters()}, sum(saved.values())


def test_gradient_checkpointing_keeps_gradients_and_cuts_saved_activations():
    tok = byte_tokenizer()
    torch.manual_seed(0)
    plain = build_tiny_gpt2(tok, n_layer=4).train()
    ckpt = copy.deepcopy(plain)
    assert enable_gradient_checkpointing([ckpt, ckpt]) == 1  # shared module counted once
    assert enable_gradient_checkpointing([ckpt]) == 0  # idempotent
    assert is_gradient_checkpointing(ckpt) and not is_gradient_checkpointing(plain)
    flag = (
        "is_activation_checkpointing"
        if hasattr(ckpt, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    assert getattr(ckpt, flag) and not getattr(plain, flag)  # HF's own flag
    assert ckpt.config.use_cache is True  # generation keeps its KV cache
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 300, (4, 16), generator=g)
    completion = torch.randint(3, 300, (4, 32), generator=g)
    inputs = (prompt, torch.ones_like(prompt), completion, torch.ones_like(completion))
    grads_plain, bytes_plain = _logprob_grads(plain, inputs)
    grads_ckpt, bytes_ckpt = _logprob_grads(ckpt, inputs)
    for name, grad in grads_plain.items():
        assert torch.allclose(grad, grads_ckpt[name], atol=1e-6), name
    assert bytes_ckpt < 0.2 * bytes_plain  # 4 layers' activations recomputed instead of kept


def test_gradient_checkpointing_callback_trains_exactly_like_without(trainer_factory):
    def fit(callbacks):
        pl.seed_everything(0)
        model = tiny_magrpo()
        data = LengthRatioDataModule(batch_size=2, num_train=8)
        trainer_factory(max_steps=4, callbacks=callbacks).fit(model, data)
        return model

    callback = GradientCheckpointing()
    with_gc, without = fit([callback]), fit([])
    assert all(is_gradient_checkpointing(a) for a in with_gc.agents)
    for a, b in zip(with_gc.state_dict().values(), without.state_dict().values()):
        assert torch.equal(a, b)  # same samples (generation unaffected) and same updates
    callback.on_fit_start(None, with_gc)  # a second stage: nothing changes, nothing raises


# ---------------------------------------------------------------- AgentCheckpoint
def test_agent_checkpoint_keeps_last_k_loadable_hf_folders(trainer_factory, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_magrpo(max_new_tokens=8)
    callback = AgentCheckpoint(dirpath=str(tmp_path / "agents"), every_n_steps=1, keep_last=2)
    trainer = trainer_factory(max_steps=2 * 3, callbacks=[callback])
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=8))
    assert sorted(os.listdir(tmp_path / "agents")) == ["step_2", "step_3"]  # step_1 pruned, no temp dirs left
    assert callback.state_dict()["saved"] == [str(tmp_path / "agents" / f"step_{n}") for n in (2, 3)]
    for i, agent in enumerate(model.agents):
        folder = tmp_path / "agents" / "step_3" / f"agent_{i}"
        loaded = AutoModelForCausalLM.from_pretrained(folder)
        reference = agent.state_dict()
        for name, tensor in loaded.state_dict().items():
            assert torch.equal(tensor, reference[name]), name
        tok = AutoTokenizer.from_pretrained(folder)
        assert tok("ab")["input_ids"] == model.tokenizers[i]("ab")["input_ids"]
    # after a resume into the same folder, pruning continues from the checkpointed list
    resumed = AgentCheckpoint(dirpath=str(tmp_path / "agents"), every_n_steps=1, keep_last=2)
    resumed.load_state_dict(callback.state_dict())
    resumed.save(SimpleNamespace(is_global_zero=True), model, 4)
    assert sorted(os.listdir(tmp_path / "agents")) == ["step_3", "step_4"]


def test_agent_checkpoint_write_is_atomic_when_saving_fails(tmp_path):
    tok = byte_tokenizer()
    models = [build_tiny_gpt2(tok), build_tiny_gpt2(tok)]
    save_agents(models, [tok, tok], str(tmp_path / "step_1"))
    before = sorted(os.listdir(tmp_path / "step_1" / "agent_1"))

    def half_then_fail(self, folder, **kwargs):
        os.makedirs(folder, exist_ok=True)
        Path(folder, "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    models[1].save_pretrained = half_then_fail.__get__(models[1])
    with pytest.raises(OSError, match="disk full"):
        save_agents(models, [tok, tok], str(tmp_path / "step_2"))
    assert os.listdir(tmp_path) == ["step_1"]  # no step_2, no temporary directory
    assert sorted(os.listdir(tmp_path / "step_1" / "agent_1")) == before
    with pytest.raises(OSError, match="disk full"):  # replacing an existing step folder fails the same way
        save_agents(models, [tok, tok], str(tmp_path / "step_1"))
    assert os.listdir(tmp_path) == ["step_1"]
    assert sorted(os.listdir(tmp_path / "step_1" / "agent_1")) == before


BAD_ARGS = [({"every_n_steps": -1}, "every_n_steps"), ({"keep_last": 0}, "keep_last")]


@pytest.mark.parametrize("kwargs,field", BAD_ARGS)
def test_agent_checkpoint_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AgentCheckpoint(**kwargs)


# ------------------------------------------------------------- the shipped config
def test_toy_config_fit_writes_all_metrics_text_and_agent_folders(tmp_path):
    from comlrl_lightning.cli import main

    args = experiment("toy_length_ratio.yaml")
    assert "configs/callbacks/default.yaml" in args
    cfg = yaml.safe_load((ROOT / "configs" / "callbacks" / "default.yaml").read_text())
    classes = [c["class_path"].rsplit(".", 1)[1] for c in cfg["trainer"]["callbacks"]]
    assert classes == [
        "InterruptCheckpoint",
        "RewardLogger",
        "CompletionLogger",
        "AgentCheckpoint",
        "ModelCheckpoint",
    ]
    cfg["trainer"]["callbacks"][2]["init_args"]["every_n_steps"] = 2  # the shipped 25 is past this short run
    config = tmp_path / "callbacks.yaml"
    config.write_text(yaml.safe_dump(cfg))
    os.chdir(ROOT)  # the config's paths are relative to the repository root
    args = [str(config) if a == "configs/callbacks/default.yaml" else a for a in args]
    main(["fit", *args, "--trainer.max_steps=8", "--trainer.log_every_n_steps=1",
          f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_progress_bar=false",
          "--model.init_args.sampling.max_new_tokens=16", "--data.init_args.batch_size=2"])  # fmt: skip
    (events,) = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)
    }  # one run: its validation before fit and its fit write a file each
    acc = EventAccumulator(events, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {
        "rewards/length_ratio/mean", "completions/clipped_ratio", "tokens_per_second", "episodes_per_second",
        "epoch/reward", "epoch/reward_std", "epoch/rewards/length_ratio/mean",
        "epoch/completions/clipped_ratio",
    }  # fmt: skip
    for i in range(2):
        expected |= {f"z_agent_{i}/completions/{m}_length" for m in ("mean", "min", "max")}
        expected |= {f"z_agent_{i}/completions/clipped_ratio"}
        expected |= {f"z_agent_{i}/grad_norm"}
        expected |= {f"epoch/z_agent_{i}/completions/{m}_length" for m in ("mean", "min", "max")}
    assert expected <= tags, expected - tags
    team = {
        "entropy",
        "clip_ratio/low_mean",
        "clip_ratio/low_min",
        "clip_ratio/high_mean",
        "clip_ratio/high_max",
        "clip_ratio/region_mean",
        "completions/min_length",
        "completions/max_length",
        "completions/mean_terminated_length",
    }
    assert team <= tags, team - tags  # a default run has TRL's team-level curves, clip ratio included
    assert not {t for t in tags if t.endswith("kl")}  # beta = 0
    # 8 optimizer steps = 4 batches
    assert [s.step for s in acc.Scalars("z_agent_1/grad_norm")] == [0, 1, 2, 3]
    assert [e.step for e in acc.Tensors("completions/text_summary")] == [1, 3]
    log_dir = Path(events)
    assert sorted(os.listdir(log_dir / "agents")) == ["step_4"]
    assert sorted(os.listdir(log_dir / "agents" / "step_4")) == ["agent_0", "agent_1"]
    assert (log_dir / "checkpoints" / "last.ckpt").exists()


# ----------------------------------------------------------- progress bar
def test_the_progress_bar_shows_no_v_num_and_no_negative_epoch_count(tmp_path):
    from lightning.pytorch.demos.boring_classes import BoringModel

    from comlrl_lightning.callbacks import RichProgress, TQDMProgress

    for bar in (RichProgress(), TQDMProgress()):
        trainer = pl.Trainer(max_epochs=-1, max_steps=1, callbacks=[bar], logger=TensorBoardLogger(str(tmp_path)),
                             enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0)  # fmt: skip
        model = BoringModel()
        trainer.fit(model)
        assert "v_num" not in bar.get_metrics(trainer, model)
    rich = RichProgress()
    rich._trainer = trainer
    assert rich._get_train_description(1).strip() == "Epoch 1"  # Lightning's: "Epoch 1/-2"


@pytest.mark.parametrize("bar_cls", ["RichProgress", "TQDMProgress"])
def test_the_progress_bar_total_is_the_batches_the_epoch_really_runs(tmp_path, bar_cls):
    # before the fix a 2-agent fit stopped by max_steps showed e.g. "3/8" batches (Lightning: the epoch's
    # batches, capped only with max_epochs=-1 and then by optimizer steps, two a batch here)
    import comlrl_lightning.callbacks as C

    bar = getattr(C, bar_cls)()

    class Totals(pl.Callback):
        def __init__(self):
            self.seen = []

        def on_train_epoch_end(self, trainer, pl_module):  # the bar's total, and the batches the epoch ran
            shown = (bar.progress.tasks[bar.train_progress_bar_id] if bar_cls == "RichProgress"
                     else bar.train_progress_bar).total  # fmt: skip
            self.seen.append((shown, trainer.fit_loop.epoch_loop.batch_progress.current.completed))

    totals = Totals()
    trainer = pl.Trainer(accelerator="cpu", max_steps=MAGRPO.max_steps_for(5, 2), callbacks=[bar, totals],
                         logger=False, enable_model_summary=False, enable_checkpointing=False,
                         limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(tiny_magrpo(max_new_tokens=4), LengthRatioDataModule(num_train=8, num_val=2, batch_size=2))
    assert totals.seen == [(4, 4), (1, 1)]  # 4 batches an epoch, 5 in all: each total is what ran


def test_a_round_loop_shows_its_round_not_an_epoch_of_max_epochs():
    from comlrl_lightning import MADPOIter
    from comlrl_lightning.callbacks import RichProgress

    bar = RichProgress()
    module = MADPOIter(agents=["builtin:tiny-gpt2"] * 2, rounds=dict(num_rounds=3))
    bar._trainer = SimpleNamespace(lightning_module=module, max_epochs=1000)
    assert bar._get_train_description(1).strip() == "Round 1/3"  # Lightning's: "Epoch 1/999"
    module._round = 3  # every round done
    assert bar._get_train_description(7).strip() == "Round 3/3"


def test_tensorboard_gets_a_custom_scalars_layout_with_the_team_first(tmp_path):
    # before the fix TensorBoard opened on per-agent cards sorted by tag, the shared reward far below
    from tensorboard.plugins.custom_scalar import layout_pb2

    tb = TensorBoardLogger(str(tmp_path), name="t")
    trainer = pl.Trainer(accelerator="cpu", max_steps=MAGRPO.max_steps_for(1, 2), logger=tb, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(tiny_magrpo(max_new_tokens=4), LengthRatioDataModule(num_train=4, num_val=2, batch_size=2))
    acc = EventAccumulator(tb.log_dir, size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    first = layout.category[0]
    assert first.title == "1 team: the shared reward"
    assert list(first.chart[0].multiline.tag) == ["^reward$", "^val/reward$"]
    assert [c.title for c in layout.category][-2:] == [
        "4 per agent",
        "5 throughput",
    ]  # per-agent curves after
