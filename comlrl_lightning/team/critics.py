"""Critics: what to build (`CriticSpec`, `CriticConfig`), loading, and the text a critic reads.

A critic is a separate model with its own tokenizer (``CriticSpec.model`` set: a
:class:`~comlrl_lightning.core.value_head.ValueModel`), or a value head on its actor's trunk
(``model=None``). IAC gives every agent its own critic reading that agent's history (and, for Q,
its completion); MAAC has one centralised critic reading every agent's observation (and, for Q,
the joint action), rendered by :func:`central_observation` and tokenised with the critic's own
tokenizer. CoMLRL: ``comlrl/trainers/actor_critic/{iac,maac}.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from comlrl_lightning.core.config import RolloutConfig
from comlrl_lightning.core.generation import tokenize_prompts
from comlrl_lightning.core.value_head import CRITIC_TYPE, CriticType, ValueModel, read_positions
from comlrl_lightning.team.agents import AgentSpec, load_agent, validate_spec


@dataclass
class CriticSpec:
    """How to build one critic (YAML-friendly, like :class:`~comlrl_lightning.team.agents.AgentSpec`)."""

    model: str | None = None
    """Hub id, local path or ``builtin:<name>`` of a separate critic model; None: a value head on the
    actor's trunk (CoMLRL ``use_separate_critic=False``), trained jointly with the actor."""
    tokenizer: str | None = None
    """Tokenizer source when it differs from ``model`` (may differ from the actors')."""
    dtype: str = "float32"
    """Parameter dtype of a separate critic: ``float32``, ``bfloat16`` or ``float16``."""
    device: str | None = None
    """Device under the agent-parallel strategy (None: the strategy's ``critic_devices``, else the agent's)."""
    value_head_hidden_dim: int | None = None
    """Width of the head's Tanh hidden layer; None: a single linear layer (CoMLRL ``value_head_hidden_dim``)."""
    learning_rate: float | None = None
    """Learning rate of this critic's optimizer; None: the module's ``critic_learning_rate``."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``from_pretrained`` arguments (or config fields for the config-built builtins)."""

    @property
    def separate(self) -> bool:
        """True for a critic with its own model, False for a head on the actor's trunk."""
        return self.model is not None


@dataclass
class CriticConfig:
    """The critic side of IAC / MAAC (CoMLRL ``IACConfig`` / ``MAACConfig`` names)."""

    critic_type: CriticType = "v"
    """What the critic estimates: one of :data:`~comlrl_lightning.core.value_head.CRITIC_TYPE`. CoMLRL name."""
    critic_learning_rate: float = 5e-6
    """Default learning rate of each critic's optimizer (> 0); CoMLRL's default 5e-6."""
    value_loss_coef: float = 0.6
    """Weight of the value loss (> 0): ``coef · mean((V − T)²)``; CoMLRL's default 0.6."""
    value_clip_range: float | None = 0.2
    """PPO-style clip ε of the value change against the pre-update values (> 0); None: no clipping.
    Default 0.2, CoMLRL's value, applied here to *every* critic. **Differs from CoMLRL**, which clips
    only a value head on the actor (``use_separate_critic=False``) and never a separate critic or
    MAAC's centralised critic (MAAC has no such field): for CoMLRL's numbers with separate critics or
    MAAC set None. Kept on because a separate critic's value targets move as much as a head's, and
    the clip bounds each step's value change the same way for both."""
    advantage_normalization: bool = True
    """Normalise each agent's advantages per turn to mean 0, std 1 (CoMLRL default True)."""
    critic_max_grad_norm: float | None = 1.0
    """Per-critic gradient-norm clip (> 0); None: off."""

    def __post_init__(self) -> None:
        CRITIC_TYPE.check(self.critic_type)
        checks = [
            ("critic_learning_rate", self.critic_learning_rate, self.critic_learning_rate > 0, "> 0"),
            ("value_loss_coef", self.value_loss_coef, self.value_loss_coef > 0, "> 0"),
            (
                "value_clip_range",
                self.value_clip_range,
                self.value_clip_range is None or self.value_clip_range > 0,
                "> 0 or None",
            ),
            (
                "critic_max_grad_norm",
                self.critic_max_grad_norm,
                self.critic_max_grad_norm is None or self.critic_max_grad_norm > 0,
                "> 0 or None",
            ),
        ]
        for name, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}: got {value!r}, must be {allowed}")


def _as_agent_spec(spec: CriticSpec) -> AgentSpec:
    assert spec.model is not None
    return AgentSpec(
        model=spec.model, tokenizer=spec.tokenizer, dtype=spec.dtype, model_kwargs=dict(spec.model_kwargs)
    )


def validate_critic_spec(spec: CriticSpec, index: int) -> None:
    """Check a CriticSpec without loading anything.

    Raises:
        ValueError: naming ``critics[i].<field>``, the bad value and what is allowed.
    """
    where = f"critics[{index}]"
    if spec.value_head_hidden_dim is not None and spec.value_head_hidden_dim < 1:
        raise ValueError(
            f"{where}.value_head_hidden_dim: got {spec.value_head_hidden_dim}, must be >= 1 or None"
        )
    if spec.learning_rate is not None and spec.learning_rate <= 0:
        raise ValueError(f"{where}.learning_rate: got {spec.learning_rate}, must be > 0 or None")
    if spec.model is None:
        if spec.tokenizer is not None or spec.model_kwargs:
            raise ValueError(
                f"{where}: tokenizer/model_kwargs need a separate critic model (critics[{index}].model), "
                "a head on the actor's trunk uses the actor's"
            )
        return
    try:
        validate_spec(_as_agent_spec(spec), index, index + 1)
    except ValueError as err:  # same checks as an agent's, named for the critic
        raise ValueError(str(err).replace(f"agents[{index}]", where)) from None


def load_critic(spec: CriticSpec) -> tuple[ValueModel, Any]:
    """``(ValueModel, tokenizer)`` of a separate critic, on CPU (loaded as an agent is: dtype,
    builtins, dropout off), with a zero-initialised head.

    Raises:
        ValueError: ``spec.model`` is None (a head on the actor's trunk is built by the module).
    """
    if spec.model is None:
        raise ValueError(
            "load_critic: spec.model is None; a head on the actor's trunk has no model of its own"
        )
    backbone, tok = load_agent(_as_agent_spec(spec))
    return ValueModel(backbone, spec.value_head_hidden_dim).to(backbone.dtype), tok


def encode_critic_inputs(
    tokenizer: Any,
    prompts: Sequence[str],
    completions: Sequence[str] | None = None,
    max_prompt_length: int | None = None,
    critic_type: str = "v",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokenise what a critic reads with the critic's own tokenizer.

    The prompt is left-padded (its special tokens as the tokenizer adds them), the completion
    right-padded without special tokens, so the read positions of :func:`read_positions` apply.

    Args:
        tokenizer: the critic's tokenizer (its pad token set).
        prompts: ``R`` observation texts.
        completions: ``R`` action texts (needed for ``"q"``; ignored for ``"v"``).
        max_prompt_length: keep only the last tokens of longer prompts.
        critic_type: ``"v"`` or ``"q"``.

    Returns:
        ``(input_ids [R, L], attention_mask [R, L], positions [R])``.

    Raises:
        ValueError: ``"q"`` without completions, or a count mismatch.
    """
    ids, mask = tokenize_prompts(tokenizer, prompts, chat_rendered=False, max_length=max_prompt_length)
    if critic_type == "v":
        return ids, mask, read_positions(mask, None, "v")
    if completions is None or len(completions) != len(prompts):
        raise ValueError(
            f"encode_critic_inputs: critic_type='q' needs one completion per prompt ({len(prompts)})"
        )
    enc = tokenizer(
        list(completions), padding=True, padding_side="right", add_special_tokens=False, return_tensors="pt"
    )
    c_ids, c_mask = enc["input_ids"], enc["attention_mask"]
    if c_ids.shape[1] == 0:  # every completion empty: read at the last prompt token
        c_ids, c_mask = (
            torch.full((len(prompts), 1), tokenizer.pad_token_id),
            torch.zeros(len(prompts), 1, dtype=torch.long),
        )
    return torch.cat([ids, c_ids], 1), torch.cat([mask, c_mask], 1), read_positions(mask, c_mask, "q")


def central_observation(
    observations: Sequence[str], joint_action: Sequence[str] | None = None
) -> tuple[str, str | None]:
    """MAAC's centralised critic input: every agent's observation, and the joint action for Q.

    CoMLRL's layout (``MAACTrainer._build_critic_input``, character for character):
    ``"[Agent i] <observation i>"`` blocks joined by blank lines; the joint action as a blank line,
    ``"[Joint Action]"``, then ``"[Agent i action]\\n<completion i>"`` blocks, every block after a
    blank line. ``observation + joint_action`` is CoMLRL's critic text. Where the observation differs
    from CoMLRL's in multi-turn runs: :class:`~comlrl_lightning.algorithms.maac.MAAC`.

    Args:
        observations: ``N`` texts, agent ``i``'s observation (its prompt history at this turn).
        joint_action: ``N`` completion texts, or None for a V-critic.

    Returns:
        ``(observation text, joint-action text or None)``: the prompt and completion parts for
        :func:`encode_critic_inputs`.
    """
    obs = "\n\n".join(f"[Agent {i}] {o}" for i, o in enumerate(observations))
    if joint_action is None:
        return obs, None
    if len(joint_action) != len(observations):
        raise ValueError(f"central_observation: {len(joint_action)} actions for {len(observations)} agents")
    action = "\n\n[Joint Action]\n\n" + "\n\n".join(
        f"[Agent {i} action]\n{c}" for i, c in enumerate(joint_action)
    )
    return obs, action


def normalize_critics(
    critics: Any, specs: list[AgentSpec], centralised: bool, algorithm: str
) -> list[CriticSpec]:
    """One :class:`CriticSpec` per critic from specs or dicts (one is broadcast): one per agent, or
    one centralised critic (MAAC). None: heads on the trunks (IAC), a separate copy of agent 0's
    model (MAAC).

    Raises:
        ValueError: the wrong number of specs for ``algorithm``, a bad spec, or a centralised critic
            without a model of its own.
    """
    n = 1 if centralised else len(specs)
    if critics is None:  # IAC: heads on the trunks; MAAC: a separate copy of agent 0's model
        critics = (
            CriticSpec(model=specs[0].model, tokenizer=specs[0].tokenizer) if centralised else CriticSpec()
        )
    items = [critics] if isinstance(critics, (CriticSpec, dict)) else list(critics)
    out = [CriticSpec(**c) if isinstance(c, dict) else c for c in items]
    if len(out) == 1 and n > 1:
        out = [CriticSpec(**asdict(out[0])) for _ in range(n)]
    if len(out) != n:
        raise ValueError(
            f"critics: got {len(out)} specs, {algorithm} needs {n} "
            f"({'one centralised critic' if centralised else 'one per agent'}), or one to broadcast"
        )
    for c, spec in enumerate(out):
        validate_critic_spec(spec, c)
        if centralised and not spec.separate:
            raise ValueError(
                "critics[0].model: MAAC's centralised critic reads every agent's observation, so it "
                "needs a model of its own (a hub id, path or 'builtin:<name>'), not a head on a trunk"
            )
    return out


@dataclass
class ActorCriticRolloutConfig(RolloutConfig):
    """:class:`RolloutConfig` with ``num_generations >= 1``: a critic is the baseline, so one sample
    per agent per node is enough (CoMLRL's IAC/MAAC default, and the only value it allows with
    ``num_turns > 1``; here any K works, targets then use the mean of the children's values)."""

    num_generations: int = 1
    """K samples per agent per node (>= 1)."""

    def __post_init__(self) -> None:
        k = self.num_generations
        if k < 1:
            raise ValueError(f"num_generations: got {k}, must be >= 1")
        self.num_generations = max(
            k, 2
        )  # the parent's checks assume a group baseline; K itself is checked above
        try:
            super().__post_init__()
        finally:
            self.num_generations = k
        if self.credit != "shared":  # the critic is the per-agent baseline (MAAC: one TD error for all)
            raise ValueError(
                f"credit: got {self.credit!r}; IAC/MAAC take credit from their critics: use 'shared'"
            )


@dataclass
class CriticBatch:
    """One critic's rollout-time values and TD targets, per turn (``[R_t]`` each; no grad).

    ``R_t`` is ``G_t·K`` (IAC: one row per agent sample) or ``G_t·J`` (MAAC: one per joint action).
    """

    values: list[torch.Tensor]
    targets: list[torch.Tensor]
