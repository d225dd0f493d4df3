"""The Python API (mmm_orch.api): the command line's semantics from a script. Every bad-input case
of the CLI corpus that Python can spell raises an MmmError with the same words and leaves nothing
behind; on the live PBS server: submit, wait, logs, cancel and re-attaching from another process;
on the live Slurm cluster: a sweep, a packed sweep, a chain, 8 threads submitting at once, and a
process killed in the middle of a submit; and the example scaling study on this computer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import mmm_orch
from helpers import REPO
from helpers.bad_input import CASES, files_under
from helpers.training import run_training
from mmm_orch.cli import build_parser

SAY_AND_EXIT_3 = "print('hello from the job', flush=True); raise SystemExit(3)"


def _pairs(items: list[str]) -> dict[str, str] | None:
    found = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            return None  # `--env FOO`: a dict cannot hold it
        found[key] = value
    return found


PARSER = build_parser()  # one for the corpus: each of xdist's workers reads it as it collects


def api_call(argv: list[str]):
    """The API call that asks what `mmm-orch ARGV` asks, or None where Python cannot spell the
    mistake (the parser's own type errors are tested below, in Python's types)."""
    at = argv.index("--") if "--" in argv else len(argv)
    program = argv[at + 1:] if at < len(argv) else None
    try:
        args = PARSER.parse_args(argv[:at])
    except SystemExit:
        return None
    if args.command not in ("render", "submit", "sweep") or getattr(args, "out", None):
        return None
    options, env = _pairs(args.options), _pairs(args.env)
    if options is None or env is None or program == []:
        return None
    common = dict(command=program, queue=args.queue, walltime=args.walltime,
                  account=args.account, name=args.name, env=env, presets=args.presets,
                  no_presets=args.no_presets, spare_nodes=args.spare_nodes,
                  stage_env=args.stage_env, workdir=getattr(args, "workdir", None),
                  template=args.template)
    if args.command == "render":
        return lambda: mmm_orch.render(args.machine, args.workload, nodes=args.nodes,
                                       options=options, **common)
    if args.command == "submit":
        return lambda: mmm_orch.submit(args.machine, args.workload, nodes=args.nodes,
                                       options=options, chain=args.chain or 0, host=args.host,
                                       **common)
    grid = {key: value.split(",") for key, value in options.items()}
    nodes = None if not args.nodes else [int(n) if n.isdigit() else n
                                         for n in args.nodes.split(",")]
    return lambda: mmm_orch.sweep(args.machine, args.workload, nodes=nodes, grid=grid,
                                  host=args.host, **common)


# Where Python's own types refuse a value first, the words name the parameter as Python spells
# it (the command line parses a node count itself; Python is given an int, up to SQLite's).
PYTHON_WORDS = {"huge node count": ["nodes 99999999999999999999999 is invalid"],
                "sweep nodes not a number": ["nodes 'x' is invalid"],
                "sweep nodes empty item": ["nodes '' is invalid"]}
SPELLED = [(case[0], api_call(case[1]), PYTHON_WORDS.get(case[0], case[2])) for case in CASES]
SPELLED = [case for case in SPELLED if case[1] is not None]


def test_most_of_the_corpus_has_a_python_spelling():
    planning = [c for c in CASES if c[1][0] in ("render", "submit", "sweep")]
    assert len(SPELLED) >= 0.9 * len(planning) and len(SPELLED) >= 150, (len(SPELLED), len(planning))


@pytest.mark.parametrize("call,fragments", [c[1:] for c in SPELLED], ids=[c[0] for c in SPELLED])
def test_each_refusal_raises_the_same_words_and_leaves_nothing(tmp_path, call, fragments):
    before = files_under(tmp_path, tmp_path / "cache")
    with pytest.raises(mmm_orch.MmmError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message.strip()
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert files_under(tmp_path, tmp_path / "cache") == before


@pytest.mark.parametrize("call,field", [
    (lambda: mmm_orch.plan("local", "fsdp", nodes="two"), "nodes"),
    (lambda: mmm_orch.plan("local", "fsdp", nodes=True), "nodes"),
    (lambda: mmm_orch.plan("local", "fsdp", nodes=0), "nodes"),
    (lambda: mmm_orch.plan("local", "fsdp", spare_nodes=-1), "spare_nodes"),
    (lambda: mmm_orch.plan("local", "fsdp", options=["epochs=1"]), "options"),
    (lambda: mmm_orch.plan("local", "fsdp", env={1: "x"}), "env"),
    (lambda: mmm_orch.plan("local", "fsdp", presets="nccl"), "presets"),
    (lambda: mmm_orch.plan("local", command="python3 x.py"), "command"),
    (lambda: mmm_orch.plan("local"), "workload"),
    (lambda: mmm_orch.plan(None, "fsdp"), "machine"),
    (lambda: mmm_orch.plan("local", "fsdp", stage_env="yes"), "stage_env"),
    (lambda: mmm_orch.submit("local", "fsdp", chain=201), "chain"),
    (lambda: mmm_orch.submit("local", "fsdp", chain=-1), "chain"),
    (lambda: mmm_orch.sweep("local", "fsdp", nodes="1,2"), "nodes"),
    (lambda: mmm_orch.sweep("local", "fsdp", grid={"lr": "1e-3"}), "grid lr"),
    (lambda: mmm_orch.jobs(state="finished"), "state"),
    (lambda: mmm_orch.plan("local", "fsdp", options={"epochs": "x"}), "--set epochs"),
    (lambda: mmm_orch.plan("nowhere", "fsdp"), "machine"),
    (lambda: mmm_orch.submit(mmm_orch.plan("local", "fsdp"), nodes=2), "nodes"),
    (lambda: mmm_orch.submit(mmm_orch.plan("local", "fsdp"), "fsdp"), "workload"),
])
def test_a_wrong_type_or_value_is_an_invalid_value_naming_its_field(tmp_path, call, field):
    before = files_under(tmp_path, tmp_path / "cache")
    with pytest.raises(mmm_orch.InvalidValue) as raised:
        call()
    assert raised.value.field == field and raised.value.allowed
    assert files_under(tmp_path, tmp_path / "cache") == before


@pytest.mark.slow
def test_import_is_instant_and_the_plan_is_the_clis():
    code = ("import sys, mmm_orch; print(sorted(m for m in ('torch', 'mmm_orch.api', "
            "'mmm_orch.planning', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
    assert (Path(mmm_orch.__file__).parent / "py.typed").is_file()
    # Polaris: its qsub is not on PATH here (conftest), so both reviews count the same recorded
    # jobs. A Slurm machine's review asks this host's squeue, whose debug partition holds the
    # other tests' jobs of the moment: Perlmutter's debug was full for one render, not the other.
    script = mmm_orch.render("polaris", "fsdp_tp", nodes=2, account="m1234",
                             options={"tp": 2, "steps": 10})
    cli = subprocess.run([sys.executable, "-m", "mmm_orch", "render", "polaris", "fsdp_tp", "-N",
                          "2", "-A", "m1234", "--set", "tp=2", "--set", "steps=10"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and script == cli.stdout
    plan = mmm_orch.plan("perlmutter", "fsdp_tp", nodes=2, account="m1234", options={"tp": 2})
    assert plan.layout.mesh == {"dp": 4, "tp": 2, "pp": 1, "cp": 1} and plan.queue.account == "m1234"


@pytest.mark.slow
def test_a_plan_made_once_is_submitted_as_reviewed_each_time_a_new_job(isolated):
    plan = mmm_orch.plan("local", command=[sys.executable, "-c", "print('planned once')"])
    jobs = [mmm_orch.submit(plan) for _ in range(2)]
    assert [job.id for job in jobs] == [1, 2]
    assert jobs[0].record.job_dir != jobs[1].record.job_dir
    for job in jobs:
        assert job.wait(timeout=120, poll=0.2).state == "completed", job.logs()
        assert "planned once" in job.logs()
        assert "planned once" in mmm_orch.job(job.id).record.script


# The API's verbs call the use cases the command line calls; what the schedulers make of a job
# (its end, a cancel) is proven on each by test_slurm_cluster and test_pbs_server. Here the API
# meets one live server, PBS; its sweeps, chains and concurrent submits meet Slurm below.
@pytest.mark.usefixtures("pbs_server", "leftovers_cancelled")
def test_submit_wait_logs_cancel_and_find_again_from_another_process(isolated):
    job = mmm_orch.submit("pbs-local", command=[sys.executable, "-c", SAY_AND_EXIT_3])
    assert job.id == 1 and job.native_id and job.state in ("pending", "running")
    assert job.wait(timeout=300, poll=0.5) is job
    assert (job.state, job.exit_code) == ("failed", 3), job.logs()
    assert "hello from the job" in job.logs() and job.logs(tail=1).count("\n") <= 1
    assert [e["event"] for e in job.timeline()][:2] == ["submitted", "job start"]

    sleeper = mmm_orch.submit("pbs-local", command=["sleep", "600"])
    found = subprocess.run(
        [sys.executable, "-c", "import mmm_orch, json; j = mmm_orch.job(2); "
         "print(json.dumps([j.native_id, [x.id for x in mmm_orch.jobs(state='failed')]]))"],
        capture_output=True, text=True, timeout=120)
    assert json.loads(found.stdout) == [sleeper.native_id, [1]], found.stderr
    assert any("cancel" in line for line in sleeper.cancel())
    assert sleeper.wait(timeout=120, poll=0.5).state == "cancelled"
    assert [j.state for j in mmm_orch.refresh(mmm_orch.jobs())] == ["failed", "cancelled"]


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_a_sweep_and_a_chain_on_slurm(isolated):
    # The sweep's points wait in the parked partition (they never run): a sweep's jobs run and
    # are reported in test_sweeps (the same use case, from the command line) and, from here, in
    # the packed sweep's test below.
    study = mmm_orch.sweep("slurm-local", "dist_check", nodes=[1, 2], queue="parked")
    assert [p["nodes"] for p in study.points] == [1, 2] and len(study.jobs) == 2
    assert [(job.id, job.record.nodes, job.state) for job in mmm_orch.refresh(study.jobs)] == \
        [(1, 1, "pending"), (2, 2, "pending")]
    rows = mmm_orch.report(study)
    assert [(r["job"], r["nodes"], r["state"]) for r in rows] == [(1, 1, "pending"),
                                                                  (2, 2, "pending")]
    for job in study.jobs:
        job.cancel()

    (isolated / ".mmm-orch" / "workloads").mkdir(parents=True)
    (isolated / ".mmm-orch" / "workloads" / "mine.yaml").write_text(
        "name: mine\nresumable: true\n")
    program = [sys.executable, "-c", "import os; os.makedirs(os.environ['MMM_ORCH_RUN_DIR'], "
               "exist_ok=True); print('step=1 loss=1', flush=True)"]
    links = mmm_orch.submit("slurm-local", "mine", command=program, chain=2)
    assert [j.id for j in links] == [3, 4] and links[0].links == links
    assert links[0].wait(timeout=300, poll=0.5).state == "completed", links[0].logs()
    assert links[1].wait(timeout=120, poll=0.5).state == "cancelled"  # the chain finished first


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_eight_threads_submitting_at_once_record_every_job_once(isolated):
    made, errors = [], []

    def one(i: int) -> None:
        try:  # (the parked partition takes jobs and never runs them: this is about submitting)
            made.append(mmm_orch.submit("slurm-local", command=["true"], name=f"t{i}",
                                        queue="parked"))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert sorted(j.id for j in made) == list(range(1, 9))
    assert len({j.native_id for j in made}) == 8
    assert {job.state for job in mmm_orch.refresh(made)} == {"pending"}
    rows = subprocess.run([sys.executable, "-m", "mmm_orch", "status", "--all", "--json"],
                          capture_output=True, text=True, timeout=60).stdout
    assert sorted(r["name"] for r in json.loads(rows)) == sorted(f"t{i}" for i in range(8))
    for job in made:
        job.cancel()


KILLING_SBATCH = """#!/bin/bash
# The real sbatch, then the submitting process killed before it reads the answer.
out=$(/usr/bin/sbatch "$@"); echo "$out"; kill -9 $PPID
"""


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_a_process_killed_mid_submit_leaves_one_record_the_next_refresh_settles(isolated):
    sbatch = isolated / "sbatch"
    sbatch.write_text(KILLING_SBATCH)
    sbatch.chmod(0o755)
    (isolated / ".mmm-orch" / "machines").mkdir(parents=True)
    (isolated / ".mmm-orch" / "machines" / "slurm-killed.yaml").write_text(
        f"extends: slurm-local\nname: slurm-killed\nscheduler: {{commands: {{submit: {sbatch}}}}}\n")
    child = subprocess.run([sys.executable, "-c", "import mmm_orch; mmm_orch.submit("
                            "'slurm-killed', command=['sleep', '600'], queue='parked')"],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    (job,) = mmm_orch.jobs()
    assert job.state == "submitting" and not job.native_id
    job.refresh()
    assert job.state == "pending" and job.native_id, job
    assert job.native_id in subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True,
                                           text=True).stdout.split()
    assert [j.id for j in mmm_orch.jobs()] == [1]
    job.cancel()
    assert job.wait(timeout=120, poll=0.5).state == "cancelled"


@pytest.mark.slow
def test_the_example_scaling_study_runs(isolated):
    """On this computer, its trainings on this host's cores: what the example does on a
    scheduler (a sweep submitted, waited for and reported) is the API's own, proven on Slurm
    above and below."""
    argv = [sys.executable, str(REPO / "examples" / "scaling_study.py"), "--machine", "local",
            "--nodes", "1"]
    proc = run_training(argv, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" completed (exit 0)") == 2
    assert (isolated / "scaling-report" / "report.html").is_file()
    assert "samples/s per device" in proc.stdout


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_a_packed_sweep_runs_in_one_job_and_is_reported_point_by_point(isolated):
    study = mmm_orch.sweep("slurm-local", "dist_check", nodes=[1, 2], devices=[1], pack=True)
    assert study.jobs == [] and study.pack.record.nodes == 2  # points are recorded as they start
    assert study.points[2] == {"nodes": 1, "devices": "1"}
    assert study.pack.wait(timeout=600, poll=0.5).state == "completed", study.pack.logs()
    rows = mmm_orch.report(study)
    assert [(r["nodes"], r["state"]) for r in rows] == [(1, "completed"), (2, "completed"),
                                                       (1, "completed")]
    assert all(r["busbw_gbps"] is not None for r in rows)
    with pytest.raises(mmm_orch.InvalidValue, match="pack_nodes 2 is invalid: only with pack=True"):
        mmm_orch.sweep("slurm-local", "dist_check", nodes=[1, 2], pack_nodes=2)
    with pytest.raises(mmm_orch.InvalidValue, match="devices .* is invalid: only with pack=True"):
        mmm_orch.sweep("slurm-local", "dist_check", devices=[1])
