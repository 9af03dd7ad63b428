"""The Slurm backends against the real daemons: one call per question (never one per job), and a
slurmrestd token that is refused with a clear message and never shown."""

from __future__ import annotations

import asyncio

import pytest

from gpuheal.clients.slurm import SlurmError, build_slurm
from gpuheal.core.settings import Settings
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import SLURM_IDS, SLURM_MATRIX

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("slurm", SLURM_MATRIX, ids=SLURM_IDS, indirect=True)
async def test_a_question_costs_the_same_calls_whatever_the_queue(slurm: Sandbox) -> None:
    for nodes, count in (("gpu[01-02]", 2), ("gpu01", 1), ("gpu02", 1)):  # one two-node job, two one-node jobs
        slurm.slurm("sbatch", "-o", "/dev/null", f"--nodelist={nodes}", f"--nodes={count}", "--wrap=sleep 300")
    for _ in range(20):
        slurm.slurm("sbatch", "-H", "-o", "/dev/null", "--wrap=sleep 1")
    backend = build_slurm(Settings.from_env(slurm.env()).slurm)
    await backend.nodes()  # learn the schema (and, over REST, the API version)
    for _ in range(50):
        on_gpu02 = await backend.jobs_on_node("gpu02")
        if len(on_gpu02) == 2:
            break
        await asyncio.sleep(0.2)
    before = backend.calls
    on_gpu02 = await backend.jobs_on_node("gpu02")
    # The CLI asks once; slurmrestd has no node filter: its light state listing, then each of the
    # three live jobs. The 20 held jobs cost nothing either way.
    assert backend.calls - before == (1 + 3 if slurm.slurm_backend == "rest" else 1)
    assert sorted(j.node_count for j in on_gpu02) == [1, 2]
    before = backend.calls
    found = await backend.jobs([j.job_id for j in on_gpu02])
    assert {j.job_id for j in found} == {j.job_id for j in on_gpu02} and backend.calls - before <= 2
    # A spare not in service (FUTURE) and a name Slurm does not have run nothing: squeue says so
    # in its own words, which are not a failure to answer.
    assert await backend.jobs_on_node("gpu04") == [] and await backend.jobs_on_node("gpu99") == []


@pytest.mark.parametrize("slurm", [("rest", "26.05")], ids=["rest-26.05"], indirect=True)
async def test_a_refused_token_says_so_and_is_never_shown(slurm: Sandbox) -> None:
    token_file = slurm.slurm_dir / "rest.token"
    token_file.write_text("eyJhbGciOiJIUzI1NiJ9.bm90LWEtcmVhbC10b2tlbg.c2lnbmF0dXJl\n")
    backend = build_slurm(Settings.from_env(slurm.env()).slurm)
    with pytest.raises(SlurmError, match="refused the token for user 'root'") as err:
        await backend.nodes()
    assert "eyJhbGciOiJIUzI1NiJ9" not in str(err.value)


@pytest.mark.parametrize("slurm", SLURM_MATRIX, ids=SLURM_IDS, indirect=True)
async def test_each_drained_node_is_read_with_its_own_reason(slurm: Sandbox) -> None:
    """Three nodes drained in the same state by three incidents: each is read as drained by its
    own (24.11 on, `sinfo --json` gave all three the first one's reason: the chaos soak's hour saw
    the coordinator free slots for nodes still out). One question, asked once."""
    for node in ("gpu01", "gpu02", "gpu03"):
        slurm.slurm("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason=gpuheal-c-{node}: XID 79")
    backend = build_slurm(Settings.from_env(slurm.env()).slurm)
    await backend.nodes()  # learn the schema (and, over REST, the API version)
    before = backend.calls
    nodes = await backend.nodes()
    assert {n: nodes[n].reason for n in ("gpu01", "gpu02", "gpu03")} == {
        n: f"gpuheal-c-{n}: XID 79" for n in ("gpu01", "gpu02", "gpu03")
    }
    assert all(nodes[n].drained for n in ("gpu01", "gpu02", "gpu03"))
    assert backend.calls - before == 1
