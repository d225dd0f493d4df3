"""Property tests of quoting: random text in every user value and path that reaches a script, the
script really run, and the value must arrive intact, or be refused up front; nothing in it may
ever execute. Shell values run through the local executor's script; paths in scheduler directives
go through real jobs on the live Slurm and PBS test servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers.jobs import TERMINAL, poll_row
from mmm_orch.cli import main

pytestmark = pytest.mark.slow  # trainings, real jobs or processes for seconds

CANARY = "/tmp/mmm-orch-quoting-canary"
INJECTIONS = ["$(touch /tmp/mmm-orch-quoting-canary)", "`touch /tmp/mmm-orch-quoting-canary`",
              "'; touch /tmp/mmm-orch-quoting-canary; '", '"; touch /tmp/mmm-orch-quoting-canary; "',
              "\\\"$(touch /tmp/mmm-orch-quoting-canary)", "${IFS}x", "%j %x %%", "a\nb",
              "#!/bin/sh", "x\x00y", "\udcff"]
# Any text: quotes, $, `, \, %, :, #, spaces, unicode, control characters, and lone surrogates
# (how Python hands over bytes of a command line that are not UTF-8).
TEXT = st.one_of(st.sampled_from(INJECTIONS), st.text(max_size=24),
                 st.text(alphabet="$`'\"\\%:#;|&<>(){}[]*?~! \t\nab/", max_size=24))
FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

PROBE = """import json, os, sys
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:], "msg": os.environ.get("MSG"), "cwd": os.getcwd()}, f)
"""


def refusable(value: str) -> bool:
    """What a value may be refused for: characters no script line can carry intact."""
    return any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in value)


def run_cli(argv: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


@pytest.fixture
def direct(isolated, monkeypatch):
    """A local machine whose launcher runs the trainer directly (no torchrun): one process."""
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "direct.yaml").write_text(
        "extends: local\nname: direct\nlauncher: {kind: torchrun, command: '{python}', args: [], "
        "python_prefix: false}\n")
    specs = isolated / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True)
    (specs / "probe.yaml").write_text(
        "name: probe\ntrainer: quoting_probe\noptions:\n  value: {type: str, default: ''}\n")
    (isolated / "quoting_probe.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    return isolated


def run_script(script: Path, out: Path, cwd: Path) -> dict:
    proc = subprocess.run(["bash", str(script)], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PROBE_OUT": str(out)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@FAST
@given(value=TEXT, msg=TEXT)
@example(value="$(touch /tmp/mmm-orch-quoting-canary)", msg="`touch /tmp/mmm-orch-quoting-canary`")
def test_set_and_env_values_arrive_intact_or_are_refused(direct, value, msg):
    Path(CANARY).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.sh"
        code, err = run_cli(["render", "direct", "probe", "--set", f"value={value}",
                             "--env", f"MSG={msg}", "--out", str(script)])
        if refusable(value) or refusable(msg):
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert not script.exists()
            return
        assert code == 0, err
        seen = run_script(script, Path(tmp) / "out.json", direct)
    assert seen["argv"] == ["--value", value] and seen["msg"] == msg
    assert not Path(CANARY).exists()


NAME = st.text(alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
               min_size=1, max_size=16).filter(lambda n: n not in (".", ".."))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=NAME)
@example(name="$(touch mmm-orch-quoting-canary)")
@example(name="My State 'x' \"y\" %j")
def test_workdir_paths_are_reached_intact_or_refused(direct, name):
    """A real local job submitted with --workdir: the trainer runs in exactly that directory."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / name
        workdir.mkdir()
        out = Path(tmp) / "out.json"
        code, err = run_cli(["submit", "direct", "probe", "--workdir", str(workdir),
                             "--env", f"PROBE_OUT={out}", "--follow"])
        if refusable(str(workdir)):
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            return
        assert code == 0, err
        seen = json.loads(out.read_text())
        assert seen["cwd"] == str(workdir)
        assert not list(Path(tmp).rglob("mmm-orch-quoting-canary"))


# -- log paths in directives, on the live schedulers ---------------------------------------------

DIRECTIVE_NAMES = ["My State", "quote'single", 'quote"double', "percent %j %x %%", "colon:path",
                   "hash #comment", "dollar $HOME $(touch canary)", "back`tick`", "semi;colon&amp",
                   "star * and ?", "tab\there", "new\nline", "uni\u00e9", "back\\slash"]


def wait_terminal(job: int, db: Path, timeout: float = 180) -> dict:
    """The job's row once it ended; time queued behind other tests' jobs counts apart."""
    def read_row() -> dict:
        proc = subprocess.run([sys.executable, "-m", "mmm_orch", "--db", str(db), "status",
                               str(job), "--json"], capture_output=True, text=True)
        return json.loads(proc.stdout)[0]
    return poll_row(read_row, lambda row: row["state"] in TERMINAL, timeout, interval=2)


@pytest.mark.live
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
@pytest.mark.parametrize("name", DIRECTIVE_NAMES)
def test_log_paths_in_directives_on_the_live_schedulers(request, isolated, kind, name, tmp_path,
                                                        leftovers_cancelled):
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    machine = "slurm-local" if kind == "slurm" else "pbs-local"
    Path(CANARY).unlink(missing_ok=True)
    state = tmp_path / name
    env = {**os.environ, "XDG_STATE_HOME": str(state), "PYTHONPATH": str(isolated)}
    (isolated / "hello_probe.py").write_text("print('hello from the job', flush=True)\n")
    specs = isolated / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True, exist_ok=True)
    (specs / "hello.yaml").write_text("name: hello\ntrainer: hello_probe\n")
    proc = subprocess.run([sys.executable, "-m", "mmm_orch", "submit", machine, "hello", "--json"],
                          capture_output=True, text=True, env=env, cwd=isolated, timeout=120)
    path_text = str(state / "mmm-orch" / "jobs")
    not_carried = (any(not (" " <= c <= "~") for c in path_text) or "\\" in path_text
                   or (kind == "pbs" and '"' in path_text))
    if not_carried:
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "cannot go into a" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (state / "mmm-orch" / "jobs").exists()
        return
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    row = wait_terminal(record["id"], state / "mmm-orch" / "jobs.db")
    log = Path(record["log_path"])
    assert log.parent == Path(record["job_dir"]) and str(log).startswith(str(state))
    assert row["state"] == "completed", log.read_text() if log.exists() else "no log at all"
    assert "hello from the job" in log.read_text()
    assert not Path(CANARY).exists() and not list(tmp_path.rglob("canary"))
