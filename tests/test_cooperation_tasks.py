"""The cooperation tasks: each reward on hand-written joint actions (values that would be wrong if
the coupling were wrong), held-out content disjoint from training, the datamodule's checks, the
frozen agent, and a tiny-model fit of every shipped config through the CLI."""

import contextlib
import glob
import os
import signal
from pathlib import Path

import pytest
from experiments import experiment

from comlrl_lightning.datamodules import CooperationDataModule
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import PASS_AT_1
from comlrl_lightning.tasks.cooperation import TASKS, words
from comlrl_lightning.tasks.cooperation.coordination import CoordinationReward
from comlrl_lightning.tasks.cooperation.dependence import DependenceReward, MessageTransition
from comlrl_lightning.tasks.cooperation.division import DivisionReward

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {"options": ["owl", "crow", "duck", "swan"]}


def ep(**extra):
    return Episode(0, {**OPTIONS, **extra})


def test_coordination_pays_only_when_both_name_the_same_option():
    joint = [
        (" owl.", " Owl\n"),
        (" owl", " crow"),
        (" I pick swan", "swan, duck"),
        (" cat", " cat"),
        (" owl", ""),
    ]
    out = CoordinationReward()(joint, [ep()] * len(joint), 0)
    # a word outside the options ("cat") never matches, even when both say it
    assert out.values == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert out.metrics[PASS_AT_1] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert out.metrics["valid"] == [1.0, 1.0, 1.0, 0.0, 0.5]


def test_division_pays_only_for_two_valid_different_items():
    joint = [(" owl", " crow"), (" owl", " owl"), (" owl", " cat"), (" crow, owl", " owl")]
    out = DivisionReward()(joint, [ep()] * len(joint), 0)
    # "cat" is no item (no part taken); "crow, owl" names two items: no choice, so no split either
    assert out.values == [1.0, 0.0, 0.0, 0.0]
    assert out.metrics["overlap"] == [0.0, 1.0, 0.0, 0.0]


JOBS = {"options": ["chef", "baker", "nurse"]}


def test_division_counts_a_reply_naming_two_items_as_no_choice():
    joint = [
        (" chef", " baker"),  # one item each, different: the split
        (" chef, baker", " baker, chef"),  # the old rule read "chef" / "baker": a split in 3 tokens
        (" chef, baker", " nurse"),  # one agent hedges
        (" Chef. chef!", " baker"),  # the same item twice is one choice
        (" chef", " chef"),  # one item each, the same: the collision
        (" baker and nurse", " chef, baker, nurse"),
    ]
    out = DivisionReward()(joint, [Episode(0, JOBS)] * len(joint), 0)
    assert out.values == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert out.metrics[PASS_AT_1] == out.values
    # overlap stays the collision of two real choices; listing items is "several", not an overlap
    assert out.metrics["overlap"] == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert out.metrics["several"] == [0.0, 1.0, 0.5, 0.0, 0.0, 1.0]


def test_held_out_success_of_division_reads_the_one_item_rule():
    # validation's team success is the pass@1 the datamodule's reward reports (core.evaluation.path_solved)
    dm = CooperationDataModule(task="division", num_train=4, num_held_out=2)
    out = dm.env.reward_fn([(" chef", " nurse"), (" chef, nurse", " nurse, chef")], [Episode(0, JOBS)] * 2, 0)
    assert out.pass_at_1.tolist() == [1.0, 0.0]


def test_named_options_and_one_choice():
    assert words.named_options("Chef, baker. chef", JOBS["options"]) == ["chef", "baker"]
    assert words.one_choice(" I take the chef.", JOBS["options"]) == "chef"
    assert words.one_choice(" chef or baker", JOBS["options"]) is None
    assert words.one_choice(" owl", JOBS["options"]) is None
    assert words.parse_choice(" chef or baker", JOBS["options"]) == "chef"  # coordination's rule is unchanged


def test_dependence_pays_at_turn_one_only_when_agent_one_names_the_secret():
    joint = [(" swan", " swan"), (" swan", " owl"), (" hello", " swan")]
    episodes = [ep(secret="swan")] * 3
    turn0 = DependenceReward()(joint, episodes, 0)
    assert turn0.values == [0.0, 0.0, 0.0]  # a message is not an answer
    assert turn0.metrics["message_names_secret"] == [1.0, 1.0, 0.0]
    turn1 = DependenceReward()(joint, episodes, 1)
    assert turn1.values == [1.0, 0.0, 1.0]  # agent 0's reply at turn 1 is not scored


def test_message_transition_shows_agent_one_agent_zeros_message_then_ends():
    t = MessageTransition()
    e = Episode(0, {"category": "birds", "view1": "swan, owl", "secret": "owl"})
    nxt = t(e, 0, [["p0"], ["p1"]], [[" owl!"], [" ok"]])
    assert nxt[1] == "Their message: owl!\nThe secret is:"
    assert t(e, 1, [["p0", "q0"], ["p1", "q1"]], [["a", "b"], ["c", "d"]]) is None


def test_held_out_problems_share_no_word_with_training():
    words.check_disjoint()
    for name, task in TASKS.items():
        train = task.rows(400, 0, "train", task.num_options)
        held = task.rows(50, 1, "held_out", task.num_options)
        seen = {w for r in train for w in r["options"]} | {r["category"] for r in train}
        assert not seen & {w for r in held for w in r["options"]}, name
        assert len({repr(r) for r in held}) == 50


def test_coordination_views_are_reversed_and_prompts_do_not_differ_otherwise():
    (row,) = TASKS["coordination"].rows(1, 3, "held_out", 4)
    assert row["view1"].split(", ") == row["options"][::-1]
    dm = CooperationDataModule(task="coordination", num_train=4, num_held_out=2)
    p0, p1 = (f(row) for f in dm.env.formatters)
    assert p0.replace(row["view0"], "X") == p1.replace(row["view1"], "X")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"task": "chess"}, "cooperation_task"), ({"num_train": 0}, "data.num_train"),
     ({"num_options": 9}, "data.num_options"), ({"formatters": ["{view0}"]}, "data.formatters")],
)  # fmt: skip
def test_bad_datamodule_input_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CooperationDataModule(**kwargs)


def test_all_agents_frozen_or_a_frozen_weight_sharer_is_refused_before_loading():
    from comlrl_lightning import MAGRPO
    from comlrl_lightning.team.agents import AgentSpec

    with pytest.raises(ValueError, match="frozen"):
        MAGRPO(agents=[AgentSpec("builtin:tiny-gpt2", frozen=True)] * 2)
    with pytest.raises(ValueError, match=r"agents\[1\].frozen"):
        MAGRPO(
            agents=[
                AgentSpec("builtin:tiny-gpt2"),
                AgentSpec("builtin:tiny-gpt2", share_weights_with=0, frozen=True),
            ]
        )


def test_a_frozen_partner_does_not_move_while_the_other_agent_trains():
    import lightning.pytorch as pl
    import torch

    from comlrl_lightning import MAGRPO, RolloutConfig, SamplingConfig
    from comlrl_lightning.team.agents import AgentSpec

    pl.seed_everything(0)
    m = MAGRPO(
        agents=[AgentSpec("builtin:tiny-gpt2", frozen=True), AgentSpec("builtin:tiny-gpt2")],
        rollout=RolloutConfig(num_generations=4),
        sampling=SamplingConfig(max_new_tokens=4),
        learning_rate=1e-2,
    )
    dm = CooperationDataModule(task="coordination", num_train=4, num_held_out=2, batch_size=2)
    # a reward that varies with agent 1's reply (the tiny model names no option), so agent 1 has a gradient
    dm.env.reward_fn.functions[0] = lambda ja, eps, turn: [float(len(a[1])) for a in ja]

    class Snapshot(pl.Callback):
        def on_train_start(self, trainer, module):
            self.before = [[p.detach().clone() for p in a.parameters()] for a in module.agents]

    snap = Snapshot()
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=[snap])  # fmt: skip
    trainer.fit(m, dm)
    assert trainer.global_step == 2  # one optimizer step per batch (agent 1's), two batches
    moved = [
        any(not torch.equal(p, q) for p, q in zip(m.agents[i].parameters(), snap.before[i])) for i in (0, 1)
    ]
    assert moved == [False, True]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_shipped_config_fits_on_the_tiny_model_and_the_frozen_agent_does_not_move(task, tmp_path):
    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    tiny = '[{"model": "builtin:tiny-gpt2", "frozen": true}, {"model": "builtin:tiny-gpt2"}]'
    main(
        ["fit", *experiment(f"coop_{task}.yaml"), "--trainer.enable_progress_bar=false",
         f"--trainer.logger.init_args.save_dir={tmp_path}", f"--model.init_args.agents={tiny}",
         "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--data.init_args.num_held_out=4",
         "--data.init_args.num_train=8"],
    )  # fmt: skip
    assert glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)


def test_dependence_with_one_turn_is_refused_at_setup(tmp_path, capsys):
    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    tiny = '[{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2"}]'
    with pytest.raises(SystemExit) as exit_info:  # the CLI prints the config error, no traceback (cli_errors)
        main(["fit", *experiment("coop_dependence.yaml"), f"--model.init_args.agents={tiny}",
              "--model.init_args.rollout.num_turns=1", f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert exit_info.value.code == 1
    assert "model.rollout.num_turns: got 1, the 'dependence' task has 2" in capsys.readouterr().err


def test_paired_gain_interval_is_paired_over_problems():
    from comlrl_lightning.core.evaluation import paired_gain_interval

    before = [0.0] * 10 + [1.0] * 10
    after = [1.0] * 20  # every failed problem solved, no solved one lost: every replicate's gain > 0
    gain, lo, hi = paired_gain_interval(before, after)
    assert gain == 0.5 and 0.2 < lo <= 0.5 <= hi < 0.8
    gain, lo, hi = paired_gain_interval([1.0, 0.0] * 10, [0.0, 1.0] * 10)  # as many lost as won
    assert gain == 0.0 and lo < 0 < hi
    with pytest.raises(ValueError, match="same"):
        paired_gain_interval([1.0], [1.0, 0.0])


def test_the_cli_ends_with_the_paired_held_out_gain(tmp_path, capsys):
    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    tiny = '[{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2"}]'
    main(["fit", *experiment("coop_coordination.yaml"), "--trainer.enable_progress_bar=false",
          f"--trainer.logger.init_args.save_dir={tmp_path}", f"--model.init_args.agents={tiny}",
          "--trainer.max_steps=2", "--trainer.val_check_interval=1", "--data.init_args.num_held_out=4",
          "--data.init_args.val_batch_size=4"])  # fmt: skip
    out = capsys.readouterr().out
    assert "held-out team success: " in out and "paired over 4 problems" in out


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail (TimeoutError) instead of hanging when the body runs past ``seconds``."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(
    ("field", "split", "pool"), [("num_held_out", "held-out", "10,080"), ("num_train", "training", "20,160")]
)
def test_more_problems_than_the_word_banks_hold_is_refused_at_once(field, split, pool):
    # it once drew for minutes at full CPU with no output; the deadline turns a hang into a failure
    with _deadline(20), pytest.raises(ValueError) as err:
        dm = CooperationDataModule(task="coordination", **{field: 100000})
        dm.load_train_val()
    msg = str(err.value)
    assert msg.startswith(f"data.{field}: got 100000") and f"only {pool} distinct" in msg, msg
    assert f"set data.{field} to at most {pool.replace(',', '')}" in msg


def test_the_pool_is_exact_every_problem_can_be_drawn_and_one_more_is_refused():
    # division, held-out, 3 options: 6 categories x 8·7·6 ordered draws = 2,016
    assert TASKS["division"].pool("held_out", 3) == 2016
    with _deadline(60):
        rows = TASKS["division"].rows(2016, 1, "held_out", 3)
    assert len({repr(r) for r in rows}) == 2016
    assert TASKS["dependence"].pool("held_out", 2) == 6 * 8 * 7 * 2  # and which of the two is the secret
    with pytest.raises(ValueError, match="data.num_held_out: got 2017.*at most 2016"):
        CooperationDataModule(task="division", num_held_out=2017)
