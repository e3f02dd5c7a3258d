"""The ``comlrl-lightning`` command: a LightningCLI over the algorithms and datamodules.

``comlrl-lightning fit --config configs/toy_length_ratio.yaml`` trains; ``fit --print_config``
shows the full config. ``model`` and ``data`` take any :class:`MAGRPO` subclass and any
:class:`DecPOMDPDataModule` subclass (``class_path``/``init_args``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from lightning.pytorch.cli import LightningCLI

from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule
from comlrl_lightning.magrpo import MAGRPO


class CoMLRLCLI(LightningCLI):
    """LightningCLI with per-agent optimizers kept (``auto_configure_optimizers=False``) and
    ``model.num_agents`` linked into ``data.num_agents`` so formatter counts are checked early."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("model.init_args.num_agents", "data.init_args.num_agents", apply_on="parse")


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
