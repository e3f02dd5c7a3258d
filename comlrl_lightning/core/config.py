"""Typed configuration of an algorithm, grouped by concern (litgpt ``args.py`` style).

Every knob is declared once here, with its unit, default and source under it. An enumerated knob's
values are declared once next to the code that implements them (a :class:`~comlrl_lightning.core.choices.Choice`:
``ADVANTAGE_MODE`` in ``core/advantages.py``, ``LOSS_TYPE`` in ``core/loss.py``, ...): its
``Literal`` type here (so LightningCLI rejects a bad value with the allowed list), its validation and
its accepted aliases (TRL's and CoMLRL's spellings) all come from it. ``__post_init__`` holds the
cross-field rules and normalises the aliases, so the rest of the code reads one canonical value. Derived quantities are methods (:meth:`RolloutConfig.generations_per_episode`,
:meth:`LossConfig.max_steps_for`).

In YAML a group is a nested mapping under ``model.init_args`` (``rollout: {num_generations: 4}``);
in Python a group is a dataclass (``MAGRPO(agents, rollout=RolloutConfig(num_generations=4))``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

from comlrl_lightning.core.advantages import ADVANTAGE_MODE, JOINT_MODE, SCALE_REWARDS, default_scale
from comlrl_lightning.core.credit import CREDIT, reward_calls_per_episode
from comlrl_lightning.core.generation import AdapterRollouts as AdapterRollouts
from comlrl_lightning.core.generation import GenerationBackend as GenerationBackend
from comlrl_lightning.core.generation import SamplingConfig as SamplingConfig
from comlrl_lightning.core.loss import LossConfig
from comlrl_lightning.core.td import SOLVED_RETURN
from comlrl_lightning.core.validation import refuse_both, require
from comlrl_lightning.infra.placement import PARALLEL_TRAINING

JointMode = JOINT_MODE.literal
AdvantageMode = ADVANTAGE_MODE.literal
ScaleRewards = SCALE_REWARDS.literal
Credit = CREDIT.literal
SolvedReturn = SOLVED_RETURN.literal
ParallelTraining = PARALLEL_TRAINING.literal


@dataclass
class RolloutConfig:
    """How episodes are rolled out as trees (MAGRPO Alg. 1; see :mod:`comlrl_lightning.core.rollout`)."""

    num_generations: int = 4
    """K samples per agent per node (>= 2: the group baseline needs siblings). TRL/CoMLRL name."""
    num_turns: int = 1
    """Turns per episode (> 1 needs the env's transition). CoMLRL name."""
    joint_mode: JointMode = "aligned"
    """How a node's samples form joint actions: one of :data:`~comlrl_lightning.core.advantages.JOINT_MODE`
    (``crossed`` is CoMLRL's spelling of ``cross``). CoMLRL name."""
    discount: float = 1.0
    """γ in ``R_t = r_t + γ·mean(child returns)``, in [0, 1] (CoMLRL ignores it: γ = 1)."""
    stop_reward: float | None = None
    """A joint action whose reward is ``>=`` this ends its branch (the team solved the task). None:
    never. Before this release this knob was called ``termination_threshold``."""
    termination_threshold: float | None = None
    """CoMLRL's ``early_termination_threshold``: a node whose mean reward over its joint actions is
    ``>`` this expands no children (CoMLRL's default −0.2 stops every branch after turn 1 when rewards
    are non-negative). None: never."""
    num_generations_eval: int = 1
    """Validation samples ``n`` per problem (TRL name). 1: one path per problem, greedy unless the
    module's ``val_sampling``; n > 1: n independent sampled paths per problem (one completion per
    agent per turn each), and ``val/pass@k`` for every k in :attr:`eval_pass_at_k` is the unbiased
    estimator (:mod:`comlrl_lightning.core.evaluation`). Costs n× the validation generation."""
    eval_num_samples: int | None = None
    """CoMLRL's name for :attr:`num_generations_eval`; when given it sets it (both given must agree)."""
    eval_pass_at_k: list[int] | None = None
    """The k of the logged ``val/pass@k``, each in [1, num_generations_eval]. None: ``[1, n]``
    (``[1]`` when n = 1)."""
    solved_return: SolvedReturn = "absorbing"
    """Return of a joint action whose branch ended *solved* before the last turn (``stop_reward``,
    ``termination_threshold``, or a transition returning ``SOLVED``): one of
    :data:`~comlrl_lightning.core.td.SOLVED_RETURN`. ``absorbing`` (default) never ranks solving early
    below solving later with the same reward. ``termination_threshold`` ends (and so absorbs) every
    joint action of its node, so their returns are scaled by that factor alike (their ranking within
    the node is kept; with ``scale_rewards="none"`` their advantages grow by it)."""
    max_generations_per_episode: int = 4096
    """Budget guard: a config whose full tree makes more completions per episode raises at construction."""
    credit: Credit = "shared"
    """Per-agent credit under the one shared reward: one of :data:`~comlrl_lightning.core.credit.CREDIT`
    (:mod:`comlrl_lightning.core.credit` has the formulas and the multi-turn bias). The modes other
    than ``shared`` score extra combinations of the samples already generated (no extra generation)
    and need ``joint_mode="aligned"``. With per-agent rewards ``[J, N]`` agent i's credit is taken
    over its own column (the same formulas, each column a shared reward of its own)."""
    max_reward_calls_per_episode: int = 16384
    """Budget guard: a config whose full tree makes more reward calls per episode (joint actions
    scored, :meth:`reward_calls_per_episode`) raises at construction."""

    def __post_init__(self) -> None:
        k_ok = self.num_generations >= 2
        require("num_generations", self.num_generations, k_ok, ">= 2 (the group baseline needs >= 2 samples)")
        require("num_turns", self.num_turns, self.num_turns >= 1, ">= 1")
        self.joint_mode = JOINT_MODE.canonical(self.joint_mode)
        require("discount", self.discount, 0.0 <= self.discount <= 1.0, "in [0, 1]")
        SOLVED_RETURN.check(self.solved_return)
        if self.eval_num_samples is not None:
            if self.num_generations_eval not in (self.eval_num_samples, 1):
                n_eval = self.num_generations_eval
                refuse_both("eval_num_samples", self.eval_num_samples, "num_generations_eval", n_eval)
            self.num_generations_eval, self.eval_num_samples = self.eval_num_samples, None
        n = self.num_generations_eval
        require("num_generations_eval", n, isinstance(n, int) and n >= 1, "an integer >= 1")
        ks = self.eval_ks()
        if not ks or any(not isinstance(k, int) or not 1 <= k <= n for k in ks):
            raise ValueError(
                f"eval_pass_at_k: got {self.eval_pass_at_k}; each k must be an integer in [1, "
                f"num_generations_eval={n}] (pass@k is undefined for k > n samples)"
            )
        CREDIT.check(self.credit)
        if self.credit != "shared" and self.joint_mode != "aligned":
            raise ValueError(
                f"credit: got {self.credit!r} with joint_mode={self.joint_mode!r}; credit modes score "
                "extra combinations of an aligned rollout: use joint_mode='aligned'"
            )

    def eval_ks(self) -> list[int]:
        """The k of the logged ``val/pass@k``: :attr:`eval_pass_at_k`, or ``[1, num_generations_eval]``
        (a method, not a filled-in field, so that a CLI override of ``num_generations_eval`` moves it)."""
        if self.eval_pass_at_k is not None:
            return list(self.eval_pass_at_k)
        return sorted({1, self.num_generations_eval})

    def reward_calls_per_episode(self, num_agents: int) -> int:
        """Upper bound on joint actions scored per episode by a full tree: ``J·Σ_{t<T} J^t`` for
        ``shared`` credit (``J`` joint actions per node), ``credit.reward_calls_per_episode`` otherwise."""
        if self.credit != "shared":
            return reward_calls_per_episode(num_agents, self.num_generations, self.num_turns, self.credit)
        j = self.num_generations if self.joint_mode == "aligned" else self.num_generations**num_agents
        return j * sum(j**t for t in range(self.num_turns))

    def generations_per_episode(self, num_agents: int) -> int:
        """Upper bound on completions per episode by a full tree: ``N·K·Σ_{t<T} J^t`` with ``J = K``
        (aligned) or ``K^N`` (cross) joint actions per node."""
        j = self.num_generations if self.joint_mode == "aligned" else self.num_generations**num_agents
        return num_agents * self.num_generations * sum(j**t for t in range(self.num_turns))

    def check_budget(self, num_agents: int) -> None:
        """Raises ValueError when the full tree exceeds ``max_generations_per_episode``."""
        budget = self.generations_per_episode(num_agents)
        if budget > self.max_generations_per_episode:
            raise ValueError(
                f"num_generations={self.num_generations}, num_agents={num_agents}, num_turns={self.num_turns}, "
                f"joint_mode={self.joint_mode!r} make up to {budget} generations per episode, over "
                f"max_generations_per_episode={self.max_generations_per_episode}; lower K/turns, use 'aligned', "
                "set stop_reward, or raise the limit"
            )
        calls = self.reward_calls_per_episode(num_agents)
        if calls > self.max_reward_calls_per_episode:
            raise ValueError(
                f"credit={self.credit!r}, num_generations={self.num_generations}, num_agents={num_agents}, "
                f"num_turns={self.num_turns}, joint_mode={self.joint_mode!r} make up to {calls} reward calls per "
                f"episode, over max_reward_calls_per_episode={self.max_reward_calls_per_episode}; lower K/turns, "
                "use credit='shared', or raise the limit"
            )


@dataclass
class AdvantageConfig:
    """Group baselines over the K siblings of a node (see :mod:`comlrl_lightning.core.advantages`)."""

    advantage_mode: AdvantageMode | None = None
    """The group baseline: one of :data:`~comlrl_lightning.core.advantages.ADVANTAGE_MODE`. None
    (default): the algorithm's, filled in at construction (:meth:`with_mode`: ``mean`` for MAGRPO;
    ``MAREINFORCE``, ``MARLOO``, ``MAReMax`` fill in ``raw``, ``rloo``, ``max`` and refuse a different
    explicit value). CoMLRL name."""
    scale_rewards: ScaleRewards | bool | None = None
    """How advantages are scaled: one of :data:`~comlrl_lightning.core.advantages.SCALE_REWARDS`. None
    (default): ``none`` for ``advantage_mode="raw"`` (A = R, CoMLRL's MAREINFORCE: dividing raw returns
    by a near-zero std turns a group like [1, 1+1e-7, 1, 1] into advantages of ~1e4), ``group``
    otherwise (see :meth:`scale`). See ``agent_wise_normalization`` for whose std. TRL name;
    ``True``/``False`` mean ``group``/``none``. Formerly ``scale_advantages``."""
    advantage_eps: float = 1e-4
    """Std floor (>= 1e-4): an all-equal group gets advantage exactly 0, never NaN."""
    agent_wise_normalization: bool = True
    """Std statistics per agent (Dr. MAS, arXiv 2602.08847: a std shared by agents whose rewards
    differ in scale mis-sizes their gradients): per (node, agent) with ``scale_rewards="group"``, per
    (batch, agent) with ``"batch"``. False: the team's, pooled over all agents of the node / batch.
    With ``shared`` aligned credit every agent has the same returns, so both give the same numbers."""

    def __post_init__(self) -> None:
        if isinstance(self.scale_rewards, bool):
            self.scale_rewards = "group" if self.scale_rewards else "none"
        if self.advantage_mode is not None:
            ADVANTAGE_MODE.check(self.advantage_mode)
        if self.scale_rewards is not None:
            SCALE_REWARDS.check(self.scale_rewards)
        require("advantage_eps", self.advantage_eps, self.advantage_eps >= 1e-4, ">= 1e-4")
        if self.advantage_mode == "raw" and self.scale_rewards == "group":
            msg = "advantage_mode='raw' with scale_rewards='group': raw returns over a near-zero group std reach "
            fix = "~R/advantage_eps (~1e4 for [1, 1+1e-7, 1, 1]); leave scale_rewards unset or add a baseline"
            warnings.warn(msg + fix, UserWarning, stacklevel=2)

    @property
    def mode(self) -> str:
        """``advantage_mode`` in use: ``mean`` when unset (an alias fills in its own first)."""
        return "mean" if self.advantage_mode is None else self.advantage_mode

    @property
    def scale(self) -> ScaleRewards:
        """``scale_rewards`` with its default resolved (:func:`~comlrl_lightning.core.advantages.default_scale`
        of :attr:`mode`). Resolved here rather than in ``__post_init__`` so an alias that fills in its
        ``advantage_mode`` (``dataclasses.replace``) gets that mode's default."""
        return default_scale(self.mode) if self.scale_rewards is None else self.scale_rewards

    def with_mode(self, mode: str, alias: str | None = None) -> AdvantageConfig:
        """This config with ``advantage_mode`` filled in as ``mode`` when unset; ``alias`` (a class
        name such as ``MARLOO``) fixes the mode: a different explicit value is refused.

        Raises:
            ValueError: ``alias`` given and ``advantage_mode`` set to another value (naming both): an
                alias never overrides an explicit choice.
        """
        if self.advantage_mode is None:
            return replace(self, advantage_mode=mode)
        if alias is not None and self.advantage_mode != mode:
            raise ValueError(
                f"advantage_mode: got {self.advantage_mode!r}, but {alias} is MAGRPO with advantage_mode="
                f"{mode!r}; leave it unset, or use MAGRPO(advantage={{'advantage_mode': {self.advantage_mode!r}}})"
            )
        return self


@dataclass
class PlacementConfig:
    """Where the agents live (CoMLRL names); see :mod:`comlrl_lightning.infra.strategy`."""

    parallel_training: ParallelTraining = "none"
    """Where the agents live: one of :data:`~comlrl_lightning.infra.placement.PARALLEL_TRAINING`. With
    ``mp`` under ``Trainer(strategy="agent_parallel")`` the strategy places the models; under a plain
    single-device strategy the module places them itself at fit start. CoMLRL name."""
    agent_devices: list[str] | str | None = None
    """One device per agent (``["cuda:0", "cuda:1"]``), ``"auto"`` or None; a list of ``num_agents`` is
    required with ``mp``; read by the ``agent_parallel`` strategy when it gets no devices of its own."""

    def __post_init__(self) -> None:
        PARALLEL_TRAINING.check(self.parallel_training)

    def check(self, num_agents: int) -> None:
        """Raises ValueError when ``mp`` lacks one device per agent."""
        devices = self.agent_devices
        if self.parallel_training == "mp" and (
            isinstance(devices, str) or devices is None or len(devices) != num_agents
        ):
            raise ValueError(
                f"agent_devices: parallel_training='mp' needs a list of {num_agents} devices "
                f"(one per agent), got {devices!r}"
            )


GROUPS: dict[str, type] = {
    "rollout": RolloutConfig,
    "advantage": AdvantageConfig,
    "loss": LossConfig,
    "sampling": SamplingConfig,
    "placement": PlacementConfig,
}
"""Init-argument name -> config group, in the order a step uses them."""

DEFAULTS: dict[str, Any] = {name: cls() for name, cls in GROUPS.items()}
"""Each group's defaults: the signature defaults (so ``--print_config`` lists every field); never
mutated (:func:`~comlrl_lightning.core.deprecations.group_flat_kwargs` returns copies)."""
