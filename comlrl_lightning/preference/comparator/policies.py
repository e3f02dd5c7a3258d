"""The comparator: for the same per-agent prompts, ``K`` joint responses from a policy other than
(or a frozen view of) the one being trained. One protocol (:class:`Comparator`), five policies
(:data:`~comlrl_lightning.preference.comparator.config.COMPARATOR_POLICY`), built by
:func:`~comlrl_lightning.preference.comparator.build.build_comparator`:
:class:`TeamComparator` (``current``, ``current_copy``, ``model``) here,
:class:`~comlrl_lightning.preference.comparator.history.HistoryComparator` and
:class:`~comlrl_lightning.preference.comparator.remote.ApiComparator` beside it, all on :class:`BaseComparator`.

Model-based policies (``current``, ``current_copy``, ``model``, ``history``) generate through the
team's path (``Team.generate`` / :func:`comlrl_lightning.core.generation.generate`: one batched call
per agent, the agent's sampling knobs, its chat template) under their own RNG stream: the stream is
reseeded from ``(seed, calls)`` on every :meth:`Comparator.sample`, inside ``torch.random.fork_rng``,
so the comparator never shifts the current policy's draws, and restoring ``calls`` from a checkpoint
(:meth:`state_dict`) replays the same draws after a resume (CoMLRL keeps per-device generator
states for the same purpose). A ``model`` comparator writes with its own tokenizer and chat
template; its texts are re-tokenized by the agents when pairs are trained.

Round protocol: :meth:`Comparator.begin_round` (``current_copy`` copies the agents; ``history``
saves/loads its HF folders), any number of :meth:`Comparator.sample`, :meth:`Comparator.end_round`
(frees transient copies; ``history`` saves the round's policy).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from comlrl_lightning.core import metrics as m
from comlrl_lightning.core.generation import generate, has_chat_template, render_prompt
from comlrl_lightning.preference.comparator.config import ComparatorConfig
from comlrl_lightning.team.centralized import CentralizedAdapter, TaggedAdapter, joint_prompt, split_roles

log = logging.getLogger(__name__)


@dataclass
class ComparatorSample:
    """The comparator's joint responses for ``B`` episodes, ``K`` each.

    Attributes:
        texts: ``[N][B·K]`` per agent; row ``b·K + k`` is joint response ``k`` of episode ``b``
            (``""`` where ``ok[b]`` is False).
        ok: ``[B]`` False where the comparator failed for episode ``b`` (``comparator_on_error="skip"``):
            that episode forms no pairs.
        num_candidates: ``K``.
        parse_failures: centralized completions with none of the tags (their texts are ``""``).
    """

    texts: list[list[str]]
    ok: list[bool]
    num_candidates: int
    parse_failures: int = 0

    def joint(self, episode: int) -> list[list[str]]:
        """``[N][K]`` the joint responses of one episode."""
        k = self.num_candidates
        return [agent[episode * k : (episode + 1) * k] for agent in self.texts]


class Comparator(Protocol):
    """What the iterative trainers call; see the module docstring for the round protocol."""

    def begin_round(self, round_index: int) -> None: ...

    def sample(
        self, prompts: Sequence[Sequence[str]], num_candidates: int, episodes: Sequence[Any] | None = None
    ) -> ComparatorSample:
        """``prompts[i][b]``: agent i's observation text for episode b (before any chat template);
        ``episodes[b]``: its dataset row (the ``generic`` API sends it)."""
        ...

    def end_round(self, round_index: int) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class _Counters:
    calls: int = 0
    errors: int = 0
    retries: int = 0
    skipped_pairs: int = 0
    parse_failures: int = 0


class BaseComparator:
    """Counters, the RNG stream, the centralized split, and the checkpoint state shared by all policies."""

    def __init__(
        self,
        config: ComparatorConfig,
        num_agents: int,
        seed: int,
        adapter: CentralizedAdapter | None = None,
    ) -> None:
        config.check(num_agents)
        self.config, self.num_agents, self.seed = config, num_agents, int(seed)
        self.adapter = adapter or TaggedAdapter()
        self.counters = _Counters()

    def begin_round(self, round_index: int) -> None:
        pass

    def end_round(self, round_index: int) -> None:
        pass

    @property
    def centralized(self) -> bool:
        return self.config.comparator_generation_mode == "centralized"

    def _joint_prompts(self, prompts: Sequence[Sequence[str]], rows: Sequence[Any]) -> list[str]:
        """``[B]`` the adapter's joint prompt per episode."""
        return [joint_prompt(self.adapter, rows[b], [p[b] for p in prompts]) for b in range(len(rows))]

    def _split(self, completions: Sequence[str], rows: Sequence[Any], k: int) -> tuple[list[list[str]], int]:
        """``[N][B·K]`` per-agent texts of the joint completions (episode ``b``'s are rows
        ``b·K .. b·K + K − 1``), and how many could not be parsed (their texts are ``""``)."""
        per_agent: list[list[str]] = [[] for _ in range(self.num_agents)]
        failures = 0
        for r, text in enumerate(completions):
            split = split_roles(self.adapter, text, rows[r // k], self.num_agents)
            failures += split.failed
            for i, part in enumerate(split.roles):
                per_agent[i].append(part)
        self.counters.parse_failures += failures
        return per_agent, failures

    def metrics(self) -> dict[str, float]:
        """``comparator/*`` counts so far (see ``core/metrics.py``)."""
        c = self.counters
        return {
            m.COMPARATOR_ERRORS: float(c.errors),
            m.COMPARATOR_RETRIES: float(c.retries),
            m.COMPARATOR_SKIPPED_PAIRS: float(c.skipped_pairs),
            m.COMPARATOR_PARSE_FAILURES: float(c.parse_failures),
        }

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: the counters and the RNG stream's position (never a key)."""
        c = self.counters
        return {
            "calls": c.calls,
            "errors": c.errors,
            "retries": c.retries,
            "skipped_pairs": c.skipped_pairs,
            "parse_failures": c.parse_failures,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("calls", "errors", "retries", "skipped_pairs", "parse_failures"):
            setattr(self.counters, name, int(state[name]))


class TeamComparator(BaseComparator):
    """``current``, ``current_copy`` and ``model``: sample with :meth:`models` through the team's path."""

    def __init__(
        self,
        config: ComparatorConfig,
        team: Any,
        seed: int,
        adapter: CentralizedAdapter | None = None,
    ) -> None:
        super().__init__(config, team.num_agents, seed, adapter)
        self.team = team
        self._loaded: list[tuple[nn.Module, Any]] | None = None
        self._copies: list[nn.Module] | None = None

    # -------------------------------------------------------------- which models write
    def models(self) -> list[tuple[nn.Module, Any]]:
        """``[N]`` (model, tokenizer) per agent that this policy samples with."""
        policy = self.config.comparator_policy
        if policy == "current":
            return list(zip(self.team.agents, self.team.tokenizers))
        if policy == "current_copy":
            if self._copies is None:
                raise RuntimeError("comparator_policy='current_copy': sample() before begin_round()")
            return list(zip(self._copies, self.team.tokenizers))
        if self._loaded is None:
            self._loaded = self._load_models()
        return self._loaded

    def _device(self, agent: int) -> torch.device:
        devices = self.config.comparator_devices
        if devices is None or devices == "auto":
            return self.team.device(agent)
        return torch.device(devices if isinstance(devices, str) else devices[agent])

    def _load_models(self) -> list[tuple[nn.Module, Any]]:
        from comlrl_lightning.team.agents import AgentSpec, load_agent

        cfg = self.config
        sources = cfg.comparator_agents or [cfg.comparator_model_name] * self.num_agents
        if len(sources) == 1:
            sources = sources * self.num_agents
        cache: dict[tuple[str, torch.device], tuple[nn.Module, Any]] = {}
        out = []
        for i, source in enumerate(sources):
            if self.centralized and i != cfg.comparator_centralized_agent_index:
                out.append((None, None))  # only the writing agent's model is loaded
                continue
            key = (source, self._device(i))
            if key not in cache:
                model, tok = load_agent(AgentSpec(model=source, dtype=self.team.specs[i].dtype))
                cache[key] = (model.to(key[1]).requires_grad_(False).eval(), tok)
                log.info("comparator_policy='model': loaded %s on %s", source, key[1])
            out.append(cache[key])
        return out

    def begin_round(self, round_index: int) -> None:
        if self.config.comparator_policy != "current_copy":
            return
        copies: dict[int, nn.Module] = {}
        out = []
        for i, agent in enumerate(self.team.agents):
            if self.centralized and i != self.config.comparator_centralized_agent_index:
                out.append(None)
                continue
            if id(agent) not in copies:  # agents sharing weights share one copy
                twin = copy.deepcopy(agent).requires_grad_(False).eval()
                for p in twin.parameters():
                    p.grad = None
                copies[id(agent)] = twin.to(self._device(i))
            out.append(copies[id(agent)])
        self._copies = out

    def end_round(self, round_index: int) -> None:
        self._copies = None

    # -------------------------------------------------------------- sampling
    def sample(
        self, prompts: Sequence[Sequence[str]], num_candidates: int, episodes: Sequence[Any] | None = None
    ) -> ComparatorSample:
        models = self.models()
        num_episodes = len(prompts[0])
        self.counters.calls += 1
        devices = sorted({str(p.device) for p in _distinct(models) if p.device.type == "cuda"})
        with torch.random.fork_rng(devices=devices, device_type="cuda"):
            torch.manual_seed(_stream_seed(self.seed, self.counters.calls))
            if self.centralized:
                idx = self.config.comparator_centralized_agent_index
                rows = list(episodes) if episodes is not None else [{}] * num_episodes
                texts = self._generate(idx, models[idx], self._joint_prompts(prompts, rows), num_candidates)
                per_agent, failures = self._split(texts, rows, num_candidates)
                return ComparatorSample(per_agent, [True] * num_episodes, num_candidates, failures)
            texts = self.team.map(lambda i: self._generate(i, models[i], prompts[i], num_candidates))
        return ComparatorSample(list(texts), [True] * num_episodes, num_candidates)

    def _generate(self, agent: int, pair: tuple[nn.Module, Any], prompts: Sequence[str], k: int) -> list[str]:
        model, tok = pair
        chat = self.team.specs[agent].chat_template and has_chat_template(tok)
        rendered = [render_prompt(tok, [p], [], chat) for p in prompts]
        return generate(model, tok, rendered, k, self.team.sampling[agent], chat, do_sample=True).texts


def _distinct(models: Sequence[tuple[nn.Module | None, Any]]) -> list[torch.Tensor]:
    """One parameter of each distinct model (its ``.device`` is where the model lives)."""
    seen, out = set(), []
    for model, _ in models:
        if model is not None and id(model) not in seen:
            seen.add(id(model))
            out.append(next(model.parameters()))
    return out


def _stream_seed(seed: int, calls: int) -> int:
    """The comparator stream's seed for its ``calls``-th sample (a 63-bit mix, SplitMix64's constants)."""
    z = (seed * 0x9E3779B97F4A7C15 + calls * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z & 0x7FFFFFFFFFFFFFFF
