"""Operating-system helpers shared by the sandbox launcher paths (standard library only, loaded by
path): syscalls through ``ctypes``, killing and reaping, the record collector, per-run cgroups,
the session keyring, staging bind mounts.
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import time

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x40000000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    16384,
    1 << 18,
)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
MAX_RECORD_BYTES = 1 << 20
_LIBC = None


def libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def unshare(flags: int) -> bool:
    try:
        return libc().unshare(ctypes.c_int(flags)) == 0
    except (OSError, AttributeError):
        return False


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> bool:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    try:
        return libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) == 0
    except (OSError, AttributeError):
        return False


def prctl(option: int, arg: int) -> bool:
    try:
        return libc().prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0
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
    Forks, so call it from a single-threaded process (the launcher, or ``--cleanup``).
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


def collect(rfd: int, pid: int, deadline: float) -> tuple[bytes, bool, bool]:
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
        if pidfd is None and not open_ and exited(pid):
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


def exited(pid: int) -> bool:
    try:  # peek without reaping: waitid with WNOWAIT
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


# ------------------------------------------------------------------------------------------ cgroups
def cgroup_create(spec: dict, name: str, memory_bytes: int, max_pids: int) -> list[str]:
    """Make one cgroup per run under each directory of ``spec`` (from
    :func:`comlrl_lightning.coding.sandbox.isolation.cgroup_spec`): memory (shared memory, tmpfs and
    memfd pages count: they are charged to the cgroup that touches them) and pids limits.
    Returns the created directories (empty where the host refuses)."""
    made = []
    for kind, parent in spec.get("dirs", []):
        path = os.path.join(parent, name)
        try:
            os.mkdir(path, 0o700)
        except OSError:
            continue
        made.append(path)
        if kind == "v2":
            limits = {"memory.max": memory_bytes, "memory.swap.max": 0, "pids.max": max_pids}
        elif kind == "memory":
            limits = {"memory.limit_in_bytes": memory_bytes, "memory.memsw.limit_in_bytes": memory_bytes}
        else:
            limits = {"pids.max": max_pids}
        for key, value in limits.items():
            try:
                with open(os.path.join(path, key), "w") as f:
                    f.write(str(value))
            except OSError:
                pass
    return made


def cgroup_join(dirs: list[str]) -> None:
    """Move the calling process into each cgroup of ``dirs`` (before it drops privileges)."""
    for path in dirs:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write("0")


def cgroup_oom_killed(dirs: list[str]) -> bool:
    """Whether the kernel's OOM killer fired in any of ``dirs`` (the memory limit was hit)."""
    for path in dirs:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(os.path.join(path, name)) as f:
                    fields = dict(line.split() for line in f if len(line.split()) == 2)
            except OSError:
                continue
            if int(fields.get("oom_kill", 0)) > 0:
                return True
    return False


def cgroup_destroy(dirs: list[str], rounds: int = 200) -> None:
    """SIGKILL every process left in ``dirs`` until they are empty, then remove them."""
    for path in dirs:
        for _ in range(rounds):
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.002)
        for _ in range(400):  # up to ~2 s: a killed task may still be exiting
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:  # a killed task may still be exiting
                time.sleep(0.005)


# ------------------------------------------------------------------------------------- keyring, uid
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "armv7l": 311, "ppc64le": 280, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1


def new_session_keyring() -> bool:
    """Join a fresh anonymous session keyring (nothing of the launcher's keyring is reachable)."""
    nr = _SYS_KEYCTL.get(os.uname().machine)
    try:
        return (
            nr is not None
            and libc().syscall(
                ctypes.c_long(nr), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None)
            )
            >= 0
        )
    except (OSError, AttributeError):
        return False


def drop_to(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` with no supplementary groups; raises if any identity remains."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise RuntimeError(f"sandbox: could not become uid {uid}")


def stage(items: list[list[str]], root: str) -> None:
    """In a new private mount namespace, bind each ``[source, name]`` read-only at ``root/name``
    (on a fresh tmpfs), so an unprivileged uid can reach paths below e.g. ``/root``."""
    if not unshare(CLONE_NEWNS) or not mount("none", "/", None, MS_REC | MS_PRIVATE, None):
        raise RuntimeError("sandbox: cannot create the staging mount namespace")
    os.makedirs(root, exist_ok=True)
    if not mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755"):
        raise RuntimeError("sandbox: cannot mount the staging tmpfs")
    for source, name in items:
        target = os.path.join(root, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        else:
            open(target, "a").close()
        if not mount(source, target, None, MS_BIND | MS_REC, None):
            raise RuntimeError(f"sandbox: cannot stage {source}")
        mount("none", target, None, MS_BIND | MS_REC | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
