"""`AgentCheckpoint`: each agent as a Hugging Face folder, written atomically, last k kept."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn

from comlrl_lightning.core.value_head import ValueModel, save_value_head
from comlrl_lightning.infra.checkpoint_io import fsync_dir
from comlrl_lightning.infra.sharded import full_state_dict


class AgentCheckpoint(pl.Callback):
    """Saves every agent with ``save_pretrained`` (model and tokenizer) during and at the end of fit.

    Layout: ``<dirpath>/step_<batches>/agent_<i>/``, where ``batches`` counts training batches (not
    ``global_step``, which grows by N optimizer steps per batch). Each folder loads with
    ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``; a LoRA agent's
    (``AgentSpec.adapter``) is PEFT's adapter layout (``adapter_config.json``,
    ``adapter_model.safetensors``): ``PeftModel.from_pretrained(base, folder)``. Agents that
    share weights get one folder each (same weights). A module with ``critics`` (IAC, MAAC) also
    gets ``critic_<c>/``: a separate critic as its model's folder plus ``value_head.pt`` (load with
    ``ValueModel.from_pretrained``), a head on an agent's trunk as ``value_head.pt`` alone.

    A step folder is written into a temporary directory next to it (``.step_<n>.*.tmp``), its files
    are fsynced, and it is moved into place with ``os.replace``: a crash leaves either the complete
    folder or none (and at most a temporary directory, removed when the error is caught). After each
    save, only the newest ``keep_last`` step folders written by this callback are kept; the list is
    part of the callback's checkpoint state, so pruning continues across a resume. Folders it did
    not write are never deleted. Rank zero writes; other ranks do nothing.

    Args:
        dirpath: root folder; default ``<trainer.log_dir>/agents`` (``default_root_dir`` without a logger).
        every_n_steps: save every this many training batches (0: only at the end of fit).
        keep_last: keep this many newest step folders (None: keep all).
        save_on_train_end: also save when fit ends (skipped if that batch count was just saved).

    Raises:
        ValueError: ``every_n_steps < 0`` or ``keep_last < 1``.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_n_steps: int = 50,
        keep_last: int | None = 2,
        save_on_train_end: bool = True,
    ) -> None:
        super().__init__()
        if every_n_steps < 0:
            raise ValueError(
                f"AgentCheckpoint.every_n_steps: got {every_n_steps}, must be >= 0 (0: only at the end)"
            )
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"AgentCheckpoint.keep_last: got {keep_last}, must be >= 1 or None (keep all)")
        self.dirpath = self._init_dirpath = dirpath
        self.every_n_steps = every_n_steps
        self.keep_last = keep_last
        self.save_on_train_end = save_on_train_end
        self.saved: list[str] = []
        self._last_saved_batches: int | None = None

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            log_dir = trainer.log_dir  # a broadcast: every rank must ask
            root = log_dir if log_dir is not None else trainer.default_root_dir
            self.dirpath = os.path.join(root, "agents")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        batches = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # this batch included
        if self.every_n_steps and batches % self.every_n_steps == 0:
            self.save(trainer, pl_module, batches)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        batches = trainer.fit_loop.epoch_loop._batches_that_stepped
        if self.save_on_train_end and batches != self._last_saved_batches:
            self.save(trainer, pl_module, batches)

    # ------------------------------------------------------------------ state
    @property
    def state_key(self) -> str:
        # several instances (other folders or intervals) keep separate states in a checkpoint
        return self._generate_state_key(dirpath=self._init_dirpath, every_n_steps=self.every_n_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"saved": list(self.saved), "dirpath": self.dirpath}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # a resumed run usually logs to a new version folder: then the old run's folders stay untouched
        if state_dict.get("dirpath") == self.dirpath:
            self.saved = list(state_dict.get("saved", []))

    # ------------------------------------------------------------------- save
    def save(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batches: int) -> str | None:
        """Write ``<dirpath>/step_<batches>`` (rank zero) and prune to ``keep_last``.

        Returns:
            The step folder's path on rank zero, None on other ranks.

        Raises:
            OSError / any error of ``save_pretrained``: after removing the temporary directory; the
            previous step folders are untouched.
        """
        self._last_saved_batches = batches
        critics = getattr(pl_module, "critics", None)
        # sharded models (fsdp2): every rank gathers the full weights, rank zero writes them
        states = [full_state_dict(m) for m in [*pl_module.agents, *(critics or [])]]
        if not trainer.is_global_zero:
            return None
        assert self.dirpath is not None, "setup() sets dirpath"
        final = os.path.join(self.dirpath, f"step_{batches}")
        save_agents(
            pl_module.agents,
            pl_module.tokenizers,
            final,
            critics,
            getattr(pl_module, "critic_tokenizers", None),
            states,
        )
        if final in self.saved:
            self.saved.remove(final)
        self.saved.append(final)
        if self.keep_last is not None:
            while len(self.saved) > self.keep_last:
                old = self.saved.pop(0)
                try:
                    shutil.rmtree(old)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    rank_zero_warn(f"AgentCheckpoint: could not delete {old}: {err}")
        return final


def save_agents(
    models: Any,
    tokenizers: Any,
    path: str,
    critics: Any = None,
    critic_tokenizers: Any = None,
    states: Any = None,
) -> None:
    """Atomically write ``path/agent_<i>/`` (``save_pretrained`` model and tokenizer) for every agent,
    and ``path/critic_<c>/`` for every critic (see :class:`AgentCheckpoint`). ``states``: per agent,
    then per critic, its full state dict when its parameters are shards
    (:func:`~comlrl_lightning.infra.sharded.full_state_dict`), else None.

    The folder is built in a temporary directory in the same parent, fsynced, then moved into
    place with ``os.replace``; an existing ``path`` is replaced.

    Raises:
        Any error of ``save_pretrained`` or the filesystem, after the temporary directory is removed.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    states = list(states or [None] * (len(models) + len(critics or [])))
    try:
        with _no_hf_progress_bars():
            for i, (model, tokenizer) in enumerate(zip(models, tokenizers)):
                agent_dir = os.path.join(tmp, f"agent_{i}")
                model.save_pretrained(agent_dir, state_dict=states[i])
                if tokenizer is not None:
                    tokenizer.save_pretrained(agent_dir)
            for c, critic in enumerate(critics or []):
                critic_dir, state = os.path.join(tmp, f"critic_{c}"), states[len(models) + c]
                if isinstance(critic, ValueModel):
                    tok = critic_tokenizers[c] if critic_tokenizers else None
                    critic.save_pretrained(critic_dir, tok, state_dict=state)
                else:  # a head on agent c's trunk: the trunk is agent_<c>/
                    save_value_head(critic, critic_dir, state)
        _fsync_tree(tmp)
        if os.path.exists(path):  # os.replace cannot replace a non-empty directory: swap it out first
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".old", dir=parent)
            os.replace(path, os.path.join(old, "x"))
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _no_hf_progress_bars() -> Iterator[None]:
    # save_pretrained draws a "Writing model shards" bar per agent, which would cut into Lightning's bar
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _fsync_tree(root: str) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)
