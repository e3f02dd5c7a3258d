"""The ``comlrl-lightning`` command: a LightningCLI over the algorithms and datamodules.

``comlrl-lightning fit --config configs/toy_length_ratio.yaml`` trains; ``fit --print_config``
shows the full config. ``model`` and ``data`` take any :class:`MAGRPO` subclass and any
:class:`DecPOMDPDataModule` subclass (``class_path``/``init_args``).
"""

from __future__ import annotations

import os
import sys
from lightning.pytorch.cli import LightningCLI

from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.magrpo import MAGRPO


class CoMLRLCLI(LightningCLI):
    """LightningCLI that keeps the per-agent optimizers (``auto_configure_optimizers=False``: a stray
    top-level ``optimizer:`` is an error, not a silent single optimizer). The agent count of the
    model and the formatter count of the data are checked in ``MAGRPO.setup``, before any model
    loads."""


def main(args: list[str] | None = None) -> None:
    """Entry point of ``comlrl-lightning`` and ``python -m comlrl_lightning``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    CoMLRLCLI(
        MAGRPO,
        DecPOMDPDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                                     "init_args": {"save_dir": "runs"}}},
        args=args,
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
