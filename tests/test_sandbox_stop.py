"""`make stop` and the demo signal only processes that are verifiably theirs: a pid file left by
an earlier run may name a PID that some other process has since been given."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from infra.sandbox.stack import Sandbox


def spawn(exe: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`exe 60`, once it runs: until the child has exec'd, /proc shows the forking Python."""
    proc = subprocess.Popen([str(exe), "60"], env=env)
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(str(exe).encode()):
        assert time.monotonic() < deadline, "the child never ran"
        time.sleep(0.01)
    return proc


def test_a_reused_pid_is_left_alone_and_the_stale_pid_file_goes(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path / "run")
    stranger = spawn(Path(shutil.which("sleep") or "/bin/sleep"), {})
    try:
        (sb.root / "worker.pid").write_text(str(stranger.pid))
        assert sb.stop_recorded("worker") == f"worker: pid {stranger.pid} is no longer ours; left alone"
        assert stranger.poll() is None and not (sb.root / "worker.pid").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_our_worker_is_stopped(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path / "run")
    exe = tmp_path / "bin" / "gpuheal"  # what a worker's command line runs
    exe.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    ours = spawn(exe, {"GPUHEAL_TEMPORAL_DIR": str(sb.root / "temporal")})
    try:
        (sb.root / "worker.pid").write_text(str(ours.pid))
        assert sb.stop_recorded("worker") == f"worker: stopped (pid {ours.pid})"
        assert ours.wait(timeout=5) != 0 and not (sb.root / "worker.pid").exists()
    finally:
        ours.kill()
        ours.wait()
    assert sb.stop_recorded("webhook") == "webhook: not running"
