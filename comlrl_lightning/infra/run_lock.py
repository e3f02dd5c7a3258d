"""One run per folder: a lock on every folder a fit writes (checkpoints, MADPOIter's replay and history
folders), so a second run pointed at it fails at once, naming the run that holds it.

Two runs writing one folder do not fail by themselves: Lightning writes ``last-v1.ckpt`` beside the
other run's ``last.ckpt`` with nothing saying whose is which, and MADPOIter's replay shards are
overwritten (its resume is then refused). :func:`hold_run_folder` takes an exclusive lock on
``<parent>/.<name>.comlrl-lightning.lock`` beside the folder ``<parent>/<name>`` (outside it, so
the folder lists only what the run wrote; the ``filelock`` package: ``flock`` on Unix, which the OS
drops when the process dies) and writes who holds it next to that (``... .lock.json``: pid, host,
command, start time). A lock left by a process that died (its record still there, the lock free) is
taken over with a line naming that process. The locks are held until :func:`release_run_folders`
(the module's ``teardown`` after ``fit``) or the process ends.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from typing import Any

from filelock import FileLock, Timeout

_log = logging.getLogger("lightning.pytorch.run_lock")
"""Printed as Lightning's own lines are (its ``lightning.pytorch`` handler); only rank zero locks. No
Lightning import: the module loads alone (a test's stand-in for another run)."""

LOCK_SUFFIX = ".comlrl-lightning.lock"
"""The lock file of folder ``<parent>/<name>`` is ``<parent>/.<name>`` + this; its holder is recorded
in the same name + ``.json``."""
_HELD: dict[str, FileLock] = {}
"""The folders (real paths) this process holds: taking one again is a no-op (a resumed fit in the
same process), and two ``flock`` handles of one process on one file would block each other."""


class RunFolderBusy(RuntimeError):
    """Another running process holds the folder (:func:`hold_run_folder`)."""


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def describe(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host h (started 2026-01-01 00:00:00 UTC): comlrl-lightning fit ...``."""
    if not holder:
        return "a process that left no record"
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')} (started {holder.get('started')}): "
        f"{holder.get('command')}"
    )


def lock_path(folder: str) -> str:
    """The lock file of ``folder`` (its real path): ``<parent>/.<name>.comlrl-lightning.lock``."""
    parent, name = os.path.split(os.path.realpath(folder).rstrip(os.sep))
    return os.path.join(parent, f".{name}{LOCK_SUFFIX}")


def hold_run_folder(folder: str, what: str) -> None:
    """Lock ``folder`` (its parent created if missing) for this process; ``what`` names the setting that chose it
    in messages (``"checkpoint folder"``, ``"replay.preference_replay_dir"``).

    Raises:
        RunFolderBusy: another process holds it; the message names that process's pid, host,
            command and start time.
    """
    path = os.path.realpath(folder)
    if path in _HELD:
        return
    os.makedirs(os.path.dirname(lock_path(path)), exist_ok=True)
    record = lock_path(path) + ".json"
    lock = FileLock(lock_path(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunFolderBusy(
            f"{what}: {path} is in use by another run, {describe(_read(record))}; two runs writing one "
            "folder overwrite each other's files: wait for it to end, stop it, or give this run another "
            "folder"
        ) from None
    previous = _read(record)
    if previous is not None:  # the lock was free but its record stayed: its holder died
        _log.info(f"run lock: {path}: recovered the stale lock of {describe(previous)}, no longer running")
    tmp = record + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_holder(), f)
    os.replace(tmp, record)
    _HELD[path] = lock


def release_run_folders() -> None:
    """Release every folder this process holds (their records removed first)."""
    for path, lock in list(_HELD.items()):
        try:
            os.remove(lock_path(path) + ".json")
        except OSError:
            pass
        lock.release(force=True)
        del _HELD[path]


def hold_checkpoint_folders(trainer: Any) -> None:
    """Lock (rank zero) the folder of every callback of ``trainer`` that writes checkpoints into its
    ``dirpath`` (``ModelCheckpoint``, ``InterruptCheckpoint``, ``AgentCheckpoint``); call after the
    callbacks' ``setup`` resolved their folders."""
    if not getattr(trainer, "is_global_zero", True):
        return
    for callback in getattr(trainer, "callbacks", None) or []:
        folder = getattr(callback, "dirpath", None)
        if isinstance(folder, (str, os.PathLike)) and folder:
            hold_run_folder(str(folder), f"{type(callback).__name__}.dirpath")
