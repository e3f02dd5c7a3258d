"""The ``comlrl-lightning`` command: a LightningCLI over the algorithms and datamodules.

``comlrl-lightning fit --config configs/toy_length_ratio.yaml`` trains; ``fit --print_config``
shows the full config. ``model`` and ``data`` take any :class:`CoMLRLModule` subclass (MAGRPO, ...) and any
:class:`DecPOMDPDataModule` subclass (``class_path``/``init_args``).
``comlrl-lightning coordinate --config configs/coordinator_humaneval_smollm2.yaml`` runs a coordinator
of one trainer per agent instead (:mod:`comlrl_lightning.coordinator.cli`).
"""

from __future__ import annotations

import math
import os
import re
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningCLI

from comlrl_lightning.algorithms.base import CoMLRLModule
from comlrl_lightning.callbacks.fit_summary import summary_line as summary_line  # moved there; kept here
from comlrl_lightning.cli_errors import config_error, wrapped_error
from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.infra.memory import release_freed_memory
from comlrl_lightning.infra.quiet import silence_start_up_noise
from comlrl_lightning.infra.run_folders import KeepingSaveConfigCallback, hold_fit_folders
from comlrl_lightning.infra.run_lock import RunFolderBusy
from comlrl_lightning.infra.sharded import ShardedTeamStrategy, check_resume

DEFAULT_SAVE_DIR = "runs"
"""Where loggers without a ``save_dir`` write when ``trainer.default_root_dir`` is not given."""
SAVE_DIR_MARK = "<trainer.default_root_dir, else runs>"
"""The CLI's default logger ``save_dir``: replaced before instantiation (see ``before_instantiate_classes``)."""


class CoMLRLCLI(LightningCLI):
    """LightningCLI for multi-agent RL.

    - ``auto_configure_optimizers=False``: a stray top-level ``optimizer:`` is an error, not a
      silent single optimizer replacing the per-agent ones.
    - ``fit --validate_before_fit true`` runs the validation loop once before training (Lightning's
      sanity check is not logged), so TensorBoard shows the metrics before and after.
    - Every ``fit`` saves on SIGTERM / Ctrl+C: an :class:`~comlrl_lightning.callbacks.InterruptCheckpoint`
      (default arguments) is added when the config's ``trainer.callbacks`` lists none, whatever
      else it lists; ``fit --save_on_interrupt false`` leaves it out.
    - ``--ckpt_path``: the given model config is compared with the checkpoint's before any model
      loads (:mod:`~comlrl_lightning.infra.resume_config`): a field that cannot change on resume is
      an error naming it, a safe change is applied with a line saying so;
      ``--use_checkpoint_config true`` takes the checkpoint's model config instead.
    - After ``fit`` the module's :class:`~comlrl_lightning.callbacks.FitSummary` prints where the logs
      are and the start -> end of ``val/pass@k`` (with a 95% Wilson interval over the validation
      problems), ``val/reward``, every reward term (``val/rewards/<name>/mean``) and ``reward``.

    The agent count of the model and the formatter count of the data are checked in
    ``MAGRPO.setup``, before any model loads.
    """

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument(
            "--validate_before_fit",
            type=bool,
            default=False,
            help="fit only: run validation once before training (logged at step 0)",
        )
        parser.add_argument(
            "--save_on_interrupt",
            type=bool,
            default=True,
            help="fit only: add an InterruptCheckpoint when trainer.callbacks lists none "
            "(SIGTERM / Ctrl+C save <log_dir>/checkpoints/interrupted.ckpt)",
        )

        parser.add_argument(
            "--use_checkpoint_config",
            type=bool,
            default=False,
            help="with --ckpt_path: build the model from the checkpoint's saved config, ignoring the "
            "given model config (default: the given one, refused where it changes what cannot change)",
        )

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse; a config error ends in one line per problem, exit status 2: every unknown key of the
        given config at once (:func:`~comlrl_lightning.cli_keys.unknown_keys`: jsonargparse stops at
        its first), then the error jsonargparse reports, each naming the full key, the value, what is
        allowed and the closest allowed key or value (:func:`~comlrl_lightning.cli_errors.explain`).
        jsonargparse's own report is printed only when no line could be made of it."""
        from jsonargparse import ArgumentError

        from comlrl_lightning.cli_errors import explain, parser_options
        from comlrl_lightning.cli_keys import given_config, unknown_keys

        parsers = [parser, *getattr(self, "_subcommand_parsers", {}).values()]
        for p in parsers:
            p.exit_on_error = False
        try:  # LightningCLI.parse_arguments less its warning when both args and sys.argv hold arguments:
            # main() passes args only when called from Python with its own (sys.argv is the host's then)
            self.config = parser.parse_object(args) if isinstance(args, dict) else parser.parse_args(args)
        except ArgumentError as err:
            options = [o for p in parsers for o in parser_options(p)]
            first = explain(str(err), options)
            given = (
                {} if isinstance(args, dict) else given_config(sys.argv[1:] if args is None else list(args))
            )
            lines = unknown_keys(given, options)

            def same(line: str) -> str:  # one key, as a flag or with a list index (callbacks[0]) or not
                return re.sub(r"\[\d+\]", "", line.split(":")[0].lstrip("-"))

            keys = [same(line) for line in lines]
            if first is not None and same(first) in keys:  # found by both: the flag or indexed form kept
                if first.startswith("--") or "[" in first.split(":")[0]:
                    lines[keys.index(same(first))] = first
            elif first is not None:
                lines.append(first)
            if not lines:
                report = [
                    line for line in str(err).splitlines() if not line.strip().startswith("Given value")
                ]
                print("\n".join(report), file=sys.stderr)
                lines = [report[-1].strip()]
            for line in lines:
                print(f"error: {line}", file=sys.stderr)
            raise SystemExit(2) from None

    def _parse_ckpt_path(self) -> None:
        """Lightning replaces the given model config with the checkpoint's here; only with
        ``--use_checkpoint_config true`` (naming the given fields it ignores). Otherwise the given
        config is built and compared in :meth:`after_instantiate_classes`."""
        from comlrl_lightning.infra.resume_config import ignored_lines, records_file

        sub = self.config.get("subcommand")
        if not sub or not self.config[sub].get("use_checkpoint_config"):
            return
        given, ckpt_path = self.config[sub].get("model"), self.config[sub].get("ckpt_path")
        if ckpt_path:  # an fsdp2 folder: Lightning reads files only, its config is in meta.pt
            self.config[sub]["ckpt_path"] = records_file(ckpt_path)
        super()._parse_ckpt_path()
        self.config[sub]["ckpt_path"] = ckpt_path
        for line in ignored_lines(given, self.config[sub].get("model")):
            print(line, file=sys.stderr)

    def after_instantiate_classes(self) -> None:
        """``--ckpt_path`` without ``--use_checkpoint_config``: compare the built model's config with
        the checkpoint's (no model is loaded yet); a refused change ends the command (status 2) with
        the fields named, an applied one prints a line; so does each changed trainer or data setting
        (recorded by :class:`~comlrl_lightning.infra.resume_config.RunConfigRecord`)."""
        from comlrl_lightning.infra import resume_config as R

        sub = self.subcommand
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if not ckpt_path or not os.path.exists(ckpt_path):
            return
        # a folder: fsdp2's sharded checkpoint, its records read from meta.pt (no tensor loaded)
        error = R.folder_refusal(ckpt_path, isinstance(self.trainer.strategy, ShardedTeamStrategy))
        if error is not None:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2)
        hparams, run_config = R.saved_records(ckpt_path)
        self._dump_config()
        lines = R.run_lines(run_config, R.run_record(self.config_dump))
        if not self.config[sub].get("use_checkpoint_config"):
            differences = R.resume_differences(hparams, dict(self.model.hparams))
            error = R.refusal(differences, ckpt_path)
            if error is not None:
                print(f"error: {error}", file=sys.stderr)
                raise SystemExit(2)
            lines = R.applied_lines(differences) + lines
        for line in lines:
            print(line, file=sys.stderr)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """Add an :class:`InterruptCheckpoint` to a fit (see the class docstring) and a progress bar
        without ``v_num`` (:mod:`~comlrl_lightning.callbacks.progress_bar`), each unless one is listed."""
        from lightning.pytorch.callbacks import ProgressBar

        from comlrl_lightning.callbacks import InterruptCheckpoint
        from comlrl_lightning.callbacks.progress_bar import default_progress_bar

        listed = config.get("callbacks") or []
        given = [*(listed if isinstance(listed, list) else [listed]), *callbacks]
        if (
            self.subcommand == "fit"
            and self.config["fit"].get("save_on_interrupt", True)
            and not any(isinstance(c, InterruptCheckpoint) for c in given)
        ):
            callbacks = [*callbacks, InterruptCheckpoint()]
        if self.subcommand == "fit":  # the trainer and data settings, for a resumed fit to compare
            from comlrl_lightning.infra.resume_config import RunConfigRecord, run_record

            self._dump_config()
            callbacks = [*callbacks, RunConfigRecord(run_record(self.config_dump))]
        if config.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in given
        ):
            callbacks = [*callbacks, default_progress_bar()]
        return super()._instantiate_trainer(config, callbacks)

    def before_instantiate_classes(self) -> None:
        """Loggers without a ``save_dir`` write under ``trainer.default_root_dir`` (default ``runs``).

        The shipped configs leave ``save_dir`` out (it then holds :data:`SAVE_DIR_MARK`, as
        ``--print_config`` shows), so ``--trainer.default_root_dir=/x`` moves the logs (and the
        checkpoints under the log folder) to ``/x``; an explicit ``--trainer.logger.init_args.save_dir``
        still wins.
        """
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        trainer = config.get("trainer") if config is not None else None
        if trainer is None:
            return
        loggers = trainer.get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            init_args = logger.get("init_args") if hasattr(logger, "get") else None
            if init_args is not None and init_args.get("save_dir") in (None, SAVE_DIR_MARK):
                init_args["save_dir"] = trainer.get("default_root_dir") or DEFAULT_SAVE_DIR

    def instantiate_classes(self) -> None:
        """Build model, data and trainer; an error from a class's ``__init__`` is shown once, message last.

        jsonargparse re-raises such an error inside a union error whose text repeats it and ends in a
        dump of every init argument, chained to the original: the user would read the message three
        times in two tracebacks and find a namespace last. Here a bad-input error (one naming its field,
        :func:`~comlrl_lightning.cli_errors.config_error`) is printed as its one line, any other as its
        own traceback alone, and the command exits with status 1.
        """
        try:
            super().instantiate_classes()
        except Exception as err:  # re-raised unless jsonargparse wrapped it
            root = err
            while root.__cause__ is not None:
                root = root.__cause__
            line = config_error(root) or wrapped_error(err)
            if line is None and root is err:
                raise
            if line is None:
                traceback.print_exception(type(root), root, root.__traceback__, chain=False, file=sys.stderr)
            else:
                print(line, file=sys.stderr)
            raise SystemExit(1) from None

    def _run_subcommand(self, subcommand: str) -> None:
        """Run it; a bad-input error raised on the way (a data file that is missing, found at setup) is
        printed as its one line, without the traceback (:func:`~comlrl_lightning.cli_errors.config_error`),
        exit status 1; any other error propagates with its traceback."""
        try:
            super()._run_subcommand(subcommand)
        except (ValueError, TypeError, OSError, RunFolderBusy) as err:
            line = config_error(err)
            if line is None:
                raise
            print(line, file=sys.stderr)
            raise SystemExit(1) from None

    def before_fit(self) -> None:
        """Under ``strategy: fsdp2``, refuse a ``--ckpt_path`` that cannot resume under this world size
        (:func:`~comlrl_lightning.infra.sharded.check_resume`) before any model loads. Then
        ``--validate_before_fit``: validate once (not on a resume: ``--ckpt_path`` given); SIGTERM /
        Ctrl+C there stop at once (nothing is trained yet, so nothing is saved), with status 143 / 130.

        First of all, the folders the fit writes are locked
        (:func:`~comlrl_lightning.infra.run_folders.hold_fit_folders`): a run refused there has
        written nothing in them."""
        # a refused run writes nothing in another's folders (infra/run_folders.py)
        hold_fit_folders(self.trainer)
        ckpt_path = self.config["fit"].get("ckpt_path")
        if ckpt_path and isinstance(self.trainer.strategy, ShardedTeamStrategy):
            check_resume(Path(ckpt_path), self.trainer.world_size)
        if not self.config["fit"].get("validate_before_fit"):
            return
        # a resumed run: its step-0 validation is in the first run's logs
        if self.config["fit"].get("ckpt_path"):
            return
        previous = {}

        def stop(signum: int, frame: Any) -> None:
            print(
                f"\n{signal.Signals(signum).name} in the validation before fit: stopping, nothing trained to save",
                file=sys.stderr,
            )
            raise SystemExit(128 + signum)

        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.trainer.validate(self.model, datamodule=self.datamodule)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        hold_fit_folders(self.trainer)  # the module's teardown after validate released them


def _scalar_history(log_dir: str | None, keys: tuple[str, ...]) -> dict[str, list[float]]:
    """Scalars logged to TensorBoard in ``log_dir`` (empty if there are none or no log dir)."""
    if not log_dir or not os.path.isdir(log_dir):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))
    out = {}
    for pattern in keys:
        prefix = pattern[:-1] if pattern.endswith("*") else None
        matches = (
            sorted((t for t in tags if t.startswith(prefix)), key=lambda t: (len(t), t))
            if prefix
            else [pattern]
        )
        for key in [m for m in matches if m in tags]:
            values = [e.value for e in acc.Scalars(key) if math.isfinite(e.value)]
            if values:
                out[key] = values
    return out


def main(args: list[str] | None = None) -> None:
    """Entry point of ``comlrl-lightning`` and ``python -m comlrl_lightning`` (``args``: default
    ``sys.argv[1:]``). The working directory goes on ``sys.path`` (first) when it is not there, as
    ``python -m`` puts it, so a config can name a reward in a module of the working directory."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    release_freed_memory()  # freed activations and gradients leave the resident set (infra/memory.py)
    silence_start_up_noise()  # again: ahead of any warning filter set since the import
    argv = sys.argv[1:] if args is None else args
    if not {"", os.getcwd()} & set(sys.path):  # as `python -m` does: a reward module here imports
        sys.path.insert(0, os.getcwd())
    if argv and argv[0] == "coordinate":  # not a Trainer function: the coordinator owns its round loop
        from comlrl_lightning.coordinator.cli import main as coordinate

        coordinate(argv[1:])
        return
    cli = CoMLRLCLI(
        CoMLRLModule,  # any algorithm: model.class_path names it (MAGRPO, its aliases, ...)
        DecPOMDPDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,
        save_config_callback=KeepingSaveConfigCallback,  # an earlier run's config.yaml kept, said
        save_config_kwargs={"overwrite": True},
        trainer_defaults={
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                # no `hp_metric` card: a constant -1 Lightning logs for the HPARAMS tab, among the curves
                "init_args": {"save_dir": SAVE_DIR_MARK, "default_hp_metric": False},
            }
        },
        args=args,  # None: parsed from sys.argv
    )
    # a vLLM engine (generation_backend: vllm) set up process groups of its own in this process and
    # tears them down at its shutdown: shut it down first, or its exit handler finds them gone (the
    # default group destroyed below) and prints a traceback per engine
    team = getattr(getattr(cli, "model", None), "team", None)
    if hasattr(team, "close_engines"):
        team.close_engines()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # a clean exit under torchrun: a worker leaving with its process group up can abort
        # ("terminate called without an active exception") and leave the other node's agent waiting
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
