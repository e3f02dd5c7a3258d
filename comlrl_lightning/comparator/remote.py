"""The ``api`` comparator: :class:`~comlrl_lightning.comparator.api.ApiClient` requests for every
agent prompt (decentralized) or every episode's joint prompt (centralized), up to
``comparator_api_concurrency`` in flight at once; a request that fails after its retries skips its
episode or stops the run (``comparator_on_error``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from comlrl_lightning.comparator.api import ApiClient, ComparatorError
from comlrl_lightning.comparator.config import ComparatorConfig
from comlrl_lightning.comparator.policies import BaseComparator, ComparatorSample
from comlrl_lightning.comparator.tagged import CentralizedComparatorAdapter, joint_prompt

log = logging.getLogger(__name__)


class ApiComparator(BaseComparator):
    """``api`` (see the module docstring). The sample's order does not depend on the concurrency:
    texts are placed by (episode, agent), and with ``stop`` the error of the first failing episode is
    raised once every request has returned."""

    def __init__(
        self,
        config: ComparatorConfig,
        num_agents: int,
        seed: int,
        sampling: dict[str, Any],
        client: ApiClient | None = None,
        adapter: CentralizedComparatorAdapter | None = None,
    ) -> None:
        super().__init__(config, num_agents, seed, adapter)
        self.client = client or ApiClient(config, sampling)

    def sample(
        self, prompts: Sequence[Sequence[str]], num_candidates: int, episodes: Sequence[Any] | None = None
    ) -> ComparatorSample:
        num_episodes, k = len(prompts[0]), num_candidates
        rows = list(episodes) if episodes is not None else [None] * num_episodes
        idx = self.config.comparator_centralized_agent_index
        if self.centralized:
            jobs = [
                (b, idx, joint_prompt(self.adapter, rows[b] or {}, [p[b] for p in prompts]))
                for b in range(num_episodes)
            ]
        else:
            jobs = [(b, i, prompts[i][b]) for b in range(num_episodes) for i in range(self.num_agents)]

        def run(job: tuple[int, int, str]) -> list[str] | ComparatorError:
            b, agent, prompt = job
            try:
                return self.client.complete(prompt, k, agent, rows[b])
            except ComparatorError as err:
                return err

        self.counters.calls += 1
        workers = min(self.config.comparator_api_concurrency, len(jobs))
        if workers > 1:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="comlrl-comparator") as pool:
                replies = list(pool.map(run, jobs))
        else:
            replies = [run(job) for job in jobs]
        self._sync()
        per_episode = len(jobs) // max(num_episodes, 1)
        texts: list[list[str]] = [[] for _ in range(self.num_agents)]
        ok, failures = [], 0
        for b in range(num_episodes):
            got = replies[b * per_episode : (b + 1) * per_episode]
            error = next((g for g in got if isinstance(g, ComparatorError)), None)
            if error is not None:
                if self.config.comparator_on_error == "stop":
                    raise ComparatorError(
                        f"comparator_on_error='stop': {error}", error.retryable, error.status
                    )
                log.warning("comparator failed for episode %d, its %d pairs skipped: %s", b, k, error)
                self.counters.skipped_pairs += k
                per_agent = [[""] * k for _ in range(self.num_agents)]
            elif self.centralized:
                per_agent, failed = self._split(got[0], [rows[b] or {}], k)
                failures += failed
            else:
                per_agent = got
            ok.append(error is None)
            for i in range(self.num_agents):
                texts[i].extend(per_agent[i])
        return ComparatorSample(texts, ok, k, failures)

    def _sync(self) -> None:
        self.counters.errors, self.counters.retries = self.client.errors, self.client.retries

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.client.errors, self.client.retries = self.counters.errors, self.counters.retries
