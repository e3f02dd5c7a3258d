"""HumanEval data module, coding feedback transition, and coding configs on the tiny model."""

import os
from pathlib import Path

import pytest
from experiments import experiment

from comlrl_lightning.cli import main
from comlrl_lightning.coding.feedback import CodingFeedbackTransition
from comlrl_lightning.coding.reward import CooperativeCodeReward
from comlrl_lightning.coding.single_agent import SingleAgentCodeReward
from comlrl_lightning.datamodules import HumanEvalDataModule
from comlrl_lightning.envs.base import SOLVED, Episode

ROOT = Path(__file__).resolve().parents[1]
TINY_TEAM = "[{model: builtin:tiny-gpt2}, {model: builtin:tiny-gpt2}]"


@pytest.fixture(scope="module")
def dm():
    d = HumanEvalDataModule(transition=CodingFeedbackTransition())
    d.setup("fit")
    return d


def test_fixed_split_of_the_164_problems(dm):
    assert len(dm.train_rows) + len(dm.val_rows) == 164 and len(dm.val_rows) == 33
    again = HumanEvalDataModule()
    again.setup("fit")
    assert [r["task_id"] for r in again.val_rows] == [r["task_id"] for r in dm.val_rows]
    assert not {r["task_id"] for r in dm.train_rows} & {r["task_id"] for r in dm.val_rows}


def test_defaults_follow_the_agent_count(dm):
    assert isinstance(dm.env.reward_fn.functions[0], CooperativeCodeReward) and dm.env.num_agents == 2
    single = HumanEvalDataModule(num_agents=1)
    assert isinstance(single.env.reward_fn.functions[0], SingleAgentCodeReward) and single.env.num_agents == 1
    with pytest.raises(ValueError, match="data.num_agents"):
        HumanEvalDataModule(num_agents=3)


def test_feedback_transition_shares_the_rewards_sandbox_reports(dm):
    assert dm.env.transition_fn.reward is dm.env.reward_fn.functions[0]


def test_feedback_quotes_the_failing_assertion_and_ends_solved_episodes(dm):
    row = next(r for r in dm.val_rows if r["task_id"] == "HumanEval/2")  # truncate_number
    ep = Episode(0, row)
    aux = "def aux(x):\n    return x"
    wrong = "def truncate_number(number: float) -> float:\n    return number"
    right = "def truncate_number(number: float) -> float:\n    return number % 1.0"
    # the reward runs the sandbox; the transition reuses its report
    reward = dm.env.reward_fn.functions[0]
    reward([[aux, wrong]], [ep], 0)
    runs_before = len(reward._reports)
    prompts = dm.env.transition(ep, 0, [["p0"], ["p1"]], [[aux], [wrong]])
    assert len(reward._reports) == runs_before
    assert "0/1 visible tests passed" in prompts[0] and "assert truncate_number(3.5) == 0.5" in prompts[1]
    assert (
        "Revise the helper function `aux`" in prompts[0]
        and "Revise the function `truncate_number`" in prompts[1]
    )
    assert dm.env.transition(ep, 0, [["p0"], ["p1"]], [[aux], [right]]) is SOLVED


def test_two_turn_coding_config_runs_from_the_cli_on_the_tiny_model(tmp_path):
    os.chdir(ROOT)
    main(["fit", *experiment("humaneval_feedback_smollm2.yaml"), f"--model.init_args.agents={TINY_TEAM}",
          "--model.init_args.sampling.max_new_tokens=16", "--model.init_args.sampling.max_prompt_length=256", "--trainer.max_steps=2", "--data.init_args.max_val_samples=2",
          "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert list(tmp_path.rglob("events.out.tfevents.*"))


def test_main_job_config_runs_end_to_end_on_the_tiny_model(tmp_path, capsys):
    os.chdir(ROOT)
    main(["fit", *experiment("humaneval_smollm2.yaml"), f"--model.init_args.agents={TINY_TEAM}",
          "--model.init_args.sampling.max_new_tokens=8", "--model.init_args.sampling.max_prompt_length=256",
          "--trainer.limit_train_batches=1", "--data.init_args.max_val_samples=2", "--data.init_args.val_batch_size=2",
          "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    out = capsys.readouterr().out
    assert "val/pass@1: 0.000 -> 0.000" in out  # random tiny agents solve nothing, before or after
    assert (
        "val/pass@2: 0.000 -> 0.000" in out
    )  # the config's num_generations_eval: 2 sampled paths per problem
    assert list(tmp_path.rglob("agents/*/agent_1/config.json"))  # AgentCheckpoint at the end


@pytest.mark.slow
def test_every_canonical_solution_passes_all_its_tests_and_earns_full_test_credit():
    """All 164 problems through the whole judged pipeline: record, run in the sandbox, judge."""
    from comlrl_lightning.coding.data import load_humaneval_rows

    rows = load_humaneval_rows()
    coop = CooperativeCodeReward()
    try:
        jas = [["def aux(x):\n    return x\n", row["prompt"] + row["canonical_solution"]] for row in rows]
        res = coop(jas, [Episode(0, row) for row in rows], 0)
    finally:
        coop.close()
    failing = [
        row["task_id"]
        for row, t, ok in zip(rows, res.metrics["tests"], res.metrics["all_passed"])
        if t != 1.5 or ok != 1.0
    ]
    assert failing == []
    assert res.values == [pytest.approx(3.0)] * 164
