"""What runs cost: the charging rules in the profiles (each with its source), the price of a plan
before it is submitted (render, --dry-run, sweeps, chains, spares), budgets that refuse a plan
with nothing written, the charge each job gets from the scheduler's own elapsed time and node
count on the live Slurm cluster and PBS server, `usage` summing them, balances parsed from the
facilities' recorded outputs, and a balance tool that is missing, slow or failing."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from helpers.cli import run_cli
from helpers.jobs import wait_state
from helpers.profiles import PACED_SPEC, facility_profiles, write_spec

from mmm_orch.planning import Request, resolve
from mmm_orch.records.balance import parse_sbank, parse_showusage
from mmm_orch.schedulers.pbs.parse import parse_qstat_dsv, statuses
from mmm_orch.schedulers.slurm.parse import SACCT_FIELDS, parse_sacct_parsable

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def state_dir() -> Path:
    import os

    return Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch"


# -- the rules, with their sources --------------------------------------------------------------

@pytest.mark.parametrize("machine", facility_profiles())
def test_every_charging_fact_in_a_facility_profile_has_a_source(machine):
    text = (REPO / "mmm_orch" / "machines" / f"{machine}.yaml").read_text()
    data = yaml.safe_load(text)
    charging = data["charging"]
    assert charging["source"] and charging["unit"]
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("charging:"))
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"^\S", lines[i]))
    block = lines[start:end]
    # Every value line is sourced: a comment beside it, or the block's comments and source above.
    for key in ("factor", "charged_for", "whole_nodes"):
        assert any(line.strip().startswith(f"{key}:") for line in block), (machine, key)
    assert "factor:" in "\n".join(block) and "#" in next(l for l in block if "factor:" in l)
    # A queue's own charge factor says where it comes from, or that it is unverified.
    for i, line in enumerate(lines):
        if "charge_factor:" in line:
            assert lines[i - 1].strip().startswith("#") or "#" in line, (machine, line)
    if "balance" in charging:
        assert charging["balance"]["source"], machine


def test_the_manual_tables_the_four_facilities_charging_rules():
    section = (REPO / "docs" / "guides" / "costs.md").read_text()
    for machine in facility_profiles():
        assert re.search(rf"^\| {machine} \|", section, re.M), machine


# -- the price of a plan ------------------------------------------------------------------------

def test_a_plan_costs_its_nodes_and_spares_for_its_walltime_at_the_queues_factor():
    plan = resolve(Request("aurora", "llama3_8b", nodes=4, account="p", walltime="02:00:00",
                           spare_nodes=1))
    assert plan.cost.nodes == 5 and plan.cost.most == pytest.approx(10.0)
    # Charged for the time used: a job that ran 30 minutes on its 5 nodes.
    assert plan.cost.charge(5, 1800) == pytest.approx(2.5)
    premium = resolve(Request("perlmutter", "llama3_8b", nodes=4, account="m1", queue="premium",
                              walltime="01:00:00"))
    assert premium.cost.factor == 2.0 and premium.cost.most == pytest.approx(8.0)
    assert premium.cost.unit == "GPU node-hours"


def test_render_and_dry_run_show_the_most_it_can_cost_and_why(cli, isolated):
    script = cli("render", "aurora", "llama3_8b", "-N", "4", "-A", "p", "--spare-nodes", "2").out
    assert "# Cost: at most 6.00 node-hours (6 node(s) x 01:00:00; charged for the time used)." \
        in script
    assert "# Spares: 2 node(s) held for failover are allocated, so charged like active ones: " \
        "2.00 node-hours of that." in script
    # (four links at once: only preemptable holds them, 20 per project; see test_queue_rules.py)
    chain = cli("submit", "polaris", "llama3_8b", "-N", "4", "-A", "p", "--chain", "4",
                "-q", "preemptable",
                "--dry-run").out
    assert re.search(r"# Chain of 4: at most 16\.00 node-hours \(every link runs its whole "
                     r"walltime\); expected 15\.\d\d \(each link stops", chain), chain
    sweep = cli("sweep", "frontier", "llama3_8b", "-N", "2,4", "-A", "p", "--dry-run").out
    assert "at most 2.00 node-hours" in sweep and "at most 4.00 node-hours" in sweep
    assert "Cost: at most 6.00 node-hours for the 2 points" in sweep
    assert not state_dir().exists()


# -- budgets ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "0", "abc", "nan", "inf"])
def test_a_budget_that_is_not_a_positive_number_is_refused(cli, isolated, value):
    result = cli("submit", "local", "dist_check", "--max-node-hours", value, "--no-env-check")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "--max-node-hours" in result.err and "a positive number of node-hours" in result.err
    assert not state_dir().exists()


def test_a_job_over_its_budget_is_refused_with_the_numbers_and_nothing_written(cli, isolated):
    result = cli("submit", "local", "fsdp", "--walltime", "02:00:00", "--max-node-hours", "1.5",
                 "--no-env-check")
    assert result.code == 2, result.err
    assert result.err.strip() == ("mmm-orch: error: --max-node-hours 1.50: this job can be "
                                  "charged up to 2.00 node-hours; allowed: a budget of at least "
                                  "that, or fewer nodes or a shorter walltime")
    assert not state_dir().exists()


def test_an_accounts_budget_counts_what_it_spent(cli, isolated, pbs_server, leftovers_cancelled):
    """budgets.yaml gives account MMMTEST 0.5 node-hours on pbs-local: a 1-hour 1-node job is
    refused at once; a 10-minute one goes, and while it is open it holds its 0.17, so that a
    sweep of 1 and 2 nodes for 10 minutes (0.5) is refused (exit 2, the numbers, nothing
    recorded)."""
    config = Path(isolated.parent / "config" / "mmm-orch")
    config.mkdir(parents=True)
    (config / "budgets.yaml").write_text(
        "budgets:\n  - {account: MMMTEST, machine: pbs-local, node_hours: 0.5}\n")
    over = cli("submit", "pbs-local", "--walltime", "01:00:00", "--", "sleep", "1")
    assert over.code == 2 and "account 'MMMTEST' on pbs-local: this job can be charged up to " \
        "1.00 node-hours; 0.00 spent and up to 0.00 held by open jobs leave 0.50 of its budget " \
        "of 0.50" in over.err, over.err
    assert not state_dir().exists()
    first = cli("submit", "pbs-local", "--queue", "parked", "--walltime", "00:10:00", "--",
                "sleep", "1")
    assert first.code == 0, first.err
    second = cli("sweep", "pbs-local", "-N", "1,2", "--queue", "parked", "--walltime",
                 "00:10:00", "--", "sleep", "1")
    assert second.code == 2 and "the sweep's 2 points can be charged up to 0.50 node-hours; 0.00 " \
        "spent and up to 0.17 held by open jobs leave 0.33" in second.err, second.err
    assert len(json.loads(cli("status", "--all", "--json").out)) == 1


def test_a_sweep_over_its_budget_submits_nothing(cli, isolated, slurm_cluster):
    name = f"budget{time.time_ns() % 10**9}"
    result = cli("sweep", "slurm-local", "--name", name, "-N", "1,2,3", "--walltime", "00:30:00",
                 "--max-node-hours", "2.5", "--", "sleep", "1")
    assert result.code == 2, result.err
    assert "the sweep's 3 points can be charged up to 3.00 node-hours" in result.err
    assert not state_dir().exists()
    queued = subprocess.run(["squeue", "--noheader", f"--name={name}"], capture_output=True,
                            text=True, check=True)
    assert queued.stdout == ""


def test_a_chain_stops_linking_at_its_budget_and_says_so(cli, isolated, slurm_cluster,
                                                         leftovers_cancelled):
    """Links of one node and two minutes (0.0333 node-hours each) under a budget of 0.05: link 1
    fits, and once it has run (about 100 s, stopping before its walltime) link 2 could pass the
    budget, so the chain ends there and cancels the links still waiting. Two minutes leave a
    loaded host's start room; the steps are paced (they wait rather than compute)."""
    write_spec(isolated, "llama_chain", PACED_SPEC)
    result = cli("submit", "slurm-local", "llama_chain", "-N", "1", "--set", "steps=1000000",
                 "--walltime", "00:02:00", "--chain", "3", "--max-node-hours", "0.05")
    assert result.code == 0, result.err
    deadline = time.monotonic() + 900
    while True:
        rows = json.loads(cli("status", "--all", "--json").out)
        if all(r["state"] in ("completed", "failed", "cancelled", "timeout", "hung")
               for r in rows):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(3)
    # The chain's line read after every link has ended (read before, it could still show the
    # last link running: a link may end between the two reads).
    line = cli("status").out.splitlines()[1]
    assert ": budget: 0.05 node-hours reach" in line, line  # the note is cut at 60 characters
    said = re.search(r"chain: stopped: budget: 0.05 node-hours reached \(links 1-1 used "
                     r"(0\.\d+); link 2 could take 0.0333 more\)",
                     cli("logs", str(rows[0]["id"])).out)
    assert said and 0.0167 < float(said[1]) <= 0.0334, said
    assert line.split()[4] == "cancelled", line  # the user's limit, not a failure
    assert rows[0]["state"] == "timeout" and rows[0]["charge"] > 0.005, rows[0]
    assert [r["state"] for r in rows[1:]] == ["cancelled", "cancelled"]
    assert all(r["started_at"] is None and r["charge"] == 0 for r in rows[1:]), rows


# -- what was spent -----------------------------------------------------------------------------

def test_recorded_accounting_gives_the_nodes_and_elapsed_time():
    slurm = (FIXTURES / "slurm" / "sacct_n_P2_22.05_slurm_local_elapsed_2_nodes.txt").read_text()
    job = parse_sacct_parsable(slurm, SACCT_FIELDS)["47"]
    assert (job.nodes, job.elapsed) == (2, 7.0)
    live = parse_qstat_dsv((FIXTURES / "pbs" / "live_qstat_f_F_dsv_end_states.txt").read_text())
    assert (live["39.vm"].state.value, live["39.vm"].nodes, live["39.vm"].elapsed) == \
        ("timeout", 1, 77.0)
    assert live["41.vm"].nodes is None  # deleted while queued: it held nothing
    aurora = json.loads((FIXTURES / "pbs" / "qstat_fx_F_json_aurora_finished_exit_status.json")
                        .read_text())["Jobs"]
    done = statuses(aurora)["6631289.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"]
    assert (done.nodes, done.elapsed) == (30, 110.0)


def _sacct(job_id: str) -> tuple[int, float]:
    out = subprocess.run(["sacct", "--noheader", "--parsable2", "--allocations",
                          "--format=AllocNodes,ElapsedRaw", f"--jobs={job_id}"],
                         capture_output=True, text=True, check=True).stdout
    # (the job's own row, not its steps'; the last one: a cluster set up again gives its ids
    # again, and sacct lists the older first)
    nodes, elapsed = out.splitlines()[-1].split("|")
    return int(nodes), float(elapsed)


def _qstat(job_id: str) -> tuple[int, float]:
    from mmm_orch.config.registry import load_machine

    qstat = load_machine("pbs-local").scheduler.commands.query
    out = subprocess.run([qstat, "-x", "-f", "-F", "json", job_id], capture_output=True,
                         text=True, check=True).stdout
    job = next(iter(json.loads(out)["Jobs"].values()))
    h, m, s = (int(x) for x in job["resources_used"]["walltime"].split(":"))
    return len(job["exec_vnode"].split("+")), float(h * 3600 + m * 60 + s)


def test_jobs_are_charged_from_the_schedulers_accounting_and_usage_sums_them(
        cli, isolated, slurm_cluster, pbs_server, leftovers_cancelled):
    """Two-node jobs that sleep 6 s on the live Slurm cluster (accounts none) and PBS server
    (accounts MMMTEST and other), a sweep of two on PBS, and a local job: each is charged its
    scheduler's node count x elapsed time, and `usage` sums them by machine and account, by
    sweep and by workload; --since and --account filter."""
    jobs = [cli("submit", "slurm-local", "-N", "2", "--json", "--", "sleep", "6"),
            cli("submit", "pbs-local", "-N", "2", "--json", "--", "sleep", "6"),
            cli("submit", "pbs-local", "-N", "1", "-A", "other", "--json", "--", "sleep", "6"),
            cli("submit", "local", "--json", "--", "sleep", "2")]
    assert all(j.code == 0 for j in jobs), [j.err for j in jobs]
    sweep = cli("sweep", "pbs-local", "--name", "sw", "-N", "1,2", "--json", "--", "sleep", "4")
    assert sweep.code == 0, sweep.err
    ids = [json.loads(j.out)["id"] for j in jobs] + [r["id"] for r in json.loads(sweep.out)]
    rows = {i: wait_state(cli, i, timeout=600) for i in ids}
    assert all(r["state"] == "completed" for r in rows.values()), rows
    expected = {}
    for i, row in rows.items():
        if row["scheduler"] == "slurm":
            nodes, elapsed = _sacct(row["native_id"])
        elif row["scheduler"] == "pbs":
            nodes, elapsed = _qstat(row["native_id"])
        else:
            nodes, elapsed = 1, row["ended_at"] - row["started_at"]
        assert (row["charged_nodes"], row["charged_seconds"]) == (nodes, pytest.approx(elapsed)), row
        assert row["charge"] == pytest.approx(nodes * elapsed / 3600), row
        assert nodes == row["nodes"] and elapsed >= (2 if row["scheduler"] == "local" else 4)
        expected[i] = row["charge"]

    usage = {(u["machine"], u["account"]): u for u in json.loads(cli("usage", "--json").out)}
    assert set(usage) == {("slurm-local", ""), ("pbs-local", "MMMTEST"), ("pbs-local", "other"),
                          ("local", "")}
    pbs_main = [i for i in ids if rows[i]["machine"] == "pbs-local" and rows[i]["account"] == "MMMTEST"]
    assert usage[("pbs-local", "MMMTEST")]["jobs"] == 3
    assert usage[("pbs-local", "MMMTEST")]["charged"] == pytest.approx(sum(expected[i] for i in pbs_main))
    assert sum(u["charged"] for u in usage.values()) == pytest.approx(sum(expected.values()))
    by_sweep = {u["group"]: u for u in json.loads(cli("usage", "--machine", "pbs-local", "--by",
                                                       "sweep", "--json").out)
                if u["account"] == "MMMTEST"}
    sweep_ids = [r["id"] for r in json.loads(sweep.out)]
    assert set(by_sweep) == {"-", f"s{rows[sweep_ids[0]]['group_id']}"}
    assert by_sweep[f"s{rows[sweep_ids[0]]['group_id']}"]["charged"] == \
        pytest.approx(sum(expected[i] for i in sweep_ids))
    text = cli("usage", "--by", "workload").out
    assert re.search(r"^pbs-local\s+other\s+command\s+1\s", text, re.M), text
    assert "total: 6 jobs" in text
    assert json.loads(cli("usage", "--since", "2999-01-01", "--json").out) == []
    assert [u["jobs"] for u in json.loads(cli("usage", "-A", "other", "--json").out)] == [1]
    report = cli("report", f"s{rows[sweep_ids[0]]['group_id']}", "--json")
    assert report.code == 0, report.err
    assert [r["charged"] for r in json.loads(report.out)] == \
        pytest.approx([expected[i] for i in sweep_ids])


@pytest.mark.parametrize("args,field", [
    (["--account", "nobody"], "--account 'nobody'"), (["--since", "last week"], "--since"),
    (["--since", "2026-13-01"], "--since"), (["--by", "month"], "--by 'month'"),
    (["--machine", "nowhere"], "machine 'nowhere'")])
def test_usage_refuses_bad_input(cli, isolated, args, field):
    cli("submit", "local", "--no-env-check", "--", "true")
    result = cli("usage", *args)
    assert result.code == 2 and field in result.err and result.err.count("\n") == 1, result.err


# -- balances -----------------------------------------------------------------------------------

def test_balances_are_read_from_the_facilities_recorded_outputs():
    rows = parse_sbank((FIXTURES / "balance" / "sbank_list_allocations_alcf_doc.txt").read_text())
    assert [(a.resource, a.used, a.remaining, a.jobs) for a in rows] == [
        ("cooley", 6032.8, 43967.2, 1139), ("theta", 1084770.3, 25483927.5, 983),
        ("thetagpu", 0.0, 2000.0, 3)]
    assert rows[0].allocation == pytest.approx(50000.0) and rows[0].project == "ProjectX"
    overspent = parse_sbank((FIXTURES / "balance" /
                             "sbank_list_allocations_created_negative_alcf_doc.txt").read_text())
    assert [(a.resource, a.remaining) for a in overspent] == [("theta", -12332699.9),
                                                             ("cooley", 43919.1)]
    olcf = parse_showusage((FIXTURES / "balance" / "showusage_olcf_doc.txt").read_text())
    assert [(a.project, a.allocation, a.used, a.remaining) for a in olcf] == [
        ("abc123", 20000.0, 126.3, 19873.7)]


def _balance_profile(isolated: Path, command: list[str], timeout: float = 20) -> None:
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True, exist_ok=True)
    (machines / "aurora-here.yaml").write_text(
        "extends: aurora\nname: aurora-here\nlogin_hosts: []\ncharging:\n  balance:\n"
        f"    command: {json.dumps(command)}\n    parser: sbank\n    timeout_s: {timeout}\n")


def test_a_balance_tool_answers_here(cli, isolated):
    doc = FIXTURES / "balance" / "sbank_list_allocations_alcf_doc.txt"
    tool = isolated / "sbank-list-allocations"
    tool.write_text(f"#!/bin/sh\n[ \"$2\" = ProjectX ] && exec cat {doc}\nexit 1\n")
    tool.chmod(0o755)
    _balance_profile(isolated, [str(tool), "-p", "{account}", "-r", "all"])
    out = cli("balance", "aurora-here", "-A", "ProjectX").out
    assert "aurora-here ProjectX (cooley): 43,967 node-hours left of 50,000 (6,033 used, " \
        "2016-01-04 to 2017-01-01)" in out, out
    assert json.loads(cli("balance", "aurora-here", "-A", "ProjectX", "--json").out)[
        "allocations"][2]["remaining"] == 2000.0
    bad = cli("balance", "aurora-here", "-A", "x;rm")
    assert bad.code == 2 and "--account 'x;rm'" in bad.err


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "slow", "failing"])
def test_a_balance_tool_that_is_missing_slow_or_failing_is_a_note(cli, isolated, case):
    """The tool's own timeout (1 s here) bounds `balance`; a review of the machine never waits
    for the tool (it would sleep 60 s). Bounds leave room for a loaded CI host."""
    command = {"missing": ["/nonexistent/sbank-list-allocations", "-p", "{account}"],
               "slow": ["sleep", "60"], "failing": ["sh", "-c", "echo no such project >&2; exit 3"]}
    _balance_profile(isolated, command[case], timeout=1)
    start = time.monotonic()
    result = cli("balance", "aurora-here", "-A", "p")
    assert result.code == 0 and time.monotonic() - start < 20, result.err
    note = {"missing": "No such file or directory", "slow": "did not answer within 1 s",
            "failing": "failed (exit 3): no such project"}[case]
    assert result.out.startswith("aurora-here: no balance: ") and note in result.out, result.out
    # Submission never asks it: a review of the same machine neither fails nor waits for it.
    start = time.monotonic()
    review = run_cli("submit", "aurora-here", "dist_check", "-A", "p", "--dry-run", cwd=isolated)
    assert review.returncode == 0 and time.monotonic() - start < 40, review.stderr


# -- what the review found ----------------------------------------------------------------------

@pytest.mark.parametrize("entry,said", [
    ("{account: p, node_hours: .nan}", "budgets[0].node_hours nan is invalid: a number >= 0"),
    ("{account: 12345, node_hours: 5}", "budgets[0]: keys account (a name)"),
    ("{account: p, node_hours: 5, since: someday}", "budgets[0].since 'someday' is invalid")])
def test_a_budgets_file_that_cannot_be_read_is_refused(cli, isolated, entry, said):
    config = isolated.parent / "config" / "mmm-orch"
    config.mkdir(parents=True)
    (config / "budgets.yaml").write_text(
        f"budgets:\n  - {{account: other, node_hours: 1}}\n  - {entry}\n")
    result = cli("submit", "local", "-A", "other", "--no-env-check", "--", "true")
    assert result.code == 2 and said.replace("[0]", "[1]") in result.err, result.err
    assert result.err.count("\n") == 1 and not state_dir().exists()


def test_an_account_budget_without_a_machine_counts_every_machine(cli, isolated):
    (isolated.parent / "config" / "mmm-orch").mkdir(parents=True)
    (isolated.parent / "config" / "mmm-orch" / "budgets.yaml").write_text(
        "budgets:\n  - {account: shared, node_hours: 0.6}\n")
    held = cli("submit", "local", "-A", "shared", "--walltime", "00:30:00", "--no-env-check",
               "--json", "--", "sleep", "60")
    assert held.code == 0, held.err
    try:  # open on `local`, it holds 0.5 of the 0.6: a 10-minute pbs-local job would pass it
        review = cli("submit", "pbs-local", "-A", "shared", "--walltime", "00:10:00",
                     "--dry-run", "--", "true")
        assert review.code == 2 and "up to 0.50 held by open jobs leave 0.10" in review.err, \
            review.err
    finally:
        cli("cancel", str(json.loads(held.out)["id"]))


def test_a_charge_factor_that_is_not_a_number_is_refused(cli, isolated):
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "dear.yaml").write_text("extends: local\nname: dear\ncharging: {factor: .nan}\n")
    result = cli("render", "dear", "dist_check")
    assert result.code == 2 and "charging.factor nan: a number, 0 or more" in result.err, result.err


@pytest.mark.slow
def test_jobs_recorded_before_charges_get_their_account_and_node_hours(cli, isolated):
    """A database of schema 4 (no account, no charge) upgraded by the next command."""
    import sqlite3

    job = cli("submit", "local", "-A", "old", "--no-env-check", "--json", "--", "sleep", "1")
    assert job.code == 0, job.err
    row = wait_state(cli, json.loads(job.out)["id"])
    path = state_dir() / "jobs.db"
    with sqlite3.connect(path) as conn:
        for column in ("account", "charged_nodes", "charged_seconds", "charge"):
            conn.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        conn.execute("PRAGMA user_version = 4")
    usage = json.loads(cli("usage", "--json").out)
    assert [(u["account"], u["jobs"]) for u in usage] == [("old", 1)]
    assert usage[0]["charged"] == pytest.approx((row["ended_at"] - row["started_at"]) / 3600)
