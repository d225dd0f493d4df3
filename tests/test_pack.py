"""Many runs in one allocation: `sweep --within` runs a sweep's points side by side on the nodes
of the allocation it runs in, largest first, each an ordinary recorded job of the sweep; a
point that fails or is cancelled ends alone. `sweep --pack` submits one batch job that does so.
The slot logic, the pack's time budget and its bookkeeping on their own; live, once on each
scheduler: inside `salloc` on the Slurm cluster and a batch job on the PBS server, and a pack of
points of nodes and devices on each; and on Slurm a pack cancelled, then rerun to its end."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.jobs import assert_nothing_recorded, wait_state
from helpers.profiles import PACED_SPEC, write_probe, write_spec
from helpers.schedulers import qsub_own_script
from helpers.training import run_steps
from mmm_orch.injob import protocol
from mmm_orch.submission import pack

MMM_ORCH = [sys.executable, "-m", "mmm_orch"]
# Each rank of a point inside a PBS job says its point's node count (its ranks over the 2 a
# node); the 2-node point fails (exit 1).
POINT = ("import os, sys, time; n = str(int(os.environ['PMI_SIZE']) // 2); "
         "os.write(1, ('point nodes=%s\\n' % n).encode()); time.sleep(2); "
         "sys.exit(1 if n == '2' else 0)")


@dataclasses.dataclass(frozen=True)
class FakePoint:
    index: int
    nodes: int
    devices: int = 0


@dataclasses.dataclass(frozen=True)
class FakeRecord:
    id: int
    point: FakePoint
    on: tuple[str, ...]


def test_points_take_free_nodes_largest_first_and_smaller_ones_backfill(monkeypatch):
    monkeypatch.setattr(pack, "POLL_S", 0)
    points = [FakePoint(1, 1), FakePoint(2, 3), FakePoint(3, 2), FakePoint(4, 1)]
    started, busy, log = [], {}, []

    def start(point, slot):
        on = slot.nodes
        assert not set(on) & {n for held in busy.values() for n in held}, "a node given twice"
        record = FakeRecord(len(started) + 1, point, on)
        started.append(record)
        busy[record.id] = on
        log.append(("start", point.index, on))
        return record

    def ended(running):  # the oldest running point ends at each look
        first = running[0]
        busy.pop(first.id)
        log.append(("end", first.point.index))
        return [first]

    records = pack.run(points, ["a", "b", "c"], start, ended, lambda running: None)
    assert [r.point.index for r in records] == [2, 3, 1, 4]
    assert log[:3] == [("start", 2, ("a", "b", "c")), ("end", 2), ("start", 3, ("a", "b"))]
    assert ("start", 1, ("c",)) == log[3]  # the 1-node point beside the 2-node one


def test_points_on_some_devices_fill_a_shared_node_first_and_leave_whole_nodes_whole():
    room = pack.Room(["a", "b"], per_node=4)
    assert room.take(FakePoint(1, 1, devices=2)) == pack.Slot(("a",), (0, 1))
    assert room.take(FakePoint(2, 1, devices=1)) == pack.Slot(("a",), (2,))  # beside it
    assert room.take(FakePoint(3, 1)) == pack.Slot(("b",))  # the whole node left
    assert room.take(FakePoint(4, 1, devices=2)) is None  # one device free on a
    assert room.take(FakePoint(5, 1, devices=1)) == pack.Slot(("a",), (3,))
    room.give_back(pack.Slot(("a",), (0, 1)))
    assert room.take(FakePoint(6, 1)) is None  # a is still shared
    assert room.take(FakePoint(7, 1, devices=2)) == pack.Slot(("a",), (0, 1))
    # the largest first, in devices: 1 node is 4 of them
    order = pack.order([FakePoint(1, 1, 1), FakePoint(2, 1), FakePoint(3, 1, 2)], per_node=4)
    assert [p.index for p in order] == [2, 3, 1]


def test_an_interrupted_run_stops_the_running_points(monkeypatch):
    monkeypatch.setattr(pack, "POLL_S", 0)
    stopped = []

    def ended(running):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack.run([FakePoint(1, 1), FakePoint(2, 1)], ["a", "b"],
                 lambda point, slot: FakeRecord(point.index, point, slot.nodes), ended,
                 lambda running: stopped.extend(r.id for r in running))
    assert sorted(stopped) == [1, 2]


def _job(job_id: int, index: int, state: str, nodes: int = 1):
    from mmm_orch.records.record import JobRecord
    from mmm_orch.schedulers.states import JobState

    return JobRecord(job_id, "slurm-local", "h", "", "slurm" if index == 0 else "local", {}, "w",
                     "n", nodes, nodes, str(job_id), "", "", "", None, "", JobState(state), "",
                     "", None, None, 0.0, None, None, 0.0, group_id=1, group_index=index)


def test_a_pack_is_one_line_counting_its_points_waiting_and_never_started():
    from mmm_orch.submission.sweeps import summary

    group = {"id": 1, "kind": "sweep", "spec": {"pack": {}, "points": [
        {"nodes": 1}, {"nodes": 2}, {"nodes": 3}]}}
    pending = summary(group, [_job(1, 0, "pending", 3)])
    assert pending["state"].value == "pending" and pending["nodes"] == [1, 2, 3]
    assert pending["note"] == "pack job 1 (pending): 3 waiting"
    running = summary(group, [_job(1, 0, "running", 3), _job(2, 3, "completed", 3),
                              _job(3, 2, "running", 2)])
    assert running["state"].value == "running"
    assert running["note"] == "pack job 1 (running): 1 completed, 1 running, 1 waiting"
    ended = summary(group, [_job(1, 0, "failed", 3), _job(2, 3, "completed", 3)])
    assert ended["state"].value == "not started"  # a point never ran: the least finished
    assert ended["note"] == "pack job 1 (failed): 1 completed, 2 not started"


def test_within_outside_an_allocation_and_a_point_larger_than_it_are_refused(cli, monkeypatch):
    for name in ("SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(name, raising=False)
    result = cli("sweep", "slurm-local", "--nodes", "1,2", "--within", "--", "true")
    assert result.code == 2 and "--within: not inside an allocation" in result.err
    assert_nothing_recorded()


def _hosts(log: str) -> set[str]:
    return {line.split()[-1] for line in log.splitlines() if line.startswith("point nodes=")}


def _check_points(cli, expect: dict[int, tuple[str, int | None]]) -> list[dict]:
    rows = [r for r in json.loads(cli("status", "--sweep", "1", "--json").out)
            if r["group_index"]]  # (a pack's own job comes first, at 0)
    assert {r["nodes"]: (r["state"], r["exit_code"]) for r in rows} == expect, rows
    return rows


# In a 3-node salloc: the 3-node point completes; then, side by side, the 1-node point runs until
# it is cancelled and the 2-node one waits for the test's word (the file in argv[1]) and fails.
SALLOC_POINT = """import os, socket, sys, time
nodes = os.environ["SLURM_NNODES"]
print(f"point nodes={nodes} host={socket.gethostname()} {os.environ['SLURMD_NODENAME']}",
      flush=True)
while nodes == "1" or (nodes == "2" and not os.path.exists(sys.argv[1])):
    time.sleep(0.2)
sys.exit(1 if nodes == "2" else 0)
"""


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_inside_salloc_points_share_three_nodes_and_a_failing_or_cancelled_one_ends_alone(
        cli, isolated):
    program, word = isolated / "point.py", isolated / "fail-now"
    program.write_text(SALLOC_POINT)
    sweep = subprocess.Popen(
        ["salloc", "-p", "debug", "--ntasks-per-node=2", "-t", "00:10:00", "-N", "3", *MMM_ORCH,
         "sweep", "slurm-local", "--nodes", "1,2,3", "--within", "--", sys.executable,
         str(program), str(word)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600  # (queued behind other tests' jobs, at worst)
        while True:
            rows = json.loads(cli("status", "--all", "--json").out or "[]")
            if sorted((r["nodes"], r["state"]) for r in rows) == [
                    (1, "running"), (2, "running"), (3, "completed")]:
                break
            assert time.monotonic() < deadline and sweep.poll() is None, rows
            time.sleep(0.5)
        one = next(r for r in rows if r["nodes"] == 1)
        assert cli("cancel", str(one["id"])).code == 0
        assert wait_state(cli, one["id"], timeout=120)["state"] == "cancelled"
        word.touch()  # the 2-node point, still running beside it, now ends by itself
        output, _ = sweep.communicate(timeout=300)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 1, output[-3000:]
    assert "3 points run in this allocation (1 cancelled, 1 completed, 1 failed)" in output
    rows = _check_points(cli, {1: ("cancelled", None), 2: ("failed", 1), 3: ("completed", 0)})
    by_nodes = {r["nodes"]: r for r in rows}
    # the 3-node point ran alone first; then the 1- and 2-node points side by side
    assert by_nodes[3]["ended_at"] <= min(by_nodes[1]["started_at"], by_nodes[2]["started_at"]) + 1
    one, two = (_hosts(cli("logs", str(by_nodes[n]["id"])).out) for n in (1, 2))
    assert len(one) == 1 and len(two) == 2 and not one & two, (one, two)
    assert abs(by_nodes[1]["started_at"] - by_nodes[2]["started_at"]) < 5
    assert all(r["scheduler"] == "local" and r["machine"] == "slurm-local" for r in rows)
    assert "3 points, nodes 1,2,3: 1 cancelled, 1 completed, 1 failed" in cli("status").out
    # the cancel ended the ranks of its point, none of them left behind
    assert subprocess.run(["pgrep", "-f", str(program)], capture_output=True).returncode == 1


@pytest.mark.usefixtures("pbs_server", "leftovers_cancelled")
def test_inside_a_pbs_batch_job_points_run_side_by_side_on_its_vnodes(cli, isolated):
    """(A sweep --within typed into `qsub -I` finds its allocation as `launch` does there:
    test_launch.py runs `launch` both ways.)"""
    out = qsub_own_script(isolated, 3, f"{' '.join(MMM_ORCH)} sweep pbs-local --nodes 1,2 "
                                       f"--within -- {sys.executable} -c \"{POINT}\"; "
                                       "echo sweep-exit=$?")
    deadline = time.monotonic() + 600  # (queued behind other tests' jobs, at worst)
    while "sweep-exit=" not in _read(out):
        assert time.monotonic() < deadline, _read(out)[-3000:]
        time.sleep(1)
    assert "sweep-exit=1" in _read(out), _read(out)[-3000:]  # the 2-node point failed
    rows = _check_points(cli, {1: ("completed", 0), 2: ("failed", 1)})
    starts = sorted(r["started_at"] for r in rows)
    assert starts[1] - starts[0] < 5  # side by side, not one after the other


def _read(path) -> str:
    return path.read_text() if path.exists() else ""


# A loaded host, where a supervisor's Python takes seconds to start, made certain: the local
# supervisor's start-up lasts until it has a SIGTERM waiting, so the cancel comes first.
SLOW_START = """import signal, sys, time
if "mmm_orch.schedulers.local.supervisor" in sys.orig_argv:
    while signal.SIGTERM not in signal.sigpending():
        time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_point_cancelled_while_its_supervisor_starts_up_ends_cancelled(cli, isolated, tmp_path,
                                                                          monkeypatch):
    """A point is recorded running as soon as its supervisor is started (the sweep does not wait
    for its start-up), so a cancel can reach the supervisor before it could handle one. That
    cancel waits for it, and the supervisor stops the point as any cancel, recorded cancelled,
    never taken for a supervisor that vanished (failed). The supervisor is the local executor's,
    which runs a point inside an allocation as it runs a job on this computer: here, the latter."""
    (tmp_path / "slow-start").mkdir()
    (tmp_path / "slow-start" / "sitecustomize.py").write_text(SLOW_START)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "slow-start"))
    # (its own sleep, told from the other tests' processes)
    result = cli("submit", "local", "--json", "--", sys.executable, "-c",
                 "import time; time.sleep(119)")
    assert result.code == 0, result.err
    job = json.loads(result.out)["id"]
    assert cli("cancel", str(job)).code == 0
    assert wait_state(cli, job, timeout=120)["state"] == "cancelled"
    assert "[mmm-orch] cancelled: stopping the job" in cli("logs", str(job)).out
    assert subprocess.run(["pgrep", "-f", "time.sleep\\(119"], capture_output=True).returncode == 1


# -- sweep --pack: one batch job runs the points ---------------------------------------------


# Each rank of a point says its tag, its ranks, the device mask and the CPUs it was given; the
# 4-rank point (2 nodes) of tag x exits 1, the 1-rank point (one device) of tag y hangs.
PROBE = """import os, sys, time
tag = sys.argv[sys.argv.index("--tag") + 1]
ranks = int(os.environ.get("SLURM_NTASKS") or os.environ["PMI_SIZE"])
print(f"probe tag={tag} ranks={ranks} mask={os.environ.get('CUDA_VISIBLE_DEVICES', '-')} "
      f"cpus={','.join(map(str, sorted(os.sched_getaffinity(0))))}", flush=True)
time.sleep(600 if (ranks, tag) == (1, "y") else 4)
sys.exit(1 if (ranks, tag) == (4, "x") else 0)
"""
PLACED = re.compile(r"point (\d+) \(.*\): job (\d+) on (\S+)(?: devices (\S+))?$")


def _probes(text: str) -> list[dict[str, str]]:
    return [dict(word.split("=", 1) for word in line.split()[-4:])
            for line in text.splitlines() if "probe tag=" in line]


@pytest.mark.live
@pytest.mark.parametrize("machine", ["slurm-local", "pbs-local"])
def test_six_points_of_nodes_and_devices_share_a_pack_and_a_failing_and_a_hung_one_end_alone(
        cli, isolated, machine, request):
    """Points of 2 nodes, 1 node and 1 device (x 2 tags) in one 3-node job: no two that run at
    the same time share a node, or on a shared node a device or a CPU; the failing and the hung
    point end alone, the other four complete; each is charged its share and reported."""
    request.getfixturevalue("slurm_cluster" if machine == "slurm-local" else "pbs_server")
    request.getfixturevalue("leftovers_cancelled")
    write_probe(isolated, "probe", PROBE, "  tag: {type: str}\n",
                'watchdog: {progress: output, first_step_timeout: "00:00:30", '
                'step_timeout: "00:00:10"}\n')
    result = cli("sweep", machine, "probe", "--nodes", "2,1", "--devices", "1", "--set",
                 "tag=x,y", "--pack", "--pack-nodes", "3", "-t", "00:02:00", "--json")
    assert result.code == 0, result.err
    pack_job = json.loads(result.out)
    assert pack_job["nodes"] == 3 and pack_job["scheduler"] == machine.split("-")[0]
    # 14 devices of points on 6: three waves of 2-minute points, and a minute's slack
    assert "walltime=00:07:00" in Path(pack_job["script_path"]).read_text().replace(" -t ",
                                                                                      " walltime=")
    ended = wait_state(cli, pack_job["id"], timeout=600)
    assert ended["state"] == "failed" and ended["exit_code"] == 1, ended  # points did not complete
    rows = {r["group_index"]: r for r in json.loads(cli("status", "--sweep", "1", "--json").out)
            if r["group_index"]}
    # points: 1 nodes=2 x, 2 nodes=2 y, 3 nodes=1 x, 4 nodes=1 y, 5 devices=1 x, 6 devices=1 y
    assert {i: (r["state"], r["exit_code"]) for i, r in rows.items()} == {
        1: ("failed", 1), 2: ("completed", 0), 3: ("completed", 0), 4: ("completed", 0),
        5: ("completed", 0), 6: ("hung", 124)}, rows
    placed = {int(m[1]): (m[3].split(","), m[4]) for m in map(
        PLACED.search, cli("logs", str(pack_job["id"])).out.splitlines()) if m}
    assert sorted(placed) == [1, 2, 3, 4, 5, 6], placed
    given = {}
    for index, row in rows.items():
        probes = _probes(cli("logs", str(row["id"])).out)
        assert len(probes) == {1: 4, 2: 4, 3: 2, 4: 2, 5: 1, 6: 1}[index], probes
        given[index] = ({p["mask"] for p in probes}, {c for p in probes for c in p["cpus"].split(",")})
    for index in (5, 6):  # one device each: its mask, and the CPU next to it
        nodes, devices = placed[index]
        assert len(nodes) == 1 and given[index][0] == {devices} and len(given[index][1]) == 1
    shared = 0
    for a in rows:
        for b in rows:
            if a >= b or rows[a]["ended_at"] <= rows[b]["started_at"] or \
                    rows[b]["ended_at"] <= rows[a]["started_at"]:
                continue  # not at the same time
            common = set(placed[a][0]) & set(placed[b][0])
            if common:  # only points on some devices share a node, never a device or a CPU
                assert placed[a][1] and placed[b][1], (a, b, placed)
                assert not given[a][0] & given[b][0] and not given[a][1] & given[b][1], given
                shared += 1
    assert shared, (placed, rows)  # the two one-device points ran side by side on one node
    # Each point is charged its share: its nodes, or half a node for one of its two devices.
    for index, row in rows.items():
        share = 0.5 if index >= 5 else row["nodes"]
        held = row["ended_at"] - row["started_at"]
        assert row["charge"] == pytest.approx(share * held / 3600, rel=0.05), (index, row)
    # `usage` counts the pack's job, which the scheduler charged, and not its points again.
    pack_row = next(r for r in json.loads(cli("status", "--sweep", "1", "--json").out)
                    if r["group_index"] == 0)
    used = json.loads(cli("usage", "--json").out)
    assert [(u["jobs"], u["charged"]) for u in used] == [(1, pytest.approx(pack_row["charge"]))]
    report = cli("report", "s1", "--out", str(isolated / "report"))
    assert report.code == 0, report.err
    html = (isolated / "report" / "report.html").read_text()
    assert all(f">{row['id']}<" in html for row in rows.values()), html[-2000:]
    line = next(line for line in cli("status").out.splitlines() if line.startswith("s1"))
    assert f"pack job {pack_job['id']} (failed): 4 completed, 1 failed, 1 hung" in line, line
    # `rerun` of one point: a pack of that point alone, on one node, for its walltime (a pack
    # run to its end again: the rerun of a whole pack, test_a_cancelled_pack_...)
    again = cli("rerun", str(rows[5]["id"]), "--json")
    assert again.code == 0, again.err
    rerun = json.loads(again.out)
    assert (rerun["nodes"], rerun["rerun_of"], rerun["group_id"]) == (1, rows[5]["id"], 2), rerun
    assert "walltime=00:03:00" in Path(rerun["script_path"]).read_text().replace(" -t ",
                                                                                  " walltime=")


def test_a_bad_pack_is_refused_before_anything_is_written(cli, isolated):
    for argv, words in [
        (["--pack-nodes", "1"], "--pack-nodes 1 is invalid: at least the 2 nodes of sweep point 2"),
        (["--pack-nodes", "0"], "--pack-nodes 0 is invalid"),
        (["--within"], "--pack 'with --within' is invalid"),
    ]:
        result = cli("sweep", "slurm-local", "--nodes", "1,2", "--pack", *argv, "--", "true")
        assert result.code == 2 and words in result.err, result.err
    result = cli("sweep", "slurm-local", "--nodes", "1,2", "--pack-nodes", "2", "--", "true")
    assert result.code == 2 and "--pack-nodes 2 is invalid: only with --pack" in result.err
    result = cli("sweep", "slurm-local", "--nodes", "1,2", "--pack", "-t", "00:40:00", "--", "true")
    assert result.code == 2 and "give --pack-walltime" in result.err, result.err
    result = cli("sweep", "slurm-local", "--nodes", "1,2", "--pack", "--chain", "2", "--", "true")
    assert result.code == 2
    for machine, argv, words in [
        ("slurm-local", ["--pack"], "--devices 3 is invalid: 1 to the 2 devices of a slurm-local node"),
        ("local", ["--pack"], "--devices 3 is invalid: a machine whose profile says how runs share"),
        ("pbs-local", [], "--devices '3' is invalid: only with --pack or --within"),
    ]:
        result = cli("sweep", machine, "--devices", "3", *argv, "--", "true")
        assert result.code == 2 and words in result.err, result.err
    assert_nothing_recorded()


# -- a pack's time budget, in-process -------------------------------------------------------
# A pack's point stops before its pack's walltime: its own walltime ends END_SLACK_S before the
# allocation's (the watchdog's stop before it, the local executor's as for any job), and a point
# the allocation has too little time left for is never started. What the pack job's script says
# of its end (MMM_ORCH_JOB_END) is all the points are given: here, as the allocation says it.

def test_a_point_s_walltime_ends_before_its_allocation_does():
    from mmm_orch.planning import Request, resolve
    from mmm_orch.usecases.inside import _within_time

    planned = resolve(Request("slurm-local", "llama3_debug", walltime="00:05:00"))
    assert planned.queue.walltime == 300
    ends_at = time.time() + 200
    assert _within_time(planned, ends_at).queue.walltime in (169, 170)  # 200 s less the slack
    assert _within_time(planned, time.time() + 3600) is planned  # its own fits: unchanged
    assert _within_time(planned, None) is planned  # an allocation that does not say


def test_points_an_allocation_has_no_time_left_for_are_recorded_not_started(cli, monkeypatch):
    """An allocation (its variables, as salloc sets them) that ends in a minute: after the slack
    of its end, no point has its stop margin and a least run left, so none starts; each is
    recorded `not started`, naming the allocation, and the sweep says so."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    monkeypatch.setenv("MMM_ORCH_JOB_END", str(int(time.time()) + 60))
    result = cli("sweep", "slurm-local", "--nodes", "1,2", "--within", "--no-env-check", "--",
                 "true")
    assert result.code == 1, result.err
    assert "2 points run in this allocation (2 not started)" in result.out, result.out
    assert "not started (slurm job 4242 ends before it could run)" in result.err, result.err
    rows = json.loads(cli("status", "--sweep", "1", "--json").out)
    assert sorted((r["nodes"], r["state"]) for r in rows) == [(1, "not started"),
                                                              (2, "not started")], rows
    assert all("slurm job 4242 ended first" in r["reason"] for r in rows), rows


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_a_cancelled_pack_ends_its_running_point_and_rerun_resume_finishes_every_point(
        cli, isolated):
    """A one-node pack of two points of a paced training (0.5 s a step, a checkpoint every 10
    steps): the first runs, the second waits for the node. `cancel --sweep` ends the pack job and
    its running point, and the waiting point never starts. `rerun --resume` of the pack goes on
    with the first from its checkpoint, then runs the second: every step of each once."""
    write_spec(isolated, "llama_chain", PACED_SPEC)
    result = cli("sweep", "slurm-local", "llama_chain", "--set", "steps=60,10", "--set",
                 "checkpoint_every=10", "--pack", "-t", "00:05:00", "--json")
    assert result.code == 0, result.err
    pack_job = json.loads(result.out)

    def points(sweep: int) -> dict[int, dict]:
        return {r["group_index"]: r
                for r in json.loads(cli("status", "--sweep", str(sweep), "--json").out)}

    deadline = time.monotonic() + 600  # (queued behind other tests' jobs, at worst)
    while not ((first := points(1).get(1)) and first["state"] == "running"
               and (protocol.latest_step(first["run_dir"]) or 0) >= 10):  # a checkpoint made
        assert time.monotonic() < deadline, points(1)
        time.sleep(0.5)
    ranks = ["pgrep", "-f", f"paced_llama3 .*--run-name {Path(first['run_dir']).name}"]
    assert subprocess.run(ranks, capture_output=True).returncode == 0  # (they are found)
    said = cli("cancel", "--sweep", "1")
    assert said.code == 0, said.err
    wait_state(cli, pack_job["id"], timeout=300)
    rows = points(1)
    assert rows[0]["state"] == "cancelled" and rows[1]["state"] == "cancelled", rows
    assert rows[2]["state"] == "not started" and rows[2]["nodes"] == 1, rows
    assert subprocess.run(ranks, capture_output=True).returncode == 1  # none of them left

    again = cli("rerun", str(pack_job["id"]), "--resume", "--json")
    assert again.code == 0, again.err
    rerun = json.loads(again.out)
    assert rerun["rerun_of"] == pack_job["id"] and rerun["group_id"] == 2
    wait_state(cli, rerun["id"], timeout=900)
    rows = points(2)
    assert [rows[i]["state"] for i in (1, 2)] == ["completed", "completed"], rows
    assert "[resume] step=" in cli("logs", str(rows[1]["id"])).out  # not from step 1 again
    resumed, fresh = (run_steps(rows[i]["run_dir"]) for i in (1, 2))
    assert [r["step"] for r in resumed] == list(range(1, 61))  # every step once, in order
    assert [r["step"] for r in fresh] == list(range(1, 11))
