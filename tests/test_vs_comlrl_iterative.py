"""Differential against CoMLRL 1.4.3 ``trainers/preference/iterative.py`` (``MADPOIterTrainer``):
the comparator's API requests and completion extraction per format, the tagged centralized prompt
and parse, the pairing and ordering of (current i, comparator i) in every ``pair_selection``, one
episode's whole scoring-and-pairing flow (``_generate_preference_pairs_for_item``), replay
sampling weights and draws, the replay knobs' refusals, and per-round pair counts.

Everything here calls CoMLRL's own code: a trainer built with ``object.__new__`` (its ``__init__``
loads models) with the ``args`` attributes each method reads. Its API methods run against the same
local HTTP server as ours; its replay writes and reads its own shard files. Stand-ins, where it would
need models: ``_preference_pair_from_record`` and ``_preference_tensors_from_text`` (they tokenize with
the agents' tokenizers; the records are compared as text), and in the per-episode flow its two
generation calls, which return fixed texts (the same texts go to ours).

Differences (each asserted below, with its cause):

1. HTTP failures: CoMLRL raises at the first failure (``ValueError``; ``RuntimeError`` for 402); here
   timeouts, refused connections, 408/429/5xx are retried with backoff, and what follows is
   ``comparator_on_error`` (skip the episode's pairs, or stop). Cause: a transient 503 must not end
   a run, nor a dead endpoint stall it.
2. A ``generic`` reply with fewer completions than asked: CoMLRL takes what came (fewer pairs);
   here it is a ``ComparatorError`` (then ``comparator_on_error``). Cause: a silent shortfall hides a
   misconfigured server.
3. No ``api.deepseek.com`` sniffing: CoMLRL sends ``n=1`` requests to DeepSeek URLs; here set
   ``comparator_api_max_n_per_request: 1``. Cause: no vendor rules in the client.
4. A centralized completion without tags: CoMLRL raises ``CentralizedComparatorParseError``; here
   every role is ``""`` and ``comparator/parse_failures`` counts it. Cause: a parse failure is a
   defined outcome (as for the centralized actor).
5. Replay ages: CoMLRL lists only non-empty rounds, so an empty round does not age the older ones and
   ``nearest_k`` counts non-empty rounds; here ages count rounds. With no empty round the weights and
   draws are identical.
6. ``comparator_api_key`` (a key in the config) does not exist here: only ``comparator_api_key_env``.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import comlrl.trainers.preference.centralized as centralized  # the test extra installs comlrl 1.4.3
import comlrl.trainers.preference.iterative as iterative
import comlrl.trainers.preference.madpo as madpo
import pytest
from local_http import chat_reply, serving

from comlrl_lightning.preference.comparator import (
    ApiClient,
    ComparatorConfig,
    ComparatorError,
    comparison_order,
)
from comlrl_lightning.preference.pairs import PreferencePair
from comlrl_lightning.preference.replay import PreferenceReplay, ReplayConfig, replay_weights
from comlrl_lightning.team.centralized import TaggedAdapter, split_roles

Trainer = iterative.MADPOIterTrainer
server_factory = pytest.fixture(serving)

SAMPLING = {"max_new_tokens": 48, "temperature": 0.8, "top_p": 0.95, "top_k": 7}
OURS_TO_THEIRS = {
    "openai_chat": "openai",
    "anthropic_messages": "anthropic",
    "openai_responses": "openai_responses",
    "generic": "generic",
}


def theirs(**args) -> Trainer:
    """A CoMLRL trainer without models, its ``args`` holding what the called methods read."""
    t = object.__new__(Trainer)
    defaults = dict(
        comparator_api_url=None,
        comparator_api_format="generic",
        comparator_api_model=None,
        comparator_api_timeout=5.0,
        comparator_api_headers=None,
        comparator_api_key=None,
        comparator_api_key_env=None,
        comparator_api_key_header="Authorization",
        comparator_api_key_prefix="Bearer",
        comparator_api_response_field="completions",
        comparator_api_extra_body=None,
        comparator_api_max_n_per_request=None,
        max_new_tokens=SAMPLING["max_new_tokens"],
        temperature=SAMPLING["temperature"],
        top_p=SAMPLING["top_p"],
        top_k=SAMPLING["top_k"],
        pair_selection="reward_gap",
        preference_pairs_per_sample=None,
        preference_replay_mode="current",
        preference_replay_k=None,
        preference_replay_lambda=None,
        preference_replay_sample_size=None,
    )
    t.args = SimpleNamespace(**{**defaults, **args})
    return t


def ours(url: str, fmt: str, **kw) -> ApiClient:
    model = kw.pop("comparator_api_model", "served-model")
    cfg = ComparatorConfig(
        comparator_policy="api",
        comparator_api_url=url,
        comparator_api_format=fmt,
        comparator_api_model=model,
        **kw,
    )
    return ApiClient(cfg, SAMPLING)


# ---------------------------------------------------------------------------------------- the API
REPLIES = {
    "openai_chat": lambda r: chat_reply([f"c{j}" for j in range(r["body"]["n"])]),
    "anthropic_messages": lambda r: (200, {"content": [{"type": "text", "text": "a"}, {"type": "tool_use"}]}),
    "openai_responses": lambda r: (200, {"output": [{"content": [{"type": "output_text", "text": "o"}]}]}),
    "generic": lambda r: (
        200,
        {"completions": [{"text": f"g{j}"} for j in range(r["body"]["num_return_sequences"])]},
    ),
}


@pytest.mark.parametrize("fmt", list(REPLIES))
@pytest.mark.parametrize("max_n", [None, 2])
def test_requests_and_completions_equal_comlrls_per_format(server_factory, monkeypatch, fmt, max_n):
    monkeypatch.setenv("CMP_KEY", "k-123")
    srv = server_factory(handler=REPLIES[fmt])
    extra = {"stop": ["###"]}
    kw = dict(
        comparator_api_max_n_per_request=max_n,
        comparator_api_key_env="CMP_KEY",
        comparator_api_extra_body=extra,
    )
    model = None if fmt == "generic" else "served-model"
    t = theirs(
        comparator_api_url=srv.url,
        comparator_api_format=OURS_TO_THEIRS[fmt],
        comparator_api_model=model,
        **kw,
    )
    row = {"prompt": "P", "task_id": 3}
    expected = t._call_comparator_api(prompt="Solve P", agent_idx=1, batch_item=row, num_candidates=5)
    their_requests = [(r["body"], _key_headers(r)) for r in srv.requests]
    per_request = {"openai_chat": max_n or 5, "generic": 5}.get(fmt, 1)
    assert len(their_requests) == -(-5 // per_request) and len(expected) == 5
    srv.requests.clear()
    got = ours(srv.url, fmt, comparator_api_model=model, **kw).complete("Solve P", 5, agent=1, episode=row)
    assert got == expected
    assert [(r["body"], _key_headers(r)) for r in srv.requests] == their_requests


def _key_headers(request) -> dict[str, str]:
    keep = ("authorization", "x-api-key", "anthropic-version", "content-type")
    return {k.lower(): v for k, v in request["headers"].items() if k.lower() in keep}


EXTRACTION_CASES = [
    {"choices": [{"message": {"content": "x"}}, {"text": "y"}, {"message": {}}, "junk"]},
    {"choices": []},
    {
        "content": [
            {"type": "text", "text": "t1"},
            {"type": "text"},
            {"type": "image"},
            {"type": "text", "text": "t2"},
        ]
    },
    {
        "output": [
            {"content": [{"type": "output_text", "text": "r"}, {"type": "text", "text": "s"}]},
            {"content": "no"},
        ]
    },
    {
        "completions": [
            "a",
            {"content": "b"},
            {"completion": "c"},
            {"response": "d"},
            {"message": {"content": "e"}},
            7,
        ]
    },
    {"responses": "single"},
    {"outputs": [None, "z"]},
    {"data": {"texts": ["deep"]}},
    {"unrelated": 1},
    ["not", "a", "dict"],
]


@pytest.mark.parametrize("fmt", list(REPLIES))
@pytest.mark.parametrize("reply", EXTRACTION_CASES)
def test_completion_extraction_equals_comlrls(fmt, reply):
    field = "data.texts" if "data" in reply else "completions"
    t = theirs(comparator_api_response_field=field)
    expected = t._extract_api_completions(reply, api_format=OURS_TO_THEIRS[fmt])
    client = ours("http://unused", fmt, comparator_api_response_field=field)
    assert client._extract(reply) == expected


def test_difference_1_http_errors_are_retried_here_not_in_comlrl(server_factory):
    srv = server_factory([(503, {"e": 1}), chat_reply(["ok"]), (503, {"e": 1}), chat_reply(["ok"])])
    t = theirs(comparator_api_url=srv.url, comparator_api_format="openai", comparator_api_model="m")
    with pytest.raises(ValueError, match="HTTP 503"):
        t._call_comparator_api(prompt="p", agent_idx=0, batch_item={}, num_candidates=1)
    srv.replies.pop(0)  # the reply CoMLRL never asked for
    client = ours(srv.url, "openai_chat", comparator_api_retry_backoff=0.0)
    assert client.complete("p", 1) == ["ok"] and client.retries == 1


def test_difference_2_a_short_generic_reply_is_an_error_here(server_factory):
    srv = server_factory(handler=lambda r: (200, {"completions": ["only"]}))
    t = theirs(comparator_api_url=srv.url)
    assert t._call_comparator_api(prompt="p", agent_idx=0, batch_item={}, num_candidates=3) == ["only"]
    with pytest.raises(ComparatorError, match="held 1 completions, 3 were asked for"):
        ours(srv.url, "generic", comparator_api_model=None).complete("p", 3)


def test_difference_3_no_deepseek_sniffing():
    t = theirs(comparator_api_url="https://api.deepseek.com/chat/completions", comparator_api_format="openai")
    assert t._comparator_api_max_n_per_request(4) == 1
    assert ours("https://api.deepseek.com/chat/completions", "openai_chat").max_n_per_request(4) == 4
    assert (
        ours(
            "https://api.deepseek.com/x", "openai_chat", comparator_api_max_n_per_request=1
        ).max_n_per_request(4)
        == 1
    )


# ---------------------------------------------------------------------------------------- centralized
@pytest.mark.parametrize("prompts", [["write f", "test f"], ["a", "b", "c"], ["only one"]])
def test_tagged_prompt_equals_comlrls(prompts):
    adapter = centralized.TaggedCentralizedComparatorAdapter()
    assert TaggedAdapter().build_prompt({}, prompts) == adapter.build_prompt({"prompt": "x"}, prompts)


@pytest.mark.parametrize(
    "text",
    [
        "<agent_0>x</agent_0><agent_1>y</agent_1>",
        "< AGENT_1 >\n  y \n</ agent_1>\n<agent_0>x</agent_0>",
        "<agent_0>only zero</agent_0>",
        "<agent_0>a</agent_0><agent_0>b</agent_0><agent_1>c",
    ],
)
def test_tagged_parse_equals_comlrls(text):
    expected = list(centralized.TaggedCentralizedComparatorAdapter().parse_completion(text, {}, 2))
    split = split_roles(TaggedAdapter(), text, {}, 2)
    assert (split.roles, split.failed) == (expected, False)


def test_comlrls_own_adapter_works_in_our_comparator_unchanged(server_factory):
    joint = "<agent_1>B</agent_1> <agent_0>A</agent_0>"
    srv = server_factory(handler=lambda r: chat_reply([joint, "untagged"]))
    cfg = ComparatorConfig(
        comparator_policy="api",
        comparator_api_url=srv.url,
        comparator_api_format="openai_chat",
        comparator_api_model="m",
        comparator_generation_mode="centralized",
    )
    from comlrl_lightning.preference.comparator.remote import ApiComparator

    adapter = centralized.TaggedCentralizedComparatorAdapter()
    sample = ApiComparator(cfg, 2, 0, SAMPLING, adapter=adapter).sample([["p0"], ["p1"]], 2, [{"id": 1}])
    assert srv.requests[0]["body"]["messages"][0]["content"] == adapter.build_prompt({"id": 1}, ["p0", "p1"])
    assert sample.joint(0) == [["A", ""], ["B", ""]] and sample.parse_failures == 1


def test_difference_4_an_untagged_completion_is_an_outcome_here():
    with pytest.raises(centralized.CentralizedComparatorParseError):
        centralized.TaggedCentralizedComparatorAdapter().parse_completion("no tags", {}, 2)
    split = split_roles(TaggedAdapter(), "no tags", {}, 2)
    assert (split.roles, split.failed) == (["", ""], True)


# ---------------------------------------------------------------------------------------- pairing
def _reward_lists(seed: int):
    rng = random.Random(seed)
    k, kc = rng.randint(1, 8), rng.randint(1, 8)
    grid = [0.0, 0.25, 0.5, 1.0]  # coarse values: ties and equal comparator rewards are common
    return [rng.choice(grid) for _ in range(k)], [rng.choice(grid) for _ in range(kc)]


@pytest.mark.parametrize("mode", ["reward_gap", "all", "random", "comparator_reward"])
@pytest.mark.parametrize("limit", [None, 1, 3])
def test_pairing_and_order_equal_comlrls(mode, limit):
    t = theirs(pair_selection=mode, preference_pairs_per_sample=limit)
    compared = 0
    for seed in range(60):
        cur, cmp = _reward_lists(seed)
        random.seed(seed)
        expected = t._select_policy_comparison_pairs(cur, cmp)
        got = comparison_order(cur, cmp, mode, limit, random.Random(seed))
        assert got == expected, (seed, cur, cmp)
        texts_cur = [[f"cur{i}" for i in range(len(cur))], [f"CUR{i}" for i in range(len(cur))]]
        texts_cmp = [[f"cmp{i}" for i in range(len(cmp))], [f"CMP{i}" for i in range(len(cmp))]]
        for (ws, wi), (ls, li) in got:  # the texts CoMLRL's _completion_group puts in each pair
            assert Trainer._completion_group(ws, wi, texts_cur, texts_cmp) == [
                texts_cur[a][wi] if ws == "current" else texts_cmp[a][wi] for a in range(2)
            ]
            assert Trainer._reward_at(ls, li, cur, cmp) == (cur[li] if ls == "current" else cmp[li])
        compared += 1
    assert compared == 60


# ---------------------------------------------------------------------------------------- replay
@pytest.mark.parametrize("lam", [0.0, 0.3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("num_rounds", [1, 2, 5])
def test_lambda_weights_equal_comlrls(lam, num_rounds):
    expected = theirs(preference_replay_lambda=lam)._lambda_decay_weights(num_rounds)
    cfg = ReplayConfig("lambda_decay", preference_replay_lambda=lam)
    assert replay_weights(cfg, list(range(num_rounds)), num_rounds - 1) == pytest.approx(expected, rel=1e-12)


def _their_pair(r: int, i: int):
    return madpo.PreferencePair([f"p{r}"], [f"w{r}.{i}"], [f"l{r}.{i}"], [], 1.0, 0.0, 0.5)


REPLAY_CONFIGS = [
    dict(preference_replay_mode="current"),
    dict(preference_replay_mode="nearest_k", preference_replay_k=2),
    dict(preference_replay_mode="nearest_k", preference_replay_k=3, preference_replay_sample_size=7),
    dict(preference_replay_mode="all_history"),
    dict(preference_replay_mode="all_history", preference_replay_sample_size=11),
    dict(preference_replay_mode="lambda_decay", preference_replay_lambda=0.5),
    dict(
        preference_replay_mode="lambda_decay", preference_replay_lambda=0.8, preference_replay_sample_size=9
    ),
]


@pytest.mark.parametrize("knobs", REPLAY_CONFIGS)
@pytest.mark.parametrize("sizes", [[4, 2, 6, 3, 5], [1, 1, 8]])
def test_replay_draws_and_per_round_counts_equal_comlrls(tmp_path, knobs, sizes):
    """Rounds of hand-built pairs through CoMLRL's ``_select_iteration_preference_pairs`` (its writer,
    its shard list, its draws from the global ``random``) and through ours (the same seed)."""
    t = theirs(**knobs)
    t._preference_replay_dir_path = str(tmp_path / "theirs")
    (tmp_path / "theirs").mkdir()
    t._preference_pair_from_record = lambda record: record  # no tokenizer: compare the texts
    replay = PreferenceReplay(ReplayConfig(**knobs), str(tmp_path / "ours"), seed=11)
    random.seed(11)
    for r, n in enumerate(sizes):
        their_current = [_their_pair(r, i) for i in range(n)]
        expected = t._select_iteration_preference_pairs(their_current, iteration_idx=r)
        current = [PreferencePair([f"p{r}"], [f"w{r}.{i}"], [f"l{r}.{i}"], 1.0, 0.0) for i in range(n)]
        replay.add_round(r, current)
        got = replay.select(r, current)
        flat = [
            (p.winner_completions[0] if hasattr(p, "winner_completions") else p["winner_completions"][0])
            for p in expected
        ]
        assert [p.chosen[0] for p in got] == flat, (r, knobs)
    assert replay.counts() == (len(sizes), sum(sizes))


def test_difference_5_an_empty_round_ages_the_others_here(tmp_path):
    knobs = dict(preference_replay_mode="nearest_k", preference_replay_k=1)
    t = theirs(**knobs)
    t._preference_replay_dir_path = str(tmp_path)
    t._preference_pair_from_record = lambda record: record
    t._select_iteration_preference_pairs([_their_pair(0, 0)], iteration_idx=0)
    # round 1 has no pairs: CoMLRL's newest listed round is still round 0, so it replays it
    assert len(t._select_iteration_preference_pairs([], iteration_idx=1)) == 1
    replay = PreferenceReplay(ReplayConfig(**knobs), str(tmp_path / "ours"), seed=0)
    replay.add_round(0, [PreferencePair(["p"], ["w"], ["l"], 1.0, 0.0)])
    replay.add_round(1, [])
    assert replay.select(1, []) == []  # the last 1 round (round 1) has nothing


@pytest.mark.parametrize(
    "knobs",
    [
        dict(preference_replay_mode="current", preference_replay_k=1),
        dict(preference_replay_mode="current", preference_replay_k=2),
        dict(preference_replay_mode="current", preference_replay_lambda=0.5),
        dict(preference_replay_mode="current", preference_replay_sample_size=3),
        dict(preference_replay_mode="nearest_k"),
        dict(preference_replay_mode="nearest_k", preference_replay_k=0),
        dict(preference_replay_mode="nearest_k", preference_replay_k=2, preference_replay_lambda=0.1),
        dict(preference_replay_mode="all_history", preference_replay_k=2),
        dict(preference_replay_mode="all_history", preference_replay_sample_size=0),
        dict(preference_replay_mode="lambda_decay"),
        dict(preference_replay_mode="lambda_decay", preference_replay_lambda=1.2),
        dict(preference_replay_mode="lambda_decay", preference_replay_lambda=0.0),
        dict(preference_replay_mode="lambda_decay", preference_replay_lambda=0.5, preference_replay_k=2),
    ],
)
def test_replay_knobs_are_refused_where_comlrl_refuses_them(knobs):
    args = SimpleNamespace(
        **{
            "preference_replay_k": None,
            "preference_replay_lambda": None,
            "preference_replay_sample_size": None,
            **knobs,
        }
    )
    try:
        iterative._validate_preference_replay_args(args)
        comlrl_ok = True
    except ValueError:
        comlrl_ok = False
    try:
        ReplayConfig(**knobs)
        ours_ok = True
    except ValueError:
        ours_ok = False
    assert ours_ok == comlrl_ok


# ---------------------------------------------------------------------------------------- one build batch
def _score(first: str, second: str) -> float:
    return float((len(first) + 2 * len(second)) % 4)  # coarse: ties and equal comparator rewards


def _their_episode_pairs(cur, cmp, prompts, mode, k, kc, limit):
    """CoMLRL's ``_generate_preference_pairs_for_item`` with its two generation calls returning ``cur``
    / ``cmp`` (``[N][K]`` texts) and no tokenizer (``_preference_tensors_from_text``)."""
    t = theirs(pair_selection=mode, preference_pairs_per_sample=limit, preference_num_candidates=k)
    t.args.comparator_num_candidates, t.args.joint_mode, t.args.log_reward_distribution = kc, "aligned", False
    t.num_agents, t.reward_processor, t.agents = 2, lambda r: r, None
    t.reward_func = lambda c0, c1: [_score(c0[0], c1[0])]
    t._generate_policy_outputs_for_item = lambda agents, item, num_candidates, **kw: [
        {"prompts": [prompts[i]], "completions": [cur[i]]} for i in range(2)
    ]
    t._generate_comparator_outputs_for_item = lambda item, iteration_idx, num_candidates, **kw: [
        {"prompts": [prompts[i]], "completions": [cmp[i]]} for i in range(2)
    ]
    t._preference_tensors_from_text = lambda *args: None
    return t._generate_preference_pairs_for_item({"x": "x"}, iteration_idx=0)


def _our_episode_pairs(cur, cmp, mode, k, kc, limit, rng):
    from comlrl_lightning.envs.base import DecPOMDP, Episode
    from comlrl_lightning.preference.comparator import ComparatorSample, build_candidates
    from comlrl_lightning.team.agents import AgentSpec

    comparator = SimpleNamespace(sample=lambda prompts, n, episodes=None: ComparatorSample(cmp, [True], n))
    team = SimpleNamespace(tokenizers=[None, None], specs=[AgentSpec("x")] * 2)
    team.generate = lambda rendered, kk: [SimpleNamespace(texts=list(cur[i])) for i in range(2)]
    env = DecPOMDP(["solve: {x}", "check: {x}"], lambda ja, eps, turn: [_score(a[0], a[1]) for a in ja])
    return build_candidates(team, env, comparator, [Episode(0, {"x": "x"})], k, kc, mode, limit, rng).pairs


@pytest.mark.parametrize("mode", ["reward_gap", "all", "random", "comparator_reward"])
@pytest.mark.parametrize("k, kc, limit", [(4, 4, None), (4, 3, 2), (2, 5, 1)])
def test_an_episodes_pairs_equal_comlrls_generate_preference_pairs_for_item(mode, k, kc, limit):
    """CoMLRL's whole per-episode flow (its reward call, selection and pair records) against
    :func:`build_candidates` on the same texts (25 random text sets per case)."""
    compared = 0
    for seed in range(25):
        rng = random.Random(seed)
        cur = [["".join(rng.choices("ab", k=rng.randint(0, 4))) for _ in range(k)] for _ in range(2)]
        cmp = [["".join(rng.choices("ab", k=rng.randint(0, 4))) for _ in range(kc)] for _ in range(2)]
        random.seed(seed)
        expected = _their_episode_pairs(cur, cmp, ["solve: x", "check: x"], mode, k, kc, limit)
        got = _our_episode_pairs(cur, cmp, mode, k, kc, limit, random.Random(seed))
        assert [(p.chosen, p.rejected, p.chosen_reward, p.rejected_reward, p.prompts) for p in got] == [
            (p.winner_completions, p.loser_completions, p.winner_reward, p.loser_reward, p.prompts)
            for p in expected
        ], (seed, cur, cmp)
        compared += len(got)
    assert compared >= 10  # pairs were formed and compared, not only empty lists
