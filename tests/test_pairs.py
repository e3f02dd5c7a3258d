"""The preference-pair record and its jsonl file (preference/pairs.py)."""

from __future__ import annotations

import json
import math

import pytest

from comlrl_lightning.preference.pairs import PreferencePair, read_pairs, write_pairs


def _pair(**kw):
    base = dict(prompts=["p0", "p1"], chosen=["a", "b"], rejected=["c", "d"])
    return PreferencePair(**{**base, **kw})


def test_round_trip_keeps_every_field_and_drops_unknown_rewards(tmp_path):
    pairs = [
        _pair(chosen_reward=0.75, rejected_reward=-0.25, episode={"prompt": "x", "id": 3}),
        _pair(chosen=["é", "日本"]),  # a human label: no rewards, no row
    ]
    path = tmp_path / "sub" / "pairs.jsonl"
    assert write_pairs(path, pairs) == 2
    lines = path.read_text(encoding="utf-8").splitlines()
    assert set(json.loads(lines[1])) == {"prompts", "chosen", "rejected"}
    back = read_pairs(path, num_agents=2)
    assert back == pairs
    assert back[0].reward_gap == 1.0 and back[1].reward_gap is None
    assert not list(tmp_path.glob("sub/*.tmp.*"))


def test_a_failed_write_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, [_pair()])

    def broken():
        yield _pair(chosen=["new", "new"])
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        write_pairs(path, broken())
    assert read_pairs(path) == [_pair()]
    assert [p.name for p in tmp_path.iterdir()] == ["pairs.jsonl"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "pairs.jsonl:2: not JSON"),
        ('["a"]', "expected a JSON object"),
        ('{"prompts": ["p"], "chosen": ["a"]}', "field 'rejected' must be a list of strings"),
        ('{"prompts": ["p"], "chosen": [1], "rejected": ["b"]}', "field 'chosen' must be a list of strings"),
        ('{"prompts": ["p"], "chosen": ["a"], "rejected": ["b"], "score": 1}', "unknown field(s) ['score']"),
        (
            '{"prompts": ["p"], "chosen": ["a"], "rejected": ["b"], "chosen_reward": "1"}',
            "'chosen_reward' must be a number",
        ),
        ('{"prompts": ["p", "q"], "chosen": ["a"], "rejected": ["b"]}', "one entry per agent"),
    ],
)
def test_bad_lines_are_refused_with_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "pairs.jsonl"
    good = json.dumps(_pair().to_json())
    path.write_text(good + "\n" + line + "\n\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        read_pairs(path)
    assert message in str(e.value)
    assert f"{path}:2" in str(e.value)


def test_agent_count_and_non_finite_rewards_are_refused(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, [_pair()])
    with pytest.raises(ValueError, match="the pair has 2 agents' completions, the team has 3"):
        read_pairs(path, num_agents=3)
    with pytest.raises(ValueError, match="chosen_reward: got nan"):
        _pair(chosen_reward=math.nan)
