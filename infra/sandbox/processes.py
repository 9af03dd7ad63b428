"""The sandbox's own processes (worker, webhook): started from this venv's `gpuheal` with a pid
file in the run directory, and stopped only while the pid is verifiably still theirs (PIDs are
reused: a pid file left by an earlier run may name some other process by now). Also what
`make stop` runs: `python -m infra.sandbox.stack stop RUN_DIR`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from infra.sandbox.temporal import DIRS

BIN = Path(sys.executable).parent


class SandboxError(RuntimeError):
    """The harness could not do what it was asked (a command failed, a service did not come up)."""


def ours(pid: int, root: Path) -> bool:
    """Whether `pid` is still a gpuheal process of the sandbox in `root`: its command line runs
    gpuheal, its environment names this run directory."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    # Either Temporal kind's: `make stop` does not know which one the demo ran.
    mine = {f"GPUHEAL_TEMPORAL_DIR={root / d}".encode() for d in DIRS.values()}
    return any(a.endswith(b"/gpuheal") for a in argv[:2]) and bool(mine & set(environ))


def stop_recorded(root: Path, name: str, sig: int = signal.SIGTERM) -> str:
    """Stop the `name` process (worker, webhook) recorded in `root`, if it is still ours, and
    forget its pid file. Says what it did."""
    pidfile = root / f"{name}.pid"
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return f"{name}: not running"
    said = f"{name}: pid {pid} is no longer ours; left alone"
    if ours(pid, root):
        os.kill(pid, sig)
        for _ in range(150):
            if not ours(pid, root):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
        said = f"{name}: stopped (pid {pid})"
    pidfile.unlink(missing_ok=True)
    return said


def spawn(root: Path, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`gpuheal ARGV` in its own session, logging to ROOT/NAME.log, its pid in ROOT/NAME.pid."""
    stop_recorded(root, name)  # a leftover from an interrupted run would serve old code
    log = open(root / f"{name}.log", "ab")
    proc = subprocess.Popen(
        [str(BIN / "gpuheal"), *argv],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    (root / f"{name}.pid").write_text(str(proc.pid))
    return proc


def wait_healthy(proc: subprocess.Popen[bytes], name: str, url: str, log: Path, timeout: float = 20) -> None:
    """Until `url` answers; raises if the process exits first or nothing answers in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            if proc.poll() is not None:
                raise SandboxError(f"{name} exited; see {log}") from None
            time.sleep(0.2)
    raise SandboxError(f"{name} did not answer within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """A process this run started: `sig`, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str]) -> None:
    """`make stop`: the worker and webhook a run directory recorded (Temporal and Slurm have
    their own scripts' stop)."""
    if len(argv) != 2 or argv[0] != "stop":
        sys.exit("usage: python -m infra.sandbox.stack stop RUN_DIR")
    run_dir = Path(argv[1]).resolve()
    if run_dir.is_dir():
        for name in ("webhook", "worker"):
            print(f"sandbox: {stop_recorded(run_dir, name)}")
