"""`AtomicCheckpointIO`: Lightning checkpoints written to ``<path>.tmp``, fsynced, then renamed.

Why not Lightning's default: ``TorchCheckpointIO`` serialises the whole checkpoint into an
in-memory buffer (a second full copy of N LLMs and their optimizer states in host RAM), then
writes it through an fsspec transaction that stages the file in the *system* temp directory and
moves it into place with ``shutil.move``. When that directory is on another filesystem (a tmpfs ``/tmp``,
a different disk) the move is a copy, so a crash part-way leaves a truncated checkpoint under the
final name; nothing is fsynced either. This plugin streams ``torch.save`` straight into a
temporary file beside the target, fsyncs it, renames it over the target with ``os.replace``
(atomic on POSIX and Windows) and fsyncs the folder: readers see the old checkpoint or the new one,
never a partial file.

Use it from YAML::

    trainer:
      plugins:
        - class_path: comlrl_lightning.infra.checkpoint_io.AtomicCheckpointIO

or ``Trainer(plugins=[AtomicCheckpointIO()])``. Remote paths (``s3://``, ...) fall back to
Lightning's own writer.
"""

from __future__ import annotations

import errno
import os
import shutil
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from comlrl_lightning.infra.run_lock import hold_run_folder


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are temp-file + fsync + ``os.replace``.

    Loading and removing are Lightning's.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically.

        Args:
            checkpoint: the dict Lightning's ``dump_checkpoint`` builds.
            path: target file; its folder is created.
            storage_options: unsupported (as in ``TorchCheckpointIO``).

        Raises:
            TypeError: ``storage_options`` was given.
            OSError: naming ``path`` (a full disk, a read-only folder), after removing ``<path>.tmp``;
                an earlier file at ``path`` is untouched. A full disk (``ENOSPC``, or torch's
                "unexpected pos" write failure) says how many bytes the checkpoint needs and how
                many are left. Other errors of ``torch.save`` as they are.
        """
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint does not take storage_options")
        fs, local = fsspec.core.url_to_fs(str(path))
        if not isinstance(fs, LocalFileSystem):
            return super().save_checkpoint(checkpoint, path)
        try:
            atomic_torch_save(checkpoint, local)
        except (OSError, RuntimeError) as err:  # torch's own ("unexpected pos ...") names no path
            full = getattr(err, "errno", None) == errno.ENOSPC or any(
                m in str(err) for m in _TORCH_WRITE_FAILED
            )
            if not full and not isinstance(err, OSError):
                raise
            target = os.path.abspath(local)
            if full:
                folder = os.path.dirname(target)
                free = shutil.disk_usage(folder).free
                raise OSError(
                    errno.ENOSPC,
                    f"could not write the checkpoint {target!r}: no space left on the device "
                    f"(it needs about {_size(tensor_bytes(checkpoint))}, {_size(free)} left in {folder!r})",
                ) from err
            raise OSError(
                err.errno, f"could not write the checkpoint {target!r}: {err.strerror or err}"
            ) from err
        return None


_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")
"""What torch's zip writer says when a write fails part-way (a full disk), instead of an OSError."""


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested checkpoint (dicts, lists, tuples): what ``torch.save`` writes, less
    the small metadata."""
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _size(num_bytes: int) -> str:
    return (
        f"{num_bytes} bytes" if num_bytes < 1024**2 else f"{num_bytes / 1024**2:,.1f} MiB ({num_bytes} bytes)"
    )


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save(obj, path)`` through ``<path>.tmp`` + fsync + ``os.replace`` + folder fsync.

    Raises:
        OSError / errors of ``torch.save``: after removing the temporary file.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(folder)


def prepare_checkpoint_dir(path: str | os.PathLike[str], what: str = "checkpoint folder") -> list[str]:
    """Lock folder ``path`` for this run, make sure checkpoints can be written there and remove stale
    temporary files.

    Takes the folder's run lock first (:func:`~comlrl_lightning.infra.run_lock.hold_run_folder`,
    held until the fit's teardown): a ``*.ckpt.tmp`` in a folder another running process holds is that
    run's checkpoint being written, and removing it made the run's rename fail. Then creates the folder,
    writes and removes a probe file, and deletes ``*.ckpt.tmp`` files that a killed
    :func:`atomic_torch_save` left behind (the complete checkpoints beside them are untouched).
    Called at setup, so a read-only or missing mount fails before any model loads or trains.

    Args:
        path: the checkpoint folder.
        what: the setting that chose it, for messages.

    Returns:
        The paths of the removed temporary files.

    Raises:
        RunFolderBusy: another running process holds the folder; nothing in it was touched.
        OSError: the folder cannot be created or written, naming it.
    """
    path = os.path.abspath(os.fspath(path))
    try:
        hold_run_folder(path, what)  # before anything here is written or removed
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-probe-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as err:
        raise OSError(
            err.errno, f"checkpoint folder {path!r} is not writable: {err.strerror or err}"
        ) from err
    removed = []
    for name in sorted(os.listdir(path)):
        if name.endswith(".ckpt.tmp") and os.path.isfile(os.path.join(path, name)):
            os.remove(os.path.join(path, name))
            removed.append(os.path.join(path, name))
    return removed


def fsync_dir(path: str) -> None:
    """Flush a folder's entries (a rename in it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no directory fds (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
