"""Refusals of ours end in one line each, no traceback and no parser report (issue 44, items 4 and 9):
every unknown key at once, a typo's given value named, keys carried from TRL pointed to their place
here, a bad fsdp2 option named, MADPOIter under fsdp2 refused before any model loads, and
``--use_checkpoint_config`` naming only what it really ignores."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from experiments import experiment, subcommand

from comlrl_lightning import MAGRPO, MADPOIter, MARLHFIter, ShardedTeamStrategy
from comlrl_lightning.cli import main
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.infra.resume_config import ignored_lines
from comlrl_lightning.infra.run_lock import release_run_folders
from comlrl_lightning.team.team import Team

ROOT = Path(__file__).resolve().parents[1]
NOISE = ("Parser key", "Does not validate", "Subtypes", "Given value", "Traceback", "Problem with")
"""jsonargparse's report and a traceback: none of it above our lines."""


def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded before the refusal")

    monkeypatch.setattr(Team, "load", refuse)


def refused(monkeypatch, capsys, tmp_path, yaml_text="", *args, status=2) -> list[str]:
    """The stderr lines of a toy fit refused with ``yaml_text`` as a last ``--config`` and ``args``."""
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    extra = list(args)
    if yaml_text:
        (tmp_path / "c.yaml").write_text(yaml_text)
        extra = ["--config", str(tmp_path / "c.yaml"), *extra]
    with pytest.raises(SystemExit) as info:
        main(["fit", *experiment("toy_length_ratio.yaml"), f"--trainer.default_root_dir={tmp_path}", *extra])
    assert info.value.code == status
    err = capsys.readouterr().err
    assert not [line for line in err.splitlines() if line.strip().startswith(NOISE)], err
    return [line for line in err.strip().splitlines() if line.startswith(("error: ", "ValueError: "))]


def test_every_unknown_key_is_reported_at_once_without_the_parsers_report(monkeypatch, capsys, tmp_path):
    # before: only data.init_args.batch_sise, after 7 lines of jsonargparse's report
    text = "trainer:\n  max_stepz: 3\nmodel:\n  init_args:\n    learning_rat: 0.1\n    rollout:\n      " \
           "num_generation: 3\ndata:\n  init_args:\n    batch_sise: 3\n"  # fmt: skip
    lines = refused(monkeypatch, capsys, tmp_path, text, "--model.init_args.foo=1")
    assert sorted(lines) == sorted(
        [
            "error: trainer.max_stepz: no such key; did you mean 'trainer.max_steps'?",
            "error: model.init_args.learning_rat: no such key of comlrl_lightning.MAGRPO; did you mean 'learning_rate'?",
            "error: model.init_args.rollout.num_generation: no such key of comlrl_lightning.MAGRPO; did you mean "
            "'rollout.num_generations'?",
            "error: model.init_args.foo: no such key of comlrl_lightning.MAGRPO",
            "error: data.init_args.batch_sise: no such key of comlrl_lightning.datamodules.LengthRatioDataModule; "
            "did you mean 'batch_size'?",
        ]
    )


def test_a_removed_callback_key_is_one_line_naming_what_replaced_it(monkeypatch, capsys, tmp_path):
    # before: the same key twice (the parser's indexed form and the config walk's plain one), with no hint
    text = "trainer:\n  callbacks:\n    - class_path: comlrl_lightning.callbacks.InterruptCheckpoint\n" \
           "      init_args:\n        undo_updates: false\n"  # fmt: skip
    (line,) = refused(monkeypatch, capsys, tmp_path, text)
    assert line.startswith(
        "error: trainer.callbacks[0].init_args.undo_updates: no such key of "
        "comlrl_lightning.callbacks.InterruptCheckpoint; removed: no copy of the weights is kept"
    )


@pytest.mark.parametrize(
    "arg,line",
    [
        ("--model.init_args.advantage.advantage_mode=meen", "error: model.init_args.advantage.advantage_mode: got "
         "'meen'; allowed: 'mean', 'max', 'rloo', 'raw', null; did you mean 'mean'?"),
        ("--model.init_args.advantage.scale_rewards=grup", "error: model.init_args.advantage.scale_rewards: got "
         "'grup'; allowed: 'group', 'batch', 'none', true or false, null; did you mean 'group'?"),
    ],
    ids=["advantage_mode", "scale_rewards"],
)  # fmt: skip
def test_a_typo_in_an_optional_choice_names_the_given_value(monkeypatch, capsys, tmp_path, arg, line):
    # before: "advantage_mode: - Expected a typing.Literal['mean', 'max', 'rloo', 'raw']", no value
    assert refused(monkeypatch, capsys, tmp_path, "", arg) == [line]


def test_keys_carried_from_trl_point_to_their_place_here(monkeypatch, capsys, tmp_path):
    text = "report_to: wandb\nnum_generations: 8\nmodel:\n  init_args:\n    peft_config: {r: 8}\n    " \
           "use_vllm: true\n"  # fmt: skip
    lines = {line.split(":")[1].strip(): line for line in refused(monkeypatch, capsys, tmp_path, text)}
    assert sorted(lines) == [
        "model.init_args.peft_config",
        "model.init_args.use_vllm",
        "num_generations",
        "report_to",
    ]
    assert lines["report_to"].startswith(
        "error: report_to: no such key; logging is Lightning's: trainer.logger"
    )
    assert lines["num_generations"].endswith(
        "not a top-level key; it is model.init_args.rollout.num_generations"
    )
    assert "no such key of comlrl_lightning.MAGRPO; a LoRA adapter is set per agent: model.init_args.agents[i]." \
           "adapter" in lines["model.init_args.peft_config"]  # fmt: skip
    use_vllm = lines["model.init_args.use_vllm"]
    assert "sampling.generation_backend: vllm" in use_vllm and "make setup-vllm" in use_vllm


def test_a_top_level_trainer_or_data_key_is_pointed_to_its_group():
    from comlrl_lightning.cli_keys import unknown_keys

    config = {"val_check_interval": 3, "batch_size": 2, "model": {"class_path": "comlrl_lightning.MAGRPO"},
              "data": {"class_path": "comlrl_lightning.datamodules.LengthRatioDataModule"}}  # fmt: skip
    assert unknown_keys(config, ["--trainer.val_check_interval", "--trainer", "--model", "--data"]) == [
        "val_check_interval: not a top-level key; it is trainer.val_check_interval",
        "batch_size: not a top-level key; it is data.init_args.batch_size",
    ]


@pytest.mark.parametrize("name", [n.name for n in sorted((ROOT / "configs").glob("*.yaml"))])
def test_no_key_of_a_shipped_experiment_is_reported_unknown(name):
    from comlrl_lightning.cli_keys import given_config, unknown_keys

    if subcommand(name) != "fit":
        pytest.skip("a coordinator config")
    os.chdir(ROOT)
    options = ["--seed_everything", "--trainer", "--model", "--data", "--validate_before_fit", "--ckpt_path"]
    config = given_config(experiment(name))
    trainer_keys = [f"--trainer.{k}" for k in config.get("trainer", {})]  # checked by the parser itself
    assert unknown_keys(config, options + trainer_keys) == []


def test_a_bad_fsdp2_mixed_precision_names_the_field_value_and_allowed(monkeypatch, capsys, tmp_path):
    # before: "ValueError: Expected a <class 'str'>. Got value: Namespace(class_path=...)" in a traceback
    lines = refused(monkeypatch, capsys, tmp_path, "", "--trainer.strategy=comlrl_lightning.ShardedTeamStrategy",
                    "--trainer.strategy.mixed_precision=fp16", status=1)  # fmt: skip
    assert lines == [
        "error: ShardedTeamStrategy.mixed_precision: got 'fp16', allowed: ['auto', 'bf16', 'none']"
    ]


def test_an_option_of_a_strategy_given_by_name_says_to_give_its_class(monkeypatch, capsys, tmp_path):
    lines = refused(monkeypatch, capsys, tmp_path, "", "--trainer.strategy=fsdp2",
                    "--trainer.strategy.mixed_precision=fp16")  # fmt: skip
    assert lines == ["error: trainer.strategy.mixed_precision: got 'fp16', but trainer.strategy is given by "
                     "name: options need its class, e.g. --trainer.strategy=comlrl_lightning.ShardedTeamStrategy "
                     "--trainer.strategy.mixed_precision=fp16 (or class_path and init_args in YAML)"]  # fmt: skip


@pytest.mark.parametrize("cls", [MADPOIter, MARLHFIter])
def test_the_iterative_trainers_under_fsdp2_are_refused_before_any_model_loads(monkeypatch, tmp_path, cls):
    # before: MADPOIter loaded every model, then "FSDP does not support deepcopy" at batch 0; MARLHFIter
    # loaded every model, then refused its reward model's parameters in the strategy's setup
    no_model_loads(monkeypatch)
    model = cls(agents="builtin:tiny-gpt2", num_agents=2, comparator=dict(comparator_policy="current_copy"))
    model.trainer = SimpleNamespace(strategy=ShardedTeamStrategy(), datamodule=LengthRatioDataModule(num_train=4),
                                    min_steps=None, min_epochs=None, world_size=1, default_root_dir=str(tmp_path))  # fmt: skip
    try:
        with pytest.raises(
            ValueError,
            match=rf"^trainer.strategy: got 'fsdp2' \(ShardedTeamStrategy\); {cls.__name__}\w* runs in one",
        ):
            model.setup("fit")
    finally:
        release_run_folders()


def test_use_checkpoint_config_names_only_the_given_values_it_ignores():
    saved = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, learning_rate=1e-3)
    used = {"class_path": "comlrl_lightning.MAGRPO", "init_args": dict(saved.hparams)}
    given = {"class_path": "comlrl_lightning.MAGRPO",
             "init_args": {"agents": "builtin:tiny-gpt2", "num_agents": 2, "learning_rate": 1e-3,
                           "advantage": {"advantage_mode": None}}}  # fmt: skip
    # before: advantage_mode (None against the 'mean' it resolves to) and every agents.0.* field
    assert ignored_lines(given, used) == []
    given["init_args"]["learning_rate"] = 0.5
    assert ignored_lines(given, used) == [
        "resume: model.learning_rate: given 0.5 ignored, the checkpoint's 0.001 used (--use_checkpoint_config)"
    ]


def test_every_trl_name_of_the_readme_table_at_the_top_level_gets_a_pointer(monkeypatch, capsys, tmp_path):
    readme = (ROOT / "README.md").read_text().split("## Coming from TRL")[1].split("\n## ")[0]
    rows = [line.split("|")[1] for line in readme.splitlines() if line.startswith("| `")]
    names = [name for row in rows for name in row.replace("`", "").replace(" ", "").split(",")]
    assert len(names) == 37 and "use_vllm" in names and "peft_config" in names
    lines = refused(monkeypatch, capsys, tmp_path, "".join(f"{name}: 1\n" for name in names))
    by_key = {line.removeprefix("error: ").split(":")[0]: line for line in lines}
    assert sorted(by_key) == sorted(names)  # every one at once
    bare = [line for line in lines if not ("; " in line or "it is " in line)]
    assert bare == []  # each points somewhere, none is a bare "no such key"
