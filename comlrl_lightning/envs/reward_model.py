"""`RewardModelReward`: a pretrained model scores joint actions (frozen, batched, no grad).

Two kinds of model (``kind``):

- ``sequence_classification``: a Hugging Face ``AutoModelForSequenceClassification`` reads the
  rendered joint action; the score is its logit when it has one label, else the softmax
  probability of ``label`` (default: the last label, the "good" class of a binary head).
- ``causal_lm``: a causal LM reads the rendered joint action (a question ending the template) and
  the score is ``p(positive) / (p(positive) + p(negative))`` for the first tokens of
  ``positive`` / ``negative`` at the next position: an LLM judge, in [0, 1].

It is a :class:`~comlrl_lightning.envs.rewards.RewardFunction`, so it composes with programmatic
rewards in a :class:`~comlrl_lightning.envs.rewards.WeightedReward`. The model loads lazily
(:meth:`RewardModelReward.load`, or at the first call), never at construction, so a bad config
fails before any weights are read. Its device is wherever its weights are: every algorithm
(:class:`~comlrl_lightning.algorithms.base.CoMLRLModule`) lists it in ``reward_models`` and the
strategy places it on ``reward_devices[i]`` (:mod:`comlrl_lightning.infra.strategy`). Its frozen
weights are left out of Lightning checkpoints and reloaded from ``model`` on resume. It is never
trained here: :class:`~comlrl_lightning.preference.marlhf.MARLHF` trains a joint reward model (a
one-label sequence classifier, :mod:`comlrl_lightning.preference.joint_reward_model`) and scores
with it through this class, on the same text (:meth:`RewardModelReward.render`) and the same
forward (:func:`sequence_logits`). Its weights are the one reward model a Lightning checkpoint keeps.
"""

from __future__ import annotations

import math
import string
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from comlrl_lightning.core.choices import Choice
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import RewardResult, reward_name

REWARD_MODEL_KIND = Choice(
    "RewardModelReward.kind",
    {
        "sequence_classification": "an `AutoModelForSequenceClassification` reads the rendered joint action; "
        "the score is its logit (one label) or the softmax probability of `label`",
        "causal_lm": "an LLM judge: `p(positive) / (p(positive) + p(negative))` of the next token after "
        "the rendered joint action, in [0, 1]",
    },
)
"""The two kinds of reward model (module docstring)."""
RewardModelKind = REWARD_MODEL_KIND.literal
DEFAULT_TEMPLATE = "{joint_action}"
"""The whole joint action, one ``Agent i:`` block per agent (see :meth:`RewardModelReward.render`)."""
DEFAULT_JUDGE_TEMPLATE = "{joint_action}\n\nDid the agents solve the task together? Answer yes or no:"
JOINT_RESPONSE_TEMPLATE = "Joint multi-agent response\n\n{agent_blocks}"
"""CoMLRL's joint reward-model text (``MARLHFTrainer._format_joint_text``): each agent's prompt and
response, ``Agent 1 prompt:\n...\n\nAgent 1 response:\n...`` (1-based, as CoMLRL). Needs the prompts
(:meth:`RewardModelReward.render`'s ``prompts``, or ``observe``)."""
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RewardModelReward:
    """Shared reward from a frozen pretrained model (see the module docstring).

    Args:
        model: hub id, local folder or ``builtin:<name>`` of the reward model.
        kind: one of :data:`REWARD_MODEL_KIND`.
        template: ``str.format`` template of the scored text. Fields: ``joint_action`` (every
            agent's completion as ``Agent i:\\n<text>`` blocks), ``completion_<i>``, ``turn``, and the
            episode row's fields (e.g. ``prompt``). Default: :data:`DEFAULT_TEMPLATE` (sequence
            classification) or :data:`DEFAULT_JUDGE_TEMPLATE` (causal LM).
        tokenizer: tokenizer source when it differs from ``model``.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        batch_size: texts per forward (> 0).
        max_length: longer texts keep their last tokens (sequence classification: their first).
        label: class whose probability is the score of a multi-label head (None: the last).
        positive, negative: the judge's answer words (``causal_lm``); their first tokens must differ.
        name: metric name (``rewards/<name>/mean``).
        observe: ``(episode, agent) -> prompt``: each agent's turn-0 prompt for the template's prompt
            fields (``prompt_<i>``, ``agent_blocks``) when called as a reward; MARLHF passes the env's
            ``DecPOMDP.observe``. None: those fields are unavailable.

    Raises:
        ValueError: at construction, a bad ``kind``/``dtype``/``batch_size``/``max_length``, naming
            the field; at :meth:`load`, equal first tokens for ``positive``/``negative`` or a
            ``label`` the head does not have.
    """

    def __init__(
        self,
        model: str,
        kind: RewardModelKind = "sequence_classification",
        template: str | None = None,
        tokenizer: str | None = None,
        dtype: str = "float32",
        batch_size: int = 8,
        max_length: int | None = 1024,
        label: int | None = None,
        positive: str = " yes",
        negative: str = " no",
        name: str = "reward_model",
        observe: Any = None,
    ) -> None:
        REWARD_MODEL_KIND.check(kind)
        if dtype not in _DTYPES:
            raise ValueError(f"RewardModelReward.dtype: got {dtype!r}, allowed: {sorted(_DTYPES)}")
        if batch_size < 1:
            raise ValueError(f"RewardModelReward.batch_size: got {batch_size}, must be >= 1")
        if max_length is not None and max_length < 1:
            raise ValueError(f"RewardModelReward.max_length: got {max_length}, must be >= 1 or None")
        if not isinstance(model, str) or not model:
            raise ValueError(
                f"RewardModelReward.model: give a hub id, a local path or 'builtin:<name>', got {model!r}"
            )
        self.model_source, self.tokenizer_source, self.kind, self.dtype = model, tokenizer, kind, dtype
        self.template = template or (
            DEFAULT_TEMPLATE if kind == "sequence_classification" else DEFAULT_JUDGE_TEMPLATE
        )
        self.batch_size, self.max_length, self.label = batch_size, max_length, label
        self.positive, self.negative, self.name = positive, negative, name
        self.observe = observe
        self._model: nn.Module | None = None
        self._tokenizer: Any = None
        self._answer_ids: tuple[int, int] | None = None

    # ------------------------------------------------------------------ loading
    @property
    def model(self) -> nn.Module:
        """The frozen model (loaded on first access, on CPU; the strategy moves it)."""
        if self._model is None:
            self.load()
        assert self._model is not None
        return self._model

    def load(self) -> nn.Module:
        """Load the model and tokenizer once: eval mode, every parameter ``requires_grad=False``."""
        if self._model is not None:
            return self._model
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        from comlrl_lightning.team.builtin import resolve_model_spec

        tok = AutoTokenizer.from_pretrained(resolve_model_spec(self.tokenizer_source or self.model_source))
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        cls = (
            AutoModelForSequenceClassification
            if self.kind == "sequence_classification"
            else AutoModelForCausalLM
        )
        model = cls.from_pretrained(resolve_model_spec(self.model_source), dtype=_DTYPES[self.dtype])
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = (
                tok.pad_token_id
            )  # sequence classification finds the last real token by it
        model.eval().requires_grad_(False)
        if self.kind == "causal_lm":
            pos, neg = (tok(w, add_special_tokens=False)["input_ids"] for w in (self.positive, self.negative))
            if not pos or not neg or pos[0] == neg[0]:
                raise ValueError(
                    f"RewardModelReward.positive/negative: {self.positive!r} and {self.negative!r} must "
                    f"start with different tokens (got {pos[:1]} and {neg[:1]})"
                )
            self._answer_ids = (pos[0], neg[0])
        elif self.label is not None and not 0 <= self.label < model.config.num_labels:
            raise ValueError(
                f"RewardModelReward.label: got {self.label}, the head has {model.config.num_labels} labels"
            )
        self._model, self._tokenizer = model, tok
        return model

    # ------------------------------------------------------------------ scoring
    def render(
        self, joint_action: Sequence[str], episode: Episode, turn: int, prompts: Sequence[str] | None = None
    ) -> str:
        """The text scored for one joint action (see ``template``). With ``prompts`` (one per agent)
        the fields ``prompt_<i>`` and ``agent_blocks`` (:data:`JOINT_RESPONSE_TEMPLATE`) exist too.

        Raises:
            KeyError: the template names a field that is neither built in nor in the episode's row.
        """
        fields: dict[str, Any] = dict(episode.data)
        fields.update({f"completion_{i}": c for i, c in enumerate(joint_action)})
        fields["joint_action"] = "\n\n".join(f"Agent {i}:\n{c}" for i, c in enumerate(joint_action))
        fields["turn"] = turn
        if prompts is not None:
            fields.update({f"prompt_{i}": p for i, p in enumerate(prompts)})
            fields["agent_blocks"] = "\n\n".join(
                f"Agent {i + 1} prompt:\n{p}\n\nAgent {i + 1} response:\n{c}"
                for i, (p, c) in enumerate(zip(prompts, joint_action))
            )
        try:
            return self.template.format(**fields)
        except KeyError as err:
            names = sorted(f for _, f, _, _ in string.Formatter().parse(self.template) if f)
            raise KeyError(
                f"RewardModelReward.template uses field {err.args[0]!r} (template fields {names}); "
                f"available: {sorted(fields)}"
            ) from None

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> list[float]:
        observe = self.observe
        texts = [
            self.render(ja, ep, turn, None if observe is None else [observe(ep, i) for i in range(len(ja))])
            for ja, ep in zip(joint_actions, episodes)
        ]
        return self.score_texts(texts).tolist()

    @torch.inference_mode()
    def score_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """``[len(texts)]`` float32 scores on CPU, ``batch_size`` texts per forward, in eval mode
        (Lightning's ``fit`` puts every submodule of the LightningModule, the frozen reward models
        too, in train mode: dropout would make a frozen reward noisy)."""
        model = self.model
        if model.training:
            model.eval()
        device = next(model.parameters()).device
        out = [
            self._score_batch(model, list(texts[i : i + self.batch_size]), device)
            for i in range(0, len(texts), self.batch_size)
        ]
        return torch.cat(out) if out else torch.zeros(0)

    def _score_batch(self, model: nn.Module, texts: list[str], device: torch.device) -> torch.Tensor:
        tok = self._tokenizer
        if self.kind == "sequence_classification":
            logits = sequence_logits(model, tok, texts, self.max_length, device)  # [B, num_labels]
            if logits.shape[-1] == 1:
                return logits[:, 0].cpu()
            label = logits.shape[-1] - 1 if self.label is None else self.label
            return logits.softmax(-1)[:, label].cpu()
        from comlrl_lightning.core.generation import position_ids_from_mask, tokenize_prompts

        ids, mask = tokenize_prompts(tok, texts, chat_rendered=False, max_length=self.max_length)
        ids, mask = ids.to(device), mask.to(device)
        logits = (
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids_from_mask(mask),
                logits_to_keep=1,
                use_cache=False,
            )
            .logits[:, -1]
            .float()
        )
        assert self._answer_ids is not None
        pair = logits[:, list(self._answer_ids)].softmax(-1)  # [B, 2]: p(positive), p(negative), renormalised
        return pair[:, 0].cpu()


def sequence_logits(
    model: nn.Module, tokenizer: Any, texts: Sequence[str], max_length: int | None, device: torch.device
) -> torch.Tensor:
    """``[B, num_labels]`` float32 logits of a sequence classifier for ``B`` texts: right-padded, the
    first ``max_length`` tokens kept, read at the last non-pad token (the HF head's rule). The one
    forward of scoring and of :mod:`~comlrl_lightning.preference.joint_reward_model`'s training
    (with grad there), so both read the same tokens."""
    enc = tokenizer(
        list(texts),
        padding=True,
        padding_side="right",
        truncation=max_length is not None,
        max_length=max_length,
        return_tensors="pt",
    )
    return model(**{k: v.to(device) for k, v in enc.items()}).logits.float()


def position_limit(model: nn.Module, max_length: int | None) -> int | None:
    """``max_length`` capped at the model's position limit (``max_position_embeddings`` or
    ``n_positions``; None when it has neither): longer texts would index past its position table."""
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    return limit if max_length is None else max_length if limit is None else min(max_length, limit)


class GoldRewardProbe:
    """A reward function that scores with ``reward`` and reports, beside it, the ``gold`` reward of the
    same joint actions (Gao et al. 2023's "gold" reward of a learned proxy): MARLHF's RL phase scores
    with its learned model and logs the task reward (``reward_model.log_task_reward``), so
    over-optimisation of the proxy shows as the two diverging.

    Called as a :class:`~comlrl_lightning.envs.rewards.RewardFunction`: returns a
    :class:`~comlrl_lightning.envs.rewards.RewardResult` whose ``values`` are ``reward``'s, unchanged,
    and whose metric :data:`GOLD_KEY` is ``gold``'s total per joint action (``[J]`` floats; the mean
    over agents of a per-agent ``[J, N]`` total); ``reward``'s own metrics are kept. The gold values
    never reach the update. Its ``name`` is ``reward``'s, so ``rewards/<name>/mean`` is unchanged.

    Args:
        reward: the reward the update uses (a reward function, e.g. a :class:`RewardModelReward`).
        gold: the task's reward (a :class:`~comlrl_lightning.envs.rewards.WeightedReward`, e.g. the
            env's ``reward_fn``), called as ``gold(joint_actions, episodes, turn)``. It is only logged,
            so an error it raises does not stop training: the call's gold values are NaN (left out of
            the logged mean), ``failures`` counts it, and a warning names it (at the 1st, 2nd, 4th, ...
            failure). ``reward``'s errors propagate.
    """

    def __init__(self, reward: Any, gold: Any) -> None:
        self.reward, self.gold, self.name = reward, gold, reward_name(reward)
        self.failures = 0
        """Calls whose gold reward raised (their joint actions logged no task reward)."""

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> RewardResult:
        out = self.reward(joint_actions, episodes, turn)
        values, metrics = (out.values, dict(out.metrics)) if isinstance(out, RewardResult) else (out, {})
        try:
            total = self.gold(joint_actions, episodes, turn).total
            metrics[GOLD_KEY] = (total.mean(-1) if total.dim() == 2 else total).tolist()
        except Exception as err:  # noqa: BLE001 - a logged-only value must not stop the RL phase
            self.failures += 1
            metrics[GOLD_KEY] = [math.nan] * len(joint_actions)
            if self.failures & (self.failures - 1) == 0:
                warnings.warn(
                    f"reward_model.log_task_reward: the task reward raised {type(err).__name__}: {err} "
                    f"({self.failures} failed call(s) so far); those joint actions log no marlhf/task_reward, "
                    "and training goes on (the update uses the learned reward only)",
                    stacklevel=2,
                )
        return RewardResult(values, metrics)


GOLD_KEY = "task_reward"
"""The metric key of :class:`GoldRewardProbe`'s gold values (a reward component ``<name>/task_reward``)."""


def reward_models_of(reward: Any) -> list[RewardModelReward]:
    """The :class:`RewardModelReward` functions of a reward (a function, a list, or a ``WeightedReward``),
    in order: what a LightningModule lists in ``reward_models`` for the strategy to place."""
    functions = getattr(reward, "functions", None)
    if functions is None:
        functions = list(reward) if isinstance(reward, (list, tuple)) else [reward]
    return [f for f in functions if isinstance(f, RewardModelReward)]
