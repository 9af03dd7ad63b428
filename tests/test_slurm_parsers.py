"""Slurm's JSON, as three releases really print it (tests/data/slurm/<version>/, captured by
tests/data/slurm/capture.sh from the real daemons), read into the project's models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuheal.clients.slurm.base import UnknownSchema
from gpuheal.clients.slurm.cli import wrapped
from gpuheal.clients.slurm.hostlist import expand
from gpuheal.clients.slurm.parsers import parse_jobs, parse_node_line, parse_nodes, parse_topology, schema_of
from gpuheal.core.models.slurm import NodeInfo

DATA = Path(__file__).parent / "data" / "slurm"
VERSIONS = {"22.05": "v0.0.38", "24.11": "v0.0.42", "26.05": "v0.0.45"}


def load(version: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / version / f"{name}.json").read_text())
    return data


@pytest.mark.parametrize("version", VERSIONS)
def test_the_schema_is_named_by_each_release(version: str) -> None:
    assert schema_of(load(version, "squeue-jobs")) == VERSIONS[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_nodes_and_a_drain_with_its_reason(version: str) -> None:
    idle = parse_nodes(load(version, "sinfo-empty"))
    assert sorted(idle) == ["gpu01", "gpu02", "gpu03"]
    assert {n.state for n in idle.values()} == {"idle"} and not any(n.drained for n in idle.values())
    drained = parse_nodes(load(version, "sinfo-drain"))
    assert drained["gpu02"].drained and drained["gpu02"].reason == "gpuheal-c-gpu02: XID 79"
    assert drained["gpu02"].state == "allocated"  # draining: busy with DRAIN, not yet drained
    assert not drained["gpu01"].drained


def test_sinfo_groups_drained_nodes_under_one_reason_scontrol_gives_each_its_own() -> None:
    """26.05, from the chaos soak's `west` (four nodes drained by four incidents, all IDLE+DRAIN):
    sinfo's group carries the first node's reason for all four; scontrol reads each node's own,
    which is what SlurmCli.nodes reads from 24.11 on."""
    grouped = parse_nodes(load("26.05", "sinfo-drained-grouped"))
    own = parse_nodes(load("26.05", "scontrol-nodes-drained"))
    drained = sorted(n for n, info in own.items() if info.drained)
    assert drained == ["gpu12", "gpu15", "gpu17", "gpu18"]
    assert {n: own[n].reason.split(":")[0] for n in drained} == {n: f"gpuheal-west-{n}" for n in drained}
    assert {grouped[n].reason.split(":")[0] for n in drained} == {"gpuheal-west-gpu12"}  # Slurm's grouping
    assert {n: (i.state, i.flags, i.partitions) for n, i in own.items()} == {
        n: (i.state, i.flags, i.partitions) for n, i in grouped.items()
    }


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_scontrol_and_slurmrestd_nodes_read_alike(version: str) -> None:
    assert sorted(parse_nodes(load(version, "scontrol-nodes"))) == ["gpu01", "gpu02", "gpu03"]
    rest = parse_nodes(load(version, "rest-nodes"))
    assert rest["gpu02"].drained and rest["gpu02"].reason == "x: y"
    assert parse_nodes(load(version, "rest-node-nosuch")) == {}  # FUTURE or unknown: nodes null


@pytest.mark.parametrize("version", VERSIONS)
def test_jobs_with_their_progress_requeue_flag_and_nodes(version: str) -> None:
    jobs = {j.name: j for j in parse_jobs(load(version, "squeue-jobs"))}
    single, noreq, twonode, held = jobs["single"], jobs["noreq"], jobs["twonode"], jobs["held"]
    assert (single.state, single.nodes, single.node_count, single.requeueable) == ("RUNNING", "gpu01", 1, True)
    assert single.progress is not None and (single.progress.step, single.progress.checkpoint_step) == (3, 2)
    assert single.required_nodes == "gpu01" and single.user == "root"
    assert not noreq.requeueable and noreq.excluded_nodes == "gpu01"
    assert twonode.node_count == 2 and expand(twonode.nodes) == ["gpu01", "gpu02"]
    assert (held.state, held.state_reason) == ("PENDING", "JobHeldUser")
    if version != "22.05":  # 22.05 does not report --mail-user
        assert single.mail_user == "ops@example.com"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_requeued_job_waits_with_a_higher_restart_count(version: str) -> None:
    single = next(j for j in parse_jobs(load(version, "squeue-requeued")) if j.name == "single")
    assert (single.state, single.state_reason, single.restart_count) == ("PENDING", "BeginTime", 1)


def test_an_unknown_schema_is_refused_and_named() -> None:
    data = load("26.05", "squeue-jobs")
    data["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.46"
    with pytest.raises(UnknownSchema, match=r"Slurm 26\.05\.\d+ answered with JSON schema 'data_parser/v0.0.46'"):
        parse_jobs(data)
    with pytest.raises(UnknownSchema, match="none named"):
        parse_nodes({"nodes": []})


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b[1-2],a", ["a", "b1", "b2"]),
        ("", []),
    ],
)
def test_hostlists_expand_as_slurm_does(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize("bad", ["gpu[01-03", "gpu01]", "gpu[3-1]", "gpu[a-b]"])
def test_a_malformed_hostlist_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        expand(bad)


# `scontrol -o show node NAME` on 22.05 (captured from the sandbox), and what its `sinfo --json`
# said of the same nodes at the same moment: the one-node text read must agree with it.
SHOW_NODE_2205 = {
    "fleet0001": (
        "NodeName=fleet0001 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=N/A AvailableFeatures=(null) "
        "ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost Port=21924  RealMemory=1000 "
        "AllocMem=0 FreeMem=N/A Sockets=4 Boards=1 State=UNKNOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 "
        "Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=None SlurmdStartTime=None LastBusyTime=Unknown "
        "CfgTRES=cpu=4,mem=1000M,billing=4 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s "
        "ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=gpuheal-sandbox-fleet0001: XID 79: GPU fell off the bus: "
        "the GPU is gone, replace the node [root@2026-11-30T17:44:22]",
        NodeInfo(
            name="fleet0001",
            state="unknown",
            flags=("DRAIN", "NOT_RESPONDING"),
            reason="gpuheal-sandbox-fleet0001: XID 79: GPU fell off the bus: the GPU is gone, replace the node",
            partitions=("gpu",),
        ),
    ),
    "gpu01": (
        "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=3.63 "
        "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost "
        "Port=21918 Version=22.05.8 OS=Linux 6.18.44-fc-v509 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 "
        "AllocMem=0 FreeMem=19982 Sockets=4 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
        "MCS_label=N/A Partitions=gpu,debug  BootTime=2026-11-30T13:37:30 SlurmdStartTime=2026-11-30T17:43:39 "
        "LastBusyTime=2026-11-30T17:43:39 CfgTRES=cpu=4,mem=1000M,billing=4 AllocTRES= CapWatts=n/a "
        "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s",
        NodeInfo(name="gpu01", state="idle", flags=(), reason="", partitions=("gpu", "debug")),
    ),
}


@pytest.mark.parametrize("name", sorted(SHOW_NODE_2205))
def test_one_node_read_from_scontrols_text_agrees_with_sinfos_json(name: str) -> None:
    line, expected = SHOW_NODE_2205[name]
    info = parse_node_line(line)
    assert info == expected and info is not None and info.drained == ("DRAIN" in expected.flags)


def test_a_line_that_is_not_a_node_is_refused() -> None:
    assert parse_node_line("Node gpu99 not found") is None


def test_topology_names_each_nodes_leaf_switch_and_block() -> None:
    tree = (
        "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[01-02]\n"
        "SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=gpu03\n"
        "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu[01-03] Switches=leaf[1-2]\n"
    )
    assert parse_topology(tree) == {
        "gpu01": {"switch": "leaf1"},
        "gpu02": {"switch": "leaf1"},
        "gpu03": {"switch": "leaf2"},
    }
    block = "BlockName=b1 BlockIndex=0 Nodes=gpu[01-04] BlockSize=4\nAggregatedBlock=b1 BlockSize=4 Nodes=gpu[01-04]\n"
    assert parse_topology(block)["gpu04"] == {"block": "b1"}
    assert parse_topology("") == {} and parse_topology("SwitchName=s Level=0 Nodes=(null)") == {}


@pytest.mark.parametrize(
    "wrapper",
    [
        ["ssh", "login01"],
        ["sudo", "ssh", "login01"],
        ["timeout", "30", "ssh", "-p", "22", "l1"],
        ["/usr/bin/autossh", "l"],
    ],
)
def test_a_remote_shell_anywhere_in_the_wrapper_gets_one_quoted_word(wrapper: list[str]) -> None:
    argv = ("scontrol", "update", "nodename=gpu01", "reason=x (y); $(rm -rf /)")
    assert wrapped(wrapper, argv) == [*wrapper, "scontrol update nodename=gpu01 'reason=x (y); $(rm -rf /)'"]


def test_a_local_wrapper_passes_the_arguments_as_they_are() -> None:
    wrapper = ["chroot", "/srv/slurm-26.05", "/usr/bin/env", "-i", "SLURM_CONF=/etc/slurm.conf"]
    assert wrapped(wrapper, ("sinfo", "--json")) == [*wrapper, "sinfo", "--json"]


def test_a_job_whose_count_is_left_out_counts_the_nodes_it_lists() -> None:
    # A count missing (or 0) must never make a job on two nodes look like a one-node job.
    meta = {"meta": {"plugin": {"data_parser": "data_parser/v0.0.38"}}}
    jobs = [{"job_id": 7, "job_state": "RUNNING", "nodes": "gpu[01-02]", "node_count": 0}]
    (job,) = parse_jobs({**meta, "jobs": jobs})
    assert job.node_count == 2
    (alone,) = parse_jobs({**meta, "jobs": [{"job_id": 8, "job_state": "PENDING", "nodes": ""}]})
    assert alone.node_count == 1
