"""Shared rewards: the `RewardFunction` protocol, `WeightedReward` and reward processors.

A reward function scores a batch of joint actions: one shared number per joint action (the
Dec-POMDP's shared reward, ``[J]``), or one number per agent (``[J, N]``, for tasks that credit the
agents separately; actor-critic trainers use each agent's column, MAGRPO groups per agent). A
:class:`WeightedReward` mixing both broadcasts the shared ones to every agent.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from comlrl_lightning.envs.episode import Episode
from comlrl_lightning.envs.reward_values import RewardError as RewardError
from comlrl_lightning.envs.reward_values import as_values, check_orientation


@runtime_checkable
class RewardFunction(Protocol):
    """Scores joint actions with one shared float each (or one float per agent each).

    Called positionally as ``fn(joint_actions, episodes, turn)`` where ``joint_actions[j][i]`` is
    agent ``i``'s completion text in joint action ``j`` (``Sequence[Sequence[str]]``), ``episodes[j]``
    the :class:`~comlrl_lightning.envs.base.Episode` it belongs to (episodes repeat when a node has
    several joint actions) and ``turn`` the 0-based turn (``int``). Returns either plain numbers
    (``J = len(joint_actions)`` floats, or ``J`` rows of ``N`` floats: one per agent) or a :class:`RewardResult` (values plus per-joint-action metrics,
    logged as ``rewards/<name>/<key>``). Nothing is reported through attributes set as a side effect.
    A ``torch.Tensor`` is refused (``tensor.tolist()`` gives the numbers), and so is a per-agent
    reward whose rows are its agents (:func:`~comlrl_lightning.envs.reward_values.check_orientation`).

    Implementations should set a class attribute ``name`` (used for the ``rewards/<name>/mean``
    metric; default: the class or function name). It is not a protocol member so that
    LightningCLI/jsonargparse can check the protocol from the call signature alone.

    The signature below is positional-only and annotated ``Any`` on purpose: jsonargparse matches a
    function or class named in YAML against this protocol by its signature, and with these
    annotations it accepts any callable taking three positional arguments (whatever their names and
    annotations), and refuses one of another arity.
    """

    def __call__(self, joint_actions: Any, episodes: Any, turn: Any, /) -> Any: ...


PASS_AT_1 = "all_passed"
"""The metric key a reward reports per joint action when the joint action solved the task (1.0/0.0);
validation estimates ``val/pass@k`` from it (core/evaluation.py; one greedy sample per problem: pass@1)."""


@dataclass
class RewardResult:
    """What a reward function returns when it has more to say than the values.

    Attributes:
        values: ``J`` floats, one shared reward per joint action, or ``J`` rows of ``N`` floats, one
            reward per agent.
        metrics: key -> ``J`` floats, logged as ``rewards/<name>/<key>`` (e.g. per-level values of a
            level-gated reward, or :data:`PASS_AT_1`).
    """

    values: Sequence[float]
    metrics: dict[str, Sequence[float]] = field(default_factory=dict)


ERRORS = "errors"
"""The component that marks (1.0) joint actions whose reward was invalid and skipped (``skip_invalid``)."""


class RewardTimeout(RewardError):
    """A reward function did not return within :attr:`WeightedReward.timeout_s`."""


def _call_with_timeout(fn: Any, args: tuple[Any, ...], timeout_s: float | None) -> Any:
    """``fn(*args)``; with a ``timeout_s``, in a daemon thread abandoned after ``timeout_s`` seconds.

    The worker runs under the caller's grad mode (torch's is per thread: a reward model's forward
    would otherwise record a graph). The main thread waits in an interruptible wait, so a signal
    (SIGTERM, Ctrl+C) is handled while a reward hangs.

    Raises:
        RewardTimeout: the call did not return in time.
        Exception: whatever ``fn`` raised.
    """
    if timeout_s is None:
        return fn(*args)
    result: list[Any] = []
    error: list[BaseException] = []
    grad = torch.is_grad_enabled()

    def work() -> None:
        try:
            with torch.set_grad_enabled(grad):
                result.append(fn(*args))
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            error.append(err)

    worker = threading.Thread(target=work, name=f"reward-{reward_name(fn)}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RewardTimeout(f"did not return within reward_timeout_s={timeout_s} s (abandoned)")
    if error:
        raise error[0]
    return result[0]


@dataclass
class RewardProcessor:
    """Affine transform then clip, applied to the weighted total: ``clip(scale * r + shift)``.

    Args:
        scale: multiplies the reward.
        shift: added after scaling.
        clip_min: lower bound after the affine map (``None``: unbounded).
        clip_max: upper bound after the affine map (``None``: unbounded).
    """

    scale: float = 1.0
    shift: float = 0.0
    clip_min: float | None = None
    clip_max: float | None = None

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        out = rewards * self.scale + self.shift
        if self.clip_min is not None or self.clip_max is not None:
            out = out.clamp(min=self.clip_min, max=self.clip_max)
        return out


def check_reward_signature(fn: object, where: str) -> None:
    """Refuse, naming ``where``, a reward that cannot be called as ``fn(joint_actions, episodes, turn)``.

    Raises:
        TypeError: not callable, or its signature does not take three positional arguments; a
            TRL-style signature (``prompts``/``completions``) is pointed to :class:`~comlrl_lightning.envs.TRLReward`.
    """
    if not callable(fn):
        raise TypeError(
            f"{where}: got a {type(fn).__name__}; a reward is a callable fn(joint_actions, episodes, turn)"
        )
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): the first call will tell
        return
    try:
        signature.bind(None, None, None)
    except TypeError:
        trl = {"prompts", "completions"} & set(signature.parameters)
        hint = (
            " It looks like a TRL reward: use comlrl_lightning.envs.TRLReward(fn) (agents' completions "
            "mapped as its docstring says)."
            if trl
            else ""
        )
        raise TypeError(
            f"{where}: {reward_name(fn)}{signature} cannot be called as fn(joint_actions, episodes, "
            f"turn), the RewardFunction protocol.{hint}"
        ) from None


def reward_name(fn: object) -> str:
    """The metric name of a reward function: its ``name`` attribute, else its class/function name."""
    name = getattr(fn, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(fn, "__name__", type(fn).__name__)


@dataclass
class RewardOutput:
    """The result of scoring J joint actions.

    Attributes:
        total: ``[J]`` float32, the shared reward after weighting and processing; ``[J, N]`` (one
            column per agent) when any function returned per-agent values.
        components: reward-function name -> ``[J]`` (or ``[J, N]``) raw (unweighted) values, for
            logging; also ``<name>/<key>`` for each key of a function's :attr:`RewardResult.metrics`.
        pass_at_1: ``[J]`` 1.0 where the joint action solved the task: the :data:`PASS_AT_1` metric
            of the first function that reports it; None when none does.
    """

    total: torch.Tensor
    components: dict[str, torch.Tensor] = field(default_factory=dict)
    pass_at_1: torch.Tensor | None = None

    @property
    def per_agent(self) -> bool:
        """Whether :attr:`total` has one column per agent."""
        return self.total.dim() == 2

    def agent(self, index: int) -> torch.Tensor:
        """``[J]`` rewards of agent ``index``: its column, or the shared reward."""
        return self.total[:, index] if self.per_agent else self.total


class WeightedReward:
    """A weighted sum of reward functions, then an optional processor.

    ``total_j = processor(sum_f w_f * f(joint_actions)_j)``, per agent when any function returns
    ``[J, N]`` (shared values then count for every agent). Each function's raw values are kept in
    :attr:`RewardOutput.components` so they can be logged as ``rewards/<name>/mean`` (TRL's name).
    A per-agent function first seen with as many joint actions as agents is called once more, on
    one joint action more, to tell its rows from its columns (``check_orientation``).

    Args:
        functions: the reward functions (see :class:`RewardFunction`).
        weights: one weight per function; default all 1.0.
        processor: optional :class:`RewardProcessor` applied to the weighted sum.
        skip_invalid: if False (default) a function that raises, returns the wrong count or shape, or
            a non-finite value raises :class:`RewardError` naming it; if True such values become NaN
            in the components, the joint action gets reward ``invalid_reward`` and the count is
            counted in the component
            :data:`ERRORS` (logged per step as ``rewards/errors``), the running total is
            :attr:`num_invalid`, and the first fault of each kind per function is shown as a warning.
        invalid_reward: reward given to joint actions with an invalid value when ``skip_invalid``.

    Attributes:
        timeout_s: seconds one call of one reward function may take (None: no limit, the default).
            Set from :attr:`DecPOMDPDataModule.reward_timeout_s
            <comlrl_lightning.datamodules.decpomdp.DecPOMDPDataModule>` (declared there). With a
            limit each call runs in a daemon worker thread; a call still running at the limit is
            abandoned (the thread is left to finish or hang on its own, it cannot block the exit)
            and its joint actions are treated as with ``skip_invalid``: ``invalid_reward``, counted
            in ``rewards/errors``, first timeout per function shown as a warning, whatever
            ``skip_invalid`` says.

    Raises:
        ValueError: ``weights`` has a different length than ``functions``, or no function given.
        TypeError: a function that cannot be called as ``fn(joint_actions, episodes, turn)``
            (:func:`check_reward_signature`).
    """

    def __init__(
        self,
        functions: Sequence[RewardFunction],
        weights: Sequence[float] | None = None,
        processor: RewardProcessor | None = None,
        skip_invalid: bool = False,
        invalid_reward: float = 0.0,
    ) -> None:
        self.functions = list(functions)
        if not self.functions:
            raise ValueError("WeightedReward.functions: give at least one reward function")
        for i, fn in enumerate(self.functions):
            check_reward_signature(fn, f"reward[{i}]")
        self.weights = [1.0] * len(self.functions) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.functions):
            raise ValueError(
                f"WeightedReward.weights: got {len(self.weights)} weights for {len(self.functions)} functions"
            )
        self.processor = processor
        self.skip_invalid = skip_invalid
        self.invalid_reward = invalid_reward
        self.num_invalid = 0
        self.timeout_s: float | None = None
        self._warned: set[tuple[str, str]] = set()
        self._oriented: set[str] = set()

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int, step: int = -1
    ) -> RewardOutput:
        """Score ``J = len(joint_actions)`` joint actions. ``step`` is only used in error messages."""
        n = len(joint_actions)
        num_agents = len(joint_actions[0]) if n else 0
        total = torch.zeros(n, dtype=torch.float32)
        invalid = torch.zeros(n, dtype=torch.bool)
        components: dict[str, torch.Tensor] = {}
        pass_at_1: torch.Tensor | None = None
        for fn, w in zip(self.functions, self.weights):
            name = reward_name(fn)
            extras: dict[str, Sequence[float]] = {}
            timed_out = False
            try:
                out = _call_with_timeout(fn, (joint_actions, episodes, turn), self.timeout_s)
                if isinstance(out, RewardResult):
                    out, extras = out.values, out.metrics
                values = as_values(out, n, num_agents)
                if values.dim() == 2 and n == num_agents and name not in self._oriented:
                    # a square [J, N] cannot show whether its rows are joint actions or agents
                    check_orientation(
                        lambda ja, ep, fn=fn: _values_of(
                            _call_with_timeout(fn, (ja, ep, turn), self.timeout_s)
                        ),
                        joint_actions,
                        episodes,
                    )
                    self._oriented.add(name)
            except Exception as err:  # noqa: BLE001 - re-raised with context below
                if not self.skip_invalid and not isinstance(err, RewardTimeout):
                    raise RewardError(
                        f"reward function {name!r} failed at step {step}, turn {turn}: {err}"
                    ) from err
                timed_out = isinstance(err, RewardTimeout)
                kind = "timeout" if timed_out else "raised"
                self._warn_once(
                    name,
                    kind,
                    f"reward function {name!r} failed at step {step}, turn {turn}: "
                    f"{type(err).__name__}: {err}",
                )
                values = torch.full((n,), float("nan"))
            bad = ~torch.isfinite(values)
            bad = bad.any(-1) if bad.dim() == 2 else bad  # one bad agent value spoils the joint action
            if bad.any() and not self.skip_invalid and not timed_out:
                raise RewardError(
                    f"reward function {name!r} returned a non-finite value at step {step}, turn {turn} "
                    f"(joint actions {bad.nonzero().flatten().tolist()})"
                )
            if bad.any():
                self._warn_once(
                    name,
                    "non-finite",
                    f"reward function {name!r} returned a non-finite value at step {step}, turn {turn}",
                )
            invalid |= bad
            components[name] = values
            for key, extra in extras.items():
                if len(extra) == n:
                    components[f"{name}/{key}"] = torch.as_tensor(extra, dtype=torch.float32)
                    if key == PASS_AT_1 and pass_at_1 is None:
                        pass_at_1 = components[f"{name}/{key}"]
            weighted = w * torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
            if (
                weighted.dim() == 2 and total.dim() == 1
            ):  # the first per-agent function: give every agent a column
                total = total[:, None].expand(n, num_agents).clone()
            total += weighted[:, None] if total.dim() == 2 and weighted.dim() == 1 else weighted
        if self.processor is not None:
            total = self.processor(total)
        if self.skip_invalid or self.timeout_s is not None:
            components[ERRORS] = invalid.float()
        if invalid.any():
            self.num_invalid += int(invalid.sum())
            total[invalid] = self.invalid_reward
        return RewardOutput(total=total, components=components, pass_at_1=pass_at_1)

    def _warn_once(self, name: str, kind: str, message: str) -> None:
        # skipped faults are counted in rewards/errors; the first of each kind per function is also shown
        if (name, kind) not in self._warned:
            self._warned.add((name, kind))
            why = "skip_invalid=True" if self.skip_invalid else "a timeout"
            warnings.warn(
                f"{message} ({why}: such joint actions get invalid_reward and are counted "
                f"in the metric rewards/{ERRORS}; further such faults are not shown)",
                stacklevel=3,
            )


def _values_of(out: Any) -> Any:
    return out.values if isinstance(out, RewardResult) else out


def as_weighted_reward(reward: RewardFunction | WeightedReward | Sequence[RewardFunction]) -> WeightedReward:
    """Wrap a single function or a list of functions into a :class:`WeightedReward`."""
    if isinstance(reward, WeightedReward):
        return reward
    if isinstance(reward, (list, tuple)):
        return WeightedReward(reward)
    return WeightedReward([reward])
