"""Preference replay on hand-built shard histories: the four modes' weights, the sampled counts, the
shards on disk, and a resumed generator drawing the same pairs."""

from __future__ import annotations

import collections
import json

import pytest

from comlrl_lightning.preference.pairs import PreferencePair, read_pairs
from comlrl_lightning.preference.replay import PreferenceReplay, ReplayConfig, replay_weights


def pairs(round_index: int, n: int) -> list[PreferencePair]:
    return [PreferencePair([f"p{round_index}"], [f"r{round_index}.{i}"], ["x"], 1.0, 0.0) for i in range(n)]


def history(tmp_path, cfg: ReplayConfig, sizes: dict[int, int], seed: int = 0) -> PreferenceReplay:
    replay = PreferenceReplay(cfg, str(tmp_path), seed=seed, num_agents=1)
    for r, n in sizes.items():
        replay.add_round(r, pairs(r, n))
    return replay


def rounds_of(selected: list[PreferencePair]) -> collections.Counter:
    return collections.Counter(int(p.prompts[0][1:]) for p in selected)


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (ReplayConfig(), [0, 0, 0, 1]),
        (ReplayConfig("nearest_k", preference_replay_k=2), [0, 0, 0.5, 0.5]),
        (ReplayConfig("all_history"), [0.25] * 4),
        (ReplayConfig("lambda_decay", preference_replay_lambda=0.5), [1 / 15, 2 / 15, 4 / 15, 8 / 15]),
        (ReplayConfig("lambda_decay", preference_replay_lambda=1.0), [0.25] * 4),
        (ReplayConfig("lambda_decay", preference_replay_lambda=0.0), [0, 0, 0, 1]),
    ],
)
def test_round_weights_per_mode(cfg, expected):
    assert replay_weights(cfg, [0, 1, 2, 3], 3) == pytest.approx(expected)


def test_an_empty_round_still_ages_the_rounds_before_it():
    lam = ReplayConfig("lambda_decay", preference_replay_lambda=0.5)
    assert replay_weights(lam, [0, 1, 3], 3) == pytest.approx(
        [1 / 11, 2 / 11, 8 / 11]
    )  # ages 3, 2, 0: round 2 had no pairs
    assert replay_weights(ReplayConfig("nearest_k", preference_replay_k=2), [0, 1], 3) == [0, 0]


def test_shards_are_jsonl_files_named_by_round(tmp_path):
    replay = history(tmp_path, ReplayConfig(), {0: 2, 1: 0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_0.jsonl", "round_1.jsonl"]
    assert [p.chosen for p in read_pairs(tmp_path / "round_0.jsonl")] == [["r0.0"], ["r0.1"]]
    assert (tmp_path / "round_1.jsonl").read_text() == ""
    assert json.loads((tmp_path / "round_0.jsonl").read_text().splitlines()[0])["prompts"] == ["p0"]
    assert replay.counts() == (2, 2)


def test_current_mode_trains_on_this_rounds_pairs_as_they_are(tmp_path):
    replay = history(tmp_path, ReplayConfig(), {0: 3, 1: 2})
    current = pairs(1, 2)
    assert replay.select(1, current) == current


def test_nearest_k_draws_only_from_the_last_k_rounds_and_the_sample_size(tmp_path):
    cfg = ReplayConfig("nearest_k", preference_replay_k=2, preference_replay_sample_size=400)
    replay = history(tmp_path, cfg, {0: 5, 1: 5, 2: 5})
    counts = rounds_of(replay.select(2, pairs(2, 5)))
    assert sum(counts.values()) == 400 and set(counts) == {1, 2}
    assert 160 <= counts[1] <= 240  # Binomial(400, 1/2): mean 200, sd 10


def test_lambda_decay_counts_follow_the_weights(tmp_path):
    cfg = ReplayConfig("lambda_decay", preference_replay_lambda=0.5, preference_replay_sample_size=3000)
    replay = history(tmp_path, cfg, {0: 4, 1: 4, 2: 4})
    counts = rounds_of(replay.select(2, pairs(2, 4)))
    for r, w in zip((0, 1, 2), (1 / 7, 2 / 7, 4 / 7)):  # sd of each count <= sqrt(3000/4) ~ 27
        assert abs(counts[r] - 3000 * w) < 5 * 27, (r, counts)


def test_default_sample_size_is_this_rounds_count_else_the_newest_nonempty(tmp_path):
    replay = history(tmp_path, ReplayConfig("all_history"), {0: 3, 1: 5, 2: 0})
    assert replay.sample_size(1) == 5 and replay.sample_size(2) == 5
    assert len(replay.select(2, [])) == 5


def test_a_small_shard_is_drawn_in_whole_shuffled_passes(tmp_path):
    cfg = ReplayConfig("all_history", preference_replay_sample_size=7)
    replay = history(tmp_path, cfg, {0: 3})
    got = collections.Counter(p.chosen[0] for p in replay.select(0, pairs(0, 3)))
    assert sorted(got.values()) == [2, 2, 3]  # two full passes of 3, then 1 more without replacement


def test_a_resumed_replay_draws_the_same_pairs(tmp_path):
    cfg = ReplayConfig("lambda_decay", preference_replay_lambda=0.7, preference_replay_sample_size=6)
    replay = history(tmp_path, cfg, {0: 4, 1: 4}, seed=3)
    replay.select(1, [])
    state = json.loads(json.dumps(replay.state_dict()))  # it survives a JSON / checkpoint round trip
    expected = replay.select(1, [])
    resumed = PreferenceReplay(cfg, "elsewhere", seed=99)
    resumed.load_state_dict(state)
    assert resumed.select(1, []) == expected
    (tmp_path / "round_1.jsonl").write_text("")
    with pytest.raises(ValueError, match="round_1.jsonl holds 0 pairs, the checkpoint recorded 4"):
        resumed.load_state_dict(state)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"preference_replay_mode": "fifo"}, r"preference_replay_mode: got 'fifo', allowed: \['current'"),
        ({"preference_replay_mode": "nearest_k"}, "preference_replay_k: got None, .*needs an integer >= 1"),
        (
            {"preference_replay_k": 3},
            "preference_replay_k: got 3, only applies to preference_replay_mode='nearest_k'",
        ),
        ({"preference_replay_mode": "lambda_decay"}, "preference_replay_lambda: got None"),
        ({"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 1.5}, "in \\[0, 1\\]"),
        ({"preference_replay_lambda": 0.5}, "only applies to preference_replay_mode='lambda_decay'"),
        ({"preference_replay_sample_size": 8}, "does not apply to preference_replay_mode='current'"),
        ({"preference_replay_mode": "all_history", "preference_replay_sample_size": 0}, "sample_size: got 0"),
    ],
)
def test_bad_replay_values_are_refused_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReplayConfig(**kwargs)
