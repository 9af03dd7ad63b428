"""The installed product, as an operator gets it: `pip install .` into a fresh virtualenv outside
the checkout, run from another folder. It must carry every module it needs (and no dev harness),
and a worker without its settings must refuse with the setting named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.sandbox import REPO

pytestmark = pytest.mark.integration

FLOORS = {"core", "clients", "providers", "activities", "workflows", "triggers", "workers", "cli"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = root / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", ".run", "*cache*", "histories"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return venv


def gpuheal(venv: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # A bare environment, from a folder that is not the checkout: nothing leaks in from either.
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(
        [str(venv / "bin" / "gpuheal"), *args],
        cwd="/",
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_wheel_installs_one_import_name_with_every_floor_inside(installed: Path) -> None:
    site = next((installed / "lib").glob("python3*/site-packages"))
    (dist,) = site.glob("gpuheal-*.dist-info")
    paths = [line.split(",")[0] for line in (dist / "RECORD").read_text().splitlines()]
    top = {p.split("/")[0] for p in paths if not p.startswith("..") and ".dist-info/" not in p}
    assert top == {"gpuheal"}, f"the wheel installs more than one top-level name: {sorted(top)}"
    floors = {p.split("/")[1] for p in paths if p.startswith("gpuheal/") and p.count("/") >= 2} - {"__pycache__"}
    assert floors == FLOORS
    # The floors are real files in the package (the checkout's top-level names only link in).
    module = site / "gpuheal" / "workflows" / "remediation.py"
    assert module.is_file() and not module.is_symlink() and not module.parent.is_symlink()


@pytest.mark.parametrize("command", ["worker", "report", "agent"])
def test_help_runs_from_another_folder(installed: Path, command: str) -> None:
    done = gpuheal(installed, command, "--help")
    assert done.returncode == 0, done.stderr
    assert f"usage: gpuheal {command}" in done.stdout


def test_a_worker_without_provider_refuses_and_names_the_setting(installed: Path) -> None:
    no_cluster = gpuheal(installed, "worker")
    assert no_cluster.returncode == 2
    assert "GPUHEAL_CLUSTER is not set" in no_cluster.stderr
    no_provider = gpuheal(installed, "worker", env={"GPUHEAL_CLUSTER": "prod"})
    assert no_provider.returncode == 2
    assert "GPUHEAL_PROVIDER is not set" in no_provider.stderr
    assert "Traceback" not in no_provider.stderr
