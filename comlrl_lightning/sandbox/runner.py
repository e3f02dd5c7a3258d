"""The process side of :mod:`comlrl_lightning.sandbox.api`: launcher, namespace init and worker.

Started by :func:`comlrl_lightning.sandbox.run_tests` as ``python -s -S [-P] runner.py JOB``
(isolated mode, see there). It imports the standard library only. Three processes are involved:

1. **launcher** (this script; the training process's child, in its own session). It creates a new
   PID namespace (root only), forks the *init*, enforces the wall-clock deadline (SIGKILL to the
   init, which makes the kernel kill every process of the namespace), collects the harness's
   records from a pipe and writes ``result.json`` for the parent. It never runs untrusted code.
2. **init** (PID 1 of the new namespace, still root): new mount and network namespaces, private
   tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the working directory, a fresh ``/proc``;
   forks the worker, reaps orphans and reports the worker's exit status to the launcher.
3. **worker**: resource limits, drops to an unused uid (root only), then runs
   :func:`comlrl_lightning.sandbox.harness.run` (program, setup, each test).

Every step degrades gracefully where the OS refuses it; what was applied is reported as
``isolation``. Without a PID namespace the init and the launcher are child subreapers and kill
what is left (by uid when it is unique, else their adopted children).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback

_spec = importlib.util.spec_from_file_location(
    "sandbox_harness", os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
)
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x40000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
MAX_RECORD_BYTES = 1 << 20
_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _unshare(flags: int) -> bool:
    try:
        return _libc().unshare(ctypes.c_int(flags)) == 0
    except (OSError, AttributeError):
        return False


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> bool:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    try:
        return _libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) == 0
    except (OSError, AttributeError):
        return False


def _prctl(option: int, arg: int) -> bool:
    try:
        return _libc().prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def live_pids(uid: int | None = None, ppid: int | None = None) -> list[int]:
    """Live (non-zombie) PIDs whose real uid is ``uid`` or whose parent is ``ppid``, from ``/proc``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if fields[b"State"].split()[0] in (b"Z", b"X"):
                continue
            if int(fields[b"Uid"].split()[0]) == uid or int(fields[b"PPid"]) == ppid:
                pids.append(int(name))
        except (OSError, ValueError, KeyError, IndexError):
            pass
    return pids


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (root only; only for a uid used by nothing else).

    A forked helper switches to ``uid`` and calls ``kill(-1, SIGKILL)``: the kernel signals every
    process of that uid in one pass, so a fork bomb cannot outrun it (unlike scanning ``/proc``).
    Forks, so call it from a single-threaded process (the launcher, or ``--kill-uid``).
    """
    if uid <= 0:
        raise ValueError(f"kill_uid: refusing uid {uid}")
    helper = os.fork()
    if helper == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() != (uid, uid, uid):  # never kill(-1) with any other identity
                os._exit(1)
            for _ in range(3):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(helper, 0)


def remove_files_of(uid: int, dirs: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")) -> None:
    """Delete what ``uid`` created directly in the world-writable ``dirs`` (used when there was no
    private mount namespace; only for a uid used by nothing else)."""
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


def kill_children(rounds: int = 500) -> None:
    """SIGKILL our children (as a subreaper: every orphan below us) and reap them until none is left."""
    me = os.getpid()
    for _ in range(rounds):
        for pid in live_pids(ppid=me):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.002)


def _emit(fd: int, nonce: str, **rec) -> None:
    rec["n"] = nonce
    os.write(fd, (json.dumps(rec) + "\n").encode())


# ----------------------------------------------------------------------------------------- launcher
def main(job_path: str) -> int:
    """Launcher entry point: run the job in ``job_path`` and write ``result.json`` next to it."""
    ctl = os.path.dirname(job_path)
    out = {"records": [], "isolation": [], "timed_out": False, "overflow": False, "status": None}
    t0 = time.monotonic()
    try:
        with open(job_path) as f:
            job = json.load(f)
        os.unlink(job_path)  # holds the nonce: gone before any untrusted code runs
        deadline = t0 + job["timeout_s"]
        if job["namespaces"]:
            if os.geteuid() == 0:
                pidns = _unshare(CLONE_NEWPID)
            else:  # unprivileged: a user namespace owning the new PID namespace, if the OS allows it
                pidns = _enter_userns()
        else:
            pidns = False
        out["isolation"].append("pid-namespace" if pidns else "no-pid-namespace")
        if not pidns:  # orphans whose init died come back to us, to be killed and reaped
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        rfd, wfd = os.pipe()
        sfd_r, sfd_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # init
            try:
                os.close(rfd)
                os.close(sfd_r)
                _init(job, wfd, sfd_w, pidns)
            except BaseException:  # noqa: BLE001 - shown in the parent's stderr tail
                traceback.print_exc()
            finally:
                os._exit(70)
        os.close(wfd)
        os.close(sfd_w)
        with open(os.path.join(ctl, "init.pid"), "w") as f:
            f.write(str(pid))
        data, out["timed_out"], out["overflow"] = _collect(rfd, pid, deadline)
        if out["timed_out"]:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if not pidns:  # no namespace to tear down: kill the group and, if unique, the sandbox uid
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            if job.get("unique_uid") and os.geteuid() == 0:
                kill_uid(job["uid"])
            kill_children()
        status = os.read(sfd_r, 4096)  # b"I"/b"i" (init set up, with/without mounts), b"K", JSON
        out["init_ready"] = status[:1] in (b"I", b"i")
        if status[:1] == b"i" and job.get("unique_uid") and os.geteuid() == 0:
            remove_files_of(job["uid"])  # no private /tmp: delete what the sandbox uid left there
        status = status[1:] if out["init_ready"] else status
        out["worker_ready"] = status[:1] == b"K"
        status = status[1:] if out["worker_ready"] else status
        out["status"] = json.loads(status) if status else None
        out["records"] = data.decode("utf-8", "replace").splitlines()
    except Exception:  # noqa: BLE001 - reported to the parent as an infrastructure failure
        out["infra_error"] = traceback.format_exc()[-2000:]
    out["duration_s"] = time.monotonic() - t0
    tmp = os.path.join(ctl, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, os.path.join(ctl, "result.json"))
    return 0


def _enter_userns() -> bool:
    uid, gid = os.getuid(), os.getgid()
    if not _unshare(CLONE_NEWUSER | CLONE_NEWPID):
        return False
    try:
        maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
        for path, text in maps:
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
    except OSError:
        pass
    return True


def _collect(rfd: int, pid: int, deadline: float) -> tuple[bytes, bool, bool]:
    """Read records until the init exits or the deadline passes. Returns (data, timed_out, overflow)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    buf, overflow, timed_out, open_ = bytearray(), False, False, True
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        fds = ([rfd] if open_ else []) + ([pidfd] if pidfd is not None else [])
        wait = remaining if pidfd is not None else min(remaining, 0.01)
        ready = select.select(fds, [], [], wait)[0] if fds else (time.sleep(wait) or [])
        if open_ and rfd in ready:
            chunk = os.read(rfd, 65536)
            if not chunk:
                open_ = False
            elif len(buf) + len(chunk) <= MAX_RECORD_BYTES:
                buf += chunk
            else:
                overflow = True
        if pidfd is not None and pidfd in ready:
            break
        if pidfd is None and not open_ and _exited(pid):
            break
    if open_:  # drain what is already there without blocking on stray writers
        os.set_blocking(rfd, False)
        try:
            while len(buf) <= MAX_RECORD_BYTES and (chunk := os.read(rfd, 65536)):
                buf += chunk
        except BlockingIOError:
            pass
    if pidfd is not None:
        os.close(pidfd)
    return bytes(buf[:MAX_RECORD_BYTES]), timed_out, overflow


def _exited(pid: int) -> bool:
    try:  # peek without reaping: waitid with WNOWAIT
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


# --------------------------------------------------------------------------------------------- init
def _init(job: dict, wfd: int, sfd: int, pidns: bool) -> None:
    nonce, iso = job["nonce"], []
    os.setpgid(0, 0)  # own process group: kill(0, ...) from the sandbox cannot reach the launcher
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # without a PID namespace, orphans come back to us
    uid, gid = job.get("uid"), job.get("gid")
    mnt = net = False
    if job["namespaces"]:
        if _unshare(CLONE_NEWNS | CLONE_NEWNET):
            mnt = net = True
        else:
            net, mnt = _unshare(CLONE_NEWNET), _unshare(CLONE_NEWNS)
    iso.append("network-namespace" if net else "no-network-namespace")
    workdir = job["workdir"]
    private = mnt and _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    if private:
        size = f"size={job['disk_mb']}m"
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(d) and _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777"):
                iso.append(f"private-tmpfs:{d}")
        os.makedirs(workdir, exist_ok=True)
        owner = f",uid={uid},gid={gid}" if uid is not None else ""
        if _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700{owner}"):
            iso.append("workdir-tmpfs")
        if pidns and _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None):
            iso.append("private-proc")
        stdlib = os.path.dirname(os.__file__)
        if uid is not None and not _world_readable(stdlib):  # e.g. Python installed under /root
            alias = "/tmp/.sandbox-stdlib"
            os.makedirs(alias, exist_ok=True)
            if _mount(stdlib, alias, None, MS_BIND | MS_REC, None):
                job["stdlib_alias"] = (stdlib, alias)
                iso.append(f"stdlib-alias:{alias}")
    else:
        iso.append("no-mount-namespace")
    _emit(wfd, nonce, k="iso", items=iso)
    os.write(sfd, b"I" if private else b"i")
    worker = os.fork()
    if worker == 0:
        try:
            _worker(job, wfd, sfd)
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        finally:
            os._exit(71)
    os.close(wfd)
    while True:  # reap orphans (we are PID 1 of the namespace) until the worker is gone
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            st = None
            break
        except InterruptedError:
            continue
        if pid == worker:
            break
    if not pidns:  # no namespace teardown: kill what the worker left (our adopted orphans, its uid)
        if job.get("unique_uid") and os.geteuid() == 0:
            kill_uid(uid)
        kill_children()
    rec = {"kind": "unknown"}
    if st is not None and os.WIFSIGNALED(st):
        rec = {"kind": "signaled", "signal": os.WTERMSIG(st)}
    elif st is not None:
        rec = {"kind": "exited", "code": os.WEXITSTATUS(st)}
    os.write(sfd, json.dumps(rec).encode())
    os._exit(0)


# ------------------------------------------------------------------------------------------- worker
def _worker(job: dict, wfd: int, sfd: int) -> None:
    nonce, iso, workdir = job["nonce"], [], job["workdir"]
    import socket  # noqa: F401 - imported before the limits, patched below

    uid, gid = job.get("uid"), job.get("gid")
    if uid is not None and os.geteuid() == 0:
        try:
            os.chown(workdir, uid, gid)
        except OSError:
            pass
    os.chdir(workdir)
    mb = 1024 * 1024
    nproc = job["max_processes"]
    if uid is None:  # RLIMIT_NPROC counts all processes of our (shared) uid
        nproc += len(live_pids(os.getuid()))
    limits = {
        "RLIMIT_AS": job["memory_mb"] * mb,
        "RLIMIT_CPU": (job["cpu_time_s"], job["cpu_time_s"] + 1),
        "RLIMIT_FSIZE": job["file_size_mb"] * mb,
        "RLIMIT_NPROC": nproc,
        "RLIMIT_CORE": 0,
        "RLIMIT_NOFILE": 256,
    }
    for name, value in limits.items():
        soft, hard = value if isinstance(value, tuple) else (value, value)
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
            iso.append(f"{name}={soft}")
        except (ValueError, OSError, AttributeError):
            iso.append(f"no-{name}")
    stdlib, alias = job.get("stdlib_alias") or (os.path.dirname(os.__file__), None)
    if alias:  # the dropped uid cannot traverse the real path: import from the bind mount
        def move(paths: list[str]) -> list[str]:
            return [alias + p[len(stdlib):] if p.startswith(stdlib) else p for p in paths]

        sys.path[:] = move(sys.path)
        for mod in list(sys.modules.values()):  # packages already imported (encodings...)
            if isinstance(getattr(mod, "__path__", None), list):
                mod.__path__[:] = move(mod.__path__)
        sys.path_importer_cache.clear()
    elif uid is not None and not _world_readable(stdlib):
        for name in PRELOAD:  # no mount namespace: import the usual modules while still root
            try:
                __import__(name)
            except ImportError:
                pass
        iso.append("stdlib-preloaded")
    if uid is not None:  # the chosen uid, else nobody; never go on as root
        for u, g in ((uid, gid), (65534, 65534)):
            try:
                os.setgroups([])
                os.setresgid(g, g, g)
                os.setresuid(u, u, u)
                iso.append(f"uid={u}")
                break
            except OSError as err:
                print(f"sandbox: cannot switch to uid {u}: {err}", file=sys.stderr)
        if os.getresuid() != (u, u, u):
            raise RuntimeError("sandbox: could not drop privileges; refusing to run untrusted code as root")
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the uid change
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes raise OSError instead of killing
    _emit(wfd, nonce, k="iso", items=iso)
    os.write(sfd, b"K")  # setup done; the status pipe is closed before any untrusted code runs
    os.close(sfd)
    harness.run(job, wfd)


PRELOAD = (
    "math", "cmath", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "random",
    "typing", "hashlib", "statistics", "fractions", "decimal", "operator", "copy", "datetime", "array",
    "struct", "textwrap", "unicodedata", "encodings.idna",
)  # fmt: skip


def _world_readable(path: str) -> bool:
    """Whether any uid can traverse to ``path`` and list it (``o+x`` on every ancestor, ``o+rx``)."""
    path = os.path.abspath(path)
    try:
        if os.stat(path).st_mode & 0o005 != 0o005:
            return False
        while path != "/":
            path = os.path.dirname(path)
            if not os.stat(path).st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


if __name__ == "__main__":
    if sys.argv[1] == "--kill-uid":
        kill_uid(int(sys.argv[2]))
        sys.exit(0)
    sys.exit(main(sys.argv[1]))
