"""`DecPOMDPDataModule`: Dec-POMDP episodes from a `datasets.Dataset`, plus the env that scores them."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from comlrl_lightning.datamodules.loader import EpisodeDataset, ResumableSampler, collate_episodes
from comlrl_lightning.envs.base import DecPOMDP, Formatter, Transition
from comlrl_lightning.envs.rewards import RewardFunction, WeightedReward

_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(source: Any, split: str = "train", field: str = "data.dataset") -> Any:
    """Rows from a hub dataset name, a local json/jsonl/parquet/csv file or data folder, a
    ``datasets.Dataset`` or a list. ``field`` names the config field in messages.

    A string that starts with ``/``, ``./``, ``../`` or ``~``, has more than one ``/``, or ends in
    a data file extension is a local path (a Hub id is ``name`` or ``owner/name``).

    Raises:
        FileNotFoundError: a local path that does not exist.
        ValueError: an unsupported local file extension; a local file with no rows; a ``.jsonl``
            line that is not a JSON object (naming the file and line); a Hub name the Hub (or the
            offline cache) cannot give.
    """
    if not isinstance(source, (str, os.PathLike)):
        return source
    import datasets

    path = os.path.expanduser(os.fspath(source))
    stem = path.removesuffix(".gz")
    ext = os.path.splitext(stem)[1]
    local = ext in _LOCAL_FORMATS or path.startswith(("/", "./", "../", "~")) or path.count("/") > 1
    if local and not os.path.exists(path):
        raise FileNotFoundError(
            f"{field}: no file or folder {os.path.abspath(path)!r} ({os.fspath(source)!r} is a "
            "local path; a Hub dataset id is 'name' or 'owner/name')"
        )
    if os.path.isdir(path):
        return datasets.load_dataset(path, split=split)
    if os.path.exists(path):
        if ext not in _LOCAL_FORMATS:
            raise ValueError(
                f"{field}: unsupported file {path!r}; allowed extensions: {sorted(_LOCAL_FORMATS)} (+ .gz)"
            )
        try:
            return datasets.load_dataset(_LOCAL_FORMATS[ext], data_files=path, split="train")
        except (StopIteration, ValueError) as err:  # an empty file: a bare StopIteration, or "no data"
            if isinstance(err, ValueError) and "no data" not in str(err):
                raise
            raise ValueError(
                f"{field}: {os.path.abspath(path)!r} has no rows; give a file with at least one"
            ) from None
        except Exception:  # datasets' DatasetGenerationError buries the line; name it, message last
            problem = _json_lines_problem(path, field) if path.endswith(".jsonl") else None
            if problem is not None:
                raise ValueError(problem) from None
            raise
    try:
        return datasets.load_dataset(path, split=split)
    except Exception as err:  # noqa: BLE001 - a Hub name: say what was tried, message last
        raise ValueError(
            f"{field}: {path!r} is no local file or folder, and the Hugging Face Hub (or, with "
            f"HF_HUB_OFFLINE=1, its cache) has no dataset of that name: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}"
        ) from None


def source_fingerprint(source: Any) -> str | None:
    """``"sha256:<hex>"`` of a local data file's bytes (a data folder: of each file's relative path and
    bytes, in sorted order); None for a Hub name, a ``datasets.Dataset`` or a list (nothing on disk
    to compare). A resumed run compares it with the checkpoint's (:meth:`DecPOMDPDataModule.load_state_dict`):
    a file edited in place keeps its path."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = os.path.expanduser(os.fspath(source))
    if os.path.isfile(path):
        files = [(os.path.basename(path), path)]
    elif os.path.isdir(path):
        files = sorted(
            (os.path.relpath(os.path.join(folder, name), path), os.path.join(folder, name))
            for folder, _, names in os.walk(path)
            for name in names
        )
    else:
        return None
    digest = hashlib.sha256()
    for name, file in files:
        digest.update(name.encode() + b"\0")
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _json_lines_problem(path: str, field: str) -> str | None:
    """What is wrong with the first line of a ``.jsonl`` file that is not one JSON object (None: nothing)."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            where = f"{field}: {os.path.abspath(path)}, line {number}"
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                return (
                    f"{where}: not valid JSON ({err.msg}, column {err.colno}); a .jsonl file holds one JSON "
                    "object per line"
                )
            if not isinstance(row, dict):
                return f"{where}: a JSON {type(row).__name__}, not an object; a .jsonl file holds one JSON object per line"
    return None


class DecPOMDPDataModule(pl.LightningDataModule):
    """Batches of episodes (lists of :class:`Episode`) and the :class:`DecPOMDP` env.

    Args:
        dataset: hub dataset name, local json/jsonl/parquet/csv path, ``datasets.Dataset`` or list of dicts.
        formatters: one formatter (callable or ``str.format`` template over the row) per agent.
        reward: reward function(s) or a :class:`WeightedReward` (shared reward of a joint action).
        transition: optional :class:`Transition` for multi-turn episodes.
        num_agents: if given, checked against the number of formatters.
        train_split: split name for hub datasets.
        val_dataset: separate validation source (same forms as ``dataset``); else ``val_fraction``.
        val_split: split name of ``val_dataset`` for hub datasets.
        val_fraction: fraction of ``dataset`` held out for validation when ``val_dataset`` is None.
        batch_size: episodes per training batch.
        val_batch_size: episodes per validation batch (default ``batch_size``).
        max_train_samples: cap on training episodes (None: all).
        max_val_samples: cap on validation episodes (None: all).
        shuffle: shuffle training episodes each epoch (seeded).
        seed: seed of the split and the shuffle.
        num_workers: DataLoader workers.
        reward_timeout_s: seconds one reward function may take to score one batch of joint actions
            (> 0; default None: no limit). A call still running then is abandoned in its worker
            thread and its joint actions get ``invalid_reward``, counted in ``rewards/errors``, as
            with ``WeightedReward(skip_invalid=True)`` (see :attr:`WeightedReward.timeout_s`).

    Raises:
        ValueError: formatter count ≠ ``num_agents``, a bad fraction/size/cap/timeout, or a template
            ``str.format`` cannot parse, naming the field. At ``setup`` (before any model loads): an
            empty split, a formatter that fails on the first row of a split, or a template field
            that a later row lacks (row index given), naming ``data.formatters[i]``.
        TypeError: a formatter that is not callable, or (at ``setup``) returns no ``str``.
    """

    def __init__(
        self,
        dataset: Any = None,
        formatters: Sequence[str | Formatter] = (),
        reward: RewardFunction | WeightedReward | Sequence[RewardFunction] | None = None,
        transition: Transition | None = None,
        num_agents: int | None = None,
        train_split: str = "train",
        val_dataset: Any = None,
        val_split: str = "validation",
        val_fraction: float = 0.0,
        batch_size: int = 4,
        val_batch_size: int | None = None,
        max_train_samples: int | None = None,
        max_val_samples: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        reward_timeout_s: float | None = None,
    ) -> None:
        super().__init__()
        if num_agents is not None and len(formatters) != num_agents:
            raise ValueError(
                f"data.formatters: got {len(formatters)} formatters for num_agents={num_agents}; give one per agent"
            )
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"data.val_fraction: got {val_fraction}, must be in [0, 1)")
        if batch_size < 1:
            raise ValueError(f"data.batch_size: got {batch_size}, must be >= 1")
        if val_batch_size is not None and (isinstance(val_batch_size, bool) or val_batch_size < 1):
            raise ValueError(
                f"data.val_batch_size: got {val_batch_size!r}, must be >= 1 or None (batch_size's value)"
            )
        for name, cap in (("max_train_samples", max_train_samples), ("max_val_samples", max_val_samples)):
            if cap is not None and cap < 1:
                raise ValueError(
                    f"data.{name}: got {cap}, must be >= 1 or None (all rows); to skip validation "
                    "set trainer.limit_val_batches=0"
                )
        if reward_timeout_s is not None and not reward_timeout_s > 0:
            raise ValueError(
                f"data.reward_timeout_s: got {reward_timeout_s!r}, must be > 0 seconds or None (no limit)"
            )
        if reward is None:
            raise ValueError("data.reward: give a reward function (or a list, or a WeightedReward)")
        try:
            self.env = DecPOMDP(formatters, reward, transition)
        except (ValueError, TypeError) as err:
            raise type(err)(f"data.{err}") from None
        self.env.reward_fn.timeout_s = reward_timeout_s
        self.dataset, self.val_dataset = dataset, val_dataset
        self.train_split, self.val_split = train_split, val_split
        self.val_fraction, self.seed = val_fraction, seed
        self.batch_size = batch_size
        self.val_batch_size = batch_size if val_batch_size is None else val_batch_size
        self.max_train_samples, self.max_val_samples = max_train_samples, max_val_samples
        self.shuffle, self.num_workers = shuffle, num_workers
        self.train_rows: Any = None
        self.val_rows: Any = None
        self._sampler: ResumableSampler | None = None
        self._resume_batches = 0
        self._fingerprints: dict[str, str] | None = None

    def load_train_val(self) -> tuple[Any, Any]:
        """``(train_rows, val_rows)``; subclasses override this to build task data."""
        rows = load_rows(self.dataset, self.train_split)
        if self.val_dataset is not None:
            return rows, load_rows(self.val_dataset, self.val_split, "data.val_dataset")
        if self.val_fraction > 0:
            n_val = max(1, round(len(rows) * self.val_fraction))
            if hasattr(rows, "train_test_split"):
                parts = rows.train_test_split(test_size=n_val, seed=self.seed, shuffle=True)
                return parts["train"], parts["test"]
            return rows[n_val:], rows[:n_val]
        return rows, None

    def setup(self, stage: str) -> None:
        if self.train_rows is not None:
            return
        train, val = self.load_train_val()
        self.train_rows = _cap(train, self.max_train_samples)
        self.val_rows = _cap(val, self.max_val_samples) if val is not None else None
        for split, rows in (("training", self.train_rows), ("validation", self.val_rows)):
            if rows is not None:
                self._check_rows(split, rows)

    def _check_rows(self, split: str, rows: Any) -> None:
        """Refuse an empty split and render every formatter on its first row, so a bad template or a
        missing field fails here, before any model loads, naming the formatter."""
        if len(rows) == 0:
            source = self.dataset if split == "training" or self.val_dataset is None else self.val_dataset
            where = source if isinstance(source, (str, os.PathLike)) else type(source).__name__
            raise ValueError(f"data.dataset: the {split} split of {where!r} has no rows")
        row = dict(rows[0])
        for i, fmt in enumerate(self.env.formatters):
            try:
                text = fmt(row)
            except Exception as err:  # noqa: BLE001 - any failure here is the user's formatter; say which
                raise ValueError(
                    f"data.formatters[{i}] ({fmt!r}) fails on the first {split} row "
                    f"(fields {sorted(row)}): {type(err).__name__}: {err}"
                ) from None
            if not isinstance(text, str):
                raise TypeError(
                    f"data.formatters[{i}] ({fmt!r}) returned a {type(text).__name__} on the first "
                    f"{split} row; a formatter returns the prompt text (str)"
                )
            for name in getattr(fmt, "fields", ()):  # a template: every row must have its fields
                index = _first_missing(rows, name)
                if index is not None:
                    raise ValueError(
                        f"data.formatters[{i}] ({fmt!r}) uses the field {name!r}, which {split} row "
                        f"{index} lacks (or has as None); fill or drop such rows"
                    )

    def train_dataloader(self) -> DataLoader:
        ds = EpisodeDataset(self.train_rows)
        self._sampler = ResumableSampler(ds, shuffle=self.shuffle, seed=self.seed)
        if self._resume_batches:
            self._sampler.skip(self._resume_batches * self.batch_size)
            self._resume_batches = 0
        return DataLoader(
            ds,
            batch_size=self.batch_size,
            sampler=self._sampler,
            collate_fn=collate_episodes,
            num_workers=self.num_workers,
            generator=self._generator(),
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_rows is None:
            return []
        return DataLoader(
            EpisodeDataset(self.val_rows),
            batch_size=self.val_batch_size,
            shuffle=False,
            collate_fn=collate_episodes,
            num_workers=self.num_workers,
            generator=self._generator(),
        )

    def _generator(self) -> torch.Generator:
        # Without its own generator a DataLoader draws its workers' base seed from torch's global RNG
        # each time an iterator starts (every epoch, every validation run). A resumed run starts its
        # iterator at another point than an uninterrupted one, so that draw would shift the sampling
        # RNG and break exact resume.
        return torch.Generator().manual_seed(self.seed)

    # Exact resume: remember how many batches of the current epoch were trained (a finished epoch:
    # 0, the next one starts). Lightning's batch counter gives it at a batch end, an epoch end and
    # after fit; CoMLRLModule.on_load_checkpoint rewrites the last two's loop state so that Lightning
    # resumes them at the same position (comlrl_lightning/infra/resume.py, Lightning #19617).
    # The local data files' fingerprints go with it: a file edited in place keeps its path.
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"fingerprints": self.fingerprints()}
        trainer = self.trainer
        if trainer is None:
            return state
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        num_batches = trainer.num_training_batches
        done = progress.processed
        return {
            **state,
            "batches_in_epoch": done if done < num_batches else 0,
            "epoch": trainer.current_epoch,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume_batches = int(state_dict.get("batches_in_epoch", 0))
        for line in self.changed_data_lines(state_dict.get("fingerprints") or {}):
            rank_zero_info(line)

    def fingerprints(self) -> dict[str, str]:
        """``{"data.dataset": ..., "data.val_dataset": ...}``: :func:`source_fingerprint` of each local
        data file or folder (computed once; Hub names and in-memory rows have none)."""
        if self._fingerprints is None:
            sources = {"data.dataset": self.dataset, "data.val_dataset": self.val_dataset}
            found = {field: source_fingerprint(source) for field, source in sources.items()}
            self._fingerprints = {field: fp for field, fp in found.items() if fp is not None}
        return self._fingerprints

    def changed_data_lines(self, saved: dict[str, str]) -> list[str]:
        """One line per data file whose content differs from the checkpoint's ``saved`` fingerprints
        (applied: the file's rows now run, and the saved position counts batches of the new rows)."""
        lines = []
        for field, old in sorted(saved.items()):
            new = self.fingerprints().get(field, "<none: not a local file now>")
            if new != old:
                source = getattr(self, field.split(".")[1])
                lines.append(
                    f"resume: {field}: the content of {os.fspath(source)!r} differs from the checkpoint's "
                    f"({old[:19]} -> {new[:19]}) (applied: its rows now run; the resumed data position "
                    f"(batch {self._resume_batches} of the epoch) counts the new rows, so the run no longer "
                    "sees the data an uninterrupted one would)"
                )
        return lines


def _first_missing(rows: Any, name: str) -> int | None:
    """The index of the first row without a (non-None) ``name`` field; None when every row has it."""
    if hasattr(rows, "column_names"):  # a datasets table: one column read, not a row loop
        if name not in rows.column_names:
            return 0
        values: Any = rows[name]
    else:
        values = (row.get(name) if hasattr(row, "get") else None for row in rows)
    return next((j for j, value in enumerate(values) if value is None), None)


def _cap(rows: Any, n: int | None) -> Any:
    if n is None or len(rows) <= n:
        return rows
    return rows.select(range(n)) if hasattr(rows, "select") else rows[:n]
