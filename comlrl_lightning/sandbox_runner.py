"""The process side of :mod:`comlrl_lightning.sandbox`: launcher, namespace init and test harness.

Started by :func:`comlrl_lightning.sandbox.run_tests` as ``python -s -S [-P] sandbox_runner.py JOB``
(isolated mode, see there). It imports the standard library only. Three processes are involved:

1. **launcher** (this script; the training process's child, in its own session). It creates a new
   PID namespace (root only), forks the *init*, enforces the wall-clock deadline (SIGKILL to the
   init, which makes the kernel kill every process of the namespace), collects the harness's
   records from a pipe and writes ``result.json`` for the parent. It never runs untrusted code.
2. **init** (PID 1 of the new namespace, still root): new mount and network namespaces, private
   tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the working directory, a fresh ``/proc``;
   forks the worker, reaps orphans and reports the worker's exit status to the launcher.
3. **worker**: resource limits, drops to an unused uid (root only), blocks ``socket``, then runs
   the program, the setup and each test, writing one JSON record per step to the pipe.

Every step degrades gracefully where the OS refuses it; what was applied is reported as
``isolation``.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
import traceback
import types

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


def uid_pids(uid: int | None = None, ppid: int | None = None) -> list[int]:
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


def kill_uid(uid: int | None, ppid: int | None = None, reap: bool = True, rounds: int = 100) -> None:
    """SIGKILL every process of ``uid`` (only for a uid used by nothing else) and every child of
    ``ppid``, until none is left; ``reap``: also reap our own exited children."""
    for _ in range(rounds):
        pids = uid_pids(uid, ppid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while reap and os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if not pids:
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
        deadline = t0 + job["timeout_s"]
        if job["namespaces"]:
            if os.geteuid() == 0:
                pidns = _unshare(CLONE_NEWPID)
            else:  # unprivileged: a user namespace owning the new PID namespace, if the OS allows it
                pidns = _enter_userns()
        else:
            pidns = False
        out["isolation"].append("pid-namespace" if pidns else "no-pid-namespace")
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
            if job.get("unique_uid") and job.get("uid") is not None:
                kill_uid(job["uid"])
            else:
                kill_uid(None, ppid=os.getpid())
        status = os.read(sfd_r, 4096)
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
        for path, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
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
    if mnt and _mount("none", "/", None, MS_REC | MS_PRIVATE, None):
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
    worker = os.fork()
    if worker == 0:
        try:
            os.close(sfd)
            _worker(job, wfd)
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
        kill_uid(uid if job.get("unique_uid") else None, ppid=os.getpid())
    rec = {"kind": "unknown"}
    if st is not None and os.WIFSIGNALED(st):
        rec = {"kind": "signaled", "signal": os.WTERMSIG(st)}
    elif st is not None:
        rec = {"kind": "exited", "code": os.WEXITSTATUS(st)}
    os.write(sfd, json.dumps(rec).encode())
    os._exit(0)


# ------------------------------------------------------------------------------------------- worker
def _worker(job: dict, wfd: int) -> None:
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
        nproc += len(uid_pids(os.getuid()))
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
        move = lambda paths: [alias + p[len(stdlib):] if p.startswith(stdlib) else p for p in paths]  # noqa: E731
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
    if uid is not None:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            iso.append(f"uid={uid}")
        except OSError as err:
            iso.append(f"no-uid-drop:{err}")
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the uid change
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes raise OSError instead of killing
    _block_sockets()
    _emit(wfd, nonce, k="iso", items=iso)
    _harness(job, wfd)


PRELOAD = ("math", "cmath", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "random",
           "typing", "hashlib", "statistics", "fractions", "decimal", "operator", "copy", "datetime", "array",
           "struct", "textwrap", "unicodedata", "encodings.idna")


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


def _block_sockets() -> None:
    import socket

    class _NoNetwork(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the sandbox")

    socket.socket = _NoNetwork
    socket.SocketType = _NoNetwork


class _StepTimeout(BaseException):
    """Raised by SIGALRM when a step exceeds its per-step timeout."""


def _harness(job: dict, wfd: int) -> None:
    """Run program, setup and each test; one record per step. Everything needed after the untrusted
    code has started is held in locals (the code can rebind builtins and module globals)."""
    write, dumps, mono, setitimer, exc_only = os.write, json.dumps, time.monotonic, signal.setitimer, (
        traceback.format_exception_only
    )
    _exec, _compile, _isinstance, _str, _type, _len = exec, compile, isinstance, str, type, len
    nonce, limit, step_timeout = job.pop("nonce"), job["max_message_chars"], job["test_timeout_s"]
    program_path = os.path.join(job["workdir"], "program.py")

    def on_alarm(signum, frame):
        raise _StepTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    module = types.ModuleType("__sandbox__")
    sys.modules["__sandbox__"] = module
    ns = module.__dict__
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    try:
        with open(program_path, "w") as f:
            f.write(job["program"])
    except OSError:
        pass

    def emit(**rec):
        rec["n"] = nonce
        write(wfd, (dumps(rec) + "\n").encode())

    sources = {program_path: job["program"], "<setup>": job["setup"]}

    def describe(err: BaseException) -> str:
        if _isinstance(err, SyntaxError):
            text = (err.text or "").strip()
            return f"SyntaxError: {err.msg} (line {err.lineno}: {text})"[:limit]
        where = None  # innermost frame of sandboxed source
        for frame, ln in traceback.walk_tb(err.__traceback__):
            if frame.f_code.co_filename in sources:
                where = (frame.f_code.co_filename, ln)
        if _isinstance(err, AssertionError) and where is not None:
            msg = _str(err)
            return (_statement_at(sources[where[0]], where[1]) + (f"  # {msg}" if msg else ""))[:limit]
        head = exc_only(_type(err), err)[-1].strip()
        if where is not None:
            name = "program" if where[0] == program_path else where[0]
            head += f" ({name} line {where[1]}: {_line(sources[where[0]], where[1])})"
        return head[:limit]

    def step(source: str, filename: str) -> dict:
        t = mono()
        sources[filename] = source
        try:
            code = _compile(source, filename, "exec")
        except (SyntaxError, ValueError) as err:
            return {"s": "error", "e": _type(err).__name__, "m": describe(err), "d": 0.0}
        try:
            try:
                setitimer(signal.ITIMER_REAL, step_timeout)
                _exec(code, ns)
            finally:
                setitimer(signal.ITIMER_REAL, 0)
            rec = {"s": "passed", "e": None, "m": ""}
        except _StepTimeout:
            rec = {"s": "timeout", "e": "Timeout", "m": f"step exceeded {step_timeout:g} s"}
        except AssertionError as err:
            rec = {"s": "failed", "e": "AssertionError", "m": describe(err)}
        except SystemExit as err:
            rec = {"s": "error", "e": "SystemExit", "m": f"SystemExit({err.code!r}) raised"[:limit]}
        except BaseException as err:  # noqa: BLE001 - every failure is a result
            rec = {"s": "error", "e": _type(err).__name__, "m": describe(err)}
        rec["d"] = mono() - t
        return rec

    tests = job["tests"]
    rec = step(job["program"], program_path)
    if rec["s"] == "passed" and job["setup"]:
        rec = step(job["setup"], "<setup>")
        if rec["s"] != "passed":
            rec["m"] = ("test setup failed: " + rec["m"])[:limit]
    emit(k="program", **rec)
    if rec["s"] == "passed":
        for i in range(_len(tests)):
            emit(k="test", i=i, **step(tests[i], f"<test {i}>"))
    emit(k="done")
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


def _line(source: str, lineno: int) -> str:
    lines = source.splitlines()
    return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""


def _statement_at(source: str, lineno: int) -> str:
    """The source of the innermost ``assert`` statement spanning ``lineno`` (else that line)."""
    try:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assert) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
                return " ".join((ast.get_source_segment(source, node) or "").split())
    except (SyntaxError, ValueError):
        pass
    return _line(source, lineno)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
