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
import signal
import sys
import threading
import traceback
from typing import Any

from lightning.pytorch.cli import LightningCLI

from comlrl_lightning.algorithms.base import CoMLRLModule
from comlrl_lightning.callbacks.held_out import HeldOutOutcomes
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.evaluation import wilson_interval
from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.infra.memory import release_freed_memory
from comlrl_lightning.infra.quiet import silence_start_up_noise

_SUMMARY_KEYS = ("val/pass@*", "val/final/pass@*", M.VAL_REWARD, "val/rewards/*", M.REWARD)
"""The scalars printed after ``fit`` (start and end value); a trailing ``*`` matches any ending
(``val/rewards/*``: each reward term, e.g. ``val/rewards/coop_code/<term>/mean``)."""
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
    - After ``fit`` it prints where the logs are and the start -> end of the logged ``val/pass@k``
      (with a 95% Wilson interval over the validation problems), ``val/reward``, every reward term
      (``val/rewards/<name>/mean``) and ``reward``.

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

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse; a config error ends in one line naming the full key, the value, what is allowed
        and the closest allowed key or value (:func:`~comlrl_lightning.cli_errors.explain`), printed
        last, exit status 2 (jsonargparse's own report stays above it, its value dumps left out)."""
        from jsonargparse import ArgumentError

        from comlrl_lightning.cli_errors import explain, parser_options

        parsers = [parser, *getattr(self, "_subcommand_parsers", {}).values()]
        for p in parsers:
            p.exit_on_error = False
        try:  # LightningCLI.parse_arguments less its warning when both args and sys.argv hold arguments:
            # main() passes args only when called from Python with its own (sys.argv is the host's then)
            self.config = parser.parse_object(args) if isinstance(args, dict) else parser.parse_args(args)
        except ArgumentError as err:
            report = [line for line in str(err).splitlines() if not line.strip().startswith("Given value")]
            print("\n".join(report), file=sys.stderr)
            options = [o for p in parsers for o in parser_options(p)]
            print(f"error: {explain(str(err), options) or report[-1].strip()}", file=sys.stderr)
            raise SystemExit(2) from None

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
        times in two tracebacks and find a namespace last. Here the original error's own traceback is
        printed alone and the command exits with status 1.
        """
        try:
            super().instantiate_classes()
        except Exception as err:  # re-raised unless jsonargparse wrapped it
            root = err
            while root.__cause__ is not None:
                root = root.__cause__
            if root is err:
                raise
            traceback.print_exception(type(root), root, root.__traceback__, chain=False, file=sys.stderr)
            raise SystemExit(1) from None

    def before_fit(self) -> None:
        """``--validate_before_fit``: validate once; SIGTERM / Ctrl+C there stop at once (nothing is
        trained yet, so nothing is saved), with status 143 / 130."""
        if not self.config["fit"].get("validate_before_fit"):
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

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        log_dir = self.trainer.log_dir
        print(
            f"\nTensorBoard logs: {log_dir}\n  view them with: tensorboard --logdir {os.path.dirname(log_dir or '.')}"
        )
        n = _num_val_problems(self.trainer, self.datamodule)
        for key, values in _scalar_history(log_dir, _SUMMARY_KEYS).items():
            print(f"  {summary_line(key, values, n)}")
        for cb in self.trainer.callbacks:  # the held-out gain, paired over the problems
            line = cb.summary() if isinstance(cb, HeldOutOutcomes) else None
            if line:
                print(f"  {line}")


def summary_line(key: str, values: list[float], num_problems: int | None) -> str:
    """``key: start -> end (points)``; a ``pass@k`` adds each end's 95% Wilson interval over
    ``num_problems`` validation problems (:func:`~comlrl_lightning.core.evaluation.wilson_interval`)."""
    first, last = values[0], values[-1]
    text = f"{key}: {first:.3f} -> {last:.3f} ({last - first:+.3f}, {len(values)} points)"
    if "pass@" in key and num_problems and all(0.0 <= v <= 1.0 for v in (first, last)):
        ci = [f"[{lo:.3f}, {hi:.3f}]" for lo, hi in (wilson_interval(v, num_problems) for v in (first, last))]
        text += f"; 95% interval over {num_problems} problems: {ci[0]} -> {ci[1]}"
    return text


def _num_val_problems(trainer: Any, datamodule: Any) -> int | None:
    """Problems one validation pass scores: the validation rows, capped by ``limit_val_batches``."""
    rows = getattr(datamodule, "val_rows", None)
    if rows is None:
        return None
    n, batches = len(rows), sum(getattr(trainer, "num_val_batches", None) or [0])
    size = getattr(datamodule, "val_batch_size", None)
    return min(n, batches * size) if batches and size else n


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
    ``sys.argv[1:]``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    release_freed_memory()  # freed activations and gradients leave the resident set (infra/memory.py)
    silence_start_up_noise()  # again: ahead of any warning filter set since the import
    argv = sys.argv[1:] if args is None else args
    if argv and argv[0] == "coordinate":  # not a Trainer function: the coordinator owns its round loop
        from comlrl_lightning.coordinator.cli import main as coordinate

        coordinate(argv[1:])
        return
    CoMLRLCLI(
        CoMLRLModule,  # any algorithm: model.class_path names it (MAGRPO, its aliases, ...)
        DecPOMDPDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": SAVE_DIR_MARK},
            }
        },
        args=args,  # None: parsed from sys.argv
    )


if __name__ == "__main__":
    main()
