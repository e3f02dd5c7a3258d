"""A team's inference engines (:class:`EnginePool`): which agent rolls out on which engine, building
them lazily, keeping their weights current, and turning their output into a
:class:`~comlrl_lightning.core.generation.Generation` like the HF path's.

Shapes: ``B`` prompts, ``K`` samples each, ``P`` padded prompt tokens, ``C`` padded completion tokens.
"""

from __future__ import annotations

import gc
import tempfile
import threading
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from comlrl_lightning.core.generation import (
    Generation,
    completion_mask_from_ids,
    context_length,
    fit_to_context,
    tokenize_prompts,
)
from comlrl_lightning.team.engine import ColocatedEngine, EngineStats, _fingerprint
from comlrl_lightning.team.kinds import LoraAdapter, Members

if TYPE_CHECKING:
    from comlrl_lightning.core.config import SamplingConfig


class PoolTeam(Members, Protocol):
    """What the pool reads of its team (:class:`~comlrl_lightning.team.team.Team` is one): a kind's
    view (:class:`~comlrl_lightning.team.kinds.Members`), the per-agent sampling knobs and the
    parameters each agent's optimizer steps."""

    sampling: list[SamplingConfig]
    num_agents: int

    def trainable_parameters(self, agent: int) -> list[torch.nn.Parameter]: ...


class EnginePool:
    """The engines of one team, built at the first rollout that needs each.

    An agent's engine key: a LoRA agent's is its base (``model``, ``dtype``, ``model_kwargs``: every
    adapter agent on that base shares one engine, the base frozen and held once); any other agent's is
    its model object (agents sharing weights share it).

    Attributes:
        stats: :class:`~comlrl_lightning.team.engine.EngineStats` (build, warm-up, sync, generate).
    """

    def __init__(self, team: PoolTeam) -> None:
        self.team = team
        self.engines: dict[Hashable, ColocatedEngine] = {}
        self._synced: dict[Hashable, Any] = {}  # what each engine (or adapter) last received
        self._lock = threading.Lock()  # one engine call at a time (agent threads share engines)
        self._dir = tempfile.TemporaryDirectory(prefix="comlrl-vllm-")
        self.stats = EngineStats()

    def close(self) -> None:
        """Shut every engine down and free its memory; the next rollout builds them again. Every engine
        is shut down even when one raises (the first error is raised after)."""
        errors = []
        for engine in self.engines.values():
            try:
                engine.close()
            except Exception as err:  # noqa: BLE001 - the others still close; raised below
                errors.append(err)
        self.engines.clear()
        self._synced.clear()
        gc.collect()  # the engines' weights and KV caches sit in reference cycles
        if errors:
            raise errors[0]

    def _is_lora(self, agent: int) -> bool:
        return isinstance(self.team.kinds[agent], LoraAdapter)

    def key(self, agent: int) -> Hashable:
        """The engine ``agent`` rolls out on (see the class docstring)."""
        spec = self.team.specs[agent]
        if self._is_lora(agent):
            return ("lora", spec.model, spec.dtype, repr(sorted(spec.model_kwargs.items())))
        return ("full", id(self.team.agents[agent]))

    def _build(self, agent: int, key: Hashable) -> ColocatedEngine:
        team, t0 = self.team, time.perf_counter()
        folder = Path(self._dir.name) / f"engine_{len(self.engines)}"
        lora = self._is_lora(agent)
        # the engine starts from the weights the trainer holds now: built-from-config and resumed
        # models need no separate source, and a full model needs no first sync
        start = team.kinds[agent].pristine_base(agent) if lora else team.agents[agent]
        start.save_pretrained(folder)
        sampling = team.sampling[agent]
        context = context_length(start) or 2048
        max_len = min(sampling.vllm_max_model_length or context, context)
        rank = None
        sharers = [i for i in range(team.num_agents) if self.key(i) == key]
        if lora:
            rank = max(int(team.specs[i].adapter.r) for i in sharers)  # type: ignore[union-attr]
        engine = ColocatedEngine(
            str(folder), next(start.parameters()).dtype, sampling, max_len, rank, len(sharers)
        )
        if not lora:
            self._synced[key] = _fingerprint(list(team.agents[agent].parameters()))
        self.stats.build_s += time.perf_counter() - t0
        return engine

    def engine(self, agent: int) -> ColocatedEngine:
        """``agent``'s engine, built on first use."""
        key = self.key(agent)
        if key not in self.engines:
            self.engines[key] = self._build(agent, key)
        return self.engines[key]

    def sync(self, agent: int) -> Any:
        """Push ``agent``'s weights (full) or adapter (LoRA) to its engine if they changed since the last
        push; returns the ``LoRARequest`` to generate with (None for a full model)."""
        engine, key, team = self.engine(agent), self.key(agent), self.team
        model = team.agents[agent]
        if not self._is_lora(agent):
            now = _fingerprint(list(model.parameters()))
            if self._synced.get(key) != now:
                t0 = time.perf_counter()
                engine.load_weights(model.state_dict())
                self._synced[key], self.stats.syncs = now, self.stats.syncs + 1
                self.stats.sync_s += time.perf_counter() - t0
            return None
        from vllm.lora.request import LoRARequest

        adapter_key = ("adapter", agent)
        now = _fingerprint(team.trainable_parameters(agent))
        folder = Path(self._dir.name) / f"adapter_{agent}"
        request = LoRARequest(f"agent_{agent}", agent + 1, str(folder))
        if self._synced.get(adapter_key) != now:
            t0 = time.perf_counter()
            model.save_pretrained(folder)  # PEFT writes the adapter only (adapter_config + safetensors)
            # loaded once, here, under the same id (load_inplace); the rollout's requests then name it
            # without load_inplace: vLLM re-adds a step's adapters at every step and would re-read a
            # request's load_inplace adapter from disk each time
            engine.load_adapter(
                LoRARequest(request.lora_name, request.lora_int_id, str(folder), load_inplace=True)
            )
            if adapter_key in self._synced:
                engine.reset_prefix_cache()
            self._synced[adapter_key], self.stats.syncs = now, self.stats.syncs + 1
            self.stats.sync_s += time.perf_counter() - t0
        return request

    def generate(
        self, agent: int, prompt_texts: Sequence[str], num_generations: int, chat_rendered: bool, greedy: bool
    ) -> Generation:
        """Agent ``agent``'s ``K = num_generations`` completions of each of its ``B`` prompts through its
        engine: a :class:`~comlrl_lightning.core.generation.Generation` of ``B·K`` rows with
        ``engine_logprobs`` set, built as the HF path builds it (same prompt tokens and truncation,
        same completion mask and decoding).

        Raises:
            ValueError: ``max_new_tokens`` not below the engine's context.
        """
        return self.generate_joint([agent], [prompt_texts], num_generations, [chat_rendered], greedy)[0]

    def joint_groups(self) -> list[list[int]]:
        """The agents that share an engine, in agent order, for the groups of two or more (a LoRA team on
        one base, agents sharing weights): :meth:`generate_joint` rolls each group out in one call."""
        groups: dict[Hashable, list[int]] = {}
        for i in range(self.team.num_agents):
            if self.team.sampling[i].generation_backend == "vllm":
                groups.setdefault(self.key(i), []).append(i)
        return [g for g in groups.values() if len(g) > 1]

    def generate_joint(
        self,
        agents: Sequence[int],
        prompt_texts: Sequence[Sequence[str]],
        num_generations: int,
        chat_rendered: Sequence[bool],
        greedy: bool,
    ) -> list[Generation]:
        """:meth:`generate` for agents that share one engine, in one engine call: every agent's requests
        (its prompts, its sampling knobs and seed, its adapter) are scheduled together, so each decode
        step runs the base model once for the whole team instead of once per agent. Per agent the same
        Generation as :meth:`generate` gives for the same seed; the seeds are drawn in ``agents``' order
        before the call (one call per agent would draw each after the previous call, which itself uses
        torch's generator).

        Args:
            agents: agent indices, all on one engine (:meth:`key`).
            prompt_texts: per agent its ``B_i`` prompt texts.
            num_generations: ``K``.
            chat_rendered: per agent whether its texts are chat-rendered.
            greedy: greedy decoding (evaluation) instead of sampling.

        Returns: per agent a Generation of ``B_i·K`` rows.

        Raises:
            ValueError: agents on different engines; ``max_new_tokens`` not below an engine's context.
        """
        keys = {self.key(a) for a in agents}
        if len(keys) != 1:
            raise ValueError(
                f"agents: got {list(agents)}, which roll out on {len(keys)} engines; allowed: one"
            )
        parts = [
            self._requests(a, texts, num_generations, chat, greedy)
            for a, texts, chat in zip(agents, prompt_texts, chat_rendered, strict=True)
        ]
        with self._lock:
            fresh = keys.pop() not in self.engines
            loras = [self.sync(a) for a in agents]
            prompts = [p for part in parts for p in part.prompts]
            params = [part.params for part in parts for _ in part.prompts]
            lora = [req for req, part in zip(loras, parts) for _ in part.prompts]
            t0 = time.perf_counter()
            outs = self.engine(agents[0]).generate(prompts, params, lora)
            spent = time.perf_counter() - t0
        gens, start = [], 0
        for a, part in zip(agents, parts):
            rows = [r for per_prompt in outs[start : start + len(part.prompts)] for r in per_prompt]
            start += len(part.prompts)
            self.stats.tokens += sum(len(t) for t, _ in rows)
            gens.append(
                _as_generation(rows, part.ids, part.mask, num_generations, self.team.tokenizers[a], part.eos)
            )
        if fresh:
            self.stats.first_call_s += spent
        else:
            self.stats.generate_s += spent
        return gens

    def _requests(
        self, agent: int, prompt_texts: Sequence[str], num_generations: int, chat_rendered: bool, greedy: bool
    ) -> _Requests:
        """``agent``'s prompts as the engine takes them (token ids, truncated as the HF path truncates) and
        its sampling parameters (drawing the call's seed)."""
        team = self.team
        tok, sampling, model = team.tokenizers[agent], team.sampling[agent], team.agents[agent]
        ids, mask = tokenize_prompts(tok, prompt_texts, chat_rendered, sampling.max_prompt_length)
        context = context_length(model)
        if sampling.vllm_max_model_length is not None:
            context = min(context or sampling.vllm_max_model_length, sampling.vllm_max_model_length)
        ids, mask = fit_to_context(ids, mask, context, sampling.max_new_tokens)
        eos = model.generation_config.eos_token_id
        eos = tok.eos_token_id if eos is None else eos
        eos_ids = [eos] if isinstance(eos, int) else list(eos)
        params = _sampling_params(sampling, num_generations, eos_ids, greedy)
        prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
        return _Requests(ids, mask, eos, params, prompts)


@dataclass
class _Requests:
    """One agent's part of an engine call."""

    ids: torch.Tensor
    """``[B, P]`` prompt token ids, left-padded (as the HF path builds them)."""
    mask: torch.Tensor
    """``[B, P]`` their attention mask."""
    eos: int | list[int]
    """The end-of-sequence id(s) the completion mask stops at."""
    params: dict[str, Any]
    """``vllm.SamplingParams`` fields for each of the agent's prompts."""
    prompts: list[list[int]]
    """Per prompt its token ids without padding."""


def _sampling_params(sampling: SamplingConfig, n: int, eos_ids: list[int], greedy: bool) -> dict[str, Any]:
    """``vllm.SamplingParams`` fields for ``n`` samples per prompt under ``sampling``'s knobs."""
    # the seed comes from torch's RNG: a seeded run and its resume draw the same samples
    seed = int(torch.randint(0, 2**31 - 1, ()))
    params: dict[str, Any] = dict(n=n, max_tokens=sampling.max_new_tokens, stop_token_ids=eos_ids, seed=seed)
    if greedy:
        return dict(params, temperature=0.0)
    return dict(params, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0)


def _as_generation(
    rows: list[tuple[list[int], list[float]]],
    ids: torch.Tensor,
    mask: torch.Tensor,
    k: int,
    tok: Any,
    eos: int | list[int],
) -> Generation:
    """The engine's ``B·K`` rows (token ids, log-probs) as a Generation over ``ids``/``mask`` ``[B, P]``."""
    width = max(1, max(len(t) for t, _ in rows))
    completion = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    logps = torch.zeros(len(rows), width, dtype=torch.float32)
    for r, (tokens, lp) in enumerate(rows):
        completion[r, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
        logps[r, : len(lp)] = torch.as_tensor(lp, dtype=torch.float32)
    completion_mask, clipped = completion_mask_from_ids(completion, eos)
    texts = tok.batch_decode(
        completion * completion_mask + tok.pad_token_id * (1 - completion_mask), skip_special_tokens=True
    )
    prompt_ids, prompt_mask = ids.repeat_interleave(k, 0), mask.repeat_interleave(k, 0)
    return Generation(
        prompt_ids, prompt_mask, completion, completion_mask, texts, clipped, logps * completion_mask
    )
