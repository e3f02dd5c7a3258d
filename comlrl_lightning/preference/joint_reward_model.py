"""The joint reward model of MARLHF: a causal-LM backbone with a scalar head on the last non-pad
token, trained with the Bradley–Terry loss on :class:`~comlrl_lightning.preference.pairs.PreferencePair`
records (CoMLRL ``preference/marlhf.py``: ``JointRewardModel``, ``_train_reward_model``).

The model is a Hugging Face ``AutoModelForSequenceClassification`` with ``num_labels=1`` built from
the backbone's folder (its ``score`` head new): the HF sequence classifier *is* a backbone with a
linear head on the last non-pad token's last hidden state, so the trained model is saved as an
ordinary HF folder (``save_pretrained``) that ``RewardModelReward(model=<folder>,
kind="sequence_classification")`` (and TRL, and ``transformers.pipeline``) reloads unchanged.

The head has no bias (Llama, GPT-2, Qwen heads are ``Linear(h, 1, bias=False)``), where CoMLRL's
``reward_head`` is ``Linear(h, 1)``. A bias never changes the Bradley–Terry loss
``−log σ(s_chosen − s_rejected)`` (it cancels in the difference, so its gradient is 0 and it keeps
its random initial value), but it shifts every raw reward by that constant: algorithms that use
raw rewards without a baseline (MAREINFORCE, ``advantage_mode: raw``) then add
``bias · ∇ log π`` noise to each step. Without a bias that noise is gone; the baselines of MAGRPO,
MARLOO, MAReMax and the critics of IAC/MAAC remove a constant either way.

Training and scoring read the same text (:meth:`RewardModelReward.render` on the pair's completions,
prompts and episode row) through the same forward
(:func:`~comlrl_lightning.envs.reward_model.sequence_logits`).
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from comlrl_lightning.core import metrics as M
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.reward_model import JOINT_RESPONSE_TEMPLATE, RewardModelReward, sequence_logits
from comlrl_lightning.envs.reward_model import position_limit as position_limit  # moved there; kept here
from comlrl_lightning.infra.checkpoint_io import atomic_torch_save
from comlrl_lightning.infra.rng import collect_rng_states, set_rng_states
from comlrl_lightning.preference.pairs import PreferencePair
from comlrl_lightning.team.agents import check_source


@dataclass
class RewardModelConfig:
    """The joint reward model of MARLHF and its Bradley–Terry training (CoMLRL ``MARLHFConfig``)."""

    reward_model: str | None = None
    """Backbone of the reward model (hub id, folder or ``builtin:<name>``; a causal LM, or a sequence
    classifier to go on training). None: agent 0's model, as CoMLRL (``reward_model_name``)."""
    reward_learning_rate: float = 1.0e-5
    """AdamW learning rate of the reward model (> 0; CoMLRL's default)."""
    reward_num_train_epochs: int = 1
    """Passes over the training pairs (>= 1; CoMLRL's default)."""
    reward_train_batch_size: int = 1
    """Pairs per reward-model optimizer step (>= 1; CoMLRL's default)."""
    reward_max_length: int | None = None
    """Tokens of the joint text kept (its first ones), at training and scoring; capped at the
    backbone's position limit (``max_position_embeddings`` / ``n_positions``). None: that limit."""
    reward_freeze_backbone: bool = False
    """Train only the scalar head (the backbone frozen), as CoMLRL's ``reward_freeze_backbone``."""
    reward_val_fraction: float = 0.0
    """Fraction of the pairs held out (in [0, 1); ``floor(P · f)`` pairs, drawn with ``reward_seed``):
    the reward model's loss and accuracy on them are logged as ``val/reward_model/loss`` and
    ``val/reward_model/accuracy`` after every epoch. 0: none held out (CoMLRL trains on all)."""
    reward_template: str = JOINT_RESPONSE_TEMPLATE
    """The joint text the model reads (``RewardModelReward.template``; default: CoMLRL's
    ``Joint multi-agent response`` text of every agent's prompt and response). Written into the
    saved folder's ``marlhf.json``."""
    reward_model_dir: str | None = None
    """Where the trained model is saved as an HF folder, and the phase's resumable state while it
    trains. None: ``<trainer.log_dir>/reward_model``. A folder that already holds a finished model
    (``marlhf.json``) is loaded instead of training again."""
    reward_seed: int = 0
    """Seed of the held-out split and the order of the pairs in each epoch (its own generator)."""
    reward_batch_size: int = 8
    """Joint texts per forward when the trained model scores joint actions in RL (> 0)."""
    log_task_reward: bool = False
    """RL phase: also score every training joint action with the env's task reward (the "gold"
    reward; :class:`~comlrl_lightning.envs.reward_model.GoldRewardProbe`) and log its mean as
    ``marlhf/task_reward`` beside ``reward`` (the learned reward the update uses, which it alone
    sees). Off by default: a task reward can cost what the learned one saves (HumanEval: a sandboxed
    test run per joint action) or mean nothing (a pair file of human preferences)."""

    def check(self) -> None:
        """Raises ValueError naming the field, the value and what is allowed."""
        if not (isinstance(self.reward_learning_rate, (int, float)) and self.reward_learning_rate > 0):
            raise ValueError(f"reward_learning_rate: got {self.reward_learning_rate!r}, must be > 0")
        if not math.isfinite(self.reward_learning_rate):
            raise ValueError(f"reward_learning_rate: got {self.reward_learning_rate!r}, must be finite")
        for name in ("reward_num_train_epochs", "reward_train_batch_size", "reward_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: got {value!r}, must be an integer >= 1")
        m = self.reward_max_length
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"reward_max_length: got {m!r}, must be an integer >= 1 or null")
        if not isinstance(self.log_task_reward, bool):
            raise ValueError(f"log_task_reward: got {self.log_task_reward!r}, must be true or false")
        f = self.reward_val_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
            raise ValueError(f"reward_val_fraction: got {f!r}, must be in [0, 1)")
        if not isinstance(self.reward_template, str) or not self.reward_template:
            raise ValueError(f"reward_template: got {self.reward_template!r}, must be a non-empty string")
        if self.reward_model is not None and (
            not isinstance(self.reward_model, str) or not self.reward_model
        ):
            raise ValueError(f"reward_model: got {self.reward_model!r}, give a hub id, a folder or null")
        check_source(self.reward_model, "reward_model.reward_model")  # before any agent loads


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """``mean(−log σ(chosen − rejected))`` over ``[P]`` pair scores (Bradley & Terry 1952; CoMLRL's
    and TRL ``RewardTrainer``'s loss). A scalar."""
    return -F.logsigmoid(chosen - rejected).mean()


def pair_texts(reward: RewardModelReward, pairs: Sequence[PreferencePair]) -> tuple[list[str], list[str]]:
    """The ``(chosen, rejected)`` joint texts of ``pairs``: :meth:`RewardModelReward.render` of each
    side with the pair's prompts and episode row (turn 0), the text scoring reads in RL.

    Raises:
        KeyError: the template names a field the pairs do not give (e.g. ``{prompt}`` with a pair file
            whose lines have no ``episode`` row), naming it.
    """
    chosen, rejected = [], []
    for p in pairs:
        episode = Episode(-1, dict(p.episode))
        chosen.append(reward.render(p.chosen, episode, 0, p.prompts))
        rejected.append(reward.render(p.rejected, episode, 0, p.prompts))
    return chosen, rejected


def load_reward_backbone(source: str) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)``: ``AutoModelForSequenceClassification(num_labels=1)`` on ``source``'s
    backbone. A causal LM (hub id, folder, ``builtin:<name>``, loaded as an agent is) gives its
    backbone weights to a new classifier whose ``score`` head is initialised from torch's global RNG;
    a folder that already holds a sequence classifier (a saved reward model) is loaded as it is. The
    pad token (EOS when the tokenizer has none) is set on both; fp32.

    Raises:
        OSError: ``reward_model.reward_model: cannot load '<source>' (<why>)``."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from comlrl_lightning.team.agents import AgentSpec, load_agent, load_errors_named, load_tokenizer

    with load_errors_named("reward_model.reward_model", source):
        if os.path.isdir(source):
            archs = getattr(AutoConfig.from_pretrained(source), "architectures", None) or []
            if any(a.endswith("ForSequenceClassification") for a in archs):
                tok = load_tokenizer(AgentSpec(source))
                model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
                model.config.pad_token_id = tok.pad_token_id
                return model, tok
        causal, tok = load_agent(AgentSpec(source))
    config = copy.deepcopy(causal.config)
    config.num_labels, config.pad_token_id = 1, tok.pad_token_id
    config.architectures = None
    model = AutoModelForSequenceClassification.from_config(config)
    model.base_model.load_state_dict(causal.base_model.state_dict())
    return model.float(), tok


def split_pairs(
    pairs: Sequence[PreferencePair], val_fraction: float, seed: int
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """``(train, held_out)``: ``floor(P · val_fraction)`` pairs drawn with a generator seeded by ``seed``.

    Raises:
        ValueError: no pairs, or none left to train on.
    """
    if not pairs:
        raise ValueError("MARLHF: no preference pairs (every candidate tied, or an empty pair file)")
    n_val = int(len(pairs) * val_fraction)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    if n_val >= len(pairs):
        raise ValueError(f"reward_val_fraction: {val_fraction} of {len(pairs)} pairs leaves none to train on")
    held = set(order[:n_val])
    return [p for i, p in enumerate(pairs) if i not in held], [p for i, p in enumerate(pairs) if i in held]


@dataclass
class RewardFitState:
    """The resumable state of the reward model's training (written after each epoch).

    Attributes:
        pairs: every pair (the file form), so a resumed phase does not build them again.
        epoch: epochs finished.
        model, optimizer: state dicts after ``epoch`` epochs (None before the first).
        generator: the pair-order generator's state.
        rng_states: the global RNG states (dropout, and what the RL phase draws after this one).
        history: per epoch, the logged metrics.
        skipped_steps: optimizer steps skipped for a non-finite loss or gradient.
        done: the model is trained and saved (``marlhf.json`` written).
    """

    pairs: list[dict[str, Any]]
    epoch: int = 0
    model: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    generator: torch.Tensor | None = None
    rng_states: dict[str, Any] | None = None
    history: list[dict[str, float]] | None = None
    skipped_steps: int = 0
    done: bool = False


def evaluate_pairs(
    model: nn.Module,
    tok: Any,
    chosen: Sequence[str],
    rejected: Sequence[str],
    batch_size: int,
    max_length: int | None,
) -> dict[str, float]:
    """Mean Bradley–Terry loss, accuracy (``s_chosen > s_rejected``) and margin over pairs, no grad,
    eval mode (restored after)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    s_c, s_r = [], []
    with torch.no_grad():
        for i in range(0, len(chosen), batch_size):
            s_c.append(sequence_logits(model, tok, chosen[i : i + batch_size], max_length, device)[:, 0])
            s_r.append(sequence_logits(model, tok, rejected[i : i + batch_size], max_length, device)[:, 0])
    model.train(was_training)
    c, r = torch.cat(s_c).cpu(), torch.cat(s_r).cpu()
    return {
        "loss": float(bradley_terry_loss(c, r)),
        "accuracy": float((c > r).float().mean()),
        "margin": float((c - r).mean()),
    }


def fit_reward_model(
    model: nn.Module,
    tok: Any,
    reward: RewardModelReward,
    state: RewardFitState,
    cfg: RewardModelConfig,
    state_path: str | None = None,
    log: Callable[[dict[str, float], int], None] | None = None,
    after_epoch: Callable[[int], None] | None = None,
    record: dict[str, Any] | None = None,
) -> RewardFitState:
    """Train ``model`` on ``state.pairs`` for the epochs ``state.epoch..reward_num_train_epochs − 1``
    (continuing from ``state``'s weights, optimizer, order and RNG when it has them), writing
    ``state`` (and ``record``'s keys beside it) to ``state_path`` after each epoch (atomically).

    Each step: ``reward_train_batch_size`` pairs in the order of a generator seeded by
    ``reward_seed``, both sides scored with grad, :func:`bradley_terry_loss`, AdamW
    (``reward_learning_rate``). A step whose loss or gradient is not finite is skipped (counted).
    ``log(metrics, epoch)`` gets ``reward_model/loss``, ``reward_model/accuracy``,
    ``reward_model/margin`` (the epoch's training means) and, with held-out pairs,
    ``val/reward_model/loss`` / ``val/reward_model/accuracy`` / ``val/reward_model/margin``.

    Returns:
        ``state`` updated (model left in eval mode).
    """
    pairs = [PreferencePair.from_json(d) for d in state.pairs]
    train, held = split_pairs(pairs, cfg.reward_val_fraction, cfg.reward_seed)
    train_c, train_r = pair_texts(reward, train)
    held_c, held_r = pair_texts(reward, held)
    if cfg.reward_freeze_backbone:
        model.base_model.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.reward_learning_rate)
    gen = torch.Generator().manual_seed(cfg.reward_seed + 1)
    if state.model is not None:
        model.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        gen.set_state(state.generator)
    if state.rng_states is not None:
        set_rng_states(state.rng_states)
    device = next(model.parameters()).device
    history = list(state.history or [])
    b = cfg.reward_train_batch_size
    for epoch in range(state.epoch, cfg.reward_num_train_epochs):
        model.train()
        order = torch.randperm(len(train), generator=gen).tolist()
        sums = {"loss": 0.0, "accuracy": 0.0, "margin": 0.0}
        for start in range(0, len(order), b):
            idx = order[start : start + b]
            s_c = sequence_logits(model, tok, [train_c[i] for i in idx], reward.max_length, device)[:, 0]
            s_r = sequence_logits(model, tok, [train_r[i] for i in idx], reward.max_length, device)[:, 0]
            loss = bradley_terry_loss(s_c, s_r)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            finite = torch.isfinite(loss) and all(
                torch.isfinite(p.grad).all() for p in params if p.grad is not None
            )
            if finite:
                optimizer.step()
            else:
                state.skipped_steps += 1
                optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                sums["loss"] += float(loss) * len(idx)
                sums["accuracy"] += float((s_c > s_r).float().sum())
                sums["margin"] += float((s_c - s_r).sum())
        metrics = {M.reward_model(k): v / len(train) for k, v in sums.items()}
        metrics[M.reward_model("skipped_steps")] = float(state.skipped_steps)
        if held:
            metrics.update(
                {
                    M.reward_model(k, held_out=True): v
                    for k, v in evaluate_pairs(
                        model, tok, held_c, held_r, cfg.reward_batch_size, reward.max_length
                    ).items()
                }
            )
        history.append(metrics)
        if log is not None:
            log(metrics, epoch)
        for name, p in model.named_parameters():
            if not torch.isfinite(p).all():
                raise FloatingPointError(
                    f"reward model: parameter {name!r} holds NaN/inf after epoch {epoch}"
                )
        state.epoch, state.history = epoch + 1, history
        state.model = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        state.optimizer = optimizer.state_dict()
        state.generator, state.rng_states = gen.get_state(), collect_rng_states()
        if state_path is not None:
            atomic_torch_save({**vars(state), **(record or {})}, state_path)
        if after_epoch is not None:
            after_epoch(epoch)
    model.eval()
    return state


def save_reward_model(model: nn.Module, tok: Any, folder: str, info: dict[str, Any]) -> None:
    """``save_pretrained`` of the model and tokenizer into ``folder``, then ``marlhf.json`` (``info``:
    the template, the pairs' count, the last metrics) written last and atomically: its presence
    marks a finished model.

    Raises:
        FloatingPointError: a parameter holds NaN/inf (nothing is written).
    """
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise FloatingPointError(f"reward model: parameter {name!r} holds NaN/inf; not saving it")
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    tmp = os.path.join(folder, "marlhf.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, "marlhf.json"))
