"""The comparator's, the rounds' and iterative MARLHF's RL phase's configuration (CoMLRL 1.4.3
``_IterativePreferenceConfig`` and ``MARLHFIterConfig`` names; ``num_rounds`` is its ``num_iterations``,
renamed because ``LossConfig.num_iterations`` means PPO epochs here).

Every enumerated knob is a :class:`~comlrl_lightning.core.choices.Choice` declared here, with
CoMLRL's other spellings as aliases. ``__post_init__`` refuses every bad value and every knob that
does not apply to the chosen policy, naming the field, the value and what is allowed, so a bad YAML
fails before any model loads.

What is not here on purpose: CoMLRL's ``comparator_api_key`` (a literal key in the config would land
in ``config.yaml`` and in checkpoints). The key is read at request time from the environment variable
named by :attr:`ComparatorConfig.comparator_api_key_env`, and only there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from comlrl_lightning.core.choices import Choice

COMPARATOR_POLICY = Choice(
    "comparator_policy",
    {
        "current": "the agents being trained, as they are when the comparator samples (CoMLRL default)",
        "current_copy": "a frozen copy of the agents taken at the round's start",
        "model": "separate frozen models (`comparator_model_name` for every agent, or "
        "`comparator_agents`, one per agent), loaded on first use with their own tokenizers",
        "history": "the agents as they were `comparator_history_k` rounds back (HF folders under "
        "`policy_checkpoint_dir`)",
        "api": "an HTTP endpoint (`comparator_api_url`, `comparator_api_format`)",
    },
    aliases={"self": "current", "copy": "current_copy", "external": "model", "checkpoint": "history"},
)
"""Who writes the joint responses the current policy is compared with (CoMLRL ``comparator_policy``)."""

COMPARATOR_GENERATION_MODE = Choice(
    "comparator_generation_mode",
    {
        "decentralized": "one response per agent, each from that agent's own model and prompt",
        "centralized": "one model (agent `comparator_centralized_agent_index`'s, or the API) writes every "
        "role in one tagged completion, split back into per-agent texts",
    },
    aliases={"decentralised": "decentralized", "centralised": "centralized"},
)
"""How a comparator's joint response is written (CoMLRL ``comparator_generation_mode``)."""

COMPARATOR_API_FORMAT = Choice(
    "comparator_api_format",
    {
        "generic": "CoMLRL's own JSON: `{prompt, agent_idx, num_return_sequences, ...}` in, the texts at "
        "`comparator_api_response_field` out",
        "openai_chat": "OpenAI-compatible `/v1/chat/completions` (vLLM, TGI, hosted models): `n` samples "
        "per request, split by `comparator_api_max_n_per_request`",
        "anthropic_messages": "Anthropic `/v1/messages`: one sample per request (no `n`)",
        "openai_responses": "OpenAI `/v1/responses`: one sample per request (no `n`)",
    },
    aliases={
        "openai": "openai_chat",
        "chat": "openai_chat",
        "anthropic": "anthropic_messages",
        "messages": "anthropic_messages",
        "responses": "openai_responses",
    },
)
"""The wire format of the ``api`` comparator (CoMLRL ``comparator_api_format``)."""

COMPARATOR_ON_ERROR = Choice(
    "comparator_on_error",
    {
        "skip": "after the bounded retries, the episode's comparator sample is dropped: its pairs are not "
        "formed (counted in `comparator/skipped_pairs`) and the round goes on",
        "stop": "after the bounded retries, raise `ComparatorError` naming the endpoint and the cause",
    },
)
"""What a failing ``api`` comparator does (CoMLRL raises at the first failure, without retries)."""

PREFERENCE_SCORING_REWARD = Choice(
    "preference_scoring_reward",
    {
        "task": "order each pair by the task reward",
        "reward_model": "order each pair by the previous round's learned reward model (iterative MARLHF; "
        "round 0 falls back to the task reward)",
    },
)
"""What orders a pair in iterative MARLHF (CoMLRL ``preference_scoring_reward``)."""

ComparatorPolicy = COMPARATOR_POLICY.literal
ComparatorGenerationMode = COMPARATOR_GENERATION_MODE.literal
ComparatorApiFormat = COMPARATOR_API_FORMAT.literal
ComparatorOnError = COMPARATOR_ON_ERROR.literal
PreferenceScoringReward = PREFERENCE_SCORING_REWARD.literal

KEY_HEADERS = ("authorization", "x-api-key", "api-key")
"""Header names that carry a key: refused in ``comparator_api_headers`` (the key comes from the env)."""


def _refuse(field: str, value: Any, why: str) -> None:
    raise ValueError(f"{field}: got {value!r}, {why}")


def _positive_int_or_none(field: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        _refuse(field, value, "must be an integer >= 1 or None")


@dataclass
class ComparatorConfig:
    """Who the current policy is compared with each round, and how (CoMLRL 1.4.3 names).

    Raises:
        ValueError: at construction, a bad value or a knob that does not apply to
            ``comparator_policy``, naming the field, the value and what is allowed.
    """

    comparator_policy: ComparatorPolicy = "current"
    """One of :data:`COMPARATOR_POLICY`. CoMLRL name and default."""
    comparator_generation_mode: ComparatorGenerationMode = "decentralized"
    """One of :data:`COMPARATOR_GENERATION_MODE`. CoMLRL name and default."""
    comparator_centralized_agent_index: int = 0
    """``centralized``: the agent whose model (or whose copy / history / ``comparator_agents`` entry)
    writes every role, in ``[0, num_agents)``. CoMLRL name."""
    comparator_model_name: str | None = None
    """``model``: one hub id, local path or ``builtin:<name>`` used for every agent. CoMLRL name."""
    comparator_agents: list[str] | None = None
    """``model``: one source per agent (or, ``centralized``, one or ``num_agents``). CoMLRL name."""
    comparator_devices: list[str] | str | None = None
    """Devices of the ``model`` / ``current_copy`` / ``history`` comparators, one per agent or one for
    all; None: each on its agent's device (as a reward model is placed). CoMLRL name."""
    comparator_num_candidates: int | None = None
    """Comparator samples per episode (>= 1); None: the current policy's ``preference_num_candidates``.
    Pairs are formed for ``min`` of the two counts. CoMLRL name."""
    comparator_history_k: int | None = None
    """``history``: compare with the policy at the end of round ``r − k`` (the initial policy while
    ``r − k < 0``); >= 1, default 1 (then it equals ``current_copy``). CoMLRL name."""
    policy_checkpoint_dir: str | None = None
    """``history``: where the per-round policies are kept as HF folders (``initial``, ``round_<r>``,
    each with ``agent_<i>``); None: ``<default_root_dir>/policy_checkpoints``. Folders no later round
    can ask for are deleted. CoMLRL name."""
    comparator_api_url: str | None = None
    """``api``: the full endpoint URL (``http://host:8000/v1/chat/completions``). CoMLRL name."""
    comparator_api_format: ComparatorApiFormat = "generic"
    """``api``: one of :data:`COMPARATOR_API_FORMAT`. CoMLRL name and default."""
    comparator_api_model: str | None = None
    """``api``: the ``model`` field of the request (required by the OpenAI / Anthropic formats). CoMLRL name."""
    comparator_api_timeout: float = 120.0
    """``api``: seconds one HTTP request may take (connect + read) before it counts as failed (> 0). CoMLRL name."""
    comparator_api_headers: dict[str, str] | None = None
    """``api``: extra request headers; a key header (``Authorization``, ``x-api-key``) is refused here:
    name the key's environment variable in ``comparator_api_key_env``. CoMLRL name."""
    comparator_api_max_n_per_request: int | None = None
    """``openai_chat``: most samples per request (``n``); larger counts are split. None: all in one
    (the Anthropic / Responses formats always send 1). CoMLRL name."""
    comparator_api_key_env: str | None = None
    """``api``: the environment variable holding the key, read at each request and never stored,
    logged or saved; None: no key. CoMLRL name."""
    comparator_api_key_header: str = "Authorization"
    """``api``: the header the key goes in (``anthropic_messages``: ``x-api-key``). CoMLRL name."""
    comparator_api_key_prefix: str = "Bearer"
    """``api``: text before the key in that header (none for ``anthropic_messages``). CoMLRL name."""
    comparator_api_response_field: str = "completions"
    """``generic``: dotted path of the completions in the reply (``data.texts``). CoMLRL name."""
    comparator_api_extra_body: dict[str, Any] | None = None
    """``api``: fields merged into every request body (``{"stop": ["\\n\\n"]}``). CoMLRL name."""
    comparator_api_max_retries: int = 3
    """``api``: retries of a request after a timeout, a refused connection, HTTP 408/429 or 5xx (>= 0);
    other 4xx and malformed replies are not retried. Not in CoMLRL (it never retries)."""
    comparator_api_retry_backoff: float = 1.0
    """``api``: seconds before the first retry, doubled each retry and capped at 30 s; a server's
    ``Retry-After`` (seconds, capped the same) replaces it (>= 0). Not in CoMLRL."""
    comparator_api_concurrency: int = 1
    """``api``: requests of one sample in flight at once, over episodes × agents (>= 1; each its own
    retries). 1: one after another, as CoMLRL (it runs agents in threads only with ``parallel_training``).
    Not in CoMLRL."""
    comparator_max_consecutive_failures: int | None = 16
    """``api`` with ``skip``: this many episodes failing in a row (across samples; a success resets
    the count) raise ``ComparatorError``: a dead endpoint stops the run instead of skipping every pair
    of every round (>= 1; None: never). Not in CoMLRL."""
    comparator_on_error: ComparatorOnError = "skip"
    """One of :data:`COMPARATOR_ON_ERROR`. Not in CoMLRL (it stops at the first failure)."""

    def __post_init__(self) -> None:
        self.comparator_policy = COMPARATOR_POLICY.canonical(self.comparator_policy)
        self.comparator_generation_mode = COMPARATOR_GENERATION_MODE.canonical(
            self.comparator_generation_mode
        )
        self.comparator_api_format = COMPARATOR_API_FORMAT.canonical(self.comparator_api_format)
        COMPARATOR_ON_ERROR.check(self.comparator_on_error)
        policy = self.comparator_policy
        idx = self.comparator_centralized_agent_index
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            _refuse("comparator_centralized_agent_index", idx, "must be an integer >= 0")
        for name in (
            "comparator_num_candidates",
            "comparator_history_k",
            "comparator_api_max_n_per_request",
            "comparator_max_consecutive_failures",
        ):
            _positive_int_or_none(name, getattr(self, name))
        only = {
            "model": ("comparator_model_name", "comparator_agents"),
            "history": ("comparator_history_k", "policy_checkpoint_dir"),
            "api": ("comparator_api_url", "comparator_api_model", "comparator_api_key_env"),
        }
        for owner, names in only.items():
            for name in names:
                value = getattr(self, name)
                if policy != owner and value is not None:
                    _refuse(name, value, f"only applies to comparator_policy='{owner}' (it is {policy!r})")
        if policy == "model":
            if (self.comparator_model_name is None) == (self.comparator_agents is None):
                _refuse(
                    "comparator_model_name",
                    self.comparator_model_name,
                    "comparator_policy='model' needs exactly one of comparator_model_name (one model for "
                    f"all agents) and comparator_agents (one per agent); comparator_agents={self.comparator_agents!r}",
                )
            agents = self.comparator_agents
            if agents is not None and (
                isinstance(agents, str) or not agents or not all(isinstance(a, str) and a for a in agents)
            ):
                _refuse("comparator_agents", agents, "must be a non-empty list of model sources")
        if self.comparator_devices is not None and policy in ("current", "api"):
            _refuse(
                "comparator_devices",
                self.comparator_devices,
                "only applies to comparator_policy 'current_copy', 'model' or 'history' "
                f"(it is {policy!r}: {'the agents sample where they are' if policy == 'current' else 'remote'})",
            )
        if policy == "history" and self.comparator_history_k is None:
            self.comparator_history_k = 1
        if policy == "api":
            self._check_api()

    def _check_api(self) -> None:
        url = self.comparator_api_url
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            _refuse("comparator_api_url", url, "comparator_policy='api' needs an http:// or https:// URL")
        if self.comparator_api_format in ("openai_chat", "anthropic_messages", "openai_responses") and (
            not self.comparator_api_model
        ):
            _refuse(
                "comparator_api_model",
                self.comparator_api_model,
                f"comparator_api_format={self.comparator_api_format!r} needs the model name",
            )
        timeout = self.comparator_api_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            _refuse("comparator_api_timeout", timeout, "must be a finite number of seconds > 0")
        workers = self.comparator_api_concurrency
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            _refuse("comparator_api_concurrency", workers, "must be an integer >= 1")
        retries = self.comparator_api_max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            _refuse("comparator_api_max_retries", retries, "must be an integer >= 0")
        backoff = self.comparator_api_retry_backoff
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not 0 <= backoff < math.inf:
            _refuse("comparator_api_retry_backoff", backoff, "must be a finite number of seconds >= 0")
        for header in self.comparator_api_headers or {}:
            if header.lower() in KEY_HEADERS or header.lower() == self.comparator_api_key_header.lower():
                _refuse(
                    "comparator_api_headers",
                    f"{{{header!r}: ...}}",
                    "a key header is not taken from the config (it would be saved in config.yaml); "
                    "put the key in an environment variable and name it in comparator_api_key_env",
                )

    def check(self, num_agents: int) -> None:
        """The rules that need the team's size (call before loading any model).

        Raises:
            ValueError: ``comparator_centralized_agent_index`` not below ``num_agents``,
                ``comparator_agents`` or ``comparator_devices`` of the wrong length, or a device
                string that is not a device.
        """
        if self.comparator_centralized_agent_index >= num_agents:
            _refuse(
                "comparator_centralized_agent_index",
                self.comparator_centralized_agent_index,
                f"must be below num_agents ({num_agents})",
            )
        devices = self.comparator_devices
        if devices is not None and devices != "auto":
            listed = [devices] if isinstance(devices, str) else list(devices)
            if not isinstance(devices, str) and len(listed) != num_agents:
                _refuse(
                    "comparator_devices", devices, f"needs one device per agent ({num_agents}) or one string"
                )
            for device in listed:
                try:
                    torch.device(device)
                except (RuntimeError, TypeError, ValueError):
                    _refuse(
                        "comparator_devices", devices, f"{device!r} is not a device (e.g. 'cpu', 'cuda:0')"
                    )
        agents = self.comparator_agents
        if agents is not None:
            allowed = {1, num_agents} if self.comparator_generation_mode == "centralized" else {num_agents}
            if len(agents) not in allowed:
                _refuse(
                    "comparator_agents", agents, f"needs {' or '.join(map(str, sorted(allowed)))} entries"
                )


@dataclass
class RoundsConfig:
    """The iterative trainers' round loop (CoMLRL ``MADPOIterConfig`` / ``MARLHFIterConfig``)."""

    num_rounds: int = 6
    """Rounds of (sample current and comparator, pair, replay, train) (>= 1). CoMLRL's
    ``num_iterations`` (default 6), renamed: ``LossConfig.num_iterations`` means PPO epochs here."""
    preference_scoring_reward: PreferenceScoringReward = "task"
    """Iterative MARLHF: one of :data:`PREFERENCE_SCORING_REWARD`. CoMLRL name and default."""

    def __post_init__(self) -> None:
        n = self.num_rounds
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            _refuse("num_rounds", n, "must be an integer >= 1")
        PREFERENCE_SCORING_REWARD.check(self.preference_scoring_reward)


@dataclass
class RLPhaseConfig:
    """The RL phase of each iterative-MARLHF round (CoMLRL ``MARLHFIterConfig``).

    Raises:
        ValueError: at construction, a bad value, naming the field, the value and what is allowed.
    """

    num_train_epochs: int = 2
    """RL passes per round (>= 1; CoMLRL's name and iterative default, 2): the round's RL phase runs
    ``num_train_epochs × trainer.num_training_batches`` training steps of ``rl_algorithm`` (a pass is
    as many steps as an epoch has batches, ``limit_train_batches`` included; the batches are the next
    ones the training dataloader gives)."""

    def __post_init__(self) -> None:
        n = self.num_train_epochs
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"num_train_epochs: got {n!r}, must be an integer >= 1")
