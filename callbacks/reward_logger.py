"""`RewardLogger`: TRL-style reward, length, per-agent and throughput metrics from each training step."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torchmetrics import MaxMetric, MeanMetric, Metric, MinMetric

from comlrl_lightning.core import metrics as M
from comlrl_lightning.envs.rewards import ERRORS

_KINDS: dict[str, type[Metric]] = {"mean": MeanMetric, "min": MinMetric, "max": MaxMetric}


class RewardLogger(pl.Callback):
    """Logs the dict a MAGRPO-family ``training_step`` returns, with TRL's metric names.

    Per batch (``on_step``, x-axis: batches) it logs:

    - ``rewards/<fn>/mean``: mean of each reward function's value over the step's joint actions
      (NaN entries, e.g. skipped samples, are ignored);
    - ``rewards/errors``: with ``WeightedReward(skip_invalid=True)``, the number of the step's joint
      actions whose reward raised or was non-finite (and got ``invalid_reward``);
    - ``turn_<t>/reward`` and ``turn_<t>/return``: mean reward and return of turn ``t`` (only when
      an episode has more than one turn);
    - ``z_agent_<i>/completions/mean_length``, ``min_length``, ``max_length`` (tokens, EOS included),
      ``mean_terminated_length`` and ``z_agent_<i>/completions/clipped_ratio`` (fraction that hit
      ``max_new_tokens``); the team-level ``completions/min_length``, ``max_length``,
      ``mean_terminated_length`` and ``clipped_ratio`` over all agents' completions;
    - ``z_agent_<i>/grad_norm`` (total gradient norm before clipping), ``z_agent_<i>/kl`` (when
      ``beta > 0``), ``z_agent_<i>/clip_ratio/low_mean``, ``high_mean`` and ``region_mean``
      (fractions of ratio-clipped tokens; 0 on-policy, i.e. ``num_iterations = 1``);
    - TRL's team-level ``entropy``, ``kl`` (when ``beta > 0``), ``clip_ratio/low_mean``,
      ``clip_ratio/low_min``, ``clip_ratio/high_mean``, ``clip_ratio/high_max`` and
      ``clip_ratio/region_mean`` (means over agents; min / max over agents for ``low_min`` /
      ``high_max``; see :mod:`comlrl_lightning.core.metrics`);
    - ``tokens_per_second`` (completion tokens of all agents and turns) and ``episodes_per_second``,
      over the wall time from ``on_train_batch_start`` to ``on_train_batch_end`` (rollout, rewards
      and updates).

    Under DDP the step values are reduced over ranks: min/max lengths by min/max, throughput summed,
    the rest averaged.

    Per epoch (``on_epoch``, aggregated with torchmetrics, reset by Lightning each epoch):
    ``epoch/reward`` (mean over all joint actions), ``epoch/reward_std`` (mean per-group reward std,
    weighted by episodes), ``epoch/rewards/<fn>/mean``, ``epoch/completions/clipped_ratio``,
    ``epoch/z_agent_<i>/completions/mean_length``, ``min_length`` (MinMetric) and ``max_length``
    (MaxMetric).

    The module itself logs ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``z_agent_<i>/loss``,
    ``z_agent_<i>/entropy`` (MAGRPO) and ``completions/mean_length``; this callback does not repeat
    them. Outputs that are not such a dict (another module, or a skipped step) are ignored.

    Args:
        prog_bar: also show ``tokens_per_second`` in the progress bar.
    """

    def __init__(self, prog_bar: bool = False) -> None:
        super().__init__()
        self.prog_bar = prog_bar
        self.metrics = nn.ModuleDict()
        self._names: dict[str, str] = {}
        self._t0: float | None = None

    # ------------------------------------------------------------------ hooks
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(outputs, Mapping) or "rewards" not in outputs:
            return
        if self._t0 is not None:
            wall_s = time.perf_counter() - self._t0
        else:
            wall_s = float(outputs.get("step_time_s", 0.0))
        self._t0 = None
        n = outputs["num_episodes"]
        for name, value in step_metrics(outputs, _loss_config(pl_module), wall_s).items():
            # sync_dist: under DDP min/max lengths take the min/max over ranks, throughput the sum
            pl_module.log(
                name,
                value,
                on_step=True,
                on_epoch=False,
                batch_size=n,
                sync_dist=True,
                reduce_fx=_reduce_fx(name),
                prog_bar=self.prog_bar and name == M.TOKENS_PER_SECOND,
            )
        self._update_epoch_metrics(pl_module, outputs)

    # ---------------------------------------------------------------- epoch
    def _update_epoch_metrics(self, pl_module: pl.LightningModule, out: dict[str, Any]) -> None:
        n = out["num_episodes"]
        reward_std = torch.as_tensor(out["reward_std"], dtype=torch.float32)
        self._epoch(pl_module, "epoch/" + M.REWARD, "mean", out["rewards"].float(), n)
        self._epoch(pl_module, "epoch/" + M.REWARD_STD, "mean", reward_std, n, weight=n)
        for fn, values in out.get("reward_components", {}).items():
            self._epoch(pl_module, M.reward_fn(fn, "epoch/"), "mean", values.float(), n)
        clipped = torch.cat([c.float().flatten() for c in out["clipped"]])
        self._epoch(pl_module, "epoch/" + M.CLIPPED_RATIO, "mean", clipped, n)
        for i, lengths in enumerate(out["completion_lengths"]):
            for kind in ("mean", "min", "max"):
                self._epoch(
                    pl_module, "epoch/" + M.agent(i, f"completions/{kind}_length"), kind, lengths.float(), n
                )

    def _epoch(
        self,
        pl_module: pl.LightningModule,
        name: str,
        kind: str,
        values: torch.Tensor,
        batch_size: int,
        weight: float | None = None,
    ) -> None:
        key = self._names.get(name)
        if key is None:
            key = self._names[name] = re.sub(r"\W", "_", name)
            # NaN reward entries (skipped samples) must not poison the epoch mean
            self.metrics[key] = _KINDS[kind](nan_strategy="ignore").to(pl_module.device)
        metric = self.metrics[key]
        values = values.detach().to(metric.device)
        if weight is None:
            metric.update(values)
        else:
            metric.update(values, weight)
        pl_module.log(name, metric, on_step=False, on_epoch=True, batch_size=batch_size, metric_attribute=key)


def step_metrics(out: Mapping[str, Any], loss_config: Any, wall_s: float) -> dict[str, float]:
    """The per-step metrics of one ``training_step`` output dict (see :class:`RewardLogger`).

    Args:
        out: the :class:`~comlrl_lightning.core.records.StepOutput` a training step returns (or a
            mapping with its keys).
        loss_config: the module's :class:`~comlrl_lightning.core.config.LossConfig` or a mapping
            (``beta`` decides whether ``kl`` is logged).
        wall_s: wall time of the step in seconds (throughput is skipped when ≤ 0).

    Returns:
        ``{metric name: value}``; lengths in tokens, ratios in [0, 1], throughput per second.
    """
    metrics: dict[str, float] = {}
    for fn, values in out.get("reward_components", {}).items():
        if fn == ERRORS:  # a count, not a reward: how many joint actions had a skipped reward fault
            metrics[f"rewards/{ERRORS}"] = float(values.float().sum())
        else:
            metrics[M.reward_fn(fn)] = float(values.float().nanmean())
    if len(out.get("turn_rewards", ())) > 1:
        for t, (rewards, returns) in enumerate(zip(out["turn_rewards"], out["turn_returns"])):
            metrics[M.turn(t, "reward")] = float(rewards.float().mean())
            metrics[M.turn(t, "return")] = float(returns.float().mean())
    for i, (lengths, clipped) in enumerate(zip(out["completion_lengths"], out["clipped"])):
        for name, value in M.length_metrics(lengths, clipped).items():
            metrics[M.agent(i, name)] = value
    metrics.update(
        M.length_metrics(torch.cat(list(out["completion_lengths"])), torch.cat(list(out["clipped"])))
    )
    del metrics[M.MEAN_LENGTH]  # the module logs the team's mean length itself
    beta = float(_field(loss_config, "beta", 0.0))
    per_agent = [M.update_metrics(stats, beta) for stats in out.get("agent_stats", ())]
    for i, stats in enumerate(per_agent):
        metrics.update({M.agent(i, name): value for name, value in stats.items() if name != M.ENTROPY})
    metrics.update(M.team_update_metrics(per_agent))
    if wall_s > 0:
        metrics[M.TOKENS_PER_SECOND] = out["num_tokens"] / wall_s
        metrics[M.EPISODES_PER_SECOND] = out["num_episodes"] / wall_s
    return metrics


def _reduce_fx(name: str) -> str:
    if name.endswith("min_length") or name.endswith("low_min"):
        return "min"
    if name.endswith("max_length") or name.endswith("high_max"):
        return "max"
    return "sum" if name.endswith("_per_second") else "mean"


def _field(config: Any, key: str, default: Any) -> Any:
    return config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)


def _loss_config(pl_module: pl.LightningModule) -> Any:
    """The module's LossConfig (``beta``, ``num_iterations``); a module without one: its hparams."""
    return getattr(pl_module, "loss", None) or pl_module.hparams
