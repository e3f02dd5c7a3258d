"""`TeamFirstLayout`: TensorBoard's CUSTOM SCALARS tab with the team's curves first.

TensorBoard's SCALARS tab orders cards by tag (per-agent ones last: ``z_agent_<i>/...``, see
:mod:`comlrl_lightning.core.metrics`) and opens only its first two groups, which are then TRL's
``clip_ratio`` and ``completions``; the shared reward, the number the team is trained on, is further down. This callback writes a custom-scalars layout (``SummaryWriter.add_custom_scalars``)
to every :class:`~lightning.pytorch.loggers.TensorBoardLogger` of the fit: the team's reward and
held-out pass@k first, each on one multi-line chart, then completions, the update, per-agent
curves and throughput (:data:`LAYOUT`). Every :class:`~comlrl_lightning.algorithms.base.CoMLRLModule`
adds one to a fit that lists none.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from comlrl_lightning.core import metrics as M

A = M.AGENT_PREFIX + r"\d+"
LAYOUT: dict[str, dict[str, list]] = {
    "1 team: the shared reward": {
        "reward (train) and val/reward (held out)": ["Multiline", [rf"^{M.REWARD}$", rf"^{M.VAL_REWARD}$"]],
        "held-out pass@k": ["Multiline", [r"^val/pass@\d+$", r"^val/final/pass@\d+$"]],
        "reward terms (train)": ["Multiline", [r"^rewards/.+/mean$"]],
        "reward terms (held out)": ["Multiline", [r"^val/rewards/.+/mean$"]],
        "reward spread in a group": ["Multiline", [r"^reward_std$", r"^frac_reward_zero_std$"]],
    },
    "2 completions": {
        "length (tokens)": ["Multiline", [r"^completions/(mean|min|max)_length$"]],
        "clipped at max_new_tokens": ["Multiline", [r"^completions/clipped_ratio$"]],
    },
    "3 update": {
        "loss per agent": ["Multiline", [rf"^{A}/loss$"]],
        "gradient norm per agent": ["Multiline", [rf"^{A}/grad_norm$"]],
        "entropy and KL": ["Multiline", [r"^entropy$", r"^kl$"]],
        "ratio clipping": ["Multiline", [r"^clip_ratio/.+$"]],
    },
    "4 per agent": {
        "completion length": ["Multiline", [rf"^{A}/completions/mean_length$"]],
        "clipped completions": ["Multiline", [rf"^{A}/completions/clipped_ratio$"]],
        "ratio clipping": ["Multiline", [rf"^{A}/clip_ratio/.+$"]],
    },
    "5 throughput": {
        "tokens and episodes per second": ["Multiline", [r"^tokens_per_second$", r"^episodes_per_second$"]]
    },
}
"""Category -> chart title -> ``["Multiline", [tag regex, ...]]`` (the format of ``add_custom_scalars``),
in the order TensorBoard shows them."""


class TeamFirstLayout(pl.Callback):
    """At fit start (rank 0), write :data:`LAYOUT` to every TensorBoard logger of the trainer."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars(LAYOUT)
