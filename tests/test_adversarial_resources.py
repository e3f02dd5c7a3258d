"""Kernel-wide resources a sandboxed run may take (issue 21): ptys, inotify, epoll, open files,
processes; and the low items: ``/proc/1`` shows no host paths, nothing is left in ``$TMPDIR``.

Each attack grabs more of a resource than the per-run cap allows and reports how far it got from
inside; the test asserts it stopped at the cap and that the host's counter (where the kernel
exposes one) did not move by more than the cap. Protections that need a layer the host may lack
skip with the layer named when it is reported missing (never a silent pass).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from comlrl_lightning.coding.sandbox.api import SandboxConfig, run_tests

ROOT = Path(__file__).resolve().parents[1]
FAST = SandboxConfig(timeout_s=6.0, test_timeout_s=5.0, memory_mb=256)
PTY_CAP = 16
PTY_NR = "/proc/sys/kernel/pty/nr"


def _run(code: str, needs: tuple[str, ...], **overrides) -> dict:
    """Run ``code`` (which fills the dict ``out``) in the sandbox; ``out`` as read back."""
    report = run_tests(
        "import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)\nout = {}\n"
        + code
        + "\nprint('OUT' + json.dumps(out))\n",
        [],
        config=FAST,
        **overrides,
    )
    missing = [layer for layer in needs if layer in report.missing]
    if missing:
        pytest.skip(f"isolation layers missing on this host: {missing}")
    line = [x for x in report.stdout.splitlines() if x.startswith("OUT")]
    assert line, (report.program, report.stderr[-1500:])
    import json

    return json.loads(line[-1][3:])


def _host_ptys() -> int | None:
    try:
        return int(Path(PTY_NR).read_text())
    except OSError:
        return None


def test_ptys_stop_at_the_cap_and_never_drain_the_host():
    before = _host_ptys()
    out = _run(
        "fds = []\n"
        "for path in ('/dev/ptmx', '/dev/pts/ptmx'):\n"
        "    for _ in range(64):\n"
        "        try:\n            fds.append(os.open(path, os.O_RDWR | os.O_NOCTTY))\n"
        "        except OSError as e:\n            out.setdefault('errors', []).append(e.errno)\n            break\n"
        "for _ in range(64):\n"
        "    try:\n        fds.extend(os.openpty())\n    except OSError:\n        break\n"
        "out['opened'] = len(fds)\n"
        f"out['nr'] = int(open({PTY_NR!r}).read()) if os.path.exists({PTY_NR!r}) else None\n",
        ("private-dev", "mount-namespace"),
    )
    assert out["opened"] <= PTY_CAP  # the private /dev has no ptmx and no devpts: 0 here
    if before is not None and out["nr"] is not None:
        assert out["nr"] - before <= PTY_CAP  # seen from inside, while the run held what it got
        assert _host_ptys() - before <= PTY_CAP


def test_inotify_and_epoll_instances_and_watches_stop_at_the_cap():
    out = _run(
        "import select\n"
        "inst, watches, ep, ep_watches = [], 0, [], 0\n"
        "for _ in range(64):\n"
        "    fd = libc.inotify_init1(0)\n"
        "    if fd < 0:\n        out['inotify_errno'] = ctypes.get_errno()\n        break\n"
        "    inst.append(fd)\n"
        "for fd in inst[:1]:\n"
        "    for _ in range(64):\n"
        "        if libc.inotify_add_watch(fd, b'/tmp', 0x100) < 0:\n            break\n"
        "        watches += 1\n"
        "for _ in range(64):\n"
        "    try:\n        ep.append(select.epoll())\n"
        "    except OSError as e:\n        out['epoll_errno'] = e.errno\n        break\n"
        "for e in ep[:1]:\n"
        "    for i in range(64):\n"
        "        try:\n            e.register(os.open('/dev/null', os.O_RDONLY))\n            ep_watches += 1\n"
        "        except OSError:\n            break\n"
        "out.update(inotify=len(inst), watches=watches, epoll=len(ep), epoll_watches=ep_watches)\n",
        ("seccomp",),
    )
    assert out["inotify"] <= 16 and out["watches"] <= 16  # refused by seccomp: 0 here
    assert out["epoll"] <= 16 and out["epoll_watches"] <= 16
    assert out["inotify"] == 0 and out["epoll"] == 0  # EPERM, the filter's answer
    assert out["inotify_errno"] == 1 and out["epoll_errno"] == 1


def test_open_file_handles_stop_at_the_per_process_limit():
    out = _run(
        "fds = []\n"
        "for _ in range(5000):\n"
        "    try:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "    except OSError as e:\n        out['errno'] = e.errno\n        break\n"
        "out['opened'] = len(fds)\n",
        (),
    )
    assert out["opened"] < 256 and out["errno"] == 24  # EMFILE: RLIMIT_NOFILE, never ENFILE (host-wide)


def test_processes_stop_at_the_cap():
    out = _run(
        "import time\npids = []\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError as e:\n        out['errno'] = e.errno\n        break\n"
        "    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n"
        "    pids.append(pid)\n"
        "out['forked'] = len(pids)\n",
        ("pid-namespace",),
        max_processes=24,
    )
    assert out["forked"] < 24 and out["errno"] == 11  # EAGAIN: RLIMIT_NPROC / the cgroup's pids.max


def test_pid_1_of_the_sandbox_shows_no_host_paths():
    out = _run(
        "out['cmdline'] = open('/proc/1/cmdline').read()\n"
        "try:\n    out['environ'] = open('/proc/1/environ').read()\n"
        "except OSError as e:\n    out['environ'] = ''\n",
        ("pid-namespace", "mount-namespace"),
    )
    assert "comlrl_sbx" not in out["cmdline"] and "/view/" not in out["cmdline"]
    assert "--ro-bind" not in out["cmdline"]  # bwrap's options came through a pipe
    assert out["environ"] == ""


def test_nothing_is_left_in_tmpdir(tmp_path):
    code = (
        "from comlrl_lightning.coding.sandbox.api import run_tests\n"
        "r = run_tests('x = 1', ['assert x == 1'], timeout_s=4.0)\n"
        "assert r.all_passed, r\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True, timeout=120)
    assert sorted(os.listdir(tmp_path)) == []  # no comlrl_seccomp_* or comlrl_sbx_* folder


# ------------------------------------------------- issue 32: AIO, AF_VSOCK and pidfd_getfd
AIO_NR = "/proc/sys/fs/aio-nr"


def _host_aio() -> int | None:
    try:
        return int(Path(AIO_NR).read_text())
    except OSError:
        return None


def test_io_setup_is_refused_and_the_host_aio_counter_does_not_move():
    # one run took fs.aio-nr to 65,536 of 65,536 (host io_setup then failed with EAGAIN)
    before = _host_aio()
    out = _run(
        "ctxs, out['errno'] = [], None\n"
        "for _ in range(256):\n"
        "    ctx = ctypes.c_ulong(0)\n"
        "    if libc.syscall(206, 65536, ctypes.byref(ctx)) != 0:\n"  # io_setup
        "        out['errno'] = ctypes.get_errno()\n        break\n"
        "    ctxs.append(ctx.value)\n"
        "out['contexts'] = len(ctxs)\n"
        f"out['nr'] = int(open({AIO_NR!r}).read()) if os.path.exists({AIO_NR!r}) else None\n",
        ("seccomp",),
    )
    assert out["contexts"] == 0 and out["errno"] == 1  # EPERM, the filter's answer
    if before is not None and out["nr"] is not None:
        assert out["nr"] <= before  # read inside the run, while it held what it got
        assert _host_aio() <= before


@pytest.mark.parametrize(
    "name, call, refused_without_the_filter",
    [
        # io_submit on a context that does not exist: EINVAL without the filter
        ("io_submit", "libc.syscall(209, ctypes.c_ulong(1), 0, None)", "EINVAL"),
        # socket(AF_VSOCK, SOCK_STREAM): not namespaced; a socket or EAFNOSUPPORT without the filter
        ("af_vsock", "libc.socket(40, 1, 0)", "a socket or EAFNOSUPPORT"),
        ("af_vsock_pair", "libc.socketpair(40, 1, 0, (ctypes.c_int * 2)())", "EOPNOTSUPP"),
        # pidfd_getfd on a descriptor that is no pidfd: EBADF without the filter
        ("pidfd_getfd", "libc.syscall(438, 0, 0, 0)", "EBADF"),
    ],
)
def test_aio_vsock_and_pidfd_getfd_are_refused_with_eperm(name, call, refused_without_the_filter):
    out = _run(f"r = {call}\nout['r'], out['errno'] = r, ctypes.get_errno()\n", ("seccomp",))
    assert (out["r"], out["errno"]) == (-1, 1), (name, out, refused_without_the_filter)
