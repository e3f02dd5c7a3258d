"""The comparator's model-based policies on tiny models (``current``, ``current_copy``, ``model``,
``history``, centralized), its own RNG stream, and its config's refusals (before any model loads)."""

from __future__ import annotations

import os

import pytest
import torch

from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.preference.comparator import ComparatorConfig, build_comparator
from comlrl_lightning.preference.comparator.history import HistoryComparator
from comlrl_lightning.preference.comparator.policies import TeamComparator
from comlrl_lightning.team.agents import AgentSpec
from comlrl_lightning.team.team import Team

PROMPTS = [["12+7=", "3*4="], ["say hi", "say bye"]]  # [N=2][B=2]
SAMPLING = {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": None}


def make_team(shared: bool = False) -> Team:
    torch.manual_seed(0)
    specs = [
        AgentSpec("builtin:tiny-gpt2"),
        AgentSpec("builtin:tiny-gpt2", share_weights_with=0 if shared else None),
    ]
    team = Team(specs, SamplingConfig(max_new_tokens=6))
    team.load(with_reference=False)
    return team


def step(model: torch.nn.Module) -> None:
    """One real optimizer step that moves every weight."""
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids = torch.arange(1, 9).unsqueeze(0)
    model(input_ids=ids).logits.pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def comparator(team, dir=None, **kw):
    return build_comparator(ComparatorConfig(**kw), team, seed=7, sampling=SAMPLING, history_dir=dir)


def test_current_copy_does_not_move_when_the_agent_steps():
    team = make_team()
    start = weights(team.agents[0])
    copy_cmp, live_cmp = comparator(team, comparator_policy="current_copy"), comparator(team)
    copy_cmp.begin_round(0)
    before = comparator(team).sample(PROMPTS, 3)  # the agents' samples before the step, same stream
    step(team.agents[0])
    assert not same(weights(team.agents[0]), start)
    assert same(weights(copy_cmp.models()[0][0]), start)
    assert all(not p.requires_grad for p in copy_cmp.models()[0][0].parameters())
    after_copy, after_live = copy_cmp.sample(PROMPTS, 3), live_cmp.sample(PROMPTS, 3)
    assert after_copy.texts == before.texts  # the copy is the round-start policy
    assert after_live.texts[0] != before.texts[0]  # `current` follows the stepped agent
    assert after_live.texts[1] == before.texts[1]  # agent 1 did not step
    copy_cmp.end_round(0)
    with pytest.raises(RuntimeError, match="before begin_round"):
        copy_cmp.sample(PROMPTS, 1)


def test_current_copy_keeps_shared_weights_shared():
    team = make_team(shared=True)
    cmp = comparator(team, comparator_policy="current_copy")
    cmp.begin_round(0)
    (m0, _), (m1, _) = cmp.models()
    assert m0 is m1 and m0 is not team.agents[0]


def test_the_comparator_stream_leaves_the_global_rng_alone_and_resumes():
    team = make_team()
    cmp = comparator(team)
    state = torch.get_rng_state()
    first, second = cmp.sample(PROMPTS, 2), cmp.sample(PROMPTS, 2)
    assert torch.equal(torch.get_rng_state(), state)
    assert len(first.texts) == 2 and len(first.texts[0]) == 4 and first.ok == [True, True]
    assert first.texts != second.texts  # a fresh draw per call
    resumed = comparator(team)
    resumed.load_state_dict(comparator(team).state_dict() | {"calls": 1})
    assert resumed.sample(PROMPTS, 2).texts == second.texts


def test_model_policy_loads_lazily_once_and_frozen():
    team = make_team()
    cmp = comparator(team, comparator_policy="model", comparator_model_name="builtin:tiny-gpt2")
    assert isinstance(cmp, TeamComparator) and cmp._loaded is None  # nothing loaded at build
    sample = cmp.sample(PROMPTS, 2)
    (m0, t0), (m1, _) = cmp.models()
    assert m0 is m1 and m0 is not team.agents[0] and t0 is not team.tokenizers[0]
    assert all(not p.requires_grad for p in m0.parameters()) and not m0.training
    assert len(sample.texts[1]) == 4


def test_history_compares_with_the_policy_k_rounds_back(tmp_path):
    team = make_team()
    cmp = comparator(team, comparator_policy="history", comparator_history_k=1, dir=str(tmp_path))
    assert isinstance(cmp, HistoryComparator)
    initial = weights(team.agents[0])
    cmp.begin_round(0)  # round 0 compares with the initial policy
    assert same(weights(cmp.models()[0][0]), initial)
    step(team.agents[0])
    end_of_0 = weights(team.agents[0])
    cmp.end_round(0)
    assert sorted(os.listdir(tmp_path)) == ["round_0"]  # k=1: `initial` is no longer needed
    step(team.agents[0])
    cmp.begin_round(1)
    assert same(weights(cmp.models()[0][0]), end_of_0)
    assert not same(weights(cmp.models()[0][0]), weights(team.agents[0]))
    # a resumed run (new objects, a checkpoint taken inside round 1) compares with the same folder
    resumed = comparator(team, comparator_policy="history", comparator_history_k=1, dir=str(tmp_path))
    resumed.load_state_dict(cmp.state_dict())
    resumed.begin_round(1)
    assert same(weights(resumed.models()[0][0]), end_of_0)
    cmp.end_round(1)
    with pytest.raises(RuntimeError, match="outside a round"):
        cmp.sample(PROMPTS, 1)


def test_history_k2_keeps_what_later_rounds_need_and_saves_shared_weights_once(tmp_path):
    team = make_team(shared=True)
    cmp = comparator(team, comparator_policy="history", comparator_history_k=2, dir=str(tmp_path))
    ends = {-1: weights(team.agents[0])}  # round -> the policy at its end (-1: initial)
    for r in range(3):
        cmp.begin_round(r)
        assert same(weights(cmp.models()[1][0]), ends[max(r - 2, -1)])
        step(team.agents[0])
        ends[r] = weights(team.agents[0])
        cmp.end_round(r)
    assert sorted(os.listdir(tmp_path)) == ["round_1", "round_2"]
    assert os.listdir(tmp_path / "round_2") == ["agent_0"]
    cmp.history.saved.append("round_9")
    with pytest.raises(FileNotFoundError, match="the checkpoint's \\['round_9'\\] are gone"):
        cmp.history.load_state_dict(cmp.history.state_dict())


def test_centralized_model_comparator_writes_one_tagged_completion_per_candidate(monkeypatch):
    team = make_team()
    cmp = comparator(team, comparator_generation_mode="centralized", comparator_centralized_agent_index=1)
    seen = []

    def fake(agent, pair, prompts, k):
        seen.append((agent, list(prompts)))
        return ["<agent_0>x</agent_0><agent_1>y</agent_1>", "untagged"] * len(prompts)

    monkeypatch.setattr(cmp, "_generate", fake)
    sample = cmp.sample(PROMPTS, 2)
    assert [a for a, _ in seen] == [1] and "Agent 1 original prompt:\nsay hi" in seen[0][1][0]
    assert sample.joint(1) == [["x", ""], ["y", ""]]
    assert cmp.metrics()[M.COMPARATOR_PARSE_FAILURES] == 2


def test_a_custom_adapter_writes_the_joint_prompt_and_splits_with_the_row():
    class Lines:
        """One role per line; the row's `sep` shows the adapter sees each episode's own row."""

        def build_prompt(self, batch_item, agent_prompts):
            return batch_item["sep"].join(agent_prompts)

        def parse_completion(self, completion, batch_item, num_agents):
            parts = completion.split(batch_item["sep"])
            return parts if len(parts) == num_agents else None

    team = make_team()
    cmp = build_comparator(
        ComparatorConfig(comparator_generation_mode="centralized"), team, 0, SAMPLING, adapter=Lines()
    )
    seen = []
    cmp._generate = lambda agent, pair, prompts, k: seen.extend(prompts) or ["a|b", "c;d"]
    sample = cmp.sample([["p"], ["q"]], 2, episodes=[{"sep": "|"}])
    assert seen == ["p|q"] and sample.joint(0) == [["a", ""], ["b", ""]] and sample.parse_failures == 1


@pytest.mark.parametrize("bad, error", [("one string", TypeError), (["only one"], ValueError)])
def test_an_adapter_bug_is_an_error_not_a_parse_failure(bad, error):
    class Broken:
        def build_prompt(self, batch_item, agent_prompts):
            return "joint"

        def parse_completion(self, completion, batch_item, num_agents):
            return bad

    cmp = build_comparator(
        ComparatorConfig(comparator_generation_mode="centralized"), make_team(), 0, SAMPLING, adapter=Broken()
    )
    cmp._generate = lambda agent, pair, prompts, k: ["x"] * k
    with pytest.raises(error, match="Broken.parse_completion"):
        cmp.sample([["p"], ["q"]], 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"comparator_policy": "nope"}, r"comparator_policy: got 'nope', allowed: \['current'"),
        ({"comparator_generation_mode": "joint"}, "comparator_generation_mode: got 'joint'"),
        (
            {"comparator_on_error": "ignore"},
            r"comparator_on_error: got 'ignore', allowed: \['skip', 'stop'\]",
        ),
        ({"comparator_policy": "model"}, "needs exactly one of comparator_model_name"),
        (
            {"comparator_model_name": "x"},
            "comparator_model_name: got 'x', only applies to comparator_policy='model'",
        ),
        (
            {"comparator_history_k": 2},
            "comparator_history_k: got 2, only applies to comparator_policy='history'",
        ),
        ({"comparator_policy": "history", "comparator_history_k": 0}, "comparator_history_k: got 0, must be"),
        ({"comparator_policy": "api"}, "comparator_api_url: got None"),
        ({"comparator_policy": "api", "comparator_api_url": "ftp://x"}, "comparator_api_url: got 'ftp://x'"),
        (
            {
                "comparator_policy": "api",
                "comparator_api_url": "http://h",
                "comparator_api_format": "openai_chat",
            },
            "comparator_api_model: got None, comparator_api_format='openai_chat' needs the model name",
        ),
        (
            {"comparator_policy": "api", "comparator_api_url": "http://h", "comparator_api_timeout": 0},
            "comparator_api_timeout: got 0",
        ),
        (
            {"comparator_policy": "api", "comparator_api_url": "http://h", "comparator_api_max_retries": -1},
            "comparator_api_max_retries: got -1",
        ),
        ({"comparator_api_max_n_per_request": 0}, "comparator_api_max_n_per_request: got 0"),
        ({"comparator_num_candidates": 1.5}, "comparator_num_candidates: got 1.5"),
        ({"comparator_centralized_agent_index": -1}, "comparator_centralized_agent_index: got -1"),
    ],
)
def test_bad_comparator_values_are_refused_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ComparatorConfig(**kwargs)


def test_team_size_rules_are_checked_before_any_model_loads():
    cfg = ComparatorConfig(comparator_policy="model", comparator_agents=["builtin:tiny-gpt2"] * 3)
    with pytest.raises(ValueError, match="comparator_agents: .* needs 2 entries"):
        cfg.check(2)
    with pytest.raises(
        ValueError, match=r"comparator_centralized_agent_index: got 2, must be below num_agents \(2\)"
    ):
        ComparatorConfig(comparator_centralized_agent_index=2).check(2)
    with pytest.raises(ValueError, match="comparator_devices: .* needs one device per agent \\(2\\)"):
        ComparatorConfig(comparator_policy="current_copy", comparator_devices=["cpu"]).check(2)
    with pytest.raises(ValueError, match="comparator_devices: .* 'gpu0' is not a device"):
        ComparatorConfig(comparator_policy="current_copy", comparator_devices=["cpu", "gpu0"]).check(2)
    with pytest.raises(ValueError, match="comparator_devices: got 'cpu', only applies to comparator_policy"):
        ComparatorConfig(comparator_devices="cpu")
    assert ComparatorConfig(comparator_policy="copy").comparator_policy == "current_copy"  # CoMLRL alias
    assert ComparatorConfig(comparator_policy="history").comparator_history_k == 1  # CoMLRL default


@pytest.mark.parametrize(
    "module, name",
    [
        ("comlrl_lightning.preference.comparator.config", "ComparatorConfig"),
        ("comlrl_lightning.preference.comparator.config", "RoundsConfig"),
        ("comlrl_lightning.preference.replay", "ReplayConfig"),
    ],
)
def test_every_config_field_is_typed_and_documented_where_it_is_declared(module, name):
    import ast
    import dataclasses
    import importlib
    import inspect

    cls = getattr(importlib.import_module(module), name)
    body = ast.parse(inspect.getsource(cls)).body[0].body
    documented = {
        node.target.id
        for node, after in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
        and after.value.value.strip()
    }
    fields = {f.name for f in dataclasses.fields(cls)}
    assert fields and fields == documented, sorted(fields - documented)
