"""Submission under faults: the submit command is wrapped by a script that calls the real one and
then misbehaves: it kills mmm-orch, reports a timeout after the scheduler took the job, hangs, or
fails to connect. Whatever happens, one submit makes at most one job, and every job has exactly
one record (after the next `status`).

Live, once on each scheduler (Slurm and OpenPBS), each way the protocol meets the scheduler: a
submit killed before and after the scheduler took the job (settled by `status`), a timeout after
it was taken (looked up and adopted at once), a retry that made a duplicate (cancelled), a retry
refused after an ambiguous attempt (the record kept), kills at random instants, and a directive
the scheduler refuses. Jobs go to a queue that accepts jobs and never starts them (Slurm: a
partition that is down; PBS: a queue that is not started), so the tests occupy no node. How each
way a submit command can end reads (died, silent, hung, unsent, refused), in-process: the
scheduler's own words, codes and signals, through the same wrapper."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.jobs import assert_nothing_recorded, cancel_leftovers
from helpers.profiles import write_machine, write_probe
from helpers.schedulers import PBS_BIN
from mmm_orch.injob.protocol import RECORD_FILE
from mmm_orch.schedulers.base import FIND_SLACK_S


@dataclass(frozen=True)
class Sched:
    kind: str
    machine: str
    submit: str            # the real submit command
    timeout_text: str      # what the command says when the request timed out after sending
    unsent_text: str       # what it says when it never reached the scheduler
    profile: str           # the user profile: the real machine with bare command names
    refused_text: str      # a refusal in the scheduler's own words

    def jobs_named(self, name: str) -> dict[str, str]:
        """Ground truth from the scheduler itself: job id -> state, for jobs with this name."""
        name += RUN
        if self.kind == "slurm":
            out = subprocess.run(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i|%T"],
                                 capture_output=True, text=True, check=True).stdout
            return dict(line.split("|") for line in out.split())
        ids = subprocess.run([f"{PBS_BIN}/qselect", "-x", "-N", name], capture_output=True,
                             text=True, check=True).stdout.split()
        if not ids:
            return {}
        table = subprocess.run([f"{PBS_BIN}/qstat", "-x", *ids], capture_output=True,
                               text=True).stdout.splitlines()[2:]  # id name user time S queue
        return {line.split()[0]: line.split()[-2] for line in table if line.strip()}


SLURM = Sched("slurm", "slurm-faults", "/usr/bin/sbatch",
              "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
              "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
              "(connect failure)",
              "extends: slurm-local\nname: slurm-faults\n",
              "sbatch: error: Batch job submission failed: Invalid account or account/partition "
              "combination specified")
PBS = Sched("pbs", "pbs-faults", f"{PBS_BIN}/qsub",
            "qsub: Premature end of message from server",
            "Connection refused\nqsub: cannot connect to server vm (errno=111)",
            "extends: pbs-local\nname: pbs-faults\n"
            "scheduler: {commands: {submit: qsub, query: qstat, cancel: qdel}}\n",
            "qsub: Job violates queue and/or server resource limits")

WRAPPER = r"""#!/bin/bash
# A submit command that calls the real one and then misbehaves as $FAULT says.
count=$(( $(cat "$STATE/calls" 2>/dev/null || echo 0) + 1 )); echo $count > "$STATE/calls"
real() { "$REAL" "$@"; }
case "$FAULT:$count" in
  kill-before:*) kill -9 $PPID; exec sleep 5 ;;
  kill-after:*) out=$(real "$@"); echo "$out"; kill -9 $PPID; exit 0 ;;
  die-after:*) real "$@" >/dev/null; kill -9 $$ ;;
  term-after:*) real "$@" >/dev/null; kill -TERM $$ ;;
  silent-after:*) real "$@" >/dev/null; exit 1 ;;
  shell-killed-after:*) real "$@" >/dev/null; echo "bash: line 1: $$ Killed $REAL" >&2; exit 137 ;;
  words-then-killed-after:*) real "$@" >/dev/null; echo "$REFUSED_TEXT" >&2; kill -9 $$ ;;
  refuse:*) echo "$REFUSED_TEXT" >&2; exit "${REFUSED_CODE:-1}" ;;
  refused-retry:1) real "$@" >/dev/null; echo "$TIMEOUT_TEXT" >&2; exit 1 ;;
  refused-retry:*) echo "$REFUSED_TEXT" >&2; exit 1 ;;
  timeout-after:*) real "$@" >/dev/null; echo "$TIMEOUT_TEXT" >&2; exit 1 ;;
  hang-after:*) real "$@" >/dev/null; exec sleep 600 ;;
  hang-first:1) exec sleep 600 ;;
  unsent-first:1) echo "$UNSENT_TEXT" >&2; exit 1 ;;
  duplicate:1) real "$@" >/dev/null; echo "$TIMEOUT_TEXT" >&2; exit 1 ;;
  slow:*) sleep "$DELAY"; exec "$REAL" "$@" ;;
  *) exec "$REAL" "$@" ;;
esac
"""
# The first lookup after the ambiguous failure sees nothing (a slow scheduler), so the job is
# submitted again: the duplicate must then be found and cancelled, or the retry's refusal must not
# be taken for proof. `forgotten`: the controller no longer lists the job (Slurm's MinJobAge).
BLIND_LOOKUP = r"""#!/bin/bash
count=$(( $(cat "$STATE/lookups" 2>/dev/null || echo 0) + 1 )); echo $count > "$STATE/lookups"
[[ ($FAULT == duplicate || $FAULT == refused-retry) && $count -eq 1 ]] && exit 0
[[ $FAULT == forgotten ]] && exit 0
exec "$REAL_LOOKUP" "$@"
"""


@pytest.fixture(params=[SLURM, PBS], ids=["slurm", "pbs"])
def sched(request, isolated, monkeypatch, tmp_path):
    fixture = "slurm_cluster" if request.param.kind == "slurm" else "pbs_server"
    request.getfixturevalue(fixture)
    s = request.param
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True, exist_ok=True)
    (machines / f"{s.machine}.yaml").write_text(s.profile)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    submit = bin_dir / Path(s.submit).name
    submit.write_text(WRAPPER)
    lookup_name = "squeue" if s.kind == "slurm" else "qselect"
    lookup = bin_dir / lookup_name
    lookup.write_text(BLIND_LOOKUP)
    for script in (submit, lookup):
        script.chmod(0o755)
    state = tmp_path / "wrapper-state"
    state.mkdir()
    extra = PBS_BIN + os.pathsep if s.kind == "pbs" else ""
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{extra}{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(state))
    monkeypatch.setenv("REAL", s.submit)
    monkeypatch.setenv("REAL_LOOKUP", "/usr/bin/squeue" if s.kind == "slurm" else f"{PBS_BIN}/qselect")
    monkeypatch.setenv("TIMEOUT_TEXT", s.timeout_text)
    monkeypatch.setenv("UNSENT_TEXT", s.unsent_text)
    monkeypatch.setenv("REFUSED_TEXT", s.refused_text)
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    monkeypatch.setenv("MMM_ORCH_RETRY_DEADLINE", "8")
    write_probe(isolated, "noop", "pass\n")
    yield s
    cancel_leftovers()


RUN = os.urandom(3).hex()  # job names unique to this run: schedulers remember ended jobs


def start(sched: Sched, name: str, fault: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mmm_orch", "submit", sched.machine, "noop", "--name", name + RUN,
         "-q", "parked"], env={**os.environ, "FAULT": fault, **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def submit(sched: Sched, name: str, fault: str) -> subprocess.CompletedProcess:
    proc = start(sched, name, fault)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def records() -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "mmm_orch", "status", "--all", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def settled(timeout: float = 90) -> list[dict]:
    """The records once no submission is left unresolved (status reconciles them)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = records()
        if not any(r["state"] == "submitting" for r in rows):
            return rows
        assert time.monotonic() < deadline, [r for r in rows if r["state"] == "submitting"]
        time.sleep(2)


def exactly_once(sched: Sched, name: str, expected_jobs: int) -> None:
    """Every live job with this name has exactly one record, and every record one job."""
    rows = settled()
    live = {i: st for i, st in sched.jobs_named(name).items()
            if st not in ("CANCELLED", "F")}
    recorded = [r["native_id"] for r in rows]
    assert len(live) == expected_jobs, (live, rows)
    assert sorted(recorded) == sorted(live), (recorded, live)


def job_copies() -> list[dict]:
    """The records' own copies in the job directories (what `db recover` rebuilds from)."""
    jobs = Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs"
    return [json.loads(f.read_text()) for f in sorted(jobs.glob(f"*/{RECORD_FILE}"))]


def test_killed_after_the_scheduler_took_the_job(sched):
    """Killed before it could write the record's copy: the status that settles the record
    writes it, with the scheduler's id, so a rebuilt database knows the job too."""
    proc = submit(sched, "killedafter", "kill-after")
    assert proc.returncode == -signal.SIGKILL
    exactly_once(sched, "killedafter", 1)
    (row,) = records()
    assert [(c["id"], c["native_id"], c["tag"]) for c in job_copies()] == \
        [(row["id"], row["native_id"], row["tag"])]
    db = Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db"
    for leftover in db.parent.glob("jobs.db*"):
        leftover.unlink()  # the database and its backup lost: only the job directories remain
    recovered = subprocess.run([sys.executable, "-m", "mmm_orch", "db", "recover"],
                               capture_output=True, text=True, timeout=120)
    assert recovered.returncode == 0, recovered.stderr
    assert [(r["native_id"], r["tag"]) for r in records()] == [(row["native_id"], row["tag"])]


HISTORY = 8  # finished jobs of one name: the old lookup read every one of them (8 + 5 words)


# PBS only: squeue reads the controller's jobs, sacct the record's time window (the Slurm side
# is test_a_job_the_controller_forgot_is_found_in_accounting).
@pytest.mark.parametrize("sched", [PBS], ids=["pbs"], indirect=True)
def test_a_tag_lookup_costs_the_same_whatever_the_history(sched, tmp_path):
    """Jobs of the same name from before the submission are not read: the one `status` after a
    killed submit settles its record in a few seconds, asking qstat about the jobs created since
    the record only (PBS: qselect -t c.ge.), not about the name's whole history."""
    name = "history" + RUN
    old = [subprocess.run([f"{PBS_BIN}/qsub", "-q", "parked", "-N", name, "-v",
                           "MMM_ORCH_TAG=another", "--", "/bin/true"], capture_output=True,
                          text=True, check=True).stdout.strip() for _ in range(HISTORY)]
    made = time.monotonic()
    subprocess.run([f"{PBS_BIN}/qdel", *old], capture_output=True, check=True)

    def named() -> list[str]:  # qselect: qstat of many ids takes up to a minute on this server
        return subprocess.run([f"{PBS_BIN}/qselect", "-x", "-N", name], capture_output=True,
                              text=True, check=True).stdout.split()

    assert sorted(named()) == sorted(old)  # all of it in the server's history
    # The history is older than the lookup's window (the record's time less the clock skew).
    time.sleep(max(0.0, made + FIND_SLACK_S + 3 - time.monotonic()))
    asked = tmp_path / "qstat-ids"
    qstat = tmp_path / "bin" / "qstat"
    qstat.write_text(f'#!/bin/bash\necho $# >> {asked}\nexec {PBS_BIN}/qstat "$@"\n')
    qstat.chmod(0o755)
    proc = submit(sched, "history", "kill-after")
    assert proc.returncode == -signal.SIGKILL
    asked.unlink(missing_ok=True)
    rows = records()  # one status
    job = [i for i in named() if i not in old]
    assert len(job) == 1 and [r["native_id"] for r in rows] == job, (rows, job)
    # qstat -f -F dsv -x ID...: 5 words and the ids (the lookup's, then status's query).
    assert max(int(n) for n in asked.read_text().split()) <= 5 + 1, asked.read_text()


@pytest.mark.parametrize("sched", [SLURM], ids=["slurm"], indirect=True)  # PBS keeps history
def test_a_job_the_controller_forgot_is_found_in_accounting(sched, monkeypatch):
    """A killed submit's job that ended before `status` ran: once the Slurm controller forgets
    it (MinJobAge; here squeue shows nothing), sacct over the record's time window still has it
    with its tag, so the record is settled, never removed."""
    proc = submit(sched, "forgotten", "kill-after")
    assert proc.returncode == -signal.SIGKILL
    (job,) = sched.jobs_named("forgotten")
    subprocess.run(["scancel", job], check=True)
    # Accounting lists an ended job by name and time a few seconds after its end (long before
    # the controller forgets it): wait for that, as the controller's MinJobAge would.
    deadline = time.monotonic() + 60
    while f"{job}|mmm-orch:" not in subprocess.run(
            ["sacct", "-X", "-n", "-P", "--name", "forgotten" + RUN, "-S", "now-1hour", "-o",
             "JobID,Comment"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "the ended job never reached accounting"
        time.sleep(1)
    monkeypatch.setenv("FAULT", "forgotten")
    assert [r["native_id"] for r in records()] == [job]  # one status settles it
    assert [(r["native_id"], r["state"]) for r in records()] == [(job, "cancelled")]


def test_a_refused_retry_after_an_ambiguous_attempt_keeps_the_record(sched):
    """The first attempt went through but said it timed out, the lookup did not show the job yet,
    and the retry was refused (a limit that counts the first job, say): that refusal proves
    nothing about the first attempt, so the record stays and `status` settles it."""
    proc = submit(sched, "refusedretry", "refused-retry")
    assert proc.returncode == 3 and sched.refused_text in proc.stderr, proc.stderr
    exactly_once(sched, "refusedretry", 1)


def test_killed_before_the_scheduler_was_asked(sched):
    proc = submit(sched, "killedbefore", "kill-before")
    assert proc.returncode == -signal.SIGKILL
    assert [r["state"] for r in records()] == ["submitting"]  # a trace, until status settles it
    exactly_once(sched, "killedbefore", 0)


def test_a_timeout_reported_after_the_job_was_taken(sched):
    proc = submit(sched, "timedout", "timeout-after")
    assert proc.returncode == 0, proc.stderr
    exactly_once(sched, "timedout", 1)


def test_a_duplicate_made_by_a_retry_is_cancelled(sched):
    proc = submit(sched, "dup", "duplicate")
    assert proc.returncode == 0, proc.stderr
    jobs = sched.jobs_named("dup")
    assert len(jobs) == 2  # the scheduler really got the job twice
    exactly_once(sched, "dup", 1)


def test_submit_killed_at_random_instants(sched):
    """SIGKILL at a random point of the whole protocol (start-up, rendering, the record, the
    scheduler call, the update), many times over."""
    rng = random.Random(2026)
    for _ in range(10):
        proc = start(sched, "sweepkill", "slow", DELAY="0.3")
        time.sleep(rng.uniform(0.0, 1.6))
        proc.kill()
        proc.communicate()
    # A scheduler command already started outlives the killed submit and may still hand in its
    # job (the fake one takes 0.3 s): count once they are all done.
    time.sleep(5)
    jobs = len({i for i, st in sched.jobs_named("sweepkill").items() if st not in ("CANCELLED", "F")})
    assert jobs <= 10
    exactly_once(sched, "sweepkill", jobs)


@pytest.mark.parametrize("machine,directive,words", [
    ("slurm-local", "--mem=900G", "Memory specification can not be satisfied"),
    ("pbs-local", "-l bogus=3", "Unknown resource Resource_List.bogus"),
])
@pytest.mark.live
def test_a_directive_the_scheduler_refuses_is_one_call_and_exit_2(request, cli, isolated,
                                                                    machine, directive, words):
    """The live scheduler's refusal of a directive (memory no node has, a resource PBS does not
    know) is permanent: one call, exit 2 with its words, nothing recorded, no retry for a
    minute. (sbatch's own refusal of an option it does not take, before it asks the controller:
    test_a_refusal_in_the_scheduler_s_words_proves_it_has_no_job.)"""
    request.getfixturevalue("slurm_cluster" if machine == "slurm-local" else "pbs_server")
    write_machine(isolated, "refuses", f"extends: {machine}\nname: refuses\n"
                  f"directives: [{json.dumps(directive)}]\n")
    started = time.monotonic()
    result = cli("submit", "refuses", "dist_check")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert words in result.err, result.err
    assert time.monotonic() - started < 20, time.monotonic() - started
    assert_nothing_recorded()


# -- how a submit command ended, in-process -------------------------------------------------
# What each end proves, read as the protocol reads it (CommandScheduler._submit_once: the
# scheduler's transient and refusal words, its refusal codes, a signal, a timeout), through the
# same wrapper around a stand-in for the real command that takes the job. The live tests above
# show, once on each scheduler, what follows: an end that may have left a job is looked up by
# its tag and adopted, or `status` settles it; a refusal leaves nothing.

def _read_by_the_protocol(s: Sched, fault: str, tmp_path: Path, monkeypatch, timeout: float = 30):
    """What one submit attempt's end says: (whether the scheduler may have the job, why), or
    SubmissionRefused."""
    from mmm_orch.schedulers import scheduler_for
    from mmm_orch.schedulers.base import Submission

    taker = tmp_path / "take"  # takes the job, as the real command would, and says its id
    taker.write_text("#!/bin/bash\necho 77\n")
    submit = tmp_path / Path(s.submit).name
    submit.write_text(WRAPPER)
    for script in (taker, submit):
        script.chmod(0o755)
    for name, value in (("FAULT", fault), ("STATE", str(tmp_path)), ("REAL", str(taker)),
                        ("TIMEOUT_TEXT", s.timeout_text), ("UNSENT_TEXT", s.unsent_text),
                        ("REFUSED_TEXT", s.refused_text)):
        monkeypatch.setenv(name, value)
    scheduler = scheduler_for(s.kind, {"submit": str(submit)})
    job = Submission(script=tmp_path / "job.sh", workdir=str(tmp_path), job_dir=tmp_path,
                     log_path=tmp_path / "job.log", walltime=60)
    return scheduler._submit_once(scheduler.submit_argv(job), job, timeout)


@pytest.mark.parametrize("fault", ["die-after", "term-after", "silent-after", "shell-killed-after",
                                   "words-then-killed-after", "timeout-after"])
@pytest.mark.parametrize("s", [SLURM, PBS], ids=["slurm", "pbs"])
def test_a_submit_command_that_dies_after_the_scheduler_took_the_job(s, fault, tmp_path,
                                                                     monkeypatch):
    """sbatch or qsub ended by a signal (or silent, or with a timeout in its words) after the
    server committed: not a refusal, so the job is looked for by its tag and adopted, never
    left running without a record. A shell (the login node's, over SSH) reports the signal as
    128+N with its own words; a refusal's words from a command that was then killed prove
    nothing either."""
    sent, why = _read_by_the_protocol(s, fault, tmp_path, monkeypatch)
    assert sent, why


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["hang-after", "hang-first"])
@pytest.mark.parametrize("s", [SLURM, PBS], ids=["slurm", "pbs"])
def test_a_hang_is_bounded_and_may_have_reached_the_scheduler(s, fault, tmp_path, monkeypatch):
    """A submit command that never answers, whether before or after it reached the scheduler, is
    given up on at the attempt's timeout (the retry deadline bounds the attempts), and may have
    left a job: looked for by its tag before any retry."""
    started = time.monotonic()
    sent, why = _read_by_the_protocol(s, fault, tmp_path, monkeypatch, timeout=2)
    assert sent and why == "no answer within 2s", why
    assert time.monotonic() - started < 30  # not the 600 s the command would hang


@pytest.mark.parametrize("s", [SLURM, PBS], ids=["slurm", "pbs"])
def test_a_connection_failure_is_retried_without_doubt(s, tmp_path, monkeypatch):
    """A submit command that never reached the scheduler (no connection) proves that no job was
    made: it is retried at once, with no lookup first."""
    sent, why = _read_by_the_protocol(s, "unsent-first", tmp_path, monkeypatch)
    assert not sent and s.unsent_text.splitlines()[-1] in why, why


# sbatch's refusal of an option it does not take, before it asks the controller (recorded from
# `sbatch --bogus-option` on the test cluster, Slurm 22.05): status 255 and getopt's words.
SBATCH_GETOPT_REFUSAL = ("sbatch: unrecognized option '--bogus-option'\n"
                         'Try "sbatch --help" for more information')


@pytest.mark.parametrize("s,words,code", [(SLURM, SLURM.refused_text, 1),
                                           (SLURM, SBATCH_GETOPT_REFUSAL, 255),
                                           (PBS, PBS.refused_text, 1)],
                         ids=["slurm", "slurm-getopt", "pbs"])
def test_a_refusal_in_the_scheduler_s_words_proves_it_has_no_job(s, words, code, tmp_path,
                                                                 monkeypatch):
    from mmm_orch.errors import SubmissionRefused

    monkeypatch.setenv("REFUSED_CODE", str(code))
    with pytest.raises(SubmissionRefused) as refused:
        _read_by_the_protocol(dataclasses.replace(s, refused_text=words), "refuse", tmp_path,
                              monkeypatch)
    assert words.splitlines()[0] in str(refused.value)
