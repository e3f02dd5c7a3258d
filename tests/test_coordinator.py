"""The Coordinator on tiny learners: the schedule, frozen partners, experience routing, placement,
exact resume, config errors before loading."""

import os
from functools import partial

import pytest
import torch

from comlrl_lightning import MAGRPO
from comlrl_lightning.coordinator import Alternate, Coordinator, EveryN, LearnerConfig, RowEpisodes, Stage
from comlrl_lightning.core.config import RolloutConfig, SamplingConfig


class Spy(MAGRPO):
    """MAGRPO that records the completion texts of every update (in order)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.updates = []

    def update_agents(self, turns):
        self.updates.append([t for turn in turns for t in turn.generations[0].texts])
        return super().update_agents(turns)


def longer_reply_reward(joint, episodes, turn):
    return [float(len(b) > len(a)) + 0.01 * len(b) for a, b in joint]


class Crash(Exception):
    pass


class Recorder:
    """Fabric callback: each round's trained learners, joint responses and weight snapshots; crashes on request."""

    def __init__(self, crash_at=None):
        self.rounds, self.crash_at = [], crash_at

    def on_round_end(self, coordinator, output):
        if output.round == self.crash_at:
            raise Crash
        weights = {x: {n: p.detach().clone() for n, p in lr.module.agents[0].named_parameters()}
                   for x, lr in coordinator.learners.items()}  # fmt: skip
        self.rounds.append({"round": output.round, "trained": output.trained, "joint": output.joint_responses,
                            "weights": weights})  # fmt: skip


def learner(name, lr=1e-2, scheduler=None, **kwargs):
    module = Spy(agents="builtin:tiny-gpt2", rollout=RolloutConfig(num_generations=2),
                 sampling=SamplingConfig(max_new_tokens=8), learning_rate=lr, scheduler=scheduler)  # fmt: skip
    return LearnerConfig(name, module, **kwargs)


def coordinator(tmp_path, learners=None, **kwargs):
    defaults = {
        "stages": [Stage("a", "Say {topic}"), Stage("b", "Reply to: {a}")], "reward": longer_reply_reward,
        "episodes": RowEpisodes([{"topic": t} for t in "pqrst"]), "num_rounds": 4, "batch_size": 2,
        "root_dir": str(tmp_path), "progress_bar": False, "save_agents": False,
    }  # fmt: skip
    defaults.update(kwargs)
    return Coordinator(learners or [learner("a"), learner("b")], **defaults)


def same(w1, w2):
    return all(torch.equal(w1[n], w2[n]) for n in w1)


def test_alternate_updates_one_learner_per_round_and_the_frozen_one_stays_bit_identical(tmp_path):
    rec = Recorder()
    c = coordinator(tmp_path, schedule=Alternate(), callbacks=[rec])
    initial = {x: {n: p.detach().clone() for n, p in lr.module.agents[0].named_parameters()}
               for x, lr in (c.setup() or c.learners).items()}  # fmt: skip
    c.fit()
    assert [r["trained"] for r in rec.rounds] == [["a"], ["b"], ["a"], ["b"]]
    assert {x: lr.num_updates for x, lr in c.learners.items()} == {"a": 2, "b": 2}
    snaps = [initial] + [r["weights"] for r in rec.rounds]  # snaps[r + 1]: after round r
    for r, row in enumerate(rec.rounds):
        for x in ("a", "b"):
            assert same(snaps[r][x], snaps[r + 1][x]) == (x not in row["trained"]), (r, x)


def test_each_learner_trains_only_on_its_own_responses(tmp_path):
    rec = Recorder()
    c = coordinator(tmp_path, schedule=EveryN(), num_rounds=2, callbacks=[rec])
    c.fit()
    a, b = c.learners["a"].module, c.learners["b"].module
    for r, row in enumerate(rec.rounds):
        assert a.updates[r] == [j[0] for j in row["joint"]]
        assert b.updates[r] == [j[1] for j in row["joint"]]
    assert a.updates[0] != b.updates[0]


def test_experience_window_trains_on_the_rounds_played_frozen_since_the_last_update(tmp_path):
    rec = Recorder()
    c = coordinator(tmp_path, [learner("a"), learner("b", experience_window=2)], schedule=Alternate(),
                    num_rounds=4, callbacks=[rec])  # fmt: skip
    c.fit()
    b = c.learners["b"].module
    joints = [r["joint"] for r in rec.rounds]
    # b trains at rounds 1 and 3, each time on its responses of the round before (frozen) and its own round
    assert b.updates == [[j[1] for j in joints[0] + joints[1]], [j[1] for j in joints[2] + joints[3]]]
    assert len(c.learners["a"].module.updates[0]) == 4  # window 1: its own round only


def test_an_interrupted_then_resumed_run_equals_an_uninterrupted_one(tmp_path):
    def make(root, **kw):
        # StepLR halves the lr every 2nd update: its count (not only the optimizer's lr) must survive.
        # b keeps 2 rounds of experience, so its buffer is non-empty in the checkpoint after round 0.
        step = partial(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)
        return coordinator(root, [learner("a", scheduler=step), learner("b", scheduler=step, experience_window=2)],
                           schedule=Alternate(), num_rounds=4, checkpoint_every=1, keep_last=2, **kw)  # fmt: skip

    full_rec = Recorder()
    full = make(tmp_path / "full", callbacks=[full_rec])
    full.fit()

    crashed = make(tmp_path / "resumed", callbacks=[Recorder(crash_at=1)])  # dies during round 1
    with pytest.raises(Crash):
        crashed.fit()
    resumed_rec = Recorder()
    resumed = make(tmp_path / "resumed", callbacks=[resumed_rec], ckpt_path="last")
    resumed.fit()

    assert [r["round"] for r in resumed_rec.rounds] == [1, 2, 3]
    assert [r["joint"] for r in resumed_rec.rounds] == [r["joint"] for r in full_rec.rounds[1:]]
    for x in ("a", "b"):
        w_full = dict(full.learners[x].module.agents[0].named_parameters())
        w_res = dict(resumed.learners[x].module.agents[0].named_parameters())
        assert all(torch.equal(w_full[n], w_res[n]) for n in w_full), x
        opt_full, opt_res = (
            full.learners[x].optimizer.state_dict(),
            resumed.learners[x].optimizer.state_dict(),
        )
        assert all(torch.equal(opt_full["state"][i]["exp_avg_sq"], opt_res["state"][i]["exp_avg_sq"])
                   for i in opt_full["state"])  # fmt: skip
        assert full.learners[x].scheduler.get_last_lr() == resumed.learners[x].scheduler.get_last_lr()
    assert [h["reward"] for h in resumed.history] == [h["reward"] for h in full.history]
    assert sorted(os.listdir(tmp_path / "resumed" / "learners" / "b" / "checkpoints")) == [
        "round-000003.ckpt", "round-000004.ckpt"]  # fmt: skip


def test_learners_sharing_a_model_share_its_device_and_keep_separate_optimizer_state(tmp_path):
    c = coordinator(tmp_path, [learner("a"), learner("b", lr=1e-3, share_weights_with="a")], num_rounds=2)
    c.fit()
    a, b = c.learners["a"], c.learners["b"]
    assert a.module.agents[0] is b.module.agents[0] and a.device == b.device
    assert a.optimizer.param_groups[0]["lr"] == 1e-2 and b.optimizer.param_groups[0]["lr"] == 1e-3
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa and sb and not torch.equal(sa[0]["exp_avg"], sb[0]["exp_avg"])  # each saw its own gradients


def test_device_plan_puts_each_model_on_its_own_gpu_and_sharing_learners_together(tmp_path):
    three = [learner("a"), learner("b"), learner("c", share_weights_with="a")]
    plan = coordinator(tmp_path, three, stages=[Stage(x, "{topic}") for x in "abc"]).device_plan
    assert [str(d) for d in plan(num_gpus=2)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert [str(d) for d in plan(num_gpus=1)] == ["cuda:0", "cuda:0", "cuda:0"]
    assert [str(d) for d in plan(num_gpus=0)] == ["cpu"] * 3
    pinned = LearnerConfig("b", Spy(agents={"model": "builtin:tiny-gpt2", "device": "cuda:1"},
                                    rollout=RolloutConfig(num_generations=2)))  # fmt: skip
    with pytest.raises(ValueError, match="cuda:1 requested, but 0 CUDA device"):
        coordinator(tmp_path, [learner("a"), pinned], accelerator="cpu").device_plan()


@pytest.mark.parametrize("change, message", [
    ({"stages": [Stage("a", "{topic}"), Stage("zz", "{a}")]}, r"stages\[1\].learner: got 'zz'"),
    ({"num_rounds": 0}, "num_rounds: got 0"),
    ({"accelerator": "tpu"}, "accelerator: got 'tpu'"),
    ({"learners": [learner("a"), learner("a")]}, "unique names"),
    ({"learners": [learner("a", share_weights_with="b"), learner("b")]}, "name an earlier learner"),
    ({"learners": [learner("a"), learner("b", share_weights_with="a", precision="bf16-true")]},
     r"learners\['b'\].precision: got 'bf16-true', but it shares the model of 'a'"),
])  # fmt: skip
def test_bad_coordinator_config_fails_before_any_model_loads(tmp_path, change, message):
    learners = change.pop("learners", None)
    with pytest.raises(ValueError, match=message):
        coordinator(tmp_path, learners, **change)


def test_a_learner_must_be_single_agent():
    with pytest.raises(ValueError, match="num_agents=2; a learner is a single-agent module"):
        LearnerConfig("a", MAGRPO(agents="builtin:tiny-gpt2", num_agents=2))


def test_a_non_finite_gradient_is_never_stepped_and_a_non_finite_weight_never_saved(tmp_path):
    c = coordinator(tmp_path)
    c.setup()
    a = c.learners["a"]
    params = list(a.module.agents[0].parameters())
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(FloatingPointError, match="learner 'a': non-finite gradient"):
        a.optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    with torch.no_grad():
        params[0][0] = float("inf")
    with pytest.raises(FloatingPointError, match="non-finite weight"):
        a.save(0)
    assert not os.path.exists(a.checkpoint_path(0))


def scalar_steps(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_a_moved_run_folder_resumes_and_replayed_rounds_write_no_duplicate_points(tmp_path):
    first = coordinator(tmp_path / "run", num_rounds=3, checkpoint_every=1, keep_last=3)
    first.fit()
    moved = tmp_path / "moved"
    os.rename(tmp_path / "run", moved)
    ckpt = moved / "coordinator" / "checkpoints" / "round-000001.pt"
    assert all(
        not os.path.isabs(p) for p in torch.load(ckpt, weights_only=False)["learner_checkpoints"].values()
    )
    resumed = coordinator(moved, num_rounds=3, ckpt_path=str(ckpt))
    resumed.fit()  # rounds 1 and 2 again, from the moved folder
    assert [h["round"] for h in resumed.history] == [0, 1, 2]
    assert scalar_steps(moved / "coordinator", "reward") == [0, 1, 2]
    assert scalar_steps(moved / "learners" / "a", "reward") == [0, 1, 2]


def test_learners_log_the_same_trl_names_as_a_team(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    coordinator(tmp_path, num_rounds=2).fit()
    acc = EventAccumulator(str(tmp_path / "learners" / "a"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    trl = {
        "loss",
        "grad_norm",
        "entropy",
        "clip_ratio/low_mean",
        "clip_ratio/low_min",
        "clip_ratio/high_mean",
        "clip_ratio/high_max",
        "clip_ratio/region_mean",
        "completions/mean_length",
        "completions/min_length",
        "completions/max_length",
        "completions/mean_terminated_length",
        "completions/clipped_ratio",
    }
    assert trl <= tags, trl - tags
    assert not tags & {"clip_ratio", "clip_ratio_low", "clip_ratio_high", "kl"}  # no second scheme; beta = 0


def test_rounds_take_the_rollouts_joint_mode_choice():
    import typing

    from comlrl_lightning.coordinator.rounds import JointMode, check_stages
    from comlrl_lightning.core.advantages import JOINT_MODE

    assert set(typing.get_args(JointMode)) == {*JOINT_MODE.values, *JOINT_MODE.aliases}
    with pytest.raises(
        ValueError, match=r"joint_mode: got 'diagonal', allowed: \['aligned', 'cross', 'crossed'\]"
    ):
        check_stages([Stage("p", lambda row, responses: "x")], {"p": None}, "diagonal")
