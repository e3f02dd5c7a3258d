"""Bad input is refused before any model loads, naming the field, the value and what is allowed (issue 12 §4)."""

import json
import os
import warnings
from pathlib import Path

import pytest
from experiments import experiment
from test_coordinator import RowEpisodes, coordinator

from comlrl_lightning import MAGRPO, AgentSpec
from comlrl_lightning.cli import main
from comlrl_lightning.datamodules import DecPOMDPDataModule, load_rows
from comlrl_lightning.envs.toy import TargetLengthReward
from comlrl_lightning.team import kinds as kinds_mod

ROOT = Path(__file__).resolve().parents[1]


def no_model_loads(monkeypatch):
    monkeypatch.setattr(
        kinds_mod, "load_agent", lambda *a: (_ for _ in ()).throw(AssertionError("a model loaded"))
    )


def jsonl(tmp_path, rows, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


# ------------------------------------------------------------------ data
def test_template_with_a_syntax_error_names_the_formatter_at_construction():
    with pytest.raises(ValueError, match=r"data\.formatters\[1\]: PromptTemplate '\{topic'"):
        DecPOMDPDataModule([{"topic": "x"}], ["A {topic}", "{topic"], TargetLengthReward(4))


@pytest.mark.parametrize("template", ["Q: {}", "Q: {0}"])
def test_a_positional_template_field_is_refused_at_construction(template):
    with pytest.raises(ValueError, match=r"data\.formatters\[0\]: .*positional fields"):
        DecPOMDPDataModule([{"q": "x"}], [template], TargetLengthReward(4))


def test_unknown_placeholder_fails_at_setup_naming_the_formatter_and_the_row_fields():
    dm = DecPOMDPDataModule([{"topic": "x"}] * 4, ["A {topic}", "B {subject}"], TargetLengthReward(4))
    with pytest.raises(
        ValueError, match=r"data\.formatters\[1\].*first training row.*\['topic'\].*'subject'"
    ):
        dm.setup("fit")


def test_callable_formatter_that_raises_is_named_at_setup():
    def bad(row):
        return row["nope"]

    dm = DecPOMDPDataModule([{"topic": "x"}] * 4, [bad], TargetLengthReward(4))
    with pytest.raises(ValueError, match=r"data\.formatters\[0\] \(<function .*bad.*KeyError"):
        dm.setup("fit")


def test_a_row_missing_a_field_is_refused_at_setup_naming_the_row(tmp_path):
    # datasets fills a field that a later row lacks with None; every row is checked at setup (not at its batch)
    rows = [{"topic": "a"}] * 3 + [{"other": 1}]
    dm = DecPOMDPDataModule(jsonl(tmp_path, rows), ["{topic}"], TargetLengthReward(4), shuffle=False)
    with pytest.raises(ValueError, match=r"data\.formatters\[0\] .*uses the field 'topic', which training row 3 "
                                         r"lacks"):  # fmt: skip
        dm.setup("fit")
    listed = DecPOMDPDataModule([{"topic": "a"}, {"topic": None}], ["{topic}"], TargetLengthReward(4))
    with pytest.raises(ValueError, match="training row 1 lacks"):
        listed.setup("fit")
    first_missing = DecPOMDPDataModule(jsonl(tmp_path, [{"other": 1}, {"topic": "a"}], "b.jsonl"), ["{topic}"],
                                       TargetLengthReward(4))  # fmt: skip
    with pytest.raises(ValueError, match=r"data\.formatters\[0\].*field 'topic' is None"):
        first_missing.setup("fit")


@pytest.mark.parametrize("path", ["./nope_dir", "../nope/data", "~/nope_dir", "a/b/c"])
def test_a_missing_local_path_without_an_extension_is_named_not_a_hub_error(path):
    with pytest.raises(
        FileNotFoundError, match=r"^data\.dataset: no file or folder '.*' \(.* is a local path"
    ):
        load_rows(path)


def test_an_unknown_hub_dataset_offline_says_what_was_tried():
    with pytest.raises(ValueError, match=r"^data\.val_dataset: 'no-such-dataset-xyz' is no local file or folder, and "
                                         r"the Hugging Face Hub"):  # fmt: skip
        load_rows("no-such-dataset-xyz", field="data.val_dataset")


@pytest.mark.parametrize(
    "bad,why", [('{"topic": "b"', "not valid JSON"), ('["b"]', "a JSON list, not an object")]
)
def test_a_malformed_jsonl_line_is_named_with_its_file_and_line_last(tmp_path, bad, why):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"topic": "a"}\n\n' + bad + '\n{"topic": "c"}\n')
    with pytest.raises(ValueError, match=rf"^data\.dataset: {path}, line 3: {why}") as info:
        load_rows(str(path))
    assert info.value.__cause__ is None and info.value.__suppress_context__  # the message is printed last


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_jsonl_names_the_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"data\.dataset: '.*empty\.jsonl' has no rows"):
        load_rows(str(path))


def test_an_empty_list_dataset_is_refused_at_setup():
    dm = DecPOMDPDataModule([], ["{q}"], TargetLengthReward(4))
    with pytest.raises(ValueError, match="training split of 'list' has no rows"):
        dm.setup("fit")


@pytest.mark.parametrize("field", ["max_train_samples", "max_val_samples"])
def test_zero_sample_caps_are_refused(field):
    with pytest.raises(ValueError, match=f"data.{field}: got 0, must be >= 1 or None"):
        DecPOMDPDataModule([{"q": 1}], ["{q}"], TargetLengthReward(4), **{field: 0})


def test_zero_train_samples_from_the_cli_fail_before_any_model_loads(monkeypatch, capsys):
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "configs/selfplay_grpo.yaml", "--data.init_args.max_train_samples=0"])
    assert info.value.code == 1
    assert "data.max_train_samples: got 0" in capsys.readouterr().err


# ------------------------------------------------------------------ model
def test_an_empty_agent_list_is_refused_at_construction():
    with pytest.raises(ValueError, match="agents: got an empty list"):
        MAGRPO(agents=[])


def test_negative_top_k_is_refused():
    with pytest.raises(ValueError, match=r"^top_k: got -1, must be an integer >= 0 or None"):
        MAGRPO(agents=["builtin:tiny-gpt2"] * 2, top_k=-1)


@pytest.mark.parametrize(
    "key,value", [("temperature", 0), ("top_p", 0.0), ("top_k", -5), ("max_new_tokens", 0)]
)
def test_per_agent_sampling_overrides_are_checked_naming_the_agent(key, value):
    agents = [AgentSpec("builtin:tiny-gpt2"), AgentSpec("builtin:tiny-gpt2", generation={key: value})]
    with pytest.raises(ValueError, match=rf"^agents\[1\]\.generation\.{key}: got {value}"):
        MAGRPO(agents=agents)


def test_a_missing_local_folder_is_named_before_anything_loads(tmp_path):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ValueError, match=rf"agents\[0\]\.model: no local folder '{missing}'"):
        MAGRPO(agents=[missing, "builtin:tiny-gpt2"])
    with pytest.raises(ValueError, match=r"agents\[1\]\.tokenizer: no local folder"):
        MAGRPO(
            agents=[AgentSpec("builtin:tiny-gpt2"), AgentSpec("builtin:tiny-gpt2", tokenizer="./nope/tok")]
        )


def test_an_uncached_hub_id_offline_is_named(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"agents\[0\]\.model: 'no-such-org/no-such-model' is neither a local folder "
                                         r"nor in the Hugging Face cache.*HF_HUB_OFFLINE=1"):  # fmt: skip
        MAGRPO(agents=["no-such-org/no-such-model"] * 2)


def test_a_load_failure_names_the_model(monkeypatch, tmp_path):
    from comlrl_lightning.team.agents import load_agent

    (tmp_path / "broken").mkdir()  # exists, so it passes the pre-load check, but holds no config.json
    with pytest.raises(
        OSError,
        match=rf"agent model '{tmp_path}/broken': cannot load '{tmp_path}/broken' \((OSError|ValueError)",
    ):
        load_agent(AgentSpec(str(tmp_path / "broken"), tokenizer="builtin:tiny-gpt2"))


# ------------------------------------------------------------------ context
def test_prompts_longer_than_the_context_keep_their_end_with_a_warning():
    from comlrl_lightning.core.config import SamplingConfig
    from comlrl_lightning.core.generation import generate
    from comlrl_lightning.team.agents import load_agent

    model, tok = load_agent(AgentSpec("builtin:tiny-gpt2"))  # n_positions = 512, one token per byte
    long_prompt = "x" * 700 + "END"
    with pytest.warns(
        UserWarning, match=r"1 of 2 prompts are longer than the model's context \(512 tokens\)"
    ):
        gen = generate(model, tok, [long_prompt, "short"], 2, SamplingConfig(max_new_tokens=12), False)
    assert gen.prompt_ids.shape[1] == 512 - 12
    assert tok.decode(gen.prompt_ids[0][-3:]) == "END"
    assert gen.completion_ids.shape[1] <= 12


def test_max_new_tokens_past_the_context_is_refused_when_the_model_loads():
    module = MAGRPO(agents=["builtin:tiny-gpt2"], max_new_tokens=600)
    with pytest.raises(
        ValueError, match=r"agents\[0\] \(builtin:tiny-gpt2\): max_new_tokens: got 600.*context is 512"
    ):
        module.configure_model()


# ------------------------------------------------------------------ CLI
REWARDS = """
def plain(joint_actions, episodes, turn):
    return [1.0] * len(joint_actions)

def other_names(a, b, c) -> list:
    return [1.0] * len(a)

def two_args(joint_actions, episodes):
    return [0.0] * len(joint_actions)
"""


@pytest.mark.parametrize("name", ["plain", "other_names"])
def test_any_three_argument_reward_is_accepted_from_yaml_whatever_its_annotations(
    tmp_path, monkeypatch, capsys, name
):
    (tmp_path / "user_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "configs/selfplay_grpo.yaml", f"--data.init_args.reward=user_rewards.{name}",
              "--print_config"])  # fmt: skip
    assert info.value.code == 0
    assert f"reward: user_rewards.{name}" in capsys.readouterr().out


def test_a_reward_module_in_the_working_directory_is_importable_from_yaml(tmp_path, monkeypatch, capsys):
    # before the fix the comlrl-lightning script (sys.path[0]: its bin folder) failed with "No module named ..."
    import sys

    (tmp_path / "cwd_rewards.py").write_text(REWARDS)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(ROOT / "configs" / "selfplay_grpo.yaml"), "--data.init_args.reward=cwd_rewards.plain",
              "--print_config"])  # fmt: skip
    assert info.value.code == 0, capsys.readouterr().err
    assert "reward: cwd_rewards.plain" in capsys.readouterr().out


def test_a_reward_of_the_wrong_arity_is_refused_from_yaml(tmp_path, monkeypatch, capsys):
    (tmp_path / "user_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "configs/selfplay_grpo.yaml", "--data.init_args.reward=user_rewards.two_args",
              "--print_config"])  # fmt: skip
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: data.init_args.reward: user_rewards.two_args(joint_actions, episodes) cannot be "
                           "a reward: a reward is called as fn(joint_actions, episodes, turn)")  # fmt: skip
    assert "TRLReward" in last


def trl_style(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_a_reward_of_the_wrong_signature_is_refused_at_construction_through_the_python_api():
    no_model = DecPOMDPDataModule  # the datamodule is built before any model
    with pytest.raises(TypeError, match=r"^data\.reward\[1\]: two_args\(joint_actions, episodes\) cannot be called as "
                                        r"fn\(joint_actions, episodes, turn\)"):  # fmt: skip
        no_model([{"q": "x"}], ["{q}"], [TargetLengthReward(4), lambda_two_args])
    with pytest.raises(TypeError, match=r"reward\[0\]: trl_style\(prompts, completions, \*\*kwargs\).*It looks like a "
                                        r"TRL reward: use comlrl_lightning\.envs\.TRLReward"):  # fmt: skip
        no_model([{"q": "x"}], ["{q}"], trl_style)


def lambda_two_args(joint_actions, episodes):
    return [0.0] * len(joint_actions)


lambda_two_args.__name__ = "two_args"


@pytest.mark.parametrize(
    "args,line",
    [
        (["--data.init_args.batch_sise=3"], "data.init_args.batch_sise: no such key of "
         "comlrl_lightning.datamodules.DecPOMDPDataModule; did you mean 'batch_size'?"),
        (["--model.init_args.learning_rat=0.1"], "model.init_args.learning_rat: no such key of comlrl_lightning.MAGRPO; "
         "did you mean 'learning_rate'?"),
        (["--model.init_args.loss.loss_type=grpoo"], "model.init_args.loss.loss_type: got 'grpoo'; allowed: "
         "'sequence_sum', 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'sequence_mean', 'token_mean'; did you mean 'grpo'?"),
        (["--trainer.max_stepz=3"], "--trainer.max_stepz: not an option; did you mean '--trainer.max_steps'?"),
        (["--optimizer=torch.optim.SGD"], "--optimizer: a top-level optimizer/lr_scheduler would replace the per-agent "
         "ones: give the factory as model.init_args.optimizer"),
        ("yaml-optimizer", "optimizer.class_path: a top-level optimizer/lr_scheduler would replace the per-agent ones"),
        ("yaml-typo", "data.init_args.batch_sise: no such key of comlrl_lightning.datamodules.DecPOMDPDataModule; "
         "did you mean 'batch_size'?"),
    ],
    ids=["cli-key", "cli-model-key", "literal", "trainer-flag", "cli-optimizer", "yaml-optimizer", "yaml-key"],
)  # fmt: skip
def test_a_config_error_ends_in_one_line_naming_the_key_and_the_closest_allowed(tmp_path, monkeypatch, capsys,
                                                                                 args, line):  # fmt: skip
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    if args == "yaml-optimizer":
        (tmp_path / "c.yaml").write_text("optimizer:\n  class_path: torch.optim.SGD\n")
        args = ["--config", str(tmp_path / "c.yaml")]
    elif args == "yaml-typo":
        (tmp_path / "c.yaml").write_text("data:\n  init_args:\n    batch_sise: 3\n")
        args = ["--config", str(tmp_path / "c.yaml")]
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "configs/selfplay_grpo.yaml", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: {line}")
    assert "Given value" not in err


def test_an_init_error_is_printed_once_with_the_message_last(monkeypatch, capsys):
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(["fit", *experiment("toy_grpo.yaml"), "--model.init_args.sampling.top_k=-1"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    message = "top_k: got -1, must be an integer >= 0 or None"
    assert err.count(message) == 1
    # the group's own check names its bare field; the CLI adds the group jsonargparse was building
    assert err.strip().splitlines()[-1].startswith(f"ValueError: sampling.{message}")
    assert "Namespace(" not in err and "direct cause" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "config,args,line",
    [
        ("toy_length_ratio.yaml", ["--model.init_args.rollout.num_generation=3"], "model.init_args.rollout."
         "num_generation: no such key of comlrl_lightning.MAGRPO; did you mean 'rollout.num_generations'?"),
        ("toy_length_ratio.yaml", "rollout:\n      num_generation: 3", "model.init_args.rollout.num_generation: "
         "no such key of comlrl_lightning.MAGRPO; did you mean 'rollout.num_generations'?"),
        ("toy_length_ratio.yaml", ["--model.init_args.num_generations=3"], "model.init_args.num_generations: no "
         "such key of comlrl_lightning.MAGRPO; did you mean 'rollout.num_generations'?"),
        ("toy_centralized_magrpo.yaml", ["--model.init_args.num_agents=2"], "model.init_args.num_agents: no such "
         "key of comlrl_lightning.CentralizedMAGRPO; one model plays every role: the role count is 'num_roles'"),
        ("toy_marlhf_iterative.yaml", "pair_source:\n      pairs_path: x.jsonl", "model.init_args.pair_source."
         "pairs_path: no such key of comlrl_lightning.MARLHFIter (no group 'pair_source'); its groups: "
         "['comparator', 'preference', 'replay', 'reward_model', 'rl_phase', 'rounds']"),
        ("toy_marlhf_iterative.yaml", ["--model.init_args.pair_source.pairs_path=x.jsonl"], "model.init_args."
         "pair_source.pairs_path: no such key of comlrl_lightning.MARLHFIter (no group 'pair_source')"),
        ("toy_length_ratio.yaml", ["--model.init_args.log_completions=true"], "model.init_args.log_completions: no "
         "such key of comlrl_lightning.MAGRPO; completions are logged by a callback: trainer.callbacks lists "
         "comlrl_lightning.callbacks.CompletionLogger"),
        ("toy_length_ratio.yaml", ["--model.init_args.sampling.top_k=abc"], "model.init_args.sampling.top_k: got "
         "'abc'; allowed: an integer or null"),
        ("toy_length_ratio.yaml", ["--model.init_args.val_sampling=maybe"], "model.init_args.val_sampling: got "
         "'maybe'; allowed: true or false"),
        ("toy_length_ratio.yaml", ["--trainer.max_steps=many"], "trainer.max_steps: got 'many'; allowed: an "
         "integer"),
    ],
    ids=["nested-cli", "nested-yaml", "group-missing", "centralized-num-agents", "marlhf-iter-pair-source-yaml",
         "marlhf-iter-pair-source-cli", "log-completions", "optional-int", "bool", "trainer-int"],
)  # fmt: skip
def test_a_bad_key_or_value_names_the_given_value_and_suggests_only_a_valid_key(
    tmp_path, monkeypatch, capsys, config, args, line
):
    # before the fix: nested typos got "ambiguous option" / "Group ... does not accept", the rejected key
    # itself was suggested (num_agents, pair_source.pairs_path), log_completions was pointed at
    # loss.mask_truncated_completions, and union / optional fields said "- Expected a <class 'int'>"
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    if isinstance(args, str):
        (tmp_path / "c.yaml").write_text("model:\n  init_args:\n    " + args + "\n")
        args = ["--config", str(tmp_path / "c.yaml")]
    with pytest.raises(SystemExit) as info:
        main(["fit", *experiment(config), *args])
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: {line}")
    if "did you mean" in last:  # only a key the class accepts
        rejected = line.split(": no such key")[0].removeprefix("model.init_args.")
        assert last.split("did you mean '")[1].rstrip("'?") != rejected


@pytest.mark.parametrize(
    "args,line",
    [
        (["--model.init_args.rollout.num_generations=1"], "ValueError: rollout.num_generations: got 1, must be >= 2"),
        (["--data.init_args.dataset=nope.jsonl"], "FileNotFoundError: data.dataset: no file or folder"),
        (["--data.init_args.formatters=[\"{nope}\"]"], "ValueError: data.formatters[0]"),
    ],
    ids=["num-generations-1", "missing-data-file", "formatter-field-at-setup"],
)  # fmt: skip
def test_a_bad_input_error_ends_the_output_without_a_traceback(monkeypatch, capsys, args, line):
    # before the fix both ended after a 30-line traceback (instantiation, and the datamodule's setup in fit)
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(["fit", *experiment("toy_grpo.yaml"), *args])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(line)
    assert "Traceback" not in err


def test_a_bug_keeps_its_traceback(monkeypatch):
    from comlrl_lightning.cli_errors import config_error

    assert config_error(ValueError("data.dataset: no file")) == "ValueError: data.dataset: no file"
    assert config_error(ValueError("too many values to unpack (expected 2)")) is None
    assert config_error(KeyError("data.dataset: x")) is None  # not a bad-input type


# ------------------------------------------------------------------ rewards, coordinator (before any model loads)
@pytest.mark.parametrize("value", [0, -1.5])
def test_a_non_positive_reward_timeout_is_refused(value):
    with pytest.raises(
        ValueError, match=rf"^data\.reward_timeout_s: got {value}, must be > 0 seconds or None"
    ):
        DecPOMDPDataModule([{"q": "x"}], ["{q}"], TargetLengthReward(4), reward_timeout_s=value)


def only_text(text):
    return [0.0]


def test_trl_reward_arguments_are_checked():
    from comlrl_lightning.envs import TRLReward

    with pytest.raises(
        ValueError, match="^TRLReward.agent: got 'all'; allowed: 'each', 'joined' or an agent index"
    ):
        TRLReward(trl_style, agent="all")
    with pytest.raises(
        TypeError, match=r"^TRLReward.function: only_text\(text\) cannot be called as fn\(prompts="
    ):
        TRLReward(only_text)


def test_a_missing_coordinator_ckpt_path_is_named_before_any_learner_loads(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"^ckpt_path: no coordinator checkpoint '.*nope\.pt'; give a round-"
    ):
        coordinator(tmp_path, ckpt_path=str(tmp_path / "nope.pt"))


def test_a_coordinator_stage_field_missing_in_a_later_row_fails_at_setup_before_any_learner_loads(tmp_path):
    rows = [
        {"topic": "p"},
        {"topic": "q"},
        {"topic": "r"},
        {"other": 1},
    ]  # row 3 is first drawn after round 0
    c = coordinator(tmp_path, episodes=RowEpisodes(rows))
    with pytest.raises(
        ValueError, match=r"rounds\.stages\[0\]\.prompt: uses \{topic\}, which episode 3 .* lacks"
    ):
        c.setup()
    assert c.learners == {}


def test_epsilon_high_below_epsilon_is_refused_before_any_model_loads(monkeypatch):
    no_model_loads(monkeypatch)
    with pytest.raises(ValueError, match=r"^epsilon_high: got 0.1, must be >= epsilon = 0.2"):
        MAGRPO(agents=["builtin:tiny-gpt2"] * 2, loss=dict(epsilon=0.2, epsilon_high=0.1))


@pytest.mark.parametrize("algorithm", ["IAC", "MAAC"])
def test_actor_critic_refuses_kl_as_reward_which_it_would_never_apply(monkeypatch, algorithm):
    # the loss-side KL is off under kl_mode="reward", and the actor-critics subtract no reward-side KL
    import comlrl_lightning

    no_model_loads(monkeypatch)
    cls = getattr(comlrl_lightning, algorithm)
    with pytest.raises(
        ValueError, match=rf"^kl_mode: got 'reward' with beta=0.1, but {algorithm} subtracts no KL"
    ):
        cls(agents=["builtin:tiny-gpt2"] * 2, loss=dict(beta=0.1, kl_mode="reward"))
    cls(agents=["builtin:tiny-gpt2"] * 2, loss=dict(beta=0.1, kl_mode="loss"))


# ------------------------------------------------------------------ MARLHF
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(rl_algorithm="ppo"), r"rl_algorithm: got 'ppo', allowed: \['magrpo', 'mareinforce'.*'maac'\]"),
        (dict(reward_model=dict(reward_learning_rate=0)), r"reward_learning_rate: got 0, must be > 0"),
        (
            dict(reward_model=dict(reward_num_train_epochs=0)),
            r"reward_num_train_epochs: got 0, must be an integer >= 1",
        ),
        (dict(reward_model=dict(reward_train_batch_size=0)), r"reward_train_batch_size: got 0"),
        (
            dict(reward_model=dict(reward_max_length=0)),
            r"reward_max_length: got 0, must be an integer >= 1 or null",
        ),
        (
            dict(reward_model=dict(reward_val_fraction=1.0)),
            r"reward_val_fraction: got 1.0, must be in \[0, 1\)",
        ),
        (dict(reward_model=dict(reward_lr=1e-5)), r"reward_model: .*unexpected keyword argument 'reward_lr'"),
        (
            dict(preference=dict(preference_num_candidates=1)),
            r"preference_num_candidates: got 1, must be an integer >= 2",
        ),
        (
            dict(preference=dict(pair_selection="best")),
            r"pair_selection: got 'best', allowed: \['reward_gap', 'all', 'random', 'comparator_reward'\]",
        ),
        (
            dict(preference=dict(pair_selection="all")),
            r"preference_pairs_per_sample: got 16 with pair_selection='all'",
        ),
        (dict(pair_source=dict(preference_num_prompts=0)), r"preference_num_prompts: got 0"),
        (dict(rollout=dict(num_turns=2)), r"rollout.num_turns: got 2; .*num_turns=1 only"),
        (
            dict(rl_algorithm="iac", advantage=dict(advantage_mode="mean")),
            r"advantage: rl_algorithm='iac' \(IAC\) has no 'advantage'",
        ),
        (
            dict(critic=dict(critic_type="q")),
            r"critic: rl_algorithm='magrpo' \(MAGRPO\) has no 'critic'.*iac, maac",
        ),
        (dict(rl_algorithm="mareinforce", advantage=dict(advantage_mode="mean")), r"advantage_mode"),
    ],
)
def test_marlhf_refuses_bad_config_before_any_model_loads(monkeypatch, kwargs, match):
    from comlrl_lightning import MARLHF

    no_model_loads(monkeypatch)
    with pytest.raises((ValueError, TypeError), match=match):
        MARLHF(agents=["builtin:tiny-gpt2"] * 2, **kwargs)


def test_marlhf_checks_a_users_pair_file_before_any_model_loads(monkeypatch, tmp_path):
    from comlrl_lightning import MARLHF

    no_model_loads(monkeypatch)
    with pytest.raises(FileNotFoundError, match=r"pair_source.pairs_path: no file at '.*nope.jsonl'"):
        MARLHF(agents=["builtin:tiny-gpt2"] * 2, pair_source=dict(pairs_path=str(tmp_path / "nope.jsonl")))
    three = jsonl(
        tmp_path, [{"prompts": ["a", "b", "c"], "chosen": ["x", "y", "z"], "rejected": ["u", "v", "w"]}]
    )
    with pytest.raises(ValueError, match=r"rows.jsonl:1: the pair has 3 agents' completions, the team has 2"):
        MARLHF(agents=["builtin:tiny-gpt2"] * 2, pair_source=dict(pairs_path=three))
    bad = jsonl(tmp_path, [{"prompts": ["a", "b"], "chosen": ["x", "y"]}], "bad.jsonl")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'rejected' must be a list of strings"):
        MARLHF(agents=["builtin:tiny-gpt2"] * 2, pair_source=dict(pairs_path=bad))


# ------------------------------------------------------------------ MADPO
@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (
            {"preference": {"preference_num_candidates": 1}},
            "preference_num_candidates: got 1, must be an integer >= 2",
        ),
        (
            {"preference": {"pair_selection": "best"}},
            "pair_selection: got 'best', allowed: ['reward_gap', 'all', 'random', 'comparator_reward']",
        ),
        (
            {"preference": {"pair_selection": "comparator_reward"}},
            "preference.pair_selection: got 'comparator_reward', which ranks pairs against a comparator",
        ),
        (
            {"preference": {"pair_selection": "all"}},
            "preference_pairs_per_sample: got 16 with pair_selection='all'",
        ),
        (
            {"preference": {"preference_pairs_per_sample": 0}},
            "preference_pairs_per_sample: got 0, must be an integer >= 1",
        ),
        ({"dpo": {"dpo_beta": 0}}, "dpo_beta: got 0, must be > 0"),
        (
            {"dpo": {"loss_type": "grpo"}},
            "preference.loss_type: got 'grpo', allowed: ['sigmoid', 'ipo', 'hinge']",
        ),
        ({"dpo": {"label_smoothing": 0.5}}, "label_smoothing: got 0.5, must be in [0, 0.5)"),
        (
            {"dpo": {"loss_type": "ipo", "label_smoothing": 0.1}},
            "label_smoothing: got 0.1, must be 0 with loss_type='ipo'",
        ),
        (
            {"dpo": {"preference_mode": "offline"}},
            "preference_mode: got 'offline', allowed: ['one_shot', 'online']",
        ),
        ({"dpo": {"num_train_epochs": 0}}, "num_train_epochs: got 0, must be an integer >= 1"),
        ({"dpo": {"train_batch_size": 0}}, "train_batch_size: got 0, must be an integer >= 1"),
        ({"dpo": {"max_grad_norm": 0}}, "max_grad_norm: got 0, must be > 0 or None"),
        ({"dpo": {"on_nonfinite": "zero"}}, "on_nonfinite: got 'zero', allowed: ['skip', 'stop']"),
        (
            {"rollout": {"num_turns": 2}},
            "rollout.num_turns: got 2; MADPO pairs one-turn aligned joint actions",
        ),
        ({"rollout": {"joint_mode": "cross"}}, "rollout.joint_mode: got 'cross'"),
        (
            {"rollout": {"num_generations": 6}},
            "rollout.num_generations: got 6, but preference.preference_num_candidates=80",
        ),
        (
            {"collaboration_mode": "centralised"},
            "collaboration_mode: got 'centralised', allowed: ['decentralized', 'centralized']",
        ),
        ({"collaboration_mode": "centralized"}, "agents: got 2 agents with collaboration_mode='centralized'"),
    ],
)
def test_madpo_refuses_bad_values_naming_the_field_before_any_model_loads(monkeypatch, groups, message):
    from comlrl_lightning import MADPO

    no_model_loads(monkeypatch)
    with pytest.raises(ValueError) as e:
        MADPO(agents=["builtin:tiny-gpt2"] * 2, **groups)
    assert message in str(e.value)


@pytest.mark.parametrize("field,value", [("num_train_epochs", 5), ("train_batch_size", 8)])
def test_madpo_warns_that_online_mode_ignores_the_one_shot_knobs(monkeypatch, field, value):
    # before the fix they were accepted and ignored without a word
    from comlrl_lightning import MADPO

    no_model_loads(monkeypatch)
    with pytest.warns(
        UserWarning, match=rf"^dpo\.{field}: got {value}, which preference_mode='online' ignores"
    ):
        MADPO(agents=["builtin:tiny-gpt2"] * 2, dpo={"preference_mode": "online", field: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MADPO(agents=["builtin:tiny-gpt2"] * 2, dpo={"preference_mode": "one_shot", field: value})


# ------------------------------------------------------------------ iterative MADPO
@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"rounds": {"num_rounds": 0}}, "num_rounds: got 0, must be an integer >= 1"),
        (
            {"rounds": {"preference_scoring_reward": "reward_model"}},
            "rounds.preference_scoring_reward: got 'reward_model'; MADPO has no reward model",
        ),
        (
            {"dpo": {"preference_mode": "online"}},
            "dpo.preference_mode: got 'online'; MADPOIter builds each round's pairs once",
        ),
        ({"comparator": {"comparator_policy": "mirror"}}, "comparator_policy: got 'mirror', allowed:"),
        ({"comparator": {"comparator_policy": "api"}}, "comparator_api_url: got None"),
        (
            {
                "comparator": {
                    "comparator_policy": "api",
                    "comparator_api_url": "http://127.0.0.1:9/v1",
                    "comparator_api_key_env": "ITERWIRE_SURELY_UNSET",
                }
            },
            "ITERWIRE_SURELY_UNSET",
        ),
        (
            {
                "comparator": {
                    "comparator_generation_mode": "centralized",
                    "comparator_centralized_agent_index": 2,
                }
            },
            "comparator_centralized_agent_index: got 2, must be below num_agents (2)",
        ),
        ({"comparator": {"comparator_policy": "history"}}, None),  # no folder yet: fine until setup
        ({"replay": {"preference_replay_mode": "nearest_k"}}, "preference_replay_k: got None"),
        (
            {"replay": {"preference_replay_mode": "current", "preference_replay_sample_size": 4}},
            "preference_replay_sample_size: got 4, does not apply to preference_replay_mode='current'",
        ),
        ({"seed": "zero"}, "seed: got 'zero', must be an integer"),
        (
            {"collaboration_mode": "centralized"},
            "collaboration_mode: got 'centralized'; MADPOIter trains one model",
        ),
        ({"preference": {"pair_selection": "best"}}, "pair_selection: got 'best', allowed:"),
        ({"rollout": {"num_turns": 2}}, "rollout.num_turns: got 2; MADPO pairs one-turn"),
    ],
)
def test_madpo_iter_refuses_bad_values_naming_the_field_before_any_model_loads(monkeypatch, groups, message):
    from comlrl_lightning import MADPOIter

    no_model_loads(monkeypatch)
    monkeypatch.delenv("ITERWIRE_SURELY_UNSET", raising=False)
    if message is None:
        MADPOIter(agents=["builtin:tiny-gpt2"] * 2, **groups)
        return
    with pytest.raises(ValueError) as e:
        MADPOIter(agents=["builtin:tiny-gpt2"] * 2, **groups)
    assert message in str(e.value)


# ------------------------------------------------------------------ iterative MARLHF
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(rounds=dict(num_rounds=0)), r"num_rounds: got 0, must be an integer >= 1"),
        (
            dict(rounds=dict(preference_scoring_reward="judge")),
            r"preference_scoring_reward: got 'judge', allowed: \['task', 'reward_model'\]",
        ),
        (dict(rl_phase=dict(num_train_epochs=0)), r"num_train_epochs: got 0, must be an integer >= 1"),
        (dict(rl_phase=dict(num_train_epochs=True)), r"num_train_epochs: got True, must be an integer >= 1"),
        (dict(rl_algorithm="ppo"), r"rl_algorithm: got 'ppo', allowed: \['magrpo', 'mareinforce'.*'maac'\]"),
        (
            dict(reward_model=dict(reward_val_fraction=1.0)),
            r"reward_val_fraction: got 1.0, must be in \[0, 1\)",
        ),
        (dict(preference=dict(pair_selection="best")), r"pair_selection: got 'best', allowed:"),
        (dict(comparator=dict(comparator_policy="mirror")), r"comparator_policy: got 'mirror', allowed:"),
        (
            dict(comparator=dict(comparator_history_k=2)),
            r"comparator_history_k: got 2, only applies to comparator_policy='history'",
        ),
        (
            dict(replay=dict(preference_replay_mode="current", preference_replay_sample_size=4)),
            r"preference_replay_sample_size: got 4, does not apply to preference_replay_mode='current'",
        ),
        (dict(seed=1.5), r"seed: got 1.5, must be an integer"),
        (dict(rollout=dict(num_turns=2)), r"rollout.num_turns: got 2; .*num_turns=1 only"),
        (
            dict(rl_algorithm="iac", advantage=dict(advantage_mode="mean")),
            r"advantage: rl_algorithm='iac' \(IAC\) has no 'advantage'",
        ),
        (dict(pair_source=dict(preference_num_prompts=4)), r"unexpected keyword argument 'pair_source'"),
    ],
)
def test_marlhf_iter_refuses_bad_values_naming_the_field_before_any_model_loads(monkeypatch, kwargs, match):
    from comlrl_lightning import MARLHFIter

    no_model_loads(monkeypatch)
    with pytest.raises((ValueError, TypeError), match=match):
        MARLHFIter(agents=["builtin:tiny-gpt2"] * 2, **kwargs)


@pytest.mark.parametrize(
    "group,value,match",
    [
        (
            "rl_phase",
            dict(epochs=1),
            r"rl_phase: unknown field\(s\) \['epochs'\]; allowed: \['num_train_epochs'\]",
        ),
        (
            "rounds",
            dict(num_iterations=3),
            r"rounds: unknown field\(s\) \['num_iterations'\]; allowed: \['num_rounds'",
        ),
        (
            "replay",
            dict(mode="all"),
            r"replay: unknown field\(s\) \['mode'\]; allowed: \['preference_replay_mode'",
        ),
        ("comparator", ["current"], r"comparator: got a list, give a ComparatorConfig or a mapping"),
    ],
)
def test_iterative_groups_name_an_unknown_field_or_a_wrong_type(monkeypatch, group, value, match):
    # before the fix a Python caller got a bare TypeError from the dataclass (no group, no allowed
    # fields) or "replace() should be called on dataclass instances"
    from comlrl_lightning import MADPOIter, MARLHFIter

    no_model_loads(monkeypatch)
    for cls in (MARLHFIter, MADPOIter) if group != "rl_phase" else (MARLHFIter,):
        with pytest.raises(ValueError, match=match):
            cls(agents=["builtin:tiny-gpt2"] * 2, **{group: value})
    assert MARLHFIter(agents=["builtin:tiny-gpt2"] * 2, rl_phase=None).rl_phase.num_train_epochs == 2


def test_marlhf_iter_bad_values_from_the_cli_fail_before_any_model_loads(monkeypatch, capsys):
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(
            ["fit", *experiment("toy_marlhf_iterative.yaml"), "--model.init_args.rl_phase.num_train_epochs=0"]
        )
    assert info.value.code == 1
    assert "num_train_epochs: got 0, must be an integer >= 1" in capsys.readouterr().err


# ------------------------------------------------------------------ centralized MAGRPO
@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (
            dict(agents=["builtin:tiny-gpt2"] * 2),
            ValueError,
            r"^agents: got 2 agents; CentralizedMAGRPO trains exactly one",
        ),
        (dict(num_roles=0), ValueError, r"^num_roles: got 0, must be an integer >= 1"),
        (dict(rollout=dict(num_turns=2)), ValueError, r"^rollout\.num_turns: got 2, allowed: \[1\]"),
        (
            dict(rollout=dict(joint_mode="cross")),
            ValueError,
            r"^rollout\.joint_mode: got 'cross', allowed: \['aligned'\]",
        ),
        (
            dict(rollout=dict(credit="counterfactual")),
            ValueError,
            r"^rollout\.credit: got 'counterfactual', allowed: \['shared'\]",
        ),
        (dict(adapter=object()), TypeError, r"^adapter: object\.build_prompt must be callable"),
    ],
    ids=["two-agents", "no-roles", "two-turns", "cross", "credit", "adapter"],
)
def test_centralized_magrpo_refuses_bad_values_before_any_model_loads(monkeypatch, kwargs, error, match):
    from comlrl_lightning import CentralizedMAGRPO

    no_model_loads(monkeypatch)
    with pytest.raises(error, match=match):
        CentralizedMAGRPO(**{"agents": "builtin:tiny-gpt2", **kwargs})


def test_centralized_num_turns_from_the_cli_fails_before_any_model_loads(monkeypatch, capsys):
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(["fit", *experiment("toy_centralized_magrpo.yaml"), "--model.init_args.rollout.num_turns=2"])
    assert info.value.code == 1
    assert "rollout.num_turns: got 2, allowed: [1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_roles=0), ValueError, r"^num_roles: got 0, must be an integer >= 1"),
        (dict(num_agents=2), ValueError, r"^agents: got 2 agents with collaboration_mode='centralized'"),
        (dict(adapter=object()), TypeError, r"^adapter: object.build_prompt must be callable"),
    ],
)
def test_centralized_madpo_refuses_bad_values_before_any_model_loads(monkeypatch, kwargs, error, match):
    from comlrl_lightning import MADPO

    no_model_loads(monkeypatch)
    with pytest.raises(error, match=match):
        MADPO(agents="builtin:tiny-gpt2", collaboration_mode="centralized", **kwargs)


def test_marlhf_bad_values_from_the_cli_fail_before_any_model_loads(monkeypatch, capsys):
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        main(
            ["fit", *experiment("toy_marlhf.yaml"), "--model.init_args.reward_model.reward_val_fraction=1.5"]
        )
    assert info.value.code == 1
    assert "reward_val_fraction: got 1.5, must be in [0, 1)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["fit", *experiment("toy_marlhf.yaml"), "--model.init_args.rl_algorithm=ppo"])
    assert info.value.code == 2
    assert "ppo" in capsys.readouterr().err


@pytest.mark.parametrize("limit", [dict(min_steps=40), dict(min_epochs=3)])
@pytest.mark.parametrize("trainer_cls", ["MARLHFIter", "MADPOIter"])
def test_iterative_trainers_refuse_a_minimum_length_before_any_model_loads(
    monkeypatch, tmp_path, limit, trainer_cls
):
    # before the fix the finished round loop kept taking batches that step nothing until the minimum
    # (min_steps never reached: global_step stays; with max_epochs=-1 the fit never ended)
    import lightning.pytorch as pl

    import comlrl_lightning
    from comlrl_lightning.datamodules import LengthRatioDataModule

    no_model_loads(monkeypatch)
    model = getattr(comlrl_lightning, trainer_cls)(agents=["builtin:tiny-gpt2"] * 2)
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        max_epochs=-1,
        default_root_dir=tmp_path,
        **limit,
    )
    name, value = next(iter(limit.items()))
    with pytest.raises(
        ValueError, match=rf"trainer.{name}: got {value}; {trainer_cls}\w* ends the fit after its last round"
    ):
        trainer.fit(model, LengthRatioDataModule(num_train=4, num_val=2, batch_size=2))


def test_a_missing_reward_model_is_named_before_any_agent_loads(monkeypatch, tmp_path):
    # before the fix it failed in configure_model, after both agents had loaded, as "agent model './x'"
    from comlrl_lightning import MARLHF, MARLHFIter

    no_model_loads(monkeypatch)
    missing = str(tmp_path / "no_rm")
    for cls in (MARLHF, MARLHFIter):
        with pytest.raises(ValueError, match=rf"^reward_model\.reward_model: no local folder '{missing}'"):
            cls(agents=["builtin:tiny-gpt2"] * 2, reward_model=dict(reward_model=missing))


def test_a_reward_model_that_fails_to_load_is_named_as_the_reward_model(tmp_path):
    from comlrl_lightning.preference.joint_reward_model import load_reward_backbone

    (tmp_path / "broken").mkdir()  # exists (passes the pre-load check) but holds no config.json
    with pytest.raises(OSError, match=rf"^reward_model\.reward_model: cannot load '{tmp_path}/broken' \((OSError|"
                                      r"ValueError): "):  # fmt: skip
        load_reward_backbone(str(tmp_path / "broken"))


def test_a_pair_whose_chosen_reward_is_below_the_rejected_one_is_refused_naming_its_line(
    monkeypatch, tmp_path
):
    # before the fix it was accepted: the reward model (or DPO) then learnt to prefer the worse side
    from comlrl_lightning import MARLHF

    no_model_loads(monkeypatch)
    good = {"prompts": ["p", "q"], "chosen": ["a", "b"], "rejected": ["c", "d"]}
    path = jsonl(tmp_path, [good, {**good, "chosen_reward": 0.1, "rejected_reward": 0.9}], "pairs.jsonl")
    with pytest.raises(ValueError, match=rf"^{path}:2: PreferencePair\.chosen_reward: got 0\.1, below "
                                         r"rejected_reward=0\.9; chosen is the preferred joint action"):  # fmt: skip
        MARLHF(agents=["builtin:tiny-gpt2"] * 2, pair_source=dict(pairs_path=path))
