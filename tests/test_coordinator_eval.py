"""The coordinator's held-out evaluation: greedy paths through the stages, the logged val/ names,
nothing trained, training samples unchanged, exact resume with evaluation on, bad values refused."""

import math

import pytest
import torch
from test_coordinator import Crash, Recorder, coordinator, learner, scalar_steps

from comlrl_lightning.coordinator import EveryN, RowEpisodes
from comlrl_lightning.envs.rewards import PASS_AT_1, RewardResult

HELD = RowEpisodes([{"topic": t} for t in ("uv", "wx", "yz")])


def toy_reward(joint, episodes, turn):
    """Reward: the reply's length / 10; solved: the reply is longer than the draft."""
    return RewardResult(
        [len(b) / 10 for _, b in joint], {PASS_AT_1: [float(len(b) > len(a)) for a, b in joint]}
    )


def test_evaluate_plays_each_episode_once_greedily_and_logs_its_reward_and_pass_at_1(tmp_path):
    c = coordinator(tmp_path, reward=toy_reward, eval_episodes=HELD)
    c.setup()
    a, b = c.learners["a"], c.learners["b"]
    weights = {n: p.detach().clone() for n, p in a.module.agents[0].named_parameters()}
    rng = torch.get_rng_state()
    out = c.evaluate()
    # the paths, rebuilt by hand: a's greedy answer to "Say {topic}", then b's greedy answer to "Reply to: <a's>"
    drafts = a.generate([a.render(f"Say {t}") for t in ("uv", "wx", "yz")], 1, greedy=True).texts
    replies = b.generate([b.render(f"Reply to: {d}") for d in drafts], 1, greedy=True).texts
    assert out.joint_responses == [list(p) for p in zip(drafts, replies)]
    assert out.episode_indices == [0, 1, 2]
    assert out.rewards.tolist() == pytest.approx([len(r) / 10 for r in replies])
    solved = [float(len(r) > len(d)) for d, r in zip(drafts, replies)]
    assert out.solved.tolist() == solved
    assert out.metrics["val/reward"] == pytest.approx(sum(len(r) for r in replies) / 30)
    assert out.metrics["val/pass@1"] == pytest.approx(sum(solved) / 3)
    assert c.eval_history == [out.record()] and c.eval_history[0]["round"] == 0
    # greedy: a second evaluation is the same; nothing trained, nothing buffered, the RNG untouched
    assert c.evaluate().joint_responses == out.joint_responses
    assert all(torch.equal(p, weights[n]) for n, p in a.module.agents[0].named_parameters())
    assert a.buffer == [] and b.buffer == [] and a.num_updates == 0
    assert torch.equal(torch.get_rng_state(), rng)


def test_several_sampled_paths_give_the_unbiased_pass_at_k(tmp_path):
    c = coordinator(tmp_path, reward=toy_reward, eval_episodes=HELD)
    out = c.evaluate(num_generations_eval=4, pass_at_k=[1, 2])
    assert len(out.joint_responses) == 12 and out.episode_indices == [0] * 4 + [1] * 4 + [2] * 4
    counts = out.solved.view(3, 4).sum(1).tolist()
    expect2 = sum(1 - math.comb(4 - int(k), 2) / math.comb(4, 2) for k in counts) / 3
    assert out.metrics["val/pass@1"] == pytest.approx(sum(counts) / 12)
    assert out.metrics["val/pass@2"] == pytest.approx(expect2)


def test_evaluating_during_fit_changes_no_training_sample(tmp_path):
    plain_rec, eval_rec = Recorder(), Recorder()
    coordinator(tmp_path / "plain", schedule=EveryN(), callbacks=[plain_rec]).fit()
    c = coordinator(
        tmp_path / "eval", schedule=EveryN(), callbacks=[eval_rec], eval_episodes=HELD, eval_every=2
    )
    c.fit()
    assert [h["round"] for h in c.eval_history] == [2, 4]
    assert [r["joint"] for r in eval_rec.rounds] == [r["joint"] for r in plain_rec.rounds]
    for x in ("a", "b"):
        assert all(
            torch.equal(eval_rec.rounds[-1]["weights"][x][n], w)
            for n, w in plain_rec.rounds[-1]["weights"][x].items()
        )


class SampledEval:
    """Fabric callback: a *sampled* evaluation after every round (draws from torch's RNG while it runs)."""

    def on_round_end(self, coordinator, output):
        coordinator.evaluate(HELD.episodes(), val_sampling=True)


def test_a_sampled_evaluation_between_rounds_leaves_the_training_rng_streams_as_they_were(tmp_path):
    plain_rec, eval_rec = Recorder(), Recorder()
    coordinator(tmp_path / "plain", callbacks=[plain_rec]).fit()
    c = coordinator(tmp_path / "eval", callbacks=[SampledEval(), eval_rec])
    c.fit()
    assert len(c.eval_history) == 4
    assert [r["joint"] for r in eval_rec.rounds] == [r["joint"] for r in plain_rec.rounds]


def test_a_resumed_run_with_evaluation_equals_an_uninterrupted_one(tmp_path):
    def make(root, **kw):
        return coordinator(
            root,
            [learner("a"), learner("b", experience_window=2)],
            num_rounds=4,
            checkpoint_every=1,
            keep_last=2,
            eval_episodes=HELD,
            eval_every=1,
            **kw,
        )

    full_rec = Recorder()
    full = make(tmp_path / "full", callbacks=[full_rec])
    full.fit()
    with pytest.raises(Crash):
        make(tmp_path / "resumed", callbacks=[Recorder(crash_at=2)]).fit()
    resumed_rec = Recorder()
    resumed = make(tmp_path / "resumed", callbacks=[resumed_rec], ckpt_path="last")
    resumed.fit()
    assert [r["round"] for r in resumed_rec.rounds] == [2, 3]
    assert [r["joint"] for r in resumed_rec.rounds] == [r["joint"] for r in full_rec.rounds[2:]]
    assert [h["round"] for h in full.eval_history] == [1, 2, 3, 4]
    assert resumed.eval_history == full.eval_history
    # the evaluation after round 2 was logged before the crash, at a step the resume purges: logged again, once
    assert scalar_steps(tmp_path / "resumed" / "coordinator", "val/reward") == [1, 2, 3, 4]
    for x in ("a", "b"):
        w_full = dict(full.learners[x].module.agents[0].named_parameters())
        assert all(
            torch.equal(w_full[n], p) for n, p in resumed.learners[x].module.agents[0].named_parameters()
        )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"eval_every": -1}, "eval_every: got -1, must be >= 0"),
        ({"eval_every": 2}, "eval_every: got 2, must be 0 when eval_episodes is None"),
    ],
)
def test_bad_evaluation_config_fails_before_any_model_loads(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        coordinator(tmp_path, **change)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_generations_eval": 0}, "num_generations_eval: got 0, must be >= 1"),
        (
            {"num_generations_eval": 2, "pass_at_k": [3]},
            r"pass_at_k: got \[3\], must be non-empty, each k in \[1, 2\]",
        ),
        ({"batch_size": 0}, "batch_size: got 0"),
    ],
)
def test_bad_evaluation_arguments_are_refused_by_name(tmp_path, kwargs, message):
    c = coordinator(tmp_path, eval_episodes=HELD)
    with pytest.raises(ValueError, match=message):
        c.evaluate(**kwargs)


def test_evaluate_without_episodes_and_a_held_out_row_missing_a_field_are_refused(tmp_path):
    with pytest.raises(ValueError, match="evaluate: no episodes"):
        coordinator(tmp_path).evaluate()
    bad = coordinator(tmp_path, eval_episodes=RowEpisodes([{"topic": "p"}, {"other": 1}]))
    with pytest.raises(ValueError, match=r"uses \{topic\}, which episode 1"):
        bad.setup()
    assert bad.learners == {}  # refused before any learner loads
