"""The sandbox against each hazard of untrusted generated code (see comlrl_lightning.sandbox)."""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from comlrl_lightning.sandbox import SandboxConfig, SandboxPool, TestJob, run_code, run_tests

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
FAST = SandboxConfig(timeout_s=3.0, test_timeout_s=1.0, memory_mb=512)
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def _no_processes_of(uid: int | None) -> None:
    assert not psutil.Process().children(recursive=True), "sandbox processes left under the test process"
    if uid is not None:
        left = [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        assert not left, f"processes of sandbox uid {uid} left: {left}"


def test_correct_program_passes():
    report = run_tests(ADD, ADD_TESTS, config=FAST)
    assert report.program_loaded and report.all_passed
    assert (report.num_passed, report.num_tests, report.fraction_passed) == (3, 3, 1.0)
    assert [t.status for t in report.tests] == ["passed"] * 3
    assert report.program.returncode == 0 and not report.tampered


def test_wrong_program_fails_with_the_assertion_in_the_message():
    report = run_tests("def add(a, b):\n    return a * b\n", ADD_TESTS, config=FAST)
    assert [t.status for t in report.tests] == ["failed", "failed", "passed"]
    assert report.tests[0].error_type == "AssertionError"
    assert "assert add(1, 2) == 3" in report.tests[0].message
    assert report.num_passed == 1 and report.fraction_passed == pytest.approx(1 / 3) and not report.all_passed


def test_other_exceptions_are_errors_and_syntax_errors_fail_to_load():
    report = run_tests(ADD, ["assert missing(1) == 1", "assert add(1, 2) == 3"], config=FAST)
    assert report.tests[0].status == "error" and report.tests[0].error_type == "NameError"
    assert "missing" in report.tests[0].message and report.tests[1].passed
    report = run_tests("def add(a, b)\n    return a + b\n", ADD_TESTS, config=FAST)
    assert not report.program_loaded
    assert (report.program.status, report.program.error_type) == ("error", "SyntaxError")
    assert all(t.status == "error" and t.error_type == "SyntaxError" for t in report.tests)
    assert report.num_passed == 0


def test_infinite_loop_times_out_within_the_limit():
    t0 = time.monotonic()
    report = run_tests("while True:\n    pass\n", ["assert True"], config=FAST, timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert report.program.status == "timeout" and report.tests[0].status == "timeout"
    assert elapsed < 1.0 + 1.0, elapsed
    # A hanging test only costs that test (per-test timer); the others still run.
    report = run_tests(ADD, ["assert add(1, 2) == 3", "while True: pass", "assert add(2, 2) == 4"],
                       config=FAST, test_timeout_s=0.3)
    assert [t.status for t in report.tests] == ["passed", "timeout", "passed"]


def test_fork_bomb_is_bounded_and_leaves_no_process():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    report = run_tests(bomb, ["assert True"], config=FAST, timeout_s=1.5, max_processes=16)
    assert time.monotonic() - t0 < 1.5 + 1.5
    assert report.program.status in ("timeout", "killed") and report.num_passed == 0
    _no_processes_of(report.sandbox_uid)
    assert sum(i * i for i in range(100_000)) == 333328333350000  # the parent still computes
    assert run_tests(ADD, ADD_TESTS, config=FAST).all_passed  # and the sandbox still works


@pytest.mark.parametrize("namespaces", [True, False])
def test_setsid_orphan_is_reaped(namespaces):
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    report = run_tests(escape + ADD, ADD_TESTS, config=FAST, namespaces=namespaces)
    assert report.all_passed
    if IS_ROOT or namespaces:
        _no_processes_of(report.sandbox_uid)


def test_huge_allocation_is_an_error_not_a_crash():
    report = run_tests("x = bytearray(8 * 1024 ** 3)\n", ["assert True"], config=FAST, memory_mb=256)
    assert (report.program.status, report.program.error_type) == ("error", "MemoryError")
    grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 * 1024))\n"
    report = run_tests(grow, ["assert True"], config=FAST, memory_mb=256)
    assert report.program.status in ("error", "killed") and report.num_passed == 0
    assert report.program.error_type in ("MemoryError", "SIGKILL")


def test_killing_the_parent_does_not_reach_training():
    me = os.getpid()
    code = (
        "import os, signal\nerrors = []\n"
        f"for target in (os.getppid(), {me}, 1):\n"
        "    try:\n        os.kill(target, signal.SIGKILL)\n"
        "    except OSError as err:\n        errors.append(type(err).__name__)\n"
        f"try:\n    os.killpg(os.getpgid({me}), signal.SIGKILL)\nexcept OSError:\n    pass\n"
    )
    report = run_tests(code, ["assert len(errors) == 3"], config=FAST)
    assert psutil.pid_exists(me) and report.all_passed  # every kill was refused; launcher reported
    # Without namespaces or uid change the code's parent is the intermediate init, never training.
    report = run_tests("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", ["assert True"],
                       config=FAST, namespaces=False, drop_privileges=False)
    assert report.program.status in ("killed", "error") and report.num_passed == 0
    assert psutil.pid_exists(me)


def test_writes_outside_the_working_directory_do_not_persist():
    token = secrets.token_hex(6)
    targets = [ROOT / f"pwned_{token}", Path(tempfile.gettempdir()) / f"x_{token}", Path("/tmp") / f"y_{token}",
               Path("/dev/shm") / f"z_{token}"]
    code = "import os\nprint(os.getcwd())\n" + "".join(
        f"try:\n    open({str(t)!r}, 'w').write('pwned')\nexcept OSError:\n    pass\n" for t in targets
    ) + "open('inside.txt', 'w').write('ok')\n"
    try:
        report = run_tests(code, ["assert open('inside.txt').read() == 'ok'"], config=FAST)
        assert report.all_passed, report
        if IS_ROOT:
            assert [t for t in targets if t.exists()] == []
        cwd = Path(report.stdout.strip().splitlines()[0])
        assert cwd.is_absolute() and not cwd.exists()  # the working directory is gone
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_exit_before_or_during_the_tests_is_not_a_pass():
    for exit_call, error_type in (("import sys; sys.exit(0)", "SystemExit"), ("import os; os._exit(0)", "EarlyExit")):
        report = run_tests(ADD + exit_call + "\n", ADD_TESTS, config=FAST)
        assert not report.program_loaded and report.num_passed == 0, exit_call
        assert report.program.error_type == error_type and report.tests[0].error_type == error_type
    report = run_tests(ADD, ["assert add(1, 2) == 3", "import os; os._exit(0)", "assert add(2, 2) == 4"], config=FAST)
    assert [t.status for t in report.tests] == ["passed", "error", "error"]
    assert report.tests[1].error_type == "EarlyExit" and not report.all_passed


def test_forged_result_markers_are_not_passes():
    fake = '{"k": "test", "i": 0, "s": "passed", "e": null, "m": "", "d": 0.0}'
    printed = f"def add(a, b):\n    return 0\nprint({fake!r})\nprint({fake!r}.replace('0,', '1,'))\n"
    report = run_tests(printed, ADD_TESTS[:2], config=FAST)
    assert report.num_passed == 0 and not report.tampered
    written = ("import os\ndef add(a, b):\n    return 0\n"
               f"for fd in range(3, 64):\n    try:\n        os.write(fd, ({fake!r} + '\\n').encode())\n"
               "    except OSError:\n        pass\n")
    report = run_tests(written, ADD_TESTS[:2], config=FAST)
    assert report.tampered and report.num_passed == 0 and report.tests[0].error_type == "ResultTampering"


def test_network_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    try:
        report = run_tests(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n", [],
                           config=FAST)
        assert (report.program.status, report.program.error_type) == ("error", "PermissionError")
        raw = f"import _socket\ns = _socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n"
        result = run_code(raw, config=FAST)
        assert result.status == "error" and result.error_type in ("OSError", "ConnectionRefusedError",
                                                                   "PermissionError", "TimeoutError")
        if "network-namespace" in run_tests("", [], config=FAST).isolation:
            with pytest.raises(socket.timeout):
                server.accept()  # nothing ever connected
    finally:
        server.close()


def test_pool_runs_in_parallel_and_keeps_order():
    jobs = [TestJob(f"import time\ntime.sleep(0.6)\nVALUE = {i}\n", [f"assert VALUE == {i}", "assert VALUE == 2"])
            for i in range(4)]
    with SandboxPool(max_workers=4, config=FAST) as pool:
        t0 = time.monotonic()
        reports = pool.run(jobs)
        wall = time.monotonic() - t0
        assert [r.tests[0].passed for r in reports] == [True] * 4
        assert [r.tests[1].passed for r in reports] == [False, False, True, False]  # order kept
        serial = sum(r.duration_s for r in reports)
        assert wall < 0.75 * serial, (wall, serial)
        mapped = pool.map([ADD, "def add(a, b):\n    return 0\n"], [ADD_TESTS, ADD_TESTS])
        assert [r.num_passed for r in mapped] == [3, 1]  # add(-1, 1) == 0 holds
    with pytest.raises(ValueError, match="lengths must match"):
        SandboxPool(1).map([ADD], [])


def test_config_is_validated():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="unknown field"):
        run_tests(ADD, [], timeout=1)
