"""The screen at the start of a job of more than one node: each node's matrix products, a node far
below the others (and its peak) left out before the trainer, a spare in its place or the job
stopped with the figures, and the node remembered as bad with them.

In-process, the verdict on given figures, the screen program itself run over a stand-in per-node
launcher (one of whose nodes never answers), failover launching without a screened-out node,
the straggler verdict, and the plans. Live, on the Slurm test cluster with node n2 really slow:
its slurmd, and so every process it starts for a job, confined to 2% of one CPU (a cgroup's CPU
quota), run first and alone (serial), since it slows a node the other tests share; and a
training whose ranks on one node are slowed the same way while it runs (only its own ranks:
beside the other tests)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.jobs import cancel_leftovers, wait_state

from mmm_orch.injob import failover, files, protocol
from mmm_orch.injob.screen import judge, main
from mmm_orch.planning import Request, resolve


def test_a_node_far_below_the_others_is_left_out_with_its_figures():
    figures = {"n1": [1.0, 1.1], "n2": [0.05, 1.0], "n3": [0.9, 1.0]}
    judged = {n.node: n for n in judge(["n1", "n2", "n3"], figures, 0.5, None, 0.3)}
    assert [n for n, j in judged.items() if j.left_out] == ["n2"]  # its slowest device decides
    assert judged["n2"].why == "matmul 0.05 GFLOP/s, 5% of the other nodes' median (0.95)"
    assert judged["n1"].of_median == pytest.approx(1.0 / 0.475)  # the others: 0.05 and 0.9


def test_a_node_near_its_peak_is_kept_however_the_others_do():
    """Far below both: a node at 80% of its devices' peak is healthy, even beside faster ones."""
    figures = {"n1": [100.0], "n2": [80.0]}
    assert not any(n.left_out for n in judge(["n1", "n2"], figures, 0.9, 100.0, 0.3))
    assert [n.node for n in judge(["n1", "n2"], figures, 0.9, 1000.0, 0.3) if n.left_out] == ["n2"]


def test_a_node_both_of_whose_ring_links_are_far_below_the_others_is_left_out():
    """n2's NIC is bad: the link into it and the link out of it are slow; each of its neighbours
    has one slow link and one good one, and is kept."""
    nodes = ["n1", "n2", "n3", "n4"]
    figures = {n: [1.0] for n in nodes}
    links = {"n1": 1.0, "n2": 0.05, "n3": 0.04, "n4": 1.1}  # each from the node before it
    judged = {n.node: n for n in judge(nodes, figures, 0.5, None, 0.3, links)}
    assert [n for n, j in judged.items() if j.left_out] == ["n2"]
    assert judged["n2"].why == ("ring links 0.05 GB/s in, 0.04 out, 5% of the other links' "
                                "median (1.05)")
    assert (judged["n1"].link_in, judged["n1"].link_out) == (1.0, 0.05)
    # Two nodes: each link is both nodes' own, with nothing else to compare: no verdict.
    two = judge(["n1", "n2"], {"n1": [1.0], "n2": [1.0]}, 0.5, None, 0.3, {"n1": 1.0, "n2": 0.01})
    assert not any(n.left_out for n in two) and two[0].link_of_median is None


RING = """#!/bin/bash
# A per-node launcher of three nodes' tasks, here.
PMI_RANK=0 "$@" & PMI_RANK=1 "$@" & PMI_RANK=2 "$@" & wait
"""


@pytest.mark.slow  # real tasks: their products and ring take seconds of CPU
def test_the_ring_measures_every_link_over_real_sockets(tmp_path, capfd):
    (tmp_path / protocol.NODES_FILE).write_text("n1\nn2\nn3\n")
    ring = tmp_path / "ring"
    ring.write_text(RING)
    ring.chmod(0o755)
    assert main(["--dir", str(tmp_path), "--active", "3", "--seconds", "60", "--of-median", "0.05",
                 "--per-node", str(ring), "--host-addr", "127.0.0.1"]) == 0
    result = files.ScreenResult.from_json((tmp_path / protocol.SCREEN_FILE).read_text())
    assert result.verdict == "passed", result
    assert all(n.link_in and n.link_out and n.link_in > 0.01 for n in result.nodes), result
    assert [n.link_out for n in result.nodes] == [result.nodes[i].link_in for i in (1, 2, 0)]
    assert "; ring link GB/s in " in capfd.readouterr().out


FAN = """#!/bin/bash
# A per-node launcher of two nodes' tasks, here: ranks 0 and 2; rank 1's node never answers.
PMI_RANK=0 "$@" & PMI_RANK=2 "$@" & wait
"""


def _screen(job_dir: Path, active: int) -> int:
    fan = job_dir / "fan.sh"
    fan.write_text(FAN)
    fan.chmod(0o755)
    return main(["--dir", str(job_dir), "--active", str(active), "--seconds", "30",
                 "--of-median", "0.2", "--per-node", str(fan), "--host-addr", "127.0.0.1",
                 "--link-seconds", "2"])


@pytest.mark.slow  # real tasks: their products and ring take seconds of CPU
def test_the_screen_leaves_out_a_node_that_gave_no_figures_and_stops_without_a_spare(
        tmp_path, capfd):
    (tmp_path / protocol.NODES_FILE).write_text("n1\nn2\nn3\n")
    assert _screen(tmp_path, 2) == 0  # a spare is left: the launch goes on without n2
    result = files.ScreenResult.from_json((tmp_path / protocol.SCREEN_FILE).read_text())
    assert result.verdict == "left out" and [n.node for n in result.left_out] == ["n2"]
    assert all(len(n.gflops) == 1 and n.gflops[0] > 0 for n in result.nodes if n.node != "n2")
    out = capfd.readouterr().out
    assert "[mmm-orch] screen: n2: no figures within the screen's time bound: left out" in out
    assert "[mmm-orch] screen: n1 matmul GFLOP/s per device: " in out
    assert "[mmm-orch] screen: left out n2; the launch goes on without; it took " in out

    assert _screen(tmp_path, 3) == protocol.EXIT_SCREENED_OUT  # no spare: stop before the trainer
    outcome = files.Outcome.from_json((tmp_path / protocol.OUTCOME_FILE).read_text())
    assert outcome.why == files.WHY_SCREENED_OUT and "n2: no figures" in outcome.detail
    assert "stopping before the trainer: 2 usable node(s) of the 3 it needs" in \
        capfd.readouterr().out


def test_a_per_node_launch_that_fails_on_every_node_screens_nothing_and_stops_nothing(
        tmp_path, capfd):
    (tmp_path / protocol.NODES_FILE).write_text("n1\nn2\n")
    assert main(["--dir", str(tmp_path), "--active", "2", "--per-node", "false"]) == 0
    assert not (tmp_path / protocol.SCREEN_FILE).exists()
    assert "no node gave figures (the per-node launch exited 1): not screened" in \
        capfd.readouterr().out


def test_failover_launches_on_the_nodes_the_screen_kept(tmp_path):
    (tmp_path / protocol.NODES_FILE).write_text("n1\nn2\nn3\n")
    screened = files.ScreenResult((files.ScreenedNode("n1", (1.0,)),
                                   files.ScreenedNode("n2", (0.01,), 0.01, None, True, "slow"),
                                   files.ScreenedNode("n3", (1.0,))), 2.0, "left out")
    (tmp_path / protocol.SCREEN_FILE).write_text(screened.to_json())
    args = argparse.Namespace(dir=tmp_path, active=2, avoid="")
    assert failover._placed(args) == (["n1", "n3"], [])
    # warned: named, kept
    (tmp_path / protocol.SCREEN_FILE).write_text(
        screened.to_json().replace('"left out"', '"warned"'))
    assert failover._placed(args) == (["n1", "n2"], ["n3"])


def test_a_job_of_more_than_one_node_is_screened_by_default():
    """At the facilities by default; on the test servers, whose nodes share one host's CPUs,
    when asked."""
    assert resolve(Request("slurm-local", "dist_check", nodes=2)).guard.screen is None
    two = resolve(Request("slurm-local", "dist_check", nodes=2, screen="stop"))
    assert two.guard.screen is not None and two.guard.screen.on_fail == "stop"
    assert two.guard.screen.per_node == "srun --nodes=2 --ntasks=2 --ntasks-per-node=1"
    assert two.guard.screen.host_addr == "127.0.0.1"
    spare = resolve(Request("slurm-local", "dist_check", nodes=1, spare_nodes=1, screen="stop"))
    assert spare.guard.screen is not None and "--nodes=2" in spare.guard.screen.per_node
    assert resolve(Request("slurm-local", "dist_check", nodes=1, screen="stop")).guard.screen is None
    assert resolve(Request("polaris", "dist_check", nodes=2, account="P", screen="off")).guard \
        .screen is None
    aurora = resolve(Request("aurora", "llama3_8b", nodes=2, account="P")).guard.screen
    assert aurora is not None and (aurora.device, aurora.devices) == ("xpu", 12)
    assert aurora.peak_gflops == pytest.approx(419500.0)


def test_a_screen_mode_that_does_not_exist_is_refused_with_one_line(cli, isolated):
    made = cli("submit", "slurm-local", "dist_check", "-N", "2", "--screen", "sometimes",
               "--dry-run")
    assert made.code == 2 and made.err.strip().splitlines() == [
        "mmm-orch: error: --screen 'sometimes' is invalid: stop, warn or off"], made.err


# -- live ----------------------------------------------------------------------------------------

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")


@contextmanager
def slowed(node: str, share: float):
    """Every process of the test cluster's `node` (its slurmd, and what that starts for a job)
    held to `share` of one CPU by a cgroup's CPU quota, until the block ends."""
    pid = subprocess.run(["pgrep", "-f", f"^slurmd -N {node}$"], capture_output=True, text=True,
                         check=True).stdout.split()[0]
    group = CPU_CGROUP / f"mmm-orch-test-slow-{node}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(int(100000 * share)))
    (group / "tasks").write_text(pid)
    try:
        yield
    finally:
        (CPU_CGROUP / "tasks").write_text(pid)
        (group / "cpu.cfs_quota_us").write_text("-1")  # what it started and still runs: freed


def _json(cli, *args):
    cut = args.index("--") if "--" in args else len(args)  # (--json is mmm-orch's)
    made = cli(*args[:cut], "--json", *args[cut:])
    assert made.code == 0, made.err
    return json.loads(made.out)


@pytest.mark.live
@pytest.mark.serial
@pytest.mark.usefixtures("slurm_cluster")
def test_a_slow_node_is_left_out_for_a_spare_or_stops_the_job_with_the_figures(cli, isolated,
                                                                              request):
    if not (CPU_CGROUP / "tasks").exists():
        pytest.skip("SLOW-NODE TEST NOT RUN: needs the cgroup v1 CPU controller at "
                    f"{CPU_CGROUP} (as on this project's machines)")
    request.addfinalizer(cancel_leftovers)
    where = "echo ran on $SLURMD_NODENAME"
    with slowed("n2", 0.02):
        # A spare: the screen leaves n2 out, the launch runs on the two others.
        row = _json(cli, "submit", "slurm-local", "-N", "2", "--spare-nodes", "1", "--screen",
                    "stop", "--walltime", "00:05:00", "--", "sh", "-c", where)
        done = wait_state(cli, row["id"], timeout=300)
        log = cli("logs", str(row["id"])).out
        assert done["state"] == "completed", log
        assert "[mmm-orch] screen: n2 matmul GFLOP/s per device: " in log
        assert "[mmm-orch] screen: left out n2; the launch goes on without" in log, log
        assert "ran on n2" not in log and {"ran on n1", "ran on n3"} <= set(log.splitlines())
        (record,) = _json(cli, "status", str(row["id"]), "--all")
        figures = {n["node"]: n for n in record["screen"]["nodes"]}
        assert record["screen"]["verdict"] == "left out" and figures["n2"]["left_out"]
        assert figures["n2"]["gflops"][0] < 0.2 * min(figures[n]["gflops"][0] for n in ("n1", "n3"))
        assert (record["end_class"], record["end_node"]) == ("screened-out", "n2"), record
        # Every node's ring links were measured. (A CPU quota slows a node's products, not its
        # links over this host's loopback: the links' verdict is tested on given figures.)
        assert all(figures[n]["link_in"] > 0 and figures[n]["link_out"] > 0 for n in figures)
        (bad,) = _json(cli, "nodes")
        assert (bad["node"], bad["job_id"]) == ("n2", row["id"])
        assert bad["evidence"].startswith("screened: matmul ") and "GFLOP/s" in bad["evidence"]

        # No spare: the job stops before anything is launched, with every node's figures.
        assert cli("nodes", "forget", "n2").code == 0
        row = _json(cli, "submit", "slurm-local", "-N", "3", "--screen", "stop", "--walltime",
                    "00:05:00", "--", "sh", "-c", where)
        done = wait_state(cli, row["id"], timeout=300)
        log = cli("logs", str(row["id"])).out
        assert (done["state"], done["exit_code"]) == ("failed", protocol.EXIT_SCREENED_OUT), log
        assert done["reason"].startswith("screened out n2: matmul "), done
        assert (done["end_class"], done["end_node"]) == ("screened-out", "n2"), done
        assert all(f"screen: {n} matmul GFLOP/s per device: " in log for n in ("n1", "n2", "n3"))
        assert protocol.LAUNCH_START not in log and "ran on" not in log
        assert [b["node"] for b in _json(cli, "nodes")] == ["n2"]
    assert cli("nodes", "forget", "n2").code == 0

    # Healthy nodes: the screen passes, says what it cost, and the launch runs.
    start = time.time()
    row = _json(cli, "submit", "slurm-local", "-N", "3", "--screen", "stop", "--walltime",
                "00:05:00", "--", "sh", "-c", where)
    done = wait_state(cli, row["id"], timeout=300)
    log = cli("logs", str(row["id"])).out
    assert done["state"] == "completed", log
    (record,) = _json(cli, "status", str(row["id"]), "--all")
    assert record["screen"]["verdict"] == "passed" and 0 < record["screen"]["seconds"] < \
        time.time() - start
    assert f"screen: passed: 3 node(s); it took {record['screen']['seconds']:.1f} s" in log


# -- stragglers while the run trains --------------------------------------------------------------

def test_a_rank_below_the_others_for_enough_checks_in_a_row_is_a_straggler():
    from mmm_orch.runtime.stragglers import Settings, Strikes

    strikes = Strikes(4, Settings(every=2, checks=2, of_median=0.5, leave=False))
    assert strikes.add([1.0, 1.0, 0.1, 1.0], 2) is None  # one check: a moment, not yet
    assert strikes.add([1.0, 1.0, 0.9, 1.0], 4) is None  # it recovered: counted again from 0
    assert strikes.add([1.0, 1.0, 0.1, 1.0], 6) is None
    assert strikes.add([1.0, 1.1, 0.2, 0.9], 8) == (2, pytest.approx(0.2))
    assert strikes.since[2] == 6


def test_failover_relaunches_without_the_node_the_trainers_left():
    from types import SimpleNamespace

    def ended(*lines: str) -> SimpleNamespace:  # what the watchdog saw of a launch that ended
        return SimpleNamespace(code=protocol.EXIT_CHECKPOINTED, received=[], checkpointed=False,
                               hung=False, lines=list(lines), last_step=8)

    line = (f"{protocol.STRAGGLER} rank 2 on n2: its matrix products at 3% of the other ranks' "
            "median for 2 checks (steps 6-8); leaving n2: saving, then relaunching without it")
    verdict = failover.classify(ended(line, "[checkpoint] step=8"), [], ["n1", "n2"], None, 60)
    assert (verdict.kind, verdict.nodes, verdict.retry) == ("straggler", ("n2",), True)
    # saved before the walltime, no straggler: stop, resumable
    assert failover.classify(ended("[checkpoint] step=8"), [], ["n1", "n2"], None, 60).kind \
        == "checkpointed"


def test_the_watch_is_set_for_a_trainer_on_more_than_one_node():
    watch = resolve(Request("slurm-local", "llama3_debug", nodes=2)).guard.stragglers
    assert watch is not None and watch.setting == "10,2,0.2,name"
    assert resolve(Request("slurm-local", "llama3_debug", nodes=1)).guard.stragglers is None
    assert resolve(Request("slurm-local", "command", nodes=2, command=("true",))
                   ).guard.stragglers is None  # no trainer of ours to check in
    leave = resolve(Request("slurm-local", "llama3_debug", nodes=2, spare_nodes=1,
                            stragglers="leave")).guard.stragglers
    assert leave is not None and leave.action == "leave"


def test_leaving_a_straggler_without_a_spare_is_refused(cli, isolated):
    made = cli("submit", "slurm-local", "llama3_debug", "-N", "2", "--stragglers", "leave",
               "--dry-run")
    assert made.code == 2 and made.err.strip() == (
        "mmm-orch: error: --stragglers 'leave' is invalid: with --spare-nodes K: a spare "
        "takes the node's place"), made.err


def _node_processes(native_id: str, node: str) -> list[int]:
    """The job's ranks on `node` (found by their variables: one host plays every node). Only
    they are slowed, so the other tests' jobs on that node run as before."""
    from helpers.faults import trainer_pids

    ranks = trainer_pids(native_id, node, "paced_llama3")
    assert ranks, f"no rank of job {native_id} on {node}"
    return ranks


@pytest.mark.live
@pytest.mark.usefixtures("slurm_cluster")
def test_a_node_slowed_while_it_trains_is_named_and_left_for_a_spare(cli, isolated, request):
    """Tiny Llama 3 on two nodes and a spare, each step 0.25 s or more; once it trains, its
    ranks on its second node are held to 2% of a CPU (a cgroup of this test's own)."""
    from helpers.profiles import paced_spec, write_spec

    if not (CPU_CGROUP / "tasks").exists():
        pytest.skip("STRAGGLER TEST NOT RUN: needs the cgroup v1 CPU controller at "
                    f"{CPU_CGROUP} (as on this project's machines)")
    request.addfinalizer(cancel_leftovers)
    write_spec(isolated, "llama_st", paced_spec("llama_st", "checkpoint_every: 100, steps: 60",
                                                step_s=0.25))
    machines = isolated / ".mmm-orch" / "machines"  # checked every 2 steps, named after 2
    machines.mkdir(parents=True)
    (machines / "slurm-watched.yaml").write_text(
        "extends: slurm-local\nname: slurm-watched\nscreen: {of_median: 0.2, straggler_every: 2, "
        "straggler_checks: 2}\n")
    row = _json(cli, "submit", "slurm-watched", "llama_st", "-N", "2", "--spare-nodes", "1",
                "--stragglers", "leave", "--walltime", "00:10:00")
    run_dir = Path(row["run_dir"])

    def trained(step: int) -> bool:
        metrics = run_dir / "metrics.jsonl"
        return metrics.exists() and f'"step": {step},' in metrics.read_text()
    deadline = time.monotonic() + 240
    while not trained(4):
        assert time.monotonic() < deadline, cli("logs", str(row["id"])).out
        time.sleep(0.5)
    state = json.loads((Path(row["job_dir"]) / protocol.FAILOVER_FILE).read_text())
    victim = state["active"][1]
    group = CPU_CGROUP / f"mmm-orch-test-straggler-{row['native_id']}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_quota_us").write_text("2000")
    moved = _node_processes(row["native_id"], victim)
    try:
        for pid in moved:
            with contextlib.suppress(OSError):  # (a process that ended meanwhile)
                (group / "cgroup.procs").write_text(str(pid))
        done = wait_state(cli, row["id"], timeout=400)
    finally:
        for pid in moved:
            with contextlib.suppress(OSError):  # (a process that ended meanwhile)
                (CPU_CGROUP / "cgroup.procs").write_text(str(pid))
        (group / "cpu.cfs_quota_us").write_text("-1")
    log = cli("logs", str(row["id"])).out
    assert done["state"] == "completed", log[-3000:]
    assert (done["end_class"], done["end_node"]) == ("straggler-left", victim), done
    named = [line for line in log.splitlines() if line.startswith(protocol.STRAGGLER)]
    assert len(named) == 1 and f" on {victim}: its matrix products at " in named[0], log[-3000:]
    assert f"; leaving {victim}: saving, then relaunching without it" in named[0]
    assert f"[mmm-orch] failover: retired {victim} at=" in log and "attempt=2/2" in log
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text()
             .splitlines() if '"event": "step"' in line]
    assert steps == list(range(1, 61))  # every step once: the relaunch went on from the save
    (bad,) = _json(cli, "nodes")
    assert bad["node"] == victim and "straggled" in bad["evidence"]
    (found,) = json.loads((run_dir / protocol.STRAGGLERS_FILE).read_text())["stragglers"]
    assert found["node"] == victim and found["of_median"] < 0.2 and found["step"] <= \
        found["since"] + 2 * 2  # named within its 2 checks, 2 steps apart

