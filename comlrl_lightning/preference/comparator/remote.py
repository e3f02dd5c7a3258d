"""The ``api`` comparator: :class:`~comlrl_lightning.preference.comparator.api.ApiClient` requests for every
agent prompt (decentralized) or every episode's joint prompt (centralized), up to
``comparator_api_concurrency`` in flight at once; a request that fails after its retries skips its
episode or stops the run (``comparator_on_error``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from comlrl_lightning.preference.comparator.api import ApiClient, ComparatorError
from comlrl_lightning.preference.comparator.config import ComparatorConfig
from comlrl_lightning.preference.comparator.policies import BaseComparator, ComparatorSample
from comlrl_lightning.team.centralized import CentralizedAdapter, joint_prompt

log = logging.getLogger(__name__)


class ApiComparator(BaseComparator):
    """``api`` (see the module docstring). The sample does not depend on the concurrency: texts are
    placed by (episode, agent). Once a request of an episode fails, that episode's other requests are
    not sent; with ``stop`` nothing more is sent and the first failing episode's error is raised.

    Raises:
        ComparatorError: from :meth:`sample`, with ``comparator_on_error="stop"`` after a failure,
            or ``comparator_max_consecutive_failures`` episodes failed in a row.
    """

    def __init__(
        self,
        config: ComparatorConfig,
        num_agents: int,
        seed: int,
        sampling: dict[str, Any],
        client: ApiClient | None = None,
        adapter: CentralizedAdapter | None = None,
    ) -> None:
        super().__init__(config, num_agents, seed, adapter)
        self.client = client or ApiClient(config, sampling)
        self.consecutive_failures = 0
        """Episodes failed in a row, across samples (any success resets it)."""

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
        failed: set[int] = set()  # episodes with a failed request: their other requests are not sent
        stop = self.config.comparator_on_error == "stop"
        abort, lock = threading.Event(), threading.Lock()

        def run(job: tuple[int, int, str]) -> list[str] | ComparatorError | None:
            b, agent, prompt = job
            if abort.is_set() or b in failed:
                return None
            try:
                return self.client.complete(prompt, k, agent, rows[b])
            except ComparatorError as err:
                with lock:
                    failed.add(b)
                if stop:
                    abort.set()  # `stop` sends nothing more
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
        chunks = [replies[b * per_episode : (b + 1) * per_episode] for b in range(num_episodes)]
        errors = [next((g for g in c if isinstance(g, ComparatorError)), None) for c in chunks]
        if stop and failed:  # requests after the abort came back None: raise before reading them
            first = errors[min(failed)]
            raise ComparatorError(f"comparator_on_error='stop': {first}", first.retryable, first.status)
        texts: list[list[str]] = [[] for _ in range(self.num_agents)]
        ok, failures = [], 0
        for b in range(num_episodes):
            got, error = chunks[b], errors[b]
            if error is not None:
                self._failed(b, k, error)
                per_agent = [[""] * k for _ in range(self.num_agents)]
            else:
                self.consecutive_failures = 0
                if self.centralized:
                    per_agent, failed_parse = self._split(got[0], [rows[b] or {}], k)
                    failures += failed_parse
                else:
                    per_agent = got
            ok.append(error is None)
            for i in range(self.num_agents):
                texts[i].extend(per_agent[i])
        return ComparatorSample(texts, ok, k, failures)

    def _failed(self, episode: int, k: int, error: ComparatorError) -> None:
        """Count the skipped episode, or stop when too many failed in a row."""
        self.consecutive_failures += 1
        limit = self.config.comparator_max_consecutive_failures
        if limit is not None and self.consecutive_failures >= limit:
            raise ComparatorError(
                f"comparator_max_consecutive_failures={limit}: {self.consecutive_failures} episodes in a row "
                f"failed (the endpoint looks down); last: {error}",
                error.retryable,
                error.status,
            )
        log.warning("comparator failed for episode %d, its %d pairs skipped: %s", episode, k, error)
        self.counters.skipped_pairs += k

    def _sync(self) -> None:
        self.counters.errors, self.counters.retries = self.client.errors, self.client.retries

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "consecutive_failures": self.consecutive_failures}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.consecutive_failures = int(state["consecutive_failures"])
        self.client.errors, self.client.retries = self.counters.errors, self.counters.retries
