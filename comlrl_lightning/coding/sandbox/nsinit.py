"""The fallback launcher path of :mod:`comlrl_lightning.coding.sandbox.runner`, used when bubblewrap is
unavailable: namespace init and worker set up with ``unshare``/``mount`` directly (standard
library only, loaded by path).

1. **init** (PID 1 of a new PID namespace when root or a user namespace allows it): new mount
   and network namespaces, private tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the working
   directory, a fresh ``/proc``; forks the worker, reaps orphans, reports the worker's exit status.
2. **worker**: resource limits, drops to an unused uid (root only), then runs the harness.

Without a PID namespace the init and the launcher are child subreapers and kill what is left (by
uid when it is unique, else their adopted children).
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import sys
import traceback


def _load(name: str):
    spec = importlib.util.spec_from_file_location(
        f"sandbox_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


osl = _load("oslayer")
harness = _load("harness")
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = (
    osl.CLONE_NEWNS,
    osl.CLONE_NEWPID,
    osl.CLONE_NEWNET,
    osl.CLONE_NEWUSER,
)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = (
    osl.MS_NOSUID,
    osl.MS_NODEV,
    osl.MS_NOEXEC,
    osl.MS_BIND,
    osl.MS_REC,
    osl.MS_PRIVATE,
)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38


def _emit(fd: int, nonce: str, **rec) -> None:
    rec["n"] = nonce
    os.write(fd, (json.dumps(rec) + "\n").encode())


def run(job: dict, ctl: str, out: dict, t0: float) -> None:
    """The fallback launcher path (no bubblewrap): own PID/mount/network namespaces via
    ``unshare``, a dropped uid, rlimits; fills ``out`` for ``result.json``."""
    deadline = t0 + job["timeout_s"]
    if job["namespaces"]:
        if os.geteuid() == 0:
            pidns = osl.unshare(CLONE_NEWPID)
        else:  # unprivileged: a user namespace owning the new PID namespace, if the OS allows it
            pidns = _enter_userns()
    else:
        pidns = False
    out["isolation"].append("pid-namespace" if pidns else "no-pid-namespace")
    if not pidns:  # orphans whose init died come back to us, to be killed and reaped
        osl.prctl(PR_SET_CHILD_SUBREAPER, 1)
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
    data, out["timed_out"], out["overflow"] = osl.collect(rfd, pid, deadline)
    if out["timed_out"]:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    if not pidns:  # no namespace to tear down: kill the group and, if unique, the sandbox uid
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if job.get("unique_uid") and os.geteuid() == 0:
            osl.kill_uid(job["uid"])
        osl.kill_children()
    status = os.read(sfd_r, 4096)  # b"I"/b"i" (init set up, with/without mounts), b"K", JSON
    out["init_ready"] = status[:1] in (b"I", b"i")
    if status[:1] == b"i" and job.get("unique_uid") and os.geteuid() == 0:
        osl.remove_files_of(job["uid"])  # no private /tmp: delete what the sandbox uid left there
    status = status[1:] if out["init_ready"] else status
    out["worker_ready"] = status[:1] == b"K"
    status = status[1:] if out["worker_ready"] else status
    out["status"] = json.loads(status) if status else None
    out["records"] = data.decode("utf-8", "replace").splitlines()


def _enter_userns() -> bool:
    uid, gid = os.getuid(), os.getgid()
    if not osl.unshare(CLONE_NEWUSER | CLONE_NEWPID):
        return False
    try:
        maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
        for path, text in maps:
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
    except OSError:
        pass
    return True


# --------------------------------------------------------------------------------------------- init
def _init(job: dict, wfd: int, sfd: int, pidns: bool) -> None:
    nonce, iso = job["nonce"], []
    os.setpgid(0, 0)  # own process group: kill(0, ...) from the sandbox cannot reach the launcher
    osl.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    osl.prctl(PR_SET_CHILD_SUBREAPER, 1)  # without a PID namespace, orphans come back to us
    uid, gid = job.get("uid"), job.get("gid")
    mnt = net = False
    if job["namespaces"]:
        if osl.unshare(CLONE_NEWNS | CLONE_NEWNET):
            mnt = net = True
        else:
            net, mnt = osl.unshare(CLONE_NEWNET), osl.unshare(CLONE_NEWNS)
    iso.append("network-namespace" if net else "no-network-namespace")
    workdir = job["workdir"]
    private = mnt and osl.mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    if private:
        size = f"size={job['disk_mb']}m"
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(d) and osl.mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777"):
                iso.append(f"private-tmpfs:{d}")
        os.makedirs(workdir, exist_ok=True)
        owner = f",uid={uid},gid={gid}" if uid is not None else ""
        if osl.mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700{owner}"):
            iso.append("workdir-tmpfs")
        if pidns and osl.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None):
            iso.append("private-proc")
        stdlib = os.path.dirname(os.__file__)
        if uid is not None and not _world_readable(stdlib):  # e.g. Python installed under /root
            alias = "/tmp/.sandbox-stdlib"
            os.makedirs(alias, exist_ok=True)
            if osl.mount(stdlib, alias, None, MS_BIND | MS_REC, None):
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
            osl.kill_uid(uid)
        osl.kill_children()
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
        nproc += len(osl.live_pids(os.getuid()))
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
            return [alias + p[len(stdlib) :] if p.startswith(stdlib) else p for p in paths]

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
    osl.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the uid change
    osl.prctl(PR_SET_NO_NEW_PRIVS, 1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes raise OSError instead of killing
    _emit(wfd, nonce, k="iso", items=iso)
    os.write(sfd, b"K")  # setup done; the status pipe is closed before any untrusted code runs
    os.close(sfd)
    harness.dispatch(job, wfd)


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
