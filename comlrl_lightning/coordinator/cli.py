"""``comlrl-lightning coordinate --config X.yaml``: build a :class:`Coordinator` from YAML and run it.

The YAML's top-level keys are :class:`Coordinator`'s arguments (``learners``, ``stages``, ``reward``,
``episodes``, ``schedule``, ``num_rounds``, …); classes are given as ``class_path``/``init_args``
as everywhere in LightningCLI configs. ``--print_config`` prints the full config; any key can be
overridden on the command line (``--num_rounds=2``). After the run it prints where the logs are,
each learner's reward at the first and last round, each held-out evaluation's ``val/reward`` and
``val/pass@k`` (``eval_every``), and the seconds per round.
"""

from __future__ import annotations

import os
import statistics

from jsonargparse import ActionConfigFile
from lightning.pytorch.cli import LightningArgumentParser

from comlrl_lightning.coordinator.coordinator import Coordinator


def parser() -> LightningArgumentParser:
    """The argument parser of ``comlrl-lightning coordinate``."""
    p = LightningArgumentParser(
        prog="comlrl-lightning coordinate",
        description=__doc__.split("\n")[0],
        env_prefix="COMLRL",
        default_env=False,
    )
    p.add_argument("--config", action=ActionConfigFile, help="a YAML file of Coordinator arguments")
    p.add_class_arguments(Coordinator, None, fail_untyped=False, sub_configs=True)
    return p


def build(args: list[str]) -> Coordinator:
    """The :class:`Coordinator` that ``args`` describe (nothing loaded yet); the full config is
    written to ``<root_dir>/config.yaml``."""
    p = parser()
    cfg = p.parse_args(args)
    init = p.instantiate_classes(cfg).as_dict()
    init.pop("config", None)
    coordinator = Coordinator(**init)
    os.makedirs(coordinator.root_dir, exist_ok=True)
    p.save(cfg, os.path.join(coordinator.root_dir, "config.yaml"), overwrite=True, skip_check=True)
    return coordinator


def summary(coordinator: Coordinator) -> str:
    """Per-learner reward at the first and last round, the held-out evaluations, and the seconds per
    round (median, first, last)."""
    h = coordinator.history
    if not h:
        return "no rounds played"
    lines = [f"\nTensorBoard logs: {coordinator.root_dir}  (tensorboard --logdir {coordinator.root_dir})"]
    for name in coordinator.names:
        lines.append(
            f"  learner {name}: reward first {h[0]['learner_reward'][name]:.3f}  last "
            f"{h[-1]['learner_reward'][name]:.3f}  (trained at rounds "
            f"{[r['round'] for r in h if name in r['trained']]})"
        )
    for e in coordinator.eval_history:
        vals = "  ".join(
            f"{k} {v:.3f}" for k, v in e.items() if k.startswith("val/") and "/rewards/" not in k
        )
        lines.append(f"  held-out after {e['round']} rounds: {vals}")
    secs = [r["seconds"] for r in h]
    lines.append(
        f"  shared reward: first {h[0]['reward']:.3f}  last {h[-1]['reward']:.3f}  ({len(h)} rounds)"
    )
    lines.append(
        f"  seconds per round: median {statistics.median(secs):.2f}  "
        f"(first {secs[0]:.2f}, last {secs[-1]:.2f})"
    )
    return "\n".join(lines)


def main(args: list[str]) -> Coordinator:
    """Run ``comlrl-lightning coordinate`` with ``args`` (after the subcommand); returns the coordinator."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    coordinator = build(args)
    coordinator.fit()
    print(summary(coordinator))
    return coordinator
