"""Every shipped config fits a step or two without a warning outside tests/warnings_allowed.py, and
without the start-up noise silenced in ``comlrl_lightning.cli`` (issue: "nothing noisy")."""

import glob
import logging
import os
import re
import warnings

import pytest
from experiments import ROOT, experiment, subcommand
from lightning.fabric.utilities.rank_zero import LightningDeprecationWarning
from warnings_allowed import ALLOWED

from comlrl_lightning.cli import main

TINY_TEAM = "[{model: builtin:tiny-gpt2}, {model: builtin:tiny-gpt2}]"
CONFIGS = sorted(os.path.basename(p) for p in glob.glob(str(ROOT / "configs" / "*.yaml")))
SHORT = ["--trainer.max_epochs=1", "--trainer.log_every_n_steps=1", "--trainer.val_check_interval=1.0", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
         "--trainer.enable_progress_bar=false", "--model.init_args.sampling.max_new_tokens=8"]  # fmt: skip
HUMANEVAL = [f"--model.init_args.agents={TINY_TEAM}", "--model.init_args.sampling.max_prompt_length=256",
             "--data.init_args.max_val_samples=2", "--data.init_args.val_batch_size=2"]  # fmt: skip


def unexpected(records):
    return [w for w in records if not any(re.search(pattern, w) for pattern, _ in ALLOWED)]


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.name} {record.levelname}: {record.getMessage()}")


def fit_recording(args, caplog):
    """Run ``comlrl-lightning`` with ``args``; the warnings it raised or logged (transformers logs
    its own on a logger that does not propagate) and the INFO lines it logged."""
    os.chdir(ROOT)
    logged = Collect()
    loggers = [logging.getLogger(name) for name in ("transformers", "lightning", "datasets", "")]
    for logger in loggers:
        logger.addHandler(logged)
    try:
        caught, infos = _record(args, caplog)
    finally:
        for logger in loggers:
            logger.removeHandler(logged)
    return caught + logged.lines, infos


def _record(args, caplog):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")  # every warning, each time (not once per place)
        # what a user's run does not show either: Python hides DeprecationWarning raised outside
        # __main__ (here: LightningCLI's calls into jsonargparse's deprecated API); Lightning's own
        # deprecations stay visible (its import installs that filter)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("always", category=LightningDeprecationWarning)
        main(args)
    return [f"{w.category.__name__}: {w.message}" for w in caught], [r.getMessage() for r in caplog.records]


def args_for(name, tmp_path):
    if subcommand(name) == "coordinate":
        from test_coordinator_cli import tiny_learners

        return [
            "coordinate",
            *experiment(name, "coordinate"),
            "--config",
            tiny_learners(tmp_path, num_rounds=1),
        ]
    extra = HUMANEVAL if name.startswith("humaneval") else []
    if name == "humaneval_maac.yaml":
        extra = [*extra, "--model.init_args.critics=[{model: builtin:tiny-gpt2}]"]
    if name == "humaneval_marlhf.yaml":  # random tiny agents tie on every candidate: no pairs to build
        extra = [*extra, "--model.init_args.pair_source.pairs_path=configs/data/marlhf_pairs_example.jsonl"]
    if name.startswith("coop_"):  # the cooperation tasks on the tiny team, 4 held-out problems
        extra = [f"--model.init_args.agents={TINY_TEAM}", "--data.init_args.num_held_out=4"]
    if name == "humaneval_centralized_magrpo.yaml":  # one joint actor
        extra = [*extra, "--model.init_args.agents=builtin:tiny-gpt2"]
    return ["fit", *experiment(name), *SHORT, *extra, f"--trainer.default_root_dir={tmp_path}"]


@pytest.mark.parametrize("name", CONFIGS)
def test_a_shipped_config_fits_without_unexpected_warnings(tmp_path, caplog, name):
    caught, infos = fit_recording(args_for(name, tmp_path), caplog)
    if "iterative" in name:  # SHORT's max_epochs=1 ends the fit before the last round: said, once
        cut = [w for w in caught if "a trainer limit (max_steps, max_epochs or max_time) stopped it" in w]
        assert len(cut) == 1, caught
        caught = [w for w in caught if w not in cut]
    if name.startswith("humaneval") and "iterative" in name:  # the random tiny team ties on every candidate
        empty = [
            w for w in caught if re.search(r"round 0 formed 0 training pairs \(0 built; ties never pair\)", w)
        ]
        assert len(empty) == 1, caught
        caught = [w for w in caught if w not in empty]
    assert unexpected(caught) == [], "\n".join(unexpected(caught))
    assert not [line for line in infos if "litlogger" in line]


@pytest.mark.slow
def test_the_main_job_on_smollm2_starts_without_unexpected_warnings(tmp_path, caplog):
    """The real agents (SmolLM2's tokenizer pads with its end-of-text token), one short batch."""
    args = ["fit", *experiment("humaneval_smollm2.yaml"), *SHORT, "--validate_before_fit=false",
            "--trainer.limit_val_batches=0", "--model.init_args.rollout.num_generations=2",
            f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    caught, _ = fit_recording(args, caplog)
    assert unexpected(caught) == []
