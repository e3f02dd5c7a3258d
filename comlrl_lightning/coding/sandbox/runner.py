"""The launcher of :mod:`comlrl_lightning.coding.sandbox.api` (standard library only).

Started by the trusted parent as ``python -s -S [-P] runner.py JOB`` in a new session: the
training process never forks untrusted code itself, shares no process group with it and runs no
``preexec_fn``. The launcher never runs untrusted code either. It reads the job, deletes the
file, and takes one of two paths (what was applied is reported as ``isolation``, what is missing
as ``missing``):

- **bubblewrap** (``job["bwrap"]``, the default where it works): a private mount namespace of the
  launcher stages what the view needs (the interpreter, the harness) read-only; one cgroup per run
  (memory incl. shared memory/memfd, pids); then a child joins the cgroup, drops to an unused uid,
  joins a fresh session keyring, sets rlimits and execs ``bwrap``, which creates user, PID, mount,
  network, IPC, UTS and cgroup namespaces, mounts the read-only view, a private ``/dev``, a fresh
  ``/proc`` and one writable scratch tmpfs (``/tmp``), installs the seccomp filter and execs the
  interpreter on :mod:`comlrl_lightning.coding.sandbox.harness`. On the deadline the launcher SIGKILLs
  ``bwrap`` (its PID 1 dies with it, the kernel kills the namespace) and every process left in
  the cgroup, then removes the cgroup.
- **fallback** (:mod:`comlrl_lightning.coding.sandbox.nsinit`): namespaces through ``unshare``, a
  dropped uid and rlimits, as before bubblewrap.

``runner.py --cleanup JSON`` (``{"uid": unique uid or null, "cgroups": [dirs]}``), run by the parent
when the launcher itself overran: SIGKILLs every process of the uid and of the cgroups, removes them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import sys
import time
import traceback


def _load(name: str):
    spec = importlib.util.spec_from_file_location(
        f"sandbox_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


osl = _load("oslayer")
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def main(job_path: str) -> int:
    """Launcher entry point: run the job in ``job_path`` and write ``result.json`` next to it."""
    ctl = os.path.dirname(job_path)
    out = {
        "records": [],
        "isolation": [],
        "missing": [],
        "timed_out": False,
        "overflow": False,
        "status": None,
    }
    t0 = time.monotonic()
    try:
        with open(job_path) as f:
            job = json.load(f)
        os.unlink(job_path)
        if job.get("bwrap"):
            _run_bwrap(job, ctl, out, t0)
        else:
            _load("nsinit").run(job, ctl, out, t0)
    except Exception:  # noqa: BLE001 - reported to the parent as an infrastructure failure
        out["infra_error"] = traceback.format_exc()[-2000:]
    out["duration_s"] = time.monotonic() - t0
    tmp = os.path.join(ctl, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, os.path.join(ctl, "result.json"))
    return 0


def _run_bwrap(job: dict, ctl: str, out: dict, t0: float) -> None:
    spec, iso, missing = job["bwrap"], out["isolation"], out["missing"]
    deadline = t0 + job["timeout_s"]
    osl.prctl(PR_SET_CHILD_SUBREAPER, 1)  # bwrap's namespace init can outlive bwrap: reap it here
    view = os.path.join(ctl, "view")
    osl.stage(spec["stage"], view)
    argv = [a.replace("{view}", view) for a in spec["argv"]]
    cgroups = osl.cgroup_create(
        spec.get("cgroup", {}), job["cgroup_name"], job["memory_mb"] << 20, job["max_processes"]
    )
    if spec.get("cgroup", {}).get("dirs"):
        (iso if cgroups else missing).append("cgroup")
    payload = {k: v for k, v in job.items() if k != "bwrap"}
    payload["workdir"] = "/tmp"
    job_r, job_w = os.pipe()
    rfd, wfd = os.pipe()
    ready_r, ready_w = os.pipe()
    seccomp = os.open(spec["seccomp"], os.O_RDONLY) if spec.get("seccomp") else None
    fds = {"{job_fd}": job_r, "{result_fd}": wfd, "{ready_fd}": ready_w, "{seccomp_fd}": seccomp}
    argv = [str(fds[a]) if a in fds else a for a in argv]
    # bwrap reads its options from a pipe and starts with an empty environment, so the sandbox's
    # /proc/1 (bwrap's init) shows neither the control folder's paths nor the launcher's command
    split = argv.index("--")  # the options go through the pipe; the command stays (bwrap needs it)
    args_r, args_w = os.pipe()
    os.write(args_w, b"".join(a.encode() + b"\0" for a in argv[1:split]))  # a few kB: fits the pipe
    os.close(args_w)
    pid = os.fork()
    if pid == 0:  # becomes bwrap
        try:
            for fd in (job_w, rfd, ready_r):
                os.close(fd)
            for fd in (job_r, wfd, ready_w, seccomp, args_r):
                if fd is not None:
                    os.set_inheritable(fd, True)
            os.setpgid(0, 0)
            osl.cgroup_join(cgroups)
            if job.get("uid") is not None and os.geteuid() == 0:
                osl.drop_to(job["uid"], job["gid"])
            keyring = osl.new_session_keyring()
            osl.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            _rlimits(job)
            os.write(ready_w, b"k" if keyring else b"-")
            os.execve(argv[0], ["bwrap", "--args", str(args_r), *argv[split:]], {})
        except BaseException:  # noqa: BLE001 - shown in the parent's stderr tail
            traceback.print_exc()
        finally:
            os._exit(70)
    for fd in (job_r, wfd, ready_w, args_r) + ((seccomp,) if seccomp is not None else ()):
        os.close(fd)
    with open(os.path.join(ctl, "init.pid"), "w") as f:
        f.write(str(pid))
    _feed_and_collect(job_w, json.dumps(payload).encode(), rfd, pid, deadline, out)
    if out["timed_out"]:
        os.kill(pid, signal.SIGKILL)
    _, st = os.waitpid(pid, 0)
    oom = osl.cgroup_oom_killed(cgroups)
    osl.cgroup_destroy(cgroups)  # leftovers that escaped bwrap's namespace (none expected)
    osl.kill_children()  # and reap the zombies handed to us as subreaper
    os.set_blocking(ready_r, False)
    try:
        ready = os.read(ready_r, 16)
    except BlockingIOError:
        ready = b""
    os.close(ready_r)
    iso.append(f"uid={os.getuid() if job.get('uid') is None else job['uid']}")
    (iso if ready[:1] == b"k" else missing).append("session-keyring")
    iso += spec["layers"]
    out["init_ready"] = ready[:1] in (b"k", b"-")
    out["worker_ready"] = b"K" in ready[1:] or any(line for line in out["records"])
    code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else None
    if oom:
        out["status"] = {"kind": "signaled", "signal": int(signal.SIGKILL), "oom": True}
    elif os.WIFSIGNALED(st):
        out["status"] = {"kind": "signaled", "signal": os.WTERMSIG(st)}
    elif code is not None and code > 128:  # bwrap reports a child killed by signal N as 128 + N
        out["status"] = {"kind": "signaled", "signal": code - 128}
    else:
        out["status"] = {"kind": "exited", "code": code}


def _feed_and_collect(job_w: int, payload: bytes, rfd: int, pid: int, deadline: float, out: dict) -> None:
    """Write the job to the sandbox (in a helper so a large job cannot block the launcher) and
    collect its records until it exits or the deadline passes."""
    writer = os.fork()
    if writer == 0:
        try:
            os.close(rfd)
            view = memoryview(payload)
            while view:
                view = view[os.write(job_w, view) :]
        finally:
            os._exit(0)
    os.close(job_w)
    data, out["timed_out"], out["overflow"] = osl.collect(rfd, pid, deadline)
    os.kill(writer, signal.SIGKILL)
    os.waitpid(writer, 0)
    out["records"] = data.decode("utf-8", "replace").splitlines()


def _rlimits(job: dict) -> None:
    mb = 1 << 20
    limits = {
        "RLIMIT_AS": (job["memory_mb"] * mb,) * 2,
        "RLIMIT_CPU": (job["cpu_time_s"], job["cpu_time_s"] + 1),
        "RLIMIT_FSIZE": (job["file_size_mb"] * mb,) * 2,
        "RLIMIT_NPROC": (
            job["max_processes"] + (len(osl.live_pids(os.getuid())) if job.get("uid") is None else 0),
        )
        * 2,
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (256, 256),
    }
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), value)


if __name__ == "__main__":
    if sys.argv[1] == "--cleanup":
        what = json.loads(sys.argv[2])
        if what.get("uid"):
            osl.kill_uid(int(what["uid"]))
        osl.cgroup_destroy([str(d) for d in what.get("cgroups", [])])
        sys.exit(0)
    sys.exit(main(sys.argv[1]))
