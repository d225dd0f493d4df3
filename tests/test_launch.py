"""`mmm-orch launch` inside a running allocation: found from the scheduler's variables, run on its
nodes through the machine's launcher with the script a batch job of the same plan would run, in
the foreground, recorded as a job. On the live Slurm cluster (salloc) and PBS server (a batch
script someone else wrote, and qsub -I through --allocate). Ctrl-C to a launch inside salloc:
test_runtime_contract, with the example project."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.jobs import TERMINAL, assert_nothing_recorded, wait_state
from helpers.profiles import write_machine
from helpers.schedulers import PBS_BIN, qsub_own_script

from mmm_orch.errors import MmmError
from mmm_orch.planning import Request
from mmm_orch.planning.placement import nodes_for, which_machine
from mmm_orch.schedulers import current_allocation as current
from mmm_orch.schedulers.allocation import Allocation, expand_hostlist, unique_lines

MMM_ORCH = [sys.executable, "-m", "mmm_orch"]
# One write of one whole line (ranks share the log; see test_own_command.RANKS).
RANKS = ("import os, socket; os.write(1, ('rank %s %s %s\\n' % (os.environ.get('SLURM_PROCID', "
         "os.environ.get('PMI_RANK')), socket.gethostname(), os.environ.get('SLURMD_NODENAME', "
         "''))).encode())")


@pytest.mark.parametrize("text,names", [
    ("n1", ["n1"]),
    ("n[1-3,7],gpu02", ["n1", "n2", "n3", "n7", "gpu02"]),
    ("nid[0008-0010]", ["nid0008", "nid0009", "nid0010"]),
    ("x1000c0s[0-1]b0n0", ["x1000c0s0b0n0", "x1000c0s1b0n0"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("n[1-2],n2", ["n1", "n2"]),
])
def test_slurm_host_lists_expand(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n[a]", "n]", "n[3-1]", "n[[1]]"])
def test_a_malformed_host_list_is_an_error_naming_it(text):
    with pytest.raises(MmmError, match="host list .* is malformed"):
        expand_hostlist(text)


def test_the_allocation_is_found_from_the_schedulers_variables(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x4102c0s0b0n0\nx4102c0s0b0n0\nx4102c0s1b0n0\n")
    assert current({}) is None
    assert current({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]"}) == \
        Allocation("slurm", "42", ("n1", "n2"))
    assert current({"PBS_JOBID": "7.vm", "PBS_NODEFILE": str(nodefile)}) == \
        Allocation("pbs", "7.vm", ("x4102c0s0b0n0", "x4102c0s1b0n0"))
    assert unique_lines("a\n\nb\na\n") == ["a", "b"]


def test_nodes_are_all_of_the_allocation_less_the_bad_or_a_slice():
    allocation = Allocation("slurm", "9", ("n1", "n2", "n3", "n4"))
    ask = lambda nodes=None: Request("slurm-local", "command", nodes=nodes)  # noqa: E731
    assert nodes_for(allocation, ask(), 0, ()) == ("n1", "n2", "n3", "n4")
    assert nodes_for(allocation, ask(), 0, ("n2",)) == ("n1", "n3", "n4")
    assert nodes_for(allocation, ask(2), 2, ()) == ("n3", "n4")
    with pytest.raises(MmmError, match=r"--nodes 3 is invalid: slurm job 9 has 4 usable nodes, 2 "):
        nodes_for(allocation, ask(3), 2, ())
    with pytest.raises(MmmError, match=r"--nodes 4 .* 3 usable nodes \(1 known-bad left out"):
        nodes_for(allocation, ask(4), 0, ("n4",))
    with pytest.raises(MmmError, match="--first-node 4 is invalid"):
        nodes_for(allocation, ask(1), 4, ())


def test_outside_an_allocation_the_error_names_the_command_that_gets_one(cli, monkeypatch):
    for name in ("SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(name, raising=False)
    result = cli("launch", "slurm-local", "dist_check", "-N", "2", "-t", "00:05:00")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1
    assert "not inside an allocation" in result.err
    assert "`salloc --partition=debug --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 -t 00:05:00`" \
        in result.err
    result = cli("launch", "pbs-local", "-A", "proj1", "--", "hostname")
    assert result.code == 2 and "qsub -I -A proj1 -q workq -l select=1:ncpus=2" in result.err
    assert_nothing_recorded()


def test_a_machine_of_another_scheduler_than_the_allocations_is_refused(cli, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    result = cli("launch", "pbs-local", "--", "hostname")
    assert result.code == 2 and "inside slurm job 5" in result.err
    result = cli("launch", "slurm-local", "-N", "3", "--", "hostname")
    assert result.code == 2 and "--nodes 3 is invalid: slurm job 5 has 2 usable nodes" in result.err
    result = cli("launch", "slurm-local", "--", "no-such-program-here", "--flag")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1
    assert "'no-such-program-here' is not found where the job runs" in result.err, result.err
    result = cli("launch", "slurm-local", "--dry-run", "--", "python3", "-c", "pass")
    assert result.code == 0 and "srun --nodes=2" in result.out, result.err  # python3: found
    assert_nothing_recorded()


@pytest.mark.parametrize("host,machine", [
    ("x3104c0s31b0n0.hsn.cm.polaris.alcf.anl.gov", "polaris"),
    ("x4102c5s2b0n0", "aurora"),
    ("aurora-uan-0010", "aurora"),
    ("nid001234", "perlmutter"),
    ("frontier01234", "frontier"),
    ("my-laptop", "local"),
])
def test_outside_an_allocation_the_machine_is_found_from_this_hosts_name(host, machine):
    assert which_machine("", None, host) == machine


def test_inside_an_allocation_the_machine_is_found_from_its_first_node(cli, isolated, monkeypatch):
    write_machine(isolated, "twin", "extends: slurm-local\nname: twin\n")
    write_machine(isolated, "elsewhere", "extends: slurm-local\nname: elsewhere\n"
                  "hostnames: ['zz\\d+']\n")
    write_machine(isolated, "unsaid", "extends: slurm-local\nname: unsaid\nhostnames: []\n")
    slurm = Allocation("slurm", "5", ("n1", "n2"))
    with pytest.raises(MmmError, match=r"matches the hostnames of slurm-local, twin; name one"):
        which_machine("", slurm, "login")
    assert which_machine("twin", slurm, "login") == "twin"  # a name given wins among matches
    assert which_machine("unsaid", slurm, "login") == "unsaid"  # and where it says nothing
    with pytest.raises(MmmError, match=r"^machine 'elsewhere' is invalid here: slurm job 5 \(first "
                       r"node n1\) matches the hostnames of slurm-local, twin, not elsewhere's"):
        which_machine("elsewhere", slurm, "login")
    with pytest.raises(MmmError, match=r"no machine profile's hostnames match slurm job 6"):
        which_machine("", Allocation("slurm", "6", ("gpu01",)), "login")

    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "zz[1-2]")
    result = cli("launch", "dist_check", "--dry-run")  # WORKLOAD alone: MACHINE is found
    assert result.code == 0, result.err
    assert "workload dist_check on elsewhere (" in result.out
    assert "srun --nodes=2" in result.out
    result = cli("launch", "slurm-local", "dist_check", "--dry-run")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1
    assert result.err.startswith("mmm-orch: error: machine 'slurm-local' is invalid here: slurm "
                                 "job 5 (first node zz1) matches the hostnames of elsewhere"), result.err
    assert_nothing_recorded()


@pytest.mark.live
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_allocate_gets_an_allocation_launches_in_it_and_keeps_the_exit_code(request, cli, isolated,
                                                                            kind, leftovers_cancelled):
    """`launch --allocate` outside any allocation: salloc, or qsub -I under a pseudo-terminal
    (this test has no terminal), with the plan's directives; the rank's own exit code comes back
    though qsub -I returns 0 whatever ran in it."""
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    machine = "slurm-local" if kind == "slurm" else "pbs-local"
    code = RANKS + "; import sys; sys.exit(3 if os.environ.get('SLURM_PROCID', os.environ.get('PMI_RANK')) == '1' else 0)"
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "PBS_JOBID")}
    env["PATH"] = f"{PBS_BIN}:{env['PATH']}"
    dry = subprocess.run([*MMM_ORCH, "launch", machine, "-N", "2", "--allocate", "--dry-run", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    assert dry.returncode == 0 and dry.stdout.startswith("salloc " if kind == "slurm" else
                                                         f"{PBS_BIN}/qsub -I "), dry.stderr
    proc = subprocess.run([*MMM_ORCH, "launch", machine, "-N", "2", "--allocate", "--",
                           sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Two jobs: the allocation the scheduler gave (recorded before it was asked for) and the
    # launch that ran in it.
    row = wait_state(cli, 2, TERMINAL, timeout=60)
    assert (row["state"], row["exit_code"], row["nodes"]) == ("failed", 3, 2)
    allocation = wait_state(cli, 1, TERMINAL, timeout=120)
    assert allocation["native_id"] and allocation["scheduler"] == kind, allocation
    assert not list((isolated.parent / "state" / "mmm-orch" / "jobs").glob("launch-*.json"))


HELD = {  # an allocation that stays pending: Slurm's start an hour from now, PBS's parked queue
    "slurm": ("extends: slurm-local\nname: held\ndirectives: ['--nodes={nodes}', "
              "'--ntasks-per-node={ranks_per_node}', '--cpus-per-task={cpus_per_rank}', "
              "'--begin=now+3600']\n", []),
    "pbs": ("extends: pbs-local\nname: held\n", ["-q", "parked"]),
}


@pytest.mark.live
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_allocate_stopped_or_killed_while_it_waits_leaves_its_allocation_recorded(
        request, cli, isolated, kind, leftovers_cancelled):
    """The allocation is recorded before it is asked for: stopped (SIGTERM) while it waits, the
    launch cancels what it asked for; killed outright (SIGKILL), `status` finds the allocation by
    its tag and `cancel` ends it. Nothing stays queued that the job database does not show."""
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    profile, words = HELD[kind]
    write_machine(isolated, "held", profile)
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "PBS_JOBID")}
    launches = {}
    for job, how in enumerate(("SIGTERM", "SIGKILL"), start=1):  # one after the other: job 1, 2
        name, err = f"held-{how.lower()}", isolated / f"launch-{how}.err"
        with open(err, "w") as stderr:
            launches[job] = subprocess.Popen(
                [*MMM_ORCH, "launch", "held", "--name", name, *words, "--allocate", "--", "true"],
                cwd=isolated, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=stderr, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _queued_by_name(name, kind):
            assert launches[job].poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.5)
    for job, how in enumerate(("SIGTERM", "SIGKILL"), start=1):
        os.kill(launches[job].pid, getattr(signal, how))
        launches[job].wait(timeout=60)
    rows = {r["id"]: r for r in json.loads(cli("status", "--all", "--json").out)}
    assert sorted(r["id"] for r in rows.values() if r["native_id"]) == [1, 2], rows
    assert rows[2]["state"] == "pending", rows  # found by its tag
    assert cli("cancel", "2").code == 0
    assert [wait_state(cli, job, TERMINAL, timeout=120)["state"] for job in (1, 2)] == \
        ["cancelled", "cancelled"]
    deadline = time.monotonic() + 60
    while _queued_by_name("held-sigterm", kind) or _queued_by_name("held-sigkill", kind):
        assert time.monotonic() < deadline, "an allocation is still queued"
        time.sleep(1)
    for launch in launches.values():
        if _group_alive(launch.pid):  # (salloc of a killed launch ends with its cancelled job)
            os.killpg(launch.pid, signal.SIGKILL)


def _queued_by_name(name: str, kind: str) -> bool:
    """Whether the scheduler holds a queued job of that name (asked directly, not through us)."""
    argv = (["squeue", "--noheader", "--states=PENDING,RUNNING", "--name", name, "-o", "%i"]
            if kind == "slurm" else [f"{PBS_BIN}/qselect", "-N", name, "-s", "QR"])
    return bool(subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_allocate_refuses_inside_an_allocation_and_on_a_machine_without_a_scheduler(cli, monkeypatch):
    result = cli("launch", "local", "--allocate", "--", "true")
    assert result.code == 2 and "machine local has no scheduler" in result.err
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    result = cli("launch", "slurm-local", "--allocate", "--", "true")
    assert result.code == 2 and "already runs inside slurm job 5" in result.err
    assert_nothing_recorded()


@pytest.mark.slow
def test_launch_on_local_runs_here_in_the_foreground(isolated):
    code = "import sys; print('hello from', __import__('os').environ['RANK'], flush=True); sys.exit(3)"
    proc = subprocess.run([*MMM_ORCH, "launch", "local", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    # The first rank to exit 3 makes torchrun end the other, which may not have printed yet.
    assert "hello from" in proc.stdout and "exit_code=3" in proc.stdout, proc.stdout
    row = json.loads(subprocess.run([*MMM_ORCH, "status", "1", "--json"], capture_output=True,
                                    text=True).stdout)[0]
    assert (row["state"], row["exit_code"], row["workload"]) == ("failed", 3, "command")


# As `launch` outside an allocation says to get one: the test cluster's nodes are shared, so the
# allocation asks for the CPUs of two ranks on each (a facility's nodes are the job's whole).
SALLOC = ["salloc", "-p", "debug", "--ntasks-per-node=2", "-t", "00:10:00"]


def _salloc(nodes: int, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SALLOC, "-N", str(nodes), *argv], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_inside_salloc_dist_check_runs_on_both_nodes_then_two_launches_side_by_side(cli, isolated):
    """In one allocation of two nodes: dist_check on both, recorded; then two launches of one
    node each at once (--first-node), on disjoint nodes, both complete. (A launch's exit code
    through salloc: the --allocate test above.)"""
    one = " ".join(MMM_ORCH) + " launch slurm-local -N 1 --first-node {} -- " + \
        f"{sys.executable} -c \"{RANKS}\""
    script = (f"{' '.join(MMM_ORCH)} launch slurm-local dist_check && "
              f"{{ {one.format(0)} > a.out 2>&1 & a=$!; {one.format(1)} > b.out 2>&1 & b=$!; "
              "wait $a && wait $b; }")
    proc = _salloc(2, "bash", "-c", script)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[dist_check] PASS world=4" in proc.stdout
    nodes = {line.split(" node=")[1].split()[0] for line in proc.stdout.splitlines()
             if line.startswith("[dist_check] rank=") and " node=" in line}
    assert len(nodes) == 2
    row = wait_state(cli, 1, TERMINAL, timeout=60)
    assert (row["state"], row["exit_code"], row["machine"]) == ("completed", 0, "slurm-local")
    record = json.loads(cli("show", "1", "--json").out)
    assert record["scheduler"] == "local" and record["plan"]["layout"]["nodes"] == 2
    assert "[dist_check] PASS world=4" in cli("logs", "1").out
    assert cli("timeline", "1").code == 0

    hosts = [{line.split()[3] for line in Path(name).read_text().splitlines()
              if line.startswith("rank ")} for name in ("a.out", "b.out")]
    assert all(len(h) == 1 for h in hosts) and hosts[0] != hosts[1], hosts
    rows = json.loads(cli("status", "--all", "--json").out)
    assert sorted((r["state"], r["nodes"]) for r in rows if r["id"] != 1) == \
        [("completed", 1), ("completed", 1)]


@pytest.mark.usefixtures("pbs_server", "leftovers_cancelled")
def test_a_batch_script_of_ones_own_launches_on_two_pbs_vnodes(cli, isolated):
    qsub_own_script(isolated, 2, f"{' '.join(MMM_ORCH)} launch pbs-local -- {sys.executable} -c "
                                 f"\"{RANKS}\"")
    deadline = time.monotonic() + 300
    while not (isolated / "pbs.out").exists() and time.monotonic() < deadline:
        time.sleep(1)
    row = wait_state(cli, 1, TERMINAL, timeout=120)
    log = cli("logs", "1").out
    assert (row["state"], row["exit_code"], row["machine"]) == ("completed", 0, "pbs-local"), log
    assert json.loads(cli("show", "1", "--json").out)["plan"]["layout"]["nodes"] == 2
    assert sorted(line.split()[1] for line in log.splitlines() if line.startswith("rank ")) == \
        ["0", "1", "2", "3"]


def test_finding_the_machine_runs_no_profiles_command(cli, isolated, monkeypatch, tmp_path):
    """A colleague's profile beside the user's, whose node-list command would run anything:
    looking for the allocation's machine reads profiles as data, so it never runs, whether the
    machine is named, found or not found; only the machine in use lists its nodes its way."""
    marker = tmp_path / "ran"
    for name, hostnames in (("colleague", "['n\\d+']"), ("other", "['zz\\d+']")):
        write_machine(isolated, name, f"extends: slurm-local\nname: {name}\n"
                      f"hostnames: {hostnames}\n"
                      f"scheduler: {{node_list: 'touch {marker}; echo n1'}}\n")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    for words in (("launch", "slurm-local", "dist_check", "--dry-run"),
                  ("launch", "dist_check", "--dry-run"),
                  ("launch", "slurm-local", "dist_check", "-N", "9", "--dry-run")):
        cli(*words)
        assert not marker.exists(), words
    assert cli("launch", "colleague", "dist_check", "--dry-run").code == 0
    assert marker.exists()  # named, it is the machine in use: its own command lists the nodes
    assert_nothing_recorded()


HOSTILE_NODELISTS = {
    "bracket groups that multiply": "a[0-99999]b[0-99999]",
    "a range of 5000 digits": "n[1-" + "9" * 5000 + "]",
    "shell syntax in a name": "n[1-2]$(touch canary)",
    "a line break in a name": "n1\ntouch canary",
    "a backquote": "`touch canary`",
    "unbalanced brackets": "n[1-2",
    "a range backwards": "n[5-1]",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_NODELISTS))
def test_a_hostile_slurm_node_list_is_refused_at_once(cli, isolated, monkeypatch, case):
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", HOSTILE_NODELISTS[case])
    started = time.monotonic()
    for words in (("launch", "slurm-local", "dist_check", "--dry-run"),
                  ("launch", "dist_check", "--dry-run")):
        result = cli(*words)
        assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
        assert "host list" in result.err, result.err
    assert time.monotonic() - started < 10  # counted, not expanded
    assert not (isolated / "canary").exists()
    assert_nothing_recorded()


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


HOSTILE_NODEFILES = {  # what PBS_NODEFILE names: made in tmp_path
    "a FIFO": _fifo,
    "/dev/zero": lambda _: "/dev/zero",
    "a directory": lambda path: (path.mkdir(), str(path))[1],
    "bytes that are not UTF-8": lambda path: (path.write_bytes(b"vm0\n\xff\xfe\n"), str(path))[1],
    "shell syntax in a name": lambda path: (path.write_text("vm0\n$(touch canary)\n"),
                                            str(path))[1],
    "a name with a space": lambda path: (path.write_text("vm0\nvm 1\n"), str(path))[1],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_NODEFILES))
def test_a_hostile_pbs_node_file_is_refused_unread(cli, isolated, monkeypatch, tmp_path, case):
    monkeypatch.setenv("PBS_JOBID", "7.server")
    monkeypatch.setenv("PBS_NODEFILE", HOSTILE_NODEFILES[case](tmp_path / "nodes"))
    for words in (("launch", "pbs-local", "dist_check", "--dry-run"),
                  ("launch", "dist_check", "--dry-run")):
        result = cli(*words)  # a FIFO read would block here: pytest's timeout would end it
        assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
        assert "PBS_NODEFILE" in result.err, result.err
    assert not (isolated / "canary").exists()
    assert_nothing_recorded()


def test_launch_here_checks_the_program_and_its_words_before_anything_is_recorded(cli, isolated):
    for words in (("launch", "local", "--", "no-such-program-here"),
                  ("launch", "local", "--", "   ", "x"), ("launch", "local", "--", "")):
        result = cli(*words)
        assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
        assert "command after --" in result.err, result.err
    assert_nothing_recorded()


def test_an_allocation_granting_fewer_cpus_than_the_plan_is_refused_with_both(cli, isolated,
                                                                              monkeypatch,
                                                                              tmp_path):
    """What a bare `salloc -N 2` grants on the test cluster's shared nodes (one CPU a node, in
    Slurm's words SLURM_JOB_CPUS_PER_NODE=1(x2)), and a PBS job of ncpus=1: the launch of two
    ranks a node is refused before anything runs, with the numbers and an allocation that fits
    (with --ntasks-per-node=2 it runs: the salloc launches above)."""
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "1(x2)")
    result = cli("launch", "slurm-local", "dist_check", "--dry-run")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "grants 1 CPU on a node (SLURM_JOB_CPUS_PER_NODE=1(x2))" in result.err, result.err
    assert "the plan runs 2 ranks x 1 CPU a node" in result.err, result.err
    assert "salloc --partition=debug --nodes=2 --ntasks-per-node=2" in result.err, result.err
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "2(x2)")
    assert cli("launch", "slurm-local", "dist_check", "--dry-run").code == 0
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_CPUS_PER_NODE"):
        monkeypatch.delenv(name)

    (tmp_path / "nodes").write_text("vm0\n")
    # (nodes as the node file names them: pbs-local's own node_list asks its server)
    write_machine(isolated, "pbsx", "extends: pbs-local\nname: pbsx\nscheduler: {node_list: ''}\n")
    monkeypatch.setenv("PBS_JOBID", "7.server")
    monkeypatch.setenv("PBS_NODEFILE", str(tmp_path / "nodes"))
    monkeypatch.setenv("NCPUS", "1")
    result = cli("launch", "pbsx", "dist_check", "--dry-run")
    assert result.code == 2 and "grants 1 CPU on a node (NCPUS=1)" in result.err, result.err
    monkeypatch.setenv("NCPUS", "2")
    result = cli("launch", "pbsx", "dist_check", "--dry-run")
    assert result.code == 0, result.err
    assert_nothing_recorded()


@pytest.mark.slow
def test_a_launch_killed_outright_takes_its_job_with_it(cli, isolated):
    """The launch holds its job: SIGKILLed (no handler runs), its supervisor still stops every
    process of the job as a cancel would, and the record ends; nothing runs on without it."""
    _kill_once_the_ranks_run(isolated, ["launch", "local"], "RANK", os.environ)
    row = wait_state(cli, 1, TERMINAL, timeout=60)
    assert row["state"] == "cancelled", row


def _kill_once_the_ranks_run(isolated: Path, words: list[str], rank_variable: str,
                             env) -> None:
    """Run `mmm-orch WORDS -- python` (two ranks that write their pids, then sleep), SIGKILL it
    once both run, and wait (bounded) until neither runs any more."""
    pids = isolated / "pids"
    with open(isolated / "launch.err", "w") as err:
        launch = subprocess.Popen(
            [*MMM_ORCH, *words, "--", sys.executable, "-c",
             f"import os, time; open('{pids}.' + os.environ.get('{rank_variable}', '0'), 'w')"
             ".write(str(os.getpid())); time.sleep(600)"],
            cwd=isolated, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=err, start_new_session=True)
    deadline = time.monotonic() + 240
    while len(list(isolated.glob("pids.*"))) < 2:
        assert launch.poll() is None and time.monotonic() < deadline, \
            (isolated / "launch.err").read_text()[-2000:]
        time.sleep(0.2)
    ranks = [int(p.read_text()) for p in isolated.glob("pids.*")]
    launch.kill()
    launch.wait()
    deadline = time.monotonic() + 120
    while any(_running(pid) for pid in ranks):
        assert time.monotonic() < deadline, "the ranks outlived the launch"
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.mark.usefixtures("pbs_server", "leftovers_cancelled")
def test_allocate_killed_while_its_command_runs_leaves_nothing_outside_the_allocation(cli,
                                                                                     isolated):
    """PBS: `launch --allocate` SIGKILLed while the command runs ends qsub -I, so PBS ends the
    job; the launch inside goes with it, and so do the ranks, which its supervisor had started
    in a session of their own (out of PBS's reach): it stops them as the launch holding them
    ends. Both records end."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "PBS_JOBID")}
    _kill_once_the_ranks_run(isolated, ["launch", "pbs-local", "--allocate"], "PMI_RANK", env)
    rows = {r["id"]: r for r in (wait_state(cli, i, TERMINAL, timeout=180) for i in (1, 2))}
    assert rows[2]["state"] == "cancelled", rows  # the launch, stopped with its allocation
    assert rows[1]["native_id"], rows  # the allocation, found by its tag and ended
