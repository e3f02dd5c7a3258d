"""Containment attacks: what a hostile program tries against the host, by class (IPC, writable host
paths, memfd/shared memory, keyrings, unix sockets, host files, namespaces and other syscalls,
leftover processes). Each test asserts the attack failed *and*, where the protection depends on a
layer the host may lack, that the layer was reported applied (never a silent pass).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from comlrl_lightning.coding.data import humaneval_path
from comlrl_lightning.coding.sandbox.api import SandboxConfig, SandboxPool, TestJob, run_tests

ROOT = Path(__file__).resolve().parents[1]
FAST = SandboxConfig(timeout_s=4.0, test_timeout_s=3.0, memory_mb=256)
LIBC = "import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def _probe(code: str, **overrides) -> dict:
    """Run ``code`` (which sets ``out``, a dict) in the sandbox; what it printed as JSON, plus the layers."""
    report = run_tests(
        LIBC + "out = {}\n" + code + "\nprint('OUT' + json.dumps(out))\n", [], config=FAST, **overrides
    )
    line = [x for x in report.stdout.splitlines() if x.startswith("OUT")]
    assert line, (report.program, report.stderr[-1500:])
    return {**json.loads(line[-1][3:]), "_isolation": report.isolation, "_missing": report.missing}


def test_the_full_set_of_layers_is_applied_or_reported_missing():
    res = _probe("")
    applied, missing = set(res["_isolation"]), set(res["_missing"])
    for layer in (
        "user-namespace",
        "pid-namespace",
        "mount-namespace",
        "network-namespace",
        "ipc-namespace",
        "uts-namespace",
        "read-only-view",
        "private-dev",
        "scratch-tmpfs",
        "seccomp",
        "cgroup",
    ):
        assert layer in applied or layer in missing, layer


def test_sysv_and_posix_ipc_are_refused_and_leave_nothing_on_the_host():
    before = Path("/proc/sysvipc/shm").read_text() if os.path.exists("/proc/sysvipc/shm") else ""
    res = _probe(
        "out['shmget'] = libc.shmget(0, 1 << 20, 0o1666)\n"
        "out['msgget'] = libc.msgget(0, 0o1666)\n"
        "out['semget'] = libc.semget(0, 1, 0o1666)\n"
        "out['mq_open'] = libc.syscall(240, b'/comlrl_q', os.O_CREAT | os.O_RDWR, 0o666, None)\n"
    )
    if "seccomp" in res["_isolation"]:
        assert [res[k] for k in ("shmget", "msgget", "semget", "mq_open")] == [-1, -1, -1, -1]
    assert "ipc-namespace" in res["_isolation"] or "ipc-namespace" in res["_missing"]
    after = Path("/proc/sysvipc/shm").read_text() if os.path.exists("/proc/sysvipc/shm") else ""
    assert after == before  # no segment reached the host's IPC namespace


def test_nothing_but_the_scratch_directory_is_writable_and_nothing_persists():
    token = secrets.token_hex(6)
    targets = [
        str(ROOT / f"pwned_{token}"),
        f"/tmp/pwned_{token}",
        f"/var/tmp/pwned_{token}",
        f"/dev/shm/pwned_{token}",
        f"/dev/pwned_{token}",
        f"/pwned_{token}",
        f"/usr/pwned_{token}",
        os.path.expanduser(f"~/pwned_{token}"),
        f"/run/pwned_{token}",
        f"/etc/pwned_{token}",
    ]
    res = _probe(
        f"targets = {targets!r}\nout['written'] = []\nfor t in targets:\n"
        "    try:\n        open(t, 'w').write('x')\n        out['written'].append(t)\n"
        "    except OSError:\n        pass\n"
    )
    try:
        assert [t for t in targets if os.path.exists(t)] == []
        if "read-only-view" in res["_isolation"]:  # inside, only the private scratch /tmp takes writes
            assert res["written"] == [f"/tmp/pwned_{token}"]
    finally:
        for t in targets:
            Path(t).unlink(missing_ok=True)


def test_memfd_and_scratch_memory_count_against_the_limit():
    grab = (
        "import os\nchunk, fds = b'x' * (1 << 20), []\n"  # many memfds: each stays under RLIMIT_FSIZE
        "for _ in range(200):\n    fds.append(os.memfd_create('grab'))\n"
        "    for _ in range(8):\n        os.write(fds[-1], chunk)\n"
    )
    report = run_tests(
        grab, ["assert True"], config=FAST, memory_mb=128, disk_mb=2048, timeout_s=20, test_timeout_s=19
    )
    assert not report.all_passed and report.program.status in ("killed", "error", "timeout")
    if "cgroup" in report.isolation:  # the cgroup's memory limit killed it, not a timeout
        assert (report.program.status, report.program.error_type) == ("killed", "MemoryLimit"), report.program
    shm = "open('/tmp/fill', 'wb').write(b'x' * (1 << 30))\n"  # the scratch tmpfs (shared memory) too
    report = run_tests(
        shm, ["assert True"], config=FAST, memory_mb=128, disk_mb=2048, timeout_s=20, test_timeout_s=19
    )
    assert not report.all_passed


def test_the_session_keyring_of_training_is_unreachable():
    keyctl = 250 if os.uname().machine == "x86_64" else None
    if keyctl is None:
        pytest.skip("syscall numbers known for x86_64 only")
    libc = ctypes.CDLL(None, use_errno=True)
    secret = b"training-secret-" + secrets.token_hex(4).encode()
    key = libc.syscall(248, b"user", b"comlrl-test-key", secret, len(secret), ctypes.c_int(-3))  # add_key @s
    res = _probe(
        "buf = ctypes.create_string_buffer(256)\n"
        f"out['read'] = libc.syscall(250, 11, {key}, buf, 256)\n"  # KEYCTL_READ of the training key
        "out['session'] = libc.syscall(250, 0, -3, 0)\n"  # KEYCTL_GET_KEYRING_ID of @s
        "out['leak'] = buf.raw[:40].decode('latin-1')\n"
    )
    try:
        assert res["read"] == -1 and secret.decode() not in res["leak"]
        if "seccomp" in res["_isolation"]:
            assert res["session"] == -1
    finally:
        if key > 0:
            libc.syscall(250, 3, key)  # KEYCTL_REVOKE


def test_unix_sockets_of_the_host_are_unreachable():
    path = os.path.join(tempfile.mkdtemp(), "training.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(os.path.dirname(path), 0o777)
    os.chmod(path, 0o777)
    server.listen(1)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0comlrl-training-" + secrets.token_hex(4).encode())
    abstract.listen(1)
    try:
        res = _probe(
            "import _socket\nout['errors'] = []\n"
            f"for addr in ({path!r}, {abstract.getsockname()!r}):\n"
            "    s = _socket.socket(_socket.AF_UNIX)\n"
            "    try:\n        s.connect(addr)\n        out['errors'].append('connected')\n"
            "    except OSError as e:\n        out['errors'].append(type(e).__name__)\n"
        )
        assert "connected" not in res["errors"], res
    finally:
        server.close()
        abstract.close()


def test_host_files_are_not_visible():
    secrets_on_host = [
        str(ROOT / "README.md"),
        humaneval_path(),
        "/etc/passwd",
        "/etc/hostname",
        os.path.expanduser("~/.bashrc"),
        f"/proc/{os.getpid()}/environ",
        str(ROOT / ".venv" / "pyvenv.cfg"),
    ]
    res = _probe(
        f"out['read'] = []\nfor p in {secrets_on_host!r}:\n"
        "    try:\n        open(p, 'rb').read(1)\n        out['read'].append(p)\n"
        "    except OSError:\n        pass\n"
        "import sys\nout['path'] = [p for p in sys.path if os.path.isdir(p)]\n"
        "out['site'] = [p for p in out['path'] for q in os.listdir(p) if 'site-packages' in p and q]\n"
    )
    if "read-only-view" in res["_isolation"]:
        assert res["read"] == [] and res["site"] == []
    else:
        assert "read-only-view" in res["_missing"]


def test_new_namespaces_mounts_ptrace_and_io_uring_are_refused():
    res = _probe(
        "out['unshare'] = libc.unshare(0x10000000)\n"  # CLONE_NEWUSER
        "out['mount'] = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\n"
        "out['ptrace'] = libc.ptrace(0, 0, None, None)\n"  # PTRACE_TRACEME
        "out['io_uring'] = libc.syscall(425, 8, ctypes.create_string_buffer(120))\n"
        "import threading\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
        "out['threads_ok'] = True\n"
    )
    if "seccomp" not in res["_isolation"]:
        pytest.skip("no seccomp filter on this host (reported missing)")
    assert [res[k] for k in ("unshare", "mount", "ptrace", "io_uring")] == [-1, -1, -1, -1]
    assert res["threads_ok"]  # clone3 refused with ENOSYS: libc falls back to clone, threads still work


@pytest.mark.slow
def test_no_process_cgroup_or_file_is_left_after_200_hostile_runs(monkeypatch):
    # only this pool's own sandboxes are looked at: another test run or a training run on the host makes and
    # removes its own meanwhile (two suites side by side failed here on each other's folders)
    private = tempfile.mkdtemp(
        prefix="comlrl_containment_"
    )  # every sandbox folder of this pool, and no other
    os.chmod(private, 0o711)  # as the system's temporary folder lets a sandbox's uid through
    monkeypatch.setattr(tempfile, "tempdir", private)
    tokens: list[str] = []
    token_hex = secrets.token_hex
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: tokens.append(token_hex(n)) or tokens[-1])
    programs = [
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
        "while True:\n    pass\n",
    ]
    cfg = FAST.replace(timeout_s=1.0, test_timeout_s=0.5, max_processes=16)
    with SandboxPool(max_workers=2, config=cfg) as pool:
        reports = pool.run([TestJob(programs[i % len(programs)], ["assert True"]) for i in range(200)])
    uids = {r.sandbox_uid for r in reports if r.sandbox_uid is not None}
    assert len(reports) == 200 and not psutil.Process().children(recursive=True)
    left = []
    for _ in range(60):  # zombies handed to PID 1 are reaped by it within moments
        left = [
            p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids
        ]
        if not left:
            break
        time.sleep(0.05)
    assert left == []
    ours = {f"comlrl-sbx-{t}" for t in tokens}  # the cgroup names this pool's launches drew
    assert len(tokens) >= 200 and os.listdir(private) == []
    os.rmdir(private)
    assert [
        p
        for p in glob.glob("/sys/fs/cgroup/*/**/comlrl-sbx-*", recursive=True)
        if os.path.basename(p) in ours
    ] == []
