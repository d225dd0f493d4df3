"""The facilities' job-count rules as behaviour (machines/*.yaml `job_limits`): queue choice
counts what the user already has (a job submitted by hand too) plus what the call adds, skips
a full queue and says so, or refuses the whole call before anything is written; `machines
check` finds where a profile and the live scheduler differ. Live on the test servers' rule
queues (scripts/pbs-server.sh configure_queue_rules, scripts/slurm-cluster.sh QOS_RULES), which
take jobs and never start them; parsers on recorded outputs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers.schedulers import PBS_BIN, scheduler_script_held
from helpers.ssh import ssh_config

from mmm_orch.config.registry import load_machine
from mmm_orch.planning import drift
from mmm_orch.planning.occupancy import NOTHING_YET, QueueLoad, past_limit
from mmm_orch.schedulers.pbs import parse as pbs_parse
from mmm_orch.schedulers.slurm import drift as slurm_drift
from mmm_orch.schedulers.slurm import parse as slurm_parse
from mmm_orch.schedulers.states import OpenJob

FIXTURES = Path(__file__).parent / "fixtures"
REPO_MACHINES = Path(__file__).parent.parent / "machines"
# The rule queues are this file's alone: its live tests run one after another on one worker.
RULES = pytest.mark.xdist_group("queue-rules")
QSUB, QSTAT, QSELECT, QDEL, QMGR = (f"{PBS_BIN}/{c}" for c in ("qsub", "qstat", "qselect",
                                                              "qdel", "qmgr"))


def job(native_id: str, names: set[str], running: bool = False, mine: bool = True,
        account: str = "P") -> OpenJob:
    return OpenJob(native_id, frozenset(names), running, mine, account)


# --- pure: counting against limits ---------------------------------------------------------

def test_limits_count_as_the_facility_counts():
    aurora = load_machine("aurora")
    capacity, prod = aurora.queue("capacity"), aurora.queue("prod")
    directives = ("-q capacity",)
    # capacity: 5 queued or running per user (refused past it); 2 running only makes jobs wait
    four = QueueLoad(tuple(job(f"{i}.aurora", {"capacity"}, running=i < 2) for i in range(4)), "qstat")
    assert past_limit(aurora, capacity, directives, four, "P", 1) is None
    said = past_limit(aurora, capacity, directives, four, "P", 2)
    assert "5 running or queued jobs per user" in said and "you have 4 there" in said
    assert "0.aurora, 1.aurora, 2.aurora, 3.aurora" in said and "this adds 2" in said
    # another user's jobs count for a project limit, not for a user limit
    theirs = QueueLoad(tuple(job(f"{i}.a", {"small"}, mine=False) for i in range(100)), "qstat")
    assert past_limit(aurora, capacity, directives, theirs, "P", 5) is None
    full = past_limit(aurora, prod, ("-q prod",), theirs, "P", 1)
    assert "100 running or queued jobs per project" in full and "project P has 100" in full
    assert past_limit(aurora, prod, ("-q prod",), theirs, "Q", 1) is None  # another project
    # a sweep's earlier points count
    assert "1 planned before and 1 more" in past_limit(
        aurora, aurora.queue("debug-scaling"), ("-q debug-scaling",),
        NOTHING_YET.adding("debug-scaling", 1), "P", 1)


def test_a_qos_on_a_partition_counts_only_its_own_jobs_and_the_machine_limit_counts_all():
    frontier = load_machine("frontier")
    debug = frontier.queue("debug")
    load = QueueLoad((job("1", {"batch", "normal"}),), "squeue")
    assert past_limit(frontier, debug, ("-p batch", "-q debug"), load, None, 1) is None
    load = QueueLoad((job("2", {"batch", "debug"}),), "squeue")
    assert "one job in any state" in past_limit(frontier, debug, ("-p batch", "-q debug"), load,
                                                None, 1)
    many = QueueLoad(tuple(job(str(i), {"extended", "normal"}) for i in range(100)), "squeue")
    said = past_limit(frontier, frontier.queue("batch"), ("-p batch",), many, None, 1)
    assert said.startswith("frontier's queues takes 100 running or queued jobs per user")


def test_facility_reviews_say_what_the_limits_make_of_a_sweep_and_a_chain(cli):
    out = cli("sweep", "aurora", "llama3_8b", "--nodes", "4,8,16", "-A", "P", "--dry-run")
    assert out.code == 0, out.err
    queues = [line.split("queue ")[1].split(",")[0] for line in out.out.splitlines()
              if line.strip()[:1].isdigit()]
    assert queues == ["debug-scaling", "capacity", "capacity"]
    assert "point 2: queue capacity" in out.out and "Max 1 job running/accruing/queued" in out.out
    chain = cli("submit", "polaris", "llama3_8b", "-N", "4", "-A", "P", "--chain", "2",
                "--dry-run")
    assert chain.code == 0, chain.err
    assert "# Queue: capacity, first queue that fits nodes and walltime and the job limits " \
           "(skipped: queue debug-scaling takes 1 running or queued job per user" in chain.out
    four = cli("submit", "polaris", "llama3_8b", "-N", "4", "-A", "P", "--chain", "4",
               "--dry-run")
    assert four.code == 2 and four.out == "" and len(four.err.strip().splitlines()) == 1
    assert "capacity takes 2 running or queued jobs per user" in four.err
    assert "Take a --queue with room (preemptable)" in four.err


@pytest.mark.parametrize("value, said", [
    ("-1", "greater than or equal to 0"), (".nan", "not a float"), ("two", "not a str"),
    ("2000000", "less than or equal to 1000000")])
def test_bad_limits_in_a_user_profile_exit_2(cli, isolated, value, said):
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "ruled.yaml").write_text(
        "extends: pbs-local\nname: ruled\nqueues:\n  - name: workq\n    max_nodes: 3\n"
        "    max_walltime: '01:00:00'\n    job_limits:\n"
        f"      - {{jobs: {value}, per: user, counts: any, source: here}}\n")
    result = cli("render", "ruled", "dist_check")
    assert result.code == 2 and "queues[0].job_limits[0].jobs" in result.err and said in result.err
    (machines / "ruled.yaml").write_text((machines / "ruled.yaml").read_text().replace(
        f"jobs: {value}, per: user, counts: any", "jobs: 1, per: user, counts: sometimes"))
    result = cli("render", "ruled", "dist_check")
    assert result.code == 2 and "counts" in result.err and "'eligible'" in result.err


# --- pure: parsers and drift on recorded outputs -------------------------------------------

def test_pbs_queue_parser_and_drift_against_auroras_recorded_configuration():
    live = pbs_parse.parse_queues((FIXTURES / "pbs" / "qstat_Qf_F_json_aurora_queues.json")
                                  .read_text())
    queues = {q.name: q for q in live}
    assert queues["debug"].limits == {(1, "user", "running"), (1, "user", "queued")}
    assert queues["tiny"].limits == {(10, "project", "any")}
    assert queues["prod"].kind == "route" and queues["prod"].destinations[:2] == ("tiny", "small")
    assert queues["debug-scaling"].max_nodes == 31 and queues["debug"].max_walltime == 3600
    found = drift.differences(load_machine("aurora"), live)
    assert "queue debug-scaling: max_nodes 256 in the profile, 31 on the server" in found
    assert "queue debug: job limit 1 running or queued job per user in the profile, not on " \
           "the server" in found
    assert any(line.startswith("queue prod: the server routes to tiny, small, medium") for line
               in found)
    assert "queue prod-large: on the server, not in the profile" in found
    assert "queue capacity: in the profile, not on the server" in found  # not in that recording


def test_slurm_parsers_and_drift_on_the_test_clusters_recorded_configuration():
    live = (slurm_parse.parse_partitions((FIXTURES / "slurm" /
                                          "scontrol_show_partition_oneliner_mmmtest.txt").read_text())
            + slurm_parse.parse_qos((FIXTURES / "slurm" / "sacctmgr_show_qos_mmmtest.txt")
                                    .read_text()))
    named = {(q.kind, q.name): q for q in live}
    assert named["partition", "short"].max_nodes == 2
    assert named["partition", "short"].max_walltime == 1200
    assert named["partition", "debug"].max_nodes is None  # UNLIMITED
    assert named["qos", "pair"].limits == {(2, "user", "any"), (1, "user", "running")}
    assert named["qos", "team"].limits == {(2, "project", "any")}
    assert drift.differences(load_machine("slurm-local"), live) == []
    assert slurm_drift.slurm_names(("-p batch", "-q debug")) == {"partition": "batch", "qos": "debug"}


# --- live: PBS --------------------------------------------------------------------------

def _ruled_profile(isolated: Path, base: str, order: list[str]) -> str:
    """A user profile over `base` whose automatic queues are `order`, tried in that order."""
    import yaml

    queues = yaml.safe_load((REPO_MACHINES / f"{base}.yaml").read_text())["queues"]
    queues.sort(key=lambda q: order.index(q["name"]) if q["name"] in order else len(order))
    for queue in queues:
        queue["automatic"] = queue["name"] in order
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True, exist_ok=True)
    (machines / f"{base}-ruled.yaml").write_text(yaml.safe_dump(
        {"extends": base, "name": f"{base}-ruled", "queues": queues}))
    return f"{base}-ruled"


# (set back one by one: `pbs-server.sh up` would restart the MoM under other tests' jobs)
RULES_AS_CONFIGURED = ("set queue single max_queued = [u:PBS_GENERIC=1]",
                       "set queue single resources_max.walltime = 01:00:00",
                       "set queue pair max_run = [u:PBS_GENERIC=1]",
                       "set queue routed-large resources_min.nodect = 3")


def _pbs_jobs(queues: tuple[str, ...]) -> list[str]:
    ids = []
    for queue in queues:
        ids += subprocess.run([QSELECT, "-q", queue], capture_output=True, text=True).stdout.split()
    return ids


@pytest.fixture
def pbs_rule_queues_empty(pbs_server):
    """The PBS rule queues hold none of this user's jobs before and after the test, and their
    rules are as pbs-server.sh sets them after it (no `up` sets them meanwhile)."""
    queues = ("single", "pair", "routed", "routed-small", "routed-large")

    def clear():
        for native in _pbs_jobs(queues):
            subprocess.run([QDEL, "-W", "force", native], capture_output=True)
    with scheduler_script_held("pbs-server"):
        clear()
        yield queues
        clear()
        for setting in RULES_AS_CONFIGURED:  # what the tests change, as pbs-server.sh sets it
            subprocess.run([QMGR, "-c", setting], check=True)


@RULES
def test_pbs_a_hand_submitted_job_counts_and_sweeps_and_chains_are_rerouted_or_refused_whole(
        cli, isolated, pbs_rule_queues_empty, tmp_path):
    script = tmp_path / "hand.sh"
    script.write_text("#!/bin/sh\nsleep 1\n")
    hand = subprocess.run([QSUB, "-q", "single", str(script)], capture_output=True, text=True,
                          check=True).stdout.strip()
    # named: refused, one line naming the limit, its source and the hand-submitted job
    refused = cli("submit", "pbs-local", "-q", "single", "--", "sleep", "1")
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert f"you have 1 there ({hand}; pbs on this computer)" in refused.err
    assert "max_queued = [u:PBS_GENERIC=1]" in refused.err
    assert cli("status", "--all", "--json").out.strip() in ("[]", "")
    # a sweep of three over the queues single, pair, workq: single is full, pair takes two
    name = _ruled_profile(isolated, "pbs-local", ["single", "pair", "workq"])
    sweep = cli("sweep", name, "--nodes", "1,2,3", "-t", "00:05:00", "--no-env-check", "--",
                "sleep", "1")
    assert sweep.code == 0, sweep.err
    assert len(_pbs_jobs(("pair",))) == 2 and _pbs_jobs(("single",)) == [hand]
    records = json.loads(cli("status", "--sweep", "1", "--json").out)
    assert len(records) == 3
    # a sweep that cannot all go into the queue it names is refused whole
    before = _pbs_jobs(pbs_rule_queues_empty)
    whole = cli("sweep", "pbs-local", "-q", "pair", "--nodes", "1,2", "-t", "00:05:00", "--",
                "sleep", "1")
    assert whole.code == 2 and "queue pair takes 2 running or queued jobs per user" in whole.err
    assert _pbs_jobs(pbs_rule_queues_empty) == before
    assert len(json.loads(cli("status", "--all", "--json").out)) == 3  # the sweep's, no more
    # a chain of three links on a one-job queue: refused, naming a queue that holds it
    chain = cli("submit", "pbs-local", "llama3_debug", "-q", "single", "--chain", "3", "-t",
                "00:05:00")
    assert chain.code == 2 and "Take a --queue with room (workq" in chain.err, chain.err
    assert _pbs_jobs(pbs_rule_queues_empty) == before


@RULES
def test_pbs_project_limits_count_the_projects_jobs_in_a_routing_queues_tiers(
        cli, pbs_rule_queues_empty):
    for nodes in ("1", "3"):  # one goes to each tier
        ok = cli("submit", "pbs-local", "-q", "routed", "-A", "projX", "-N", nodes, "-t",
                 "00:05:00", "--", "sleep", "1")
        assert ok.code == 0, ok.err
    tiers = subprocess.run([QSELECT, "-q", "routed-small"], capture_output=True, text=True).stdout
    assert tiers.split(), "the routing queue sent the 1-node job to routed-small"
    full = cli("submit", "pbs-local", "-q", "routed", "-A", "projX", "-t", "00:05:00", "--",
               "sleep", "1")
    assert full.code == 2 and "2 running or queued jobs per project" in full.err, full.err
    assert "project projX has 2 there" in full.err
    other = cli("submit", "pbs-local", "-q", "routed", "-A", "projY", "-t", "00:05:00", "--",
                "sleep", "1")
    assert other.code == 0, other.err


@RULES
def test_pbs_machines_check_finds_no_drift_then_each_change_here_and_over_ssh(
        cli, sshd, pbs_rule_queues_empty):
    ssh_config(Path(os.environ["HOME"]), sshd)
    clean = cli("machines", "check", "pbs-local")
    assert clean.code == 0 and "match the live scheduler" in clean.out, clean.out
    over_ssh = cli("machines", "check", "pbs-local", "--host", "login")
    assert over_ssh.code == 0 and "match the live scheduler" in over_ssh.out, over_ssh.err
    assert cli("machines", "check", "slurm-local", "--host", "login").code == 0
    for change in ("set queue pair max_run = [u:PBS_GENERIC=3]",
                   "set queue routed-large resources_min.nodect = 2",
                   "set queue single resources_max.walltime = 00:45:00",
                   "set queue single max_queued = [u:PBS_GENERIC=4]"):
        subprocess.run([QMGR, "-c", change], check=True)
    drifted = cli("machines", "check", "pbs-local", "--json")
    assert drifted.code == 1
    assert sorted(json.loads(drifted.out)["differences"]) == [
        "queue pair: job limit 1 running job per user in the profile, not on the server",
        "queue pair: job limit of 3 (running, per user) on the server, not in the profile",
        "queue routed tier routed-large: min_nodes 3 in the profile, 2 on the server",
        "queue single: job limit 1 running or queued job per user in the profile, not on the "
        "server",
        "queue single: job limit of 4 (any, per user) on the server, not in the profile",
        "queue single: max_walltime 01:00:00 in the profile, 00:45:00 on the server"]
    over_ssh = cli("machines", "check", "pbs-local", "--host", "login")
    assert over_ssh.code == 1 and "job limit of 4 (any, per user) on the server" in over_ssh.out


# --- live: Slurm ------------------------------------------------------------------------

@pytest.fixture
def slurm_rules_reset(slurm_cluster):
    """The rule QOS hold no jobs before and after the test, and what the tests change is put
    back after it (no `up` sets it meanwhile: slurm-cluster.sh sets the QOS afresh)."""
    def clear():  # (scancel takes one QOS at a time)
        for qos in ("single", "pair", "team"):
            subprocess.run(["scancel", f"--qos={qos}"], capture_output=True)
    with scheduler_script_held("slurm-cluster"):
        clear()
        yield
        clear()
        subprocess.run(["sacctmgr", "-i", "modify", "qos", "pair", "set", "MaxJobsPerUser=1",
                        "MaxSubmitJobsPerUser=2"], capture_output=True)
        subprocess.run(["scontrol", "update", "partitionname=short", "MaxNodes=2", "MaxTime=20"],
                       capture_output=True)


def _squeue(qos: str) -> list[str]:
    return subprocess.run(["squeue", "--noheader", "--format=%i", f"--qos={qos}"],
                          capture_output=True, text=True).stdout.split()


@RULES
def test_slurm_a_hand_submitted_job_counts_and_a_sweep_is_rerouted_or_refused_whole(
        cli, isolated, slurm_rules_reset, tmp_path):
    hand = subprocess.run(["sbatch", "--parsable", "-p", "parked", "-q", "single", "--wrap",
                           "sleep 1"], capture_output=True, text=True, check=True).stdout.strip()
    refused = cli("submit", "slurm-local", "-q", "single", "--", "sleep", "1")
    assert refused.code == 2 and f"you have 1 there ({hand}; slurm on this computer)" in refused.err
    assert _squeue("single") == [hand]
    name = _ruled_profile(isolated, "slurm-local", ["single", "pair", "debug"])
    review = cli("sweep", name, "--nodes", "1,2,3", "-t", "00:05:00", "--dry-run", "--",
                 "sleep", "1")
    assert review.code == 0, review.err
    queues = [line.split("queue ")[1].split(",")[0] for line in review.out.splitlines()
              if line.strip()[:1].isdigit()]
    assert queues == ["pair", "pair", "debug"]
    whole = cli("sweep", "slurm-local", "-q", "team", "--nodes", "1,2,3", "-t", "00:05:00",
                "--", "sleep", "1")
    assert whole.code == 2 and "MaxSubmitJobsPerAccount=2" in whole.err, whole.err
    assert _squeue("team") == [] and cli("status", "--all", "--json").out.strip() in ("[]", "")
    chain = cli("submit", "slurm-local", "llama3_debug", "-q", "single", "--chain", "3", "-t",
                "00:05:00")
    assert chain.code == 2 and "Take a --queue with room (debug" in chain.err, chain.err
    assert _squeue("single") == [hand]
    two = cli("sweep", "slurm-local", "-q", "team", "--nodes", "1,2", "-t", "00:05:00", "--",
              "sleep", "1")
    assert two.code == 0, two.err
    assert len(_squeue("team")) == 2


@RULES
def test_slurm_machines_check_finds_no_drift_then_each_change(cli, slurm_rules_reset):
    clean = cli("machines", "check", "slurm-local")
    assert clean.code == 0, clean.out
    subprocess.run(["sacctmgr", "-i", "modify", "qos", "pair", "set", "MaxJobsPerUser=2"],
                   check=True, capture_output=True)
    subprocess.run(["scontrol", "update", "partitionname=short", "MaxNodes=3", "MaxTime=30"],
                   check=True)
    drifted = cli("machines", "check", "slurm-local")
    assert drifted.code == 1
    assert "queue pair: job limit of 2 (running, per user) on the server" in drifted.out
    assert "queue short: max_nodes 2 in the profile, 3 on the server" in drifted.out
    assert "queue short: max_walltime 00:20:00 in the profile, 00:30:00 on the server" in drifted.out


def test_a_sweep_the_queues_cannot_take_is_told_of_one_allocation_for_all_its_points(cli):
    result = cli("sweep", "slurm-local", "--nodes", "1,2", "-q", "single", "-t", "00:20:00",
                 "--dry-run", "--", "true")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "--queue 'single' is full for you" in result.err
    assert ("or run the 2 points side by side in one job of 2 nodes for 00:41:00 (at most "
            "1.37 node-hours): submit it with --pack, or get the allocation with `salloc "
            "--partition=debug --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 -t 00:41:00` and "
            "run this sweep in it with --within") in result.err
    packed = cli("sweep", "slurm-local", "--nodes", "1,2", "-t", "00:20:00", "--pack",
                 "--dry-run", "--", "true")  # what it said: one job, on 2 nodes, for 00:41:00
    assert packed.code == 0, packed.err
    assert "one job of 2 node(s), queue debug, walltime 00:41:00, at most 1.37 node-hours" in \
        packed.out
    polaris = cli("sweep", "polaris", "llama3_8b", "-A", "P", "--nodes", "4,8", "-q",
                  "debug-scaling", "--dry-run")
    assert "in one job of 8 nodes for 02:01:00, which no queue of polaris takes" in polaris.err
