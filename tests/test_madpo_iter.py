"""Iterative MADPO on tiny models: rounds of build (current vs comparator), replay and DPO training;
bit-exact resume inside a build, inside training and between rounds; the api comparator in a fit
against a real local HTTP server."""

from __future__ import annotations

import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from local_http import chat_reply, serving

from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.records import StepOutput
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.preference.madpo_iter import MADPOIter, text_pair_tokens
from comlrl_lightning.preference.pairs import read_pairs

server_factory = pytest.fixture(serving)
K, BATCH, TRAIN, EPOCHS, PAIRS_PER_UPDATE = 3, 2, 4, 2, 3


def _module(**kw):
    args = dict(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        learning_rate=1e-3,
        preference=dict(preference_num_candidates=K, preference_pairs_per_sample=2),
        dpo=dict(num_train_epochs=EPOCHS, train_batch_size=PAIRS_PER_UPDATE),
        rounds=dict(num_rounds=2),
        comparator=dict(comparator_policy="current_copy"),
        sampling={"max_new_tokens": 8},
    )
    args.update(kw)
    return MADPOIter(**args)


class Record(pl.Callback):
    """Per step: the round and phase after it, the outputs, and the logged pair counts."""

    def __init__(self):
        self.steps, self.pairs = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before = (pl_module.round, pl_module._phase)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append((pl_module.round, pl_module._phase, outputs))
        if self.before[1] == "build" and (pl_module.round, pl_module._phase) != self.before:
            m = trainer.callback_metrics  # the build just ended: its pair counts
            self.pairs.append(tuple(int(m[k]) for k in (M.PAIRS_CURRENT, M.PAIRS_TRAIN, M.PAIRS_TOTAL)))


def test_two_rounds_build_replay_and_train_then_stop(trainer_factory, tmp_path):
    pl.seed_everything(0)
    model, rec = _module(), Record()
    model.configure_model()
    before = [[p.detach().clone() for p in a.parameters()] for a in model.agents]
    trainer = trainer_factory(max_steps=-1, max_epochs=100, callbacks=[rec], default_root_dir=tmp_path)
    trainer.fit(model, LengthRatioDataModule(batch_size=BATCH, num_train=TRAIN))
    assert model.round == 2 and trainer.should_stop
    shards = [read_pairs(tmp_path / "preference_replay" / f"round_{r}.jsonl", 2) for r in range(2)]
    counts = [len(s) for s in shards]
    assert all(0 < c <= TRAIN * 2 for c in counts)  # at most preference_pairs_per_sample per prompt
    # replay 'current': each round trains on exactly its own pairs; the total counts every shard
    assert rec.pairs == [(counts[0], counts[0], counts[0]), (counts[1], counts[1], sum(counts))]
    builds = TRAIN // BATCH
    updates = [EPOCHS * -(-c // PAIRS_PER_UPDATE) for c in counts]
    assert len(rec.steps) == 2 * builds + sum(updates)
    assert trainer.global_step == 2 * len(rec.steps)  # N steps per training_step, build steps included
    trained = [out for _, _, out in rec.steps if isinstance(out, StepOutput)]  # build steps: none
    assert [o.num_episodes for o in trained].count(PAIRS_PER_UPDATE) >= 2 and len(trained) == sum(updates)
    assert sum(o.num_episodes for o in trained) == EPOCHS * sum(counts)  # every pair, once per pass
    # each pair is current i against comparator i, the chosen side scored higher by the task reward
    assert all(p.chosen_reward > p.rejected_reward for s in shards for p in s)
    assert float(trainer.callback_metrics[M.SAMPLES]) == 2 * TRAIN * (K + K)  # comparator samples counted
    assert model.comparator._copies is None  # current_copy's copy freed at the round's end
    for b, agent in zip(before, model.agents):
        assert any(not torch.equal(x, p) for x, p in zip(b, agent.parameters()))


def test_text_pair_tokens_end_with_eos_unless_clipped():
    model = _module()
    model.configure_model()
    tok = model.tokenizers[0]
    from comlrl_lightning.preference.pairs import PreferencePair

    long = " ".join(["word"] * 40)
    pair = PreferencePair(prompts=["Say hi", "Say hi"], chosen=["hi", long], rejected=[long, ""])
    (row,) = text_pair_tokens(model.team, [pair])
    assert row[0].chosen.tolist() == tok("hi", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert not row[0].chosen_clipped and row[0].rejected_clipped and len(row[0].rejected) == 8
    assert row[1].rejected.tolist() == [tok.eos_token_id] and row[0].chosen_prompt.dim() == 1


class Preempted(Exception):
    pass


def _run(trainer_factory, root, ckpt_path=None, callbacks=(), crash_at=None, **kw):
    pl.seed_everything(0)
    model = _module(
        preference=dict(preference_num_candidates=K, preference_pairs_per_sample=2, pair_selection="random"),
        comparator=dict(comparator_policy="history", comparator_history_k=1),
        replay=dict(preference_replay_mode="lambda_decay", preference_replay_lambda=0.5),
    )

    class Crash(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if crash_at is not None and trainer.global_step == 2 * crash_at:
                raise Preempted  # after the checkpoint of step crash_at

    trainer = trainer_factory(
        max_steps=-1, max_epochs=100, callbacks=[Crash(), *callbacks], default_root_dir=root, **kw
    )
    try:
        data = LengthRatioDataModule(batch_size=BATCH, num_train=TRAIN, shuffle=True)
        trainer.fit(model, data, ckpt_path=ckpt_path)
    except Preempted:
        pass
    return model


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    from conftest import tiny_trainer

    root = tmp_path_factory.mktemp("straight")
    return _run(tiny_trainer, root), root


# training_step 1: inside round 0's build; 4: inside its training; 2 + updates: round 0 done
@pytest.mark.parametrize("crash_at", [1, 4, "between"])
def test_resume_inside_a_build_inside_training_and_between_rounds_is_bit_exact(
    trainer_factory, tmp_path, straight, crash_at
):
    reference, root = straight
    if crash_at == "between":
        count = len(read_pairs(root / "preference_replay" / "round_0.jsonl"))
        crash_at = TRAIN // BATCH + EPOCHS * -(-count // PAIRS_PER_UPDATE)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2 * crash_at, save_top_k=-1)
    _run(trainer_factory, tmp_path, callbacks=[saver], crash_at=crash_at, enable_checkpointing=True)
    (ckpt,) = os.listdir(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / ckpt, weights_only=False)
    state = saved["iterative"]
    expected_phase = "build" if crash_at == 1 else ("train" if crash_at == 4 else "build")
    assert state["phase"] == expected_phase and state["round"] == (1 if crash_at > 4 else 0)
    assert (len(state["round_pairs"]) > 0) == (crash_at == 1)
    resumed = _run(trainer_factory, tmp_path, ckpt_path=str(tmp_path / "ckpt" / ckpt))
    assert resumed.round == reference.round == 2 and resumed._samples == reference._samples
    for r in range(2):
        name = f"preference_replay/round_{r}.jsonl"
        assert read_pairs(tmp_path / name) == read_pairs(root / name)
    assert sorted(os.listdir(tmp_path / "policy_checkpoints")) == sorted(
        os.listdir(root / "policy_checkpoints")
    )
    ours, theirs = resumed.comparator.state_dict(), reference.comparator.state_dict()
    assert ours["history"].pop("directory") == str(tmp_path / "policy_checkpoints")
    theirs["history"].pop("directory")
    assert ours == theirs  # the stream's calls, the counters, the rounds saved
    assert resumed.replay.rng.getstate() == reference.replay.rng.getstate()
    for i in range(2):
        for (name, a), b in zip(resumed.agents[i].named_parameters(), reference.agents[i].parameters()):
            assert torch.equal(a, b), f"agent {i} {name}"


def test_api_comparator_in_a_fit_against_a_local_server(
    trainer_factory, tmp_path, server_factory, monkeypatch
):
    secret = "sk-iterwire-test-0123456789"
    monkeypatch.setenv("ITERWIRE_TEST_KEY", secret)
    seen = []

    def handler(request):
        seen.append(request)
        if len(seen) == 1:
            return 503, {"error": "warming up"}  # retried once, then answered
        if len(seen) == 3:
            return 400, {"error": "refused"}  # not retried: that episode's pairs are skipped
        return chat_reply(["x" * (len(seen) % 5)] * request["body"]["n"])

    srv = server_factory(handler=handler)
    comparator = dict(
        comparator_policy="api",
        comparator_api_url=srv.url,
        comparator_api_format="openai_chat",
        comparator_api_model="tiny",
        comparator_api_key_env="ITERWIRE_TEST_KEY",
        comparator_api_retry_backoff=0.0,
        comparator_api_timeout=10.0,
    )
    pl.seed_everything(0)
    model = _module(comparator=comparator)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=1)
    trainer = trainer_factory(
        max_steps=-1, max_epochs=100, default_root_dir=tmp_path, callbacks=[saver], enable_checkpointing=True
    )
    trainer.fit(model, LengthRatioDataModule(batch_size=BATCH, num_train=TRAIN))
    assert model.round == 2
    # per round one request per agent and episode (n = K in one request), plus the retried one
    assert len(seen) == 2 * 2 * TRAIN + 1
    assert all(r["headers"]["Authorization"] == f"Bearer {secret}" for r in seen)
    assert all(r["body"]["model"] == "tiny" and r["body"]["n"] == K for r in seen)
    got = model.comparator.metrics()
    assert got[M.COMPARATOR_RETRIES] == 1 and got[M.COMPARATOR_ERRORS] == 2
    assert got[M.COMPARATOR_SKIPPED_PAIRS] == K  # the refused episode's K candidate pairs
    (ckpt,) = os.listdir(tmp_path / "ckpt")
    assert secret.encode() not in (tmp_path / "ckpt" / ckpt).read_bytes()
    assert secret not in str(model.hparams)


def test_the_toy_config_trains_two_rounds_from_the_cli(tmp_path):
    import glob

    from experiments import ROOT, experiment
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from comlrl_lightning.cli import main

    os.chdir(ROOT)  # configs use paths relative to the repository root
    main(
        [
            "fit",
            *experiment("toy_madpo_iterative.yaml"),
            "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.default_root_dir={tmp_path}",
            "--data.init_args.num_train=8",
            "--model.init_args.sampling.max_new_tokens=8",
            "--trainer.log_every_n_steps=5",  # once-a-round values must survive the interval
            "--trainer.limit_val_batches=1",
        ]
    )
    (events,) = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)
    }  # one run: its validation before fit and its fit write a file each
    acc = EventAccumulator(events)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"pairs/current", "pairs/train", "pairs/total", "iter/round", "iter/samples"} <= tags
    assert {"comparator/errors", "comparator/skipped_pairs", "rewards/margins", "val/reward"} <= tags
    assert sorted({int(e.value) for e in acc.Scalars("iter/round")}) == [0, 1]
    shards = [read_pairs(tmp_path / "preference_replay" / f"round_{r}.jsonl", 2) for r in range(2)]
    # pairs/* of the last round built, at every step from round 0's end on: both rounds' counts appear
    assert {int(e.value) for e in acc.Scalars("pairs/current")} == {len(s) for s in shards}
    assert acc.Scalars("pairs/total")[-1].value == sum(len(s) for s in shards)
    assert acc.Scalars("iter/samples")[-1].value == 2 * 8 * (4 + 4)  # 2 rounds x 8 prompts x (K + K')


def test_the_humaneval_config_runs_two_rounds_on_the_tiny_team(tmp_path):
    from experiments import ROOT, experiment

    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    # the random tiny team's 8-token programs all fail every test: every candidate ties, no round forms a
    # pair, and the fit says so at its end instead of ending as a success (the wiring is checked below)
    with pytest.raises(RuntimeError, match=r"MADPOIter formed 0 preference pairs in 2 round\(s\)"):
        main(
            [
                "fit",
                *experiment("humaneval_madpo_iterative.yaml"),
                "--trainer.enable_progress_bar=false",
                "--model.init_args.agents=[{model: builtin:tiny-gpt2}, {model: builtin:tiny-gpt2}]",
                "--model.init_args.sampling.max_new_tokens=8",
                "--model.init_args.sampling.max_prompt_length=256",
                "--trainer.limit_train_batches=1",
                "--data.init_args.max_val_samples=2",
                "--data.init_args.val_batch_size=2",
                "--validate_before_fit=false",
                f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )
    shards = sorted(p.name for p in (tmp_path / "preference_replay").iterdir())
    assert shards == ["round_0.jsonl", "round_1.jsonl"]
    # history k=1: the policy after round 1 is kept for a next round; the initial one was pruned
    assert sorted(p.name for p in (tmp_path / "policy_checkpoints").iterdir()) == ["round_1"]


def test_the_learning_harness_row_spends_the_online_rows_sample_budget(monkeypatch):
    """``benchmarks/learning/learning.py``'s ``madpo_iter`` row: its budget (comparator samples counted) equals
    the online rows' in the recorded config, and its quick run (tiny model) counts what it generated."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "lib"))
    import bench_paths  # noqa: F401 - every benchmarks/<concern>/ on sys.path
    import learning_config
    import learning_runs
    import learning_tasks
    import learning_train

    cfg = learning_config.CONFIG
    module = learning_train.build_module("madpo_iter", learning_config.TASK, cfg)  # built, not loaded
    k_cur = module.preference.preference_num_candidates
    k_cmp = module.comparator_config.comparator_num_candidates
    walk = cfg["batches"] // learning_config.ITERATIVE_ROUNDS
    iterative = module.rounds.num_rounds * walk * cfg["batch_size"] * (k_cur + k_cmp)
    assert iterative == cfg["batches"] * cfg["batch_size"] * cfg["k"] == 96
    assert module.comparator_config.comparator_policy == "current_copy"

    monkeypatch.setattr(learning_train, "SMOLLM2", "builtin:tiny-gpt2")
    # the random tiny team forms no pair on HumanEval (every candidate ties), which ends a real fit in an
    # error (test_rounds_that_form_no_pair_warn_each_round_and_fail_the_fit); here only the budget counts
    monkeypatch.setattr(MADPOIter, "refuse_if_nothing_trained", lambda self: None)
    run = learning_train.run_one("madpo_iter", learning_config.TASK, 0, learning_runs.QUICK)
    samples = [h["samples"] for h in run["history"]]
    # quick: 3 rounds x 1 batch x 2 problems x (2 + 2) joint responses, 2 answers each
    assert samples[0] == 0 and samples[-1] == 2 * 3 * 1 * learning_runs.QUICK["batch_size"] * (2 + 2) == 48
    assert samples == sorted(samples) and len(run["history"][-1]["solved"]) == learning_tasks.NUM_HELD_OUT


@pytest.mark.parametrize(
    "comparator",
    [
        dict(comparator_policy="current"),
        dict(
            comparator_policy="model", comparator_model_name="builtin:tiny-gpt2", comparator_num_candidates=2
        ),
        dict(comparator_policy="current_copy", comparator_generation_mode="centralized"),
    ],
    ids=["current", "model", "current_copy-centralized"],
)
def test_every_team_comparator_runs_a_round_in_a_fit(trainer_factory, tmp_path, comparator):
    pl.seed_everything(0)
    model = _module(comparator=comparator, rounds=dict(num_rounds=1))
    trainer = trainer_factory(max_steps=-1, max_epochs=100, default_root_dir=tmp_path)
    trainer.fit(model, LengthRatioDataModule(batch_size=BATCH, num_train=TRAIN))
    assert model.round == 1 and trainer.should_stop
    k_cmp = comparator.get("comparator_num_candidates", K)
    assert model.samples_generated == TRAIN * (K + k_cmp)
    pairs = read_pairs(tmp_path / "preference_replay" / "round_0.jsonl", 2)
    assert len(pairs) <= TRAIN * 2 and all(p.chosen_reward > p.rejected_reward for p in pairs)
    failures = model.comparator.metrics()[M.COMPARATOR_PARSE_FAILURES]
    if comparator.get("comparator_generation_mode") == "centralized":
        # the random tiny model writes no <agent_i> tag: every joint completion is a parse failure,
        # scored as empty roles (a defined outcome, counted), never a crash
        assert failures == TRAIN * K
    else:
        assert failures == 0


@pytest.mark.parametrize("where", ["build", "train"])
def test_sigterm_inside_a_build_or_training_step_resumes_bit_exact(
    trainer_factory, tmp_path, straight, where, monkeypatch
):
    # InterruptCheckpoint abandons the step a SIGTERM lands in and saves the batch end before it;
    # before the fix the checkpoint held the abandoned step's round state (the comparator's draws
    # made, the training pass's cursor moved past pairs never trained on)
    import signal

    from comlrl_lightning.algorithms import round_loop
    from comlrl_lightning.callbacks import InterruptCheckpoint

    reference, root = straight
    calls = {"build": 0, "train": 0}
    real_build, real_update = round_loop.build_candidates, MADPOIter.update_agents

    def build(*args, **kw):  # round 0's second build batch, sampled and scored
        out = real_build(*args, **kw)
        calls["build"] += 1
        if where == "build" and calls["build"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    def update(self, tokens):  # round 0's second update, its pairs drawn, before any forward
        calls["train"] += 1
        if where == "train" and calls["train"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_update(self, tokens)

    monkeypatch.setattr(round_loop, "build_candidates", build)
    monkeypatch.setattr(MADPOIter, "update_agents", update)
    stop = InterruptCheckpoint(dirpath=str(tmp_path / "ckpt"))
    with pytest.raises(SystemExit) as info:
        _run(trainer_factory, tmp_path, callbacks=[stop])
    assert info.value.code == 128 + signal.SIGTERM
    monkeypatch.undo()
    assert torch.load(stop.ckpt_path, weights_only=False)["iterative"]["phase"] == where
    resumed = _run(trainer_factory, tmp_path, ckpt_path=stop.ckpt_path)
    assert resumed.round == 2 and resumed._samples == reference._samples
    for r in range(2):
        name = f"preference_replay/round_{r}.jsonl"
        assert read_pairs(tmp_path / name) == read_pairs(root / name), name
    for i in range(2):
        for (name, a), b in zip(resumed.agents[i].named_parameters(), reference.agents[i].parameters()):
            assert torch.equal(a, b), f"agent {i} {name}"


def _same_score(joint_actions, episodes, turn):
    return [0.5] * len(joint_actions)


def test_rounds_that_form_no_pair_warn_each_round_and_fail_the_fit(trainer_factory, tmp_path):
    # before the fix: a reward that scores every candidate alike formed 0 pairs, trained nothing, exited 0
    from comlrl_lightning.datamodules import DecPOMDPDataModule

    pl.seed_everything(0)
    model = _module()
    data = DecPOMDPDataModule([{"q": str(i)} for i in range(TRAIN + 2)], ["A {q}", "B {q}"], _same_score,
                              batch_size=BATCH, val_fraction=0.3)  # fmt: skip
    trainer = trainer_factory(max_steps=-1, max_epochs=100, default_root_dir=tmp_path)
    with pytest.warns(
        UserWarning, match=r"MADPOIter: round 0 formed 0 training pairs \(0 built; ties never pair\)"
    ):
        with pytest.raises(RuntimeError, match=r"^preference\.pair_selection: MADPOIter formed 0 preference pairs "
                                               r"in 2 round\(s\), so it trained nothing"):  # fmt: skip
            trainer.fit(model, data)
    assert model.round == 2
