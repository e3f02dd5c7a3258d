"""The ``history`` comparator (:class:`HistoryComparator`) and its store (:class:`PolicyHistory`):
the team's policy at the start of training (``initial``) and at the end of each round
(``round_<r>``), one HF folder per distinct agent model (``agent_<i>``).

Why on disk, not in memory: ``k`` rounds of N models in host RAM cost ``k·N`` model copies for the
whole run, and a resumed run would have lost them. HF folders survive a resume as they are (the
module's checkpoint holds :meth:`PolicyHistory.state_dict`: the folder and the rounds saved), and a
user can load any of them with ``from_pretrained``. CoMLRL 1.4.3 keeps the same layout
(``policy_checkpoints/initial``, ``iteration_<r>``) and never deletes; here a folder no later round
can ask for (older than ``r + 1 − k``) is deleted when round ``r`` is saved.

Each folder is written to ``.tmp-<name>-<pid>`` beside it and renamed into place, so a crash leaves
the old folder or the new one (a half-written ``.tmp-*`` is removed at the next save).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
from torch import nn

from comlrl_lightning.infra.checkpoint_io import fsync_dir
from comlrl_lightning.preference.comparator.config import ComparatorConfig
from comlrl_lightning.preference.comparator.policies import TeamComparator
from comlrl_lightning.team.centralized import CentralizedAdapter


class PolicyHistory:
    """Saves and loads the team's per-round policies under ``directory`` (see the module docstring).

    Args:
        directory: the store's folder (``policy_checkpoint_dir``).
        team: the team (its ``agents``, ``specs`` for weight sharing, ``tokenizers``).
        k: ``comparator_history_k`` (>= 1).
    """

    def __init__(self, directory: str, team: Any, k: int) -> None:
        self.directory, self.team, self.k = os.fspath(directory), team, int(k)
        self.saved: list[str] = []

    @staticmethod
    def label(round_index: int) -> str:
        """The folder of the policy at the end of round ``round_index`` (``initial`` for -1)."""
        return "initial" if round_index < 0 else f"round_{round_index}"

    def _owner(self, agent: int) -> int:
        """The first agent with ``agent``'s module (agents sharing weights are one module; LoRA agents
        sharing a base are not: each has its own adapter)."""
        return next(j for j, m in enumerate(self.team.agents) if m is self.team.agents[agent])

    def _save(self, label: str) -> None:
        os.makedirs(self.directory, exist_ok=True)
        for stale in os.listdir(self.directory):
            if stale.startswith(".tmp-"):
                shutil.rmtree(os.path.join(self.directory, stale), ignore_errors=True)
        tmp = os.path.join(self.directory, f".tmp-{label}-{os.getpid()}")
        for i, agent in enumerate(self.team.agents):
            if self._owner(i) == i:
                agent.save_pretrained(os.path.join(tmp, f"agent_{i}"))
        target = os.path.join(self.directory, label)
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_dir(self.directory)
        if label not in self.saved:
            self.saved.append(label)

    def save_initial(self) -> None:
        """Save ``initial`` before anything else is saved (a resumed run, or a later round, skips it)."""
        if not self.saved:
            self._save("initial")

    def save_round(self, round_index: int) -> None:
        """Save the policy at the end of ``round_index``, then delete what no later round needs."""
        self._save(self.label(round_index))
        needed = self.label(round_index + 1 - self.k)
        keep = self.saved[self.saved.index(needed) :] if needed in self.saved else self.saved
        for old in [s for s in self.saved if s not in keep]:
            shutil.rmtree(os.path.join(self.directory, old), ignore_errors=True)
        self.saved = list(keep)

    def path_for(self, round_index: int) -> str:
        """The folder round ``round_index`` compares with: ``round_<r−k>``, or ``initial``.

        Raises:
            FileNotFoundError: that folder is missing (deleted, or another ``policy_checkpoint_dir``).
        """
        label = self.label(round_index - self.k)
        path = os.path.join(self.directory, label)
        if label not in self.saved or not os.path.isdir(path):
            raise FileNotFoundError(
                f"policy_checkpoint_dir={self.directory!r}: round {round_index} compares with {label!r} "
                f"(comparator_history_k={self.k}), which is not there; saved: {self.saved}"
            )
        return path

    def load(
        self, round_index: int, devices: list[torch.device], only: int | None = None
    ) -> list[tuple[nn.Module | None, Any]]:
        """``[N]`` (frozen model, agent's tokenizer) of :meth:`path_for` ``(round_index)``, agent i on
        ``devices[i]``; with ``only``, just that agent's model (the others None)."""
        path = self.path_for(round_index)
        loaded: dict[int, nn.Module] = {}
        out: list[tuple[nn.Module | None, Any]] = []
        for i in range(len(self.team.agents)):
            if only is not None and i != only:
                out.append((None, None))
                continue
            owner = self._owner(i)
            if owner not in loaded:  # the agent's kind reads it back (a LoRA adapter: on its frozen base)
                model = self.team.load_saved(owner, os.path.join(path, f"agent_{owner}"))
                loaded[owner] = model.to(devices[i]).requires_grad_(False).eval()
            out.append((loaded[owner], self.team.tokenizers[i]))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "saved": list(self.saved), "k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what a checkpoint saw.

        Raises:
            FileNotFoundError: a folder the checkpoint recorded is gone.
        """
        self.directory, self.saved, self.k = state["directory"], list(state["saved"]), int(state["k"])
        missing = [s for s in self.saved if not os.path.isdir(os.path.join(self.directory, s))]
        if missing:
            raise FileNotFoundError(
                f"policy_checkpoint_dir={self.directory!r}: the checkpoint's {missing} are gone"
            )


class HistoryComparator(TeamComparator):
    """``history``: the agents as they were at the end of round ``r − comparator_history_k`` (the
    initial agents while that is negative), kept as HF folders (:class:`PolicyHistory`)."""

    def __init__(
        self,
        config: ComparatorConfig,
        team: Any,
        seed: int,
        directory: str,
        adapter: CentralizedAdapter | None = None,
    ) -> None:
        super().__init__(config, team, seed, adapter)
        self.history = PolicyHistory(directory, team, int(config.comparator_history_k or 1))

    def models(self) -> list[tuple[nn.Module, Any]]:
        if self._loaded is None:
            raise RuntimeError("comparator_policy='history': sample() outside a round (before begin_round())")
        return self._loaded

    def begin_round(self, round_index: int) -> None:
        self.history.save_initial()
        only = self.config.comparator_centralized_agent_index if self.centralized else None
        self._loaded = self.history.load(round_index, [self._device(i) for i in range(self.num_agents)], only)

    def end_round(self, round_index: int) -> None:
        self._loaded = None
        self.history.save_round(round_index)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.history.load_state_dict(state["history"])
