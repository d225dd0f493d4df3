"""Hostile or broken files a user's directory may hold (a colleague's checkout, a shared
$MMM_ORCH_PATH): YAML bombs and deep nesting, wrong `extends`, wrong types, failure patterns that
backtrack, FIFOs and directories where files belong, forged markers in logs. Each ends with
exit 2 and one line naming the file (and line), fast and in bounded memory, or, for a log, is
read as far as it makes sense; never a traceback, a crash of the interpreter or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import REPO
from helpers.profiles import facility_profiles

MACHINE = "extends: local\nname: {name}\n"
WORKLOAD = "extends: fsdp\nname: {name}\n"
KINDS = {"machines": MACHINE, "workloads": WORKLOAD}


def cli_in_a_fresh_interpreter(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, float, int]:
    """(result, seconds, peak memory in MiB): a crash of the interpreter or a hang fails the
    test instead of taking the test run with it. The peak is the interpreter's own (VmHWM of its
    memory map): getrusage's ru_maxrss keeps the high-water mark of the process it was forked
    from, here a pytest worker that may hold 500 MB."""
    code = ("import sys, runpy; sys.argv = ['mmm-orch', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('mmm_orch', run_name='__main__')\n"
            "finally:\n    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
            "    print('peak', int(hwm[0].split()[1]) // 1024, file=sys.stderr)\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    elapsed = time.monotonic() - started
    *lines, peak = proc.stderr.strip().splitlines() or ["peak 0"]
    assert peak.startswith("peak "), proc.stderr[-2000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, "\n".join(lines)), \
        elapsed, int(peak.split()[1])


def assert_refused(proc, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _fan_out(levels: int, width: int) -> str:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _alias_chain(levels: int) -> str:
    lines = ["c0: &c0 {x: 1, y: 2}"]
    lines += [f"c{i}: &c{i} {{l: *c{i - 1}, r: *c{i - 1}}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


BOMBS = {
    "alias fan-out": _fan_out(9, 10),
    "alias chain of mappings": _alias_chain(40),
    "deep sequence": "x: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "deep mapping": "x: " + "{a: " * 50_000 + "1" + "}" * 50_000 + "\n",
    "deep block mapping": "x:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)) + " " * 200 + "v: 1\n",
    "deep sequence, then a bomb": "x: " + "[" * 80 + "]" * 80 + "\n" + _fan_out(8, 10),
    "larger than a profile can be": "x: " + "y" * (2 << 20) + "\n",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bomb", BOMBS)
def test_yaml_bombs_and_deep_nesting_are_refused_fast(isolated, kind, bomb):
    directory = isolated / ".mmm-orch" / kind
    directory.mkdir(parents=True)
    (directory / "bomb.yaml").write_text(KINDS[kind].format(name="bomb") + BOMBS[bomb])
    args = ["render", "bomb", "fsdp"] if kind == "machines" else ["render", "local", "bomb"]
    proc, elapsed, peak = cli_in_a_fresh_interpreter(isolated, *args)
    assert_refused(proc, "bomb.yaml")
    assert elapsed < 15 and peak < 400, (elapsed, peak)


@pytest.mark.parametrize("value", ["[local, aurora]", "{name: local}", "3", "true", "../local",
                                   "/etc/passwd", "'local aurora'", "nope"])
@pytest.mark.parametrize("kind", KINDS)
def test_extends_must_name_one_known_file(cli, isolated, kind, value):
    directory = isolated / ".mmm-orch" / kind
    directory.mkdir(parents=True)
    (directory / "mine.yaml").write_text(f"extends: {value}\nname: mine\n")
    args = ["render", "mine", "fsdp"] if kind == "machines" else ["render", "local", "mine"]
    result = cli(*args)
    assert result.code == 2 and "mine.yaml:1: extends" in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1


def test_an_extends_cycle_ends(cli, isolated):
    directory = isolated / ".mmm-orch" / "machines"
    directory.mkdir(parents=True)
    (directory / "a.yaml").write_text("extends: b\nname: a\n")
    (directory / "b.yaml").write_text("extends: a\nname: b\n")
    result = cli("render", "a", "fsdp")
    assert result.code == 2 and "extends chain is too deep" in result.err, result.err


def _typed_values(data, loc=()):
    """(key path, value) of every number and boolean in a document."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _typed_values(value, loc + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _typed_values(value, loc + (i,))
    elif isinstance(data, (bool, int, float)):
        yield loc, data


def _wrongly_typed_cases():
    cases = []
    for kind, name in (("machines", "aurora"), ("machines", "slurm-local"), ("workloads", "llama3_8b"),
                       ("workloads", "fsdp")):
        data = yaml.safe_load((REPO / kind / f"{name}.yaml").read_text())
        for loc, value in _typed_values(data):
            if kind == "workloads" and {"args", "options"} & set(map(str, loc)):
                continue  # trainer values: typed by the option they belong to
            wrong = [1] if isinstance(value, bool) else [True, str(value)]
            cases += [(kind, name, loc, w) for w in wrong]
    return cases


def _set(data, loc, value):
    for key in loc[:-1]:
        data = data[key]
    data[loc[-1]] = value


@pytest.mark.parametrize("kind,name,loc,wrong", _wrongly_typed_cases(),
                         ids=lambda v: "/".join(map(str, v)) if isinstance(v, tuple) else repr(v))
def test_a_value_of_the_wrong_type_is_refused_not_converted(cli, isolated, kind, name, loc, wrong):
    """`true` where a number belongs is not 1, `"4"` is not 4, and `1` is not true."""
    data = yaml.safe_load((REPO / kind / f"{name}.yaml").read_text())
    _set(data, loc, wrong)
    directory = isolated / ".mmm-orch" / kind
    directory.mkdir(parents=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(data))
    args = ["show", kind[:-1], name]
    result = cli(*args)
    assert result.code == 2, (loc, wrong, result.out[:300])
    assert f"{name}.yaml:" in result.err and str(loc[-1]) in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1


CATASTROPHIC = ["(a+)+$", "(a*)*b", "(a|a)*c", "(a|ab)*c", "^(\\w+\\s?)*$", "(x+x+)+y",
                "(?:a+){2,}z", "((ab)*)+$", "(.*a){12}", "(?P<host>\\S+)+:"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_failure_pattern_that_backtracks_is_refused_when_the_profile_loads(cli, isolated, pattern):
    directory = isolated / ".mmm-orch" / "machines"
    directory.mkdir(parents=True)
    (directory / "mine.yaml").write_text(
        MACHINE.format(name="mine") + f"failures:\n  - name: slow\n    pattern: '{pattern}'\n")
    log = isolated / "job.log"
    log.write_text("a" * 100_000 + "!\n")
    started = time.monotonic()
    result = cli("diagnose", "--log", str(log), "--machine", "mine")
    assert time.monotonic() - started < 10
    assert result.code == 2 and "mine.yaml" in result.err and "backtracks" in result.err, result.err


def test_every_packaged_failure_pattern_is_accepted_and_long_lines_are_cut(cli, isolated):
    log = isolated / "job.log"
    log.write_text(("x" * 200_000 + " ") * 5 + "\nRuntimeError: CUDA error: out of memory\n")
    started = time.monotonic()
    for machine in (*facility_profiles(), "slurm-local", "pbs-local"):
        result = cli("diagnose", "--log", str(log), "--machine", machine)
        assert result.code == 0, result.err
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("kind", ["fifo", "directory"])
@pytest.mark.parametrize("where", ["machine", "workload", "diagnose --log", "startup --log"])
def test_a_fifo_or_directory_where_a_file_belongs_never_hangs(isolated, kind, where):
    if where in ("machine", "workload"):
        directory = isolated / ".mmm-orch" / f"{where}s"
        directory.mkdir(parents=True)
        path = directory / "odd.yaml"
        args = ["render", "odd", "fsdp"] if where == "machine" else ["render", "local", "odd"]
    else:
        path = isolated / "odd.log"
        args = [*where.split(), str(path)]
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    proc, elapsed, _ = cli_in_a_fresh_interpreter(isolated, *args)
    assert_refused(proc, "odd.")
    assert elapsed < 15


FORGED = ["[mmm-orch] job_start=" + "9" * 5000 + " host=n1",
          "[mmm-orch] launch_start=1e400 ranks=4 nodes=2",
          "[mmm-orch] first_step=99999999999999999999.5",
          "[mmm-orch] launch_start=1795000000.1 ranks=" + "9" * 5000 + " nodes=2",
          "[mmm-orch] launch_end=1795000010.0 exit_code=" + "9" * 5000,
          "[mmm-orch] attempt=1/2 at=" + "9" * 400 + " active=n1",
          "[mmm-orch] resumed_step=nan step=4",
          "Job started at: 2026-13-45-999999 on n1",
          "[2026-99-99 99:99:99,123] step=1 loss=2"]


@pytest.mark.parametrize("line", FORGED, ids=lambda line: line[:40])
def test_forged_markers_in_a_log_are_ignored(cli, isolated, line):
    log = isolated / "job.log"
    log.write_text("[mmm-orch] job_start=1795000000.0 host=n1\n" + line + "\n"
                   "[mmm-orch] first_step=1795000012.5\n")
    result = cli("startup", "--log", str(log), "--json")
    assert result.code == 0, result.err
    assert "internal error" not in result.err


@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "-1", "1e4", "7 days"])
def test_a_bad_node_expiry_in_the_environment_is_refused(cli, monkeypatch, value):
    assert cli("submit", "local", "dist_check").code == 0  # a database to read nodes from
    monkeypatch.setenv("MMM_ORCH_BAD_NODE_DAYS", value)
    result = cli("nodes")
    assert result.code == 2 and f"MMM_ORCH_BAD_NODE_DAYS {value!r} is invalid" in result.err
