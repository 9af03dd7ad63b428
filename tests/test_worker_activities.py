"""The worker registers what the activity interface declares: its list is collected from the
implementations' `@implements` methods, and a worker that would serve fewer refuses to start
(a workflow would schedule the missing activity and wait for a worker that never comes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal.activities import interface as act
from gpuheal.activities.validation import ValidationActivities
from gpuheal.core.errors import SettingsError
from gpuheal.core.settings import Settings
from gpuheal.workers import main as worker


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    hook = tmp_path / "hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    return Settings.from_env({"GPUHEAL_CLUSTER": "t", "GPUHEAL_PROVIDER": "exec", "GPUHEAL_PROVIDER_HOOK": str(hook)})


def names(fns: list[object]) -> set[str]:
    return {fn.__temporal_activity_definition.name for fn in fns}  # type: ignore[attr-defined]


def test_the_worker_serves_every_declared_activity_but_kubernetes_without_a_cluster(settings: Settings) -> None:
    served = names(worker.activity_list(settings))
    assert served == {ref.name for ref in act.WORKER}
    assert not served & {ref.name for ref in act.KUBERNETES}
    # every activity the interface declares is in some worker's list: nothing declared is left out
    assert {ref.name for ref in act.ALL + act.VALIDATION + act.RMA} == {ref.name for ref in act.WORKER + act.KUBERNETES}


def test_a_worker_missing_an_implementation_refuses_to_start(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as if the validation activity had lost its @implements: the worker's classes no longer declare it
    monkeypatch.delattr(ValidationActivities, "validate_node_gpus")
    with pytest.raises(SettingsError, match="validate_node_gpus"):
        worker.activity_list(settings)


def test_an_activity_implemented_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="implemented twice"):
        act.implementations(ValidationActivities, ValidationActivities)


async def test_a_validation_job_the_rest_backend_cannot_run_refuses_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The burn-in goes through Slurm's commands whatever the backend: with slurmrestd and no
    Slurm client beside it (a worker image without one: no scontrol on its PATH), every burn-in
    would fail to run. Refused at start, naming why."""
    s = Settings.from_env(
        {
            "GPUHEAL_CLUSTER": "prod",
            "GPUHEAL_PROVIDER": "sandbox",
            "GPUHEAL_SLURM_BACKEND": "rest",
            "GPUHEAL_SLURM_REST_URL": "http://127.0.0.1:6820",
            "GPUHEAL_VALIDATE_JOB": "/opt/site/burn-in.sh",
            "GPUHEAL_SLURM_CLI_WRAPPER": f"env PATH={tmp_path}",
        }
    )
    monkeypatch.setattr(worker, "BURN_IN_CHECKS", 1)  # (no second try: nothing will change)
    with pytest.raises(SettingsError, match=r"GPUHEAL_VALIDATE_JOB is set.*cannot run.*GPUHEAL_SLURM_BACKEND=rest"):
        await worker.check_burn_in_can_run(s)
    unset = s.model_copy(update={"remediation": s.remediation.model_copy(update={"validate_job": None})})
    await worker.check_burn_in_can_run(unset)  # nothing to run: nothing refused
