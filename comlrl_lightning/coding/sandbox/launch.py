"""Starting the launcher and reading what it left (trusted side of :mod:`comlrl_lightning.coding.sandbox.api`).

:func:`launch` writes the job, starts ``runner.py`` in a new session (no ``preexec_fn`` in the
threaded training process), waits with a backstop deadline and returns the launcher's
``result.json`` as a :class:`RawRun`; infrastructure failures raise :class:`SandboxError`, never
a silent zero. The backend is chosen once per process: bubblewrap when a trial run works, else
the fallback launcher path, and the missing layers are logged once (:mod:`.isolation`).
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from comlrl_lightning.coding.sandbox import isolation
from comlrl_lightning.coding.sandbox.config import SandboxConfig

log = logging.getLogger(__name__)
_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
_UID_RANGE = (2_000_000_000, 2_100_000_000)


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the code's fault): e.g. the launcher failed to start."""


@dataclass
class RawRun:
    """What one launch produced: the launcher's ``result.json`` (``res``), output tails, timing."""

    res: dict
    stdout: str
    stderr: str
    killed_by_parent: bool
    duration_s: float
    uid: int | None
    isolation: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    bwrap: bool = False  # the bubblewrap path: every layer is reported by the launcher, none from inside

    def layers(self, extra: list[str]) -> tuple[list[str], list[str]]:
        """(applied, missing) with ``extra`` applied items reported from inside the run (fallback
        path); the missing ones are logged once per process."""
        applied = self.isolation + [str(x) for x in extra]
        missing = sorted(set(self.missing) | set(isolation.missing_layers(applied)))
        isolation.warn_missing_once(missing)
        return applied, missing

    @property
    def end_status(self) -> dict:
        """How the sandboxed process ended: ``kind`` exited/signaled/unknown, ``code``/``signal``."""
        return self.res.get("status") or {"kind": "unknown"}


_backend_lock = threading.Lock()
_backend: dict[str, bool] = {}


def launch(fields: dict, cfg: SandboxConfig, pass_fds: tuple[int, ...] = ()) -> RawRun:
    """Run one job (``fields``: mode-specific keys) under ``cfg``; see the module docstring.
    ``pass_fds``: descriptors the sandboxed process inherits (a split run's call channel,
    :mod:`comlrl_lightning.coding.sandbox.split`).

    Raises:
        SandboxError: the launcher could not start, crashed, or the sandbox failed to set up.
    """
    use_bwrap = cfg.namespaces and cfg.backend != "fallback" and _bwrap_usable(cfg)
    return _launch_once(fields, cfg, use_bwrap, pass_fds)


def _bwrap_usable(cfg: SandboxConfig) -> bool:
    with _backend_lock:
        if "bwrap" not in _backend:
            _backend["bwrap"] = False
            if isolation.bwrap_binary() is not None:
                try:
                    probe = {"mode": "tests", "program": "", "tests": [], "setup": ""}
                    _launch_once(probe, cfg, True)
                    _backend["bwrap"] = True
                except SandboxError as err:
                    log.warning(
                        "sandbox: bubblewrap unusable here (%s); using the fallback launcher", str(err)[:300]
                    )
            if cfg.backend == "bwrap" and not _backend["bwrap"]:
                raise SandboxError("SandboxConfig.backend='bwrap' but bubblewrap cannot run here")
        return _backend["bwrap"]


def _launch_once(fields: dict, cfg: SandboxConfig, use_bwrap: bool, pass_fds: tuple[int, ...] = ()) -> RawRun:
    base = tempfile.mkdtemp(prefix="comlrl_sbx_")
    t0 = time.monotonic()
    try:
        os.chmod(base, 0o711)
        workdir = os.path.join(base, "work")
        os.mkdir(workdir, 0o700)
        uid, unique = _pick_uid(cfg)
        seed = str(cfg.hash_seed if cfg.hash_seed is not None else secrets.randbelow(2**32))
        job = {
            "nonce": secrets.token_hex(16),
            **fields,
            "workdir": workdir,
            "timeout_s": cfg.timeout_s,
            "test_timeout_s": cfg.test_timeout_s,
            "cpu_time_s": int(cfg.cpu_time_s or int(cfg.timeout_s + 0.999) + 1),
            "memory_mb": cfg.memory_mb,
            "file_size_mb": cfg.file_size_mb,
            "disk_mb": cfg.disk_mb,
            "max_processes": cfg.max_processes,
            "namespaces": cfg.namespaces,
            "uid": uid,
            "gid": uid,
            "unique_uid": unique,
            "max_message_chars": cfg.max_message_chars,
            "cgroup_name": f"comlrl-sbx-{secrets.token_hex(8)}",
        }
        if use_bwrap:
            spec = isolation.bwrap_spec(cfg.disk_mb)
            spec["argv"] = [a.replace("{hash_seed}", seed) for a in spec["argv"]]
            if spec.get("seccomp"):  # the filter's bytes, into this run's folder (removed with it)
                path = os.path.join(base, "seccomp.bpf")
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as f:
                    f.write(spec["seccomp"])
                spec["seccomp"] = path
            job["bwrap"] = spec
        job_path = os.path.join(base, "job.json")
        with open(os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(job, f)
        cgroups = [
            os.path.join(d, job["cgroup_name"])
            for _, d in job.get("bwrap", {}).get("cgroup", {}).get("dirs", [])
        ]
        killed_by_parent, launcher_rc = _launch(
            job_path, base, workdir, cfg, uid if unique else None, cgroups, pass_fds
        )
        lim = cfg.max_output_chars
        stdout, stderr = _tail(os.path.join(base, "stdout"), lim), _tail(os.path.join(base, "stderr"), lim)
        try:
            with open(os.path.join(base, "result.json")) as f:
                res = json.load(f)
        except (OSError, ValueError):
            res = None
        if res is not None and res.get("infra_error"):
            raise SandboxError(f"sandbox launcher failed: {res['infra_error']}")
        if (
            res is None and launcher_rc >= 0 and not killed_by_parent
        ):  # it always writes a result unless killed
            raise SandboxError(
                f"sandbox launcher exited with code {launcher_rc} without a result: {stderr[-1500:]}"
            )
        res = res or {
            "records": [],
            "isolation": [],
            "missing": [],
            "timed_out": killed_by_parent,  # launcher killed
            "status": None,
            "init_ready": True,
            "worker_ready": True,
            "overflow": False,
            "launcher_died": not killed_by_parent,
        }
        setup_failed = not res["init_ready"] or (not res["worker_ready"] and res["status"] is not None)
        if setup_failed and not res["timed_out"]:
            # setup failed before any untrusted code ran (the ready pipe is closed before it does)
            raise SandboxError(f"sandbox setup failed ({res.get('isolation')}); stderr: {stderr[-1500:]}")
        applied = list(res.get("isolation", []))
        return RawRun(
            res,
            stdout,
            stderr,
            killed_by_parent,
            time.monotonic() - t0,
            uid,
            applied,
            list(res.get("missing", [])),
            use_bwrap,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _pick_uid(cfg: SandboxConfig) -> tuple[int | None, bool]:
    """(uid to run as, whether it is unused by anyone else); ``(None, False)`` without root."""
    if not cfg.drop_privileges or os.geteuid() != 0:
        return None, False
    if cfg.uid is not None:
        return cfg.uid, False
    for _ in range(20):
        uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0]
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            return uid, True
    return 65534, False


def _launch(
    job_path: str,
    base: str,
    workdir: str,
    cfg: SandboxConfig,
    unique_uid: int | None,
    cgroups: list[str],
    pass_fds: tuple[int, ...] = (),
) -> tuple[bool, int]:
    """Start the launcher and wait for it: (whether the parent had to kill it, its return code)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"}
    if cfg.hash_seed is not None:
        env["PYTHONHASHSEED"] = str(cfg.hash_seed)
    flags = ["-s", "-S"] + (["-P"] if sys.version_info >= (3, 11) else [])
    with open(os.path.join(base, "stdout"), "wb") as out, open(os.path.join(base, "stderr"), "wb") as err:
        try:
            proc = subprocess.Popen(
                [sys.executable, *flags, _RUNNER, job_path],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=workdir,
                start_new_session=True,
                close_fds=True,
                pass_fds=pass_fds,
            )
        except OSError as exc:
            raise SandboxError(f"could not start the sandbox launcher: {exc}") from exc
        try:
            return False, proc.wait(timeout=cfg.timeout_s + cfg.startup_grace_s)
        except subprocess.TimeoutExpired:
            _kill_stuck(proc, base, unique_uid, cgroups)
            return True, proc.returncode


def _kill_stuck(proc: subprocess.Popen, base: str, unique_uid: int | None, cgroups: list[str]) -> None:
    """Fallback when the launcher overran: kill its namespace init, its process group, the uid and
    the run's cgroups (then removed)."""
    try:
        with open(os.path.join(base, "init.pid")) as f:
            os.kill(int(f.read()), signal.SIGKILL)  # still the launcher's unreaped child
    except (OSError, ValueError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
    if (
        unique_uid is not None or cgroups
    ):  # in a fresh process: forking the (threaded) training process is unsafe
        quiet = subprocess.DEVNULL
        cmd = [
            sys.executable,
            "-s",
            "-S",
            _RUNNER,
            "--cleanup",
            json.dumps({"uid": unique_uid, "cgroups": cgroups}),
        ]
        try:
            subprocess.run(cmd, env={}, timeout=30, stdin=quiet, stdout=quiet, stderr=quiet, check=False)
        except subprocess.TimeoutExpired:  # the run is already judged (it overran): retry off this thread
            log.warning(
                "sandbox cleanup overran 30 s (uid %s, cgroups %s); retrying in the background for up to "
                "%d s: until then processes of that uid may still run",
                unique_uid,
                cgroups,
                CLEANUP_RETRY_S,
            )
            threading.Thread(target=_retry_cleanup, args=(cmd, unique_uid, cgroups), daemon=True).start()


CLEANUP_RETRY_S = 300
"""Seconds the background retry of an overrun cleanup may take (a machine at load 30 took over 30 s)."""
CLEANUP_FAILURES: list[tuple[int | None, list[str]]] = []
"""(uid, cgroups) of cleanups that failed twice: what may be left running (also logged as an error)."""


def _retry_cleanup(cmd: list[str], unique_uid: int | None, cgroups: list[str]) -> None:
    quiet = subprocess.DEVNULL
    try:
        done = subprocess.run(cmd, env={}, timeout=CLEANUP_RETRY_S, stdin=quiet, stdout=quiet, stderr=quiet)
        if done.returncode == 0:
            log.warning("sandbox cleanup of uid %s done on retry", unique_uid)
            return
    except subprocess.TimeoutExpired:
        pass
    CLEANUP_FAILURES.append((unique_uid, list(cgroups)))
    log.error(
        "sandbox cleanup of uid %s (cgroups %s) failed twice: check for its processes", unique_uid, cgroups
    )


def _tail(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4 * limit))
            return f.read().decode("utf-8", "replace")[-limit:]
    except OSError:
        return ""


def signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
