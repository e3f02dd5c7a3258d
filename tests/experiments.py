"""The ``--config`` arguments of a shipped experiment, read from the command in its header comment
(``#   comlrl-lightning fit --config A --config B``, or ``coordinate`` for a coordinator config), so
tests run exactly what the file documents."""

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def experiment(name: str, subcommand: str = "fit") -> list[str]:
    """``["--config", "configs/trainer/cpu.yaml", ..., "--config", "configs/<name>"]`` for ``configs/<name>``."""
    for line in (ROOT / "configs" / name).read_text().splitlines():
        if line.startswith("#") and f"comlrl-lightning {subcommand} " in line:
            args = shlex.split(line.lstrip("# ").split(f"comlrl-lightning {subcommand}", 1)[1])
            assert args[-1] == f"configs/{name}", f"configs/{name}: its header command must end with itself"
            return args
    raise AssertionError(
        f"configs/{name}: no '#   comlrl-lightning {subcommand} --config ...' line in its header"
    )


def subcommand(name: str) -> str:
    """``"coordinate"`` for a coordinator config (its header runs ``comlrl-lightning coordinate``), else ``"fit"``."""
    return "coordinate" if "comlrl-lightning coordinate " in (ROOT / "configs" / name).read_text() else "fit"
