"""The bad-input corpus (tests/helpers/bad_input.py): cases generated from the workload specs (every option, every type, every
bound), from the command line parser (every typed argument of every command) and from the
machine profiles (node counts, queues, walltimes, presets), plus the findings that slipped
through before. Each must end with exit 2, one line that names the field and the value, no
traceback, and nothing written: no record, no job directory, no file."""

from __future__ import annotations

import pytest
from helpers.bad_input import CASES, files_under, typed_arguments
from helpers.jobs import wait_state
from helpers.profiles import write_probe

from mmm_orch.config import registry


def test_the_corpus_is_large_and_covers_every_option_and_argument():
    assert len(CASES) >= 150, len(CASES)
    covered = {case[0].split("=")[0] for case in CASES}
    for workload in registry.names("workloads"):
        for name in registry.load_workload(workload).options:
            assert f"--set {workload}.{name}" in covered
    assert len(typed_arguments()) >= 8


@pytest.mark.parametrize("argv,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_with_one_line_and_nothing_written(cli, tmp_path, argv, fragments):
    before = files_under(tmp_path, tmp_path / "cache")
    result = cli(*argv)
    assert result.code == 2, (result.code, result.err)
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert files_under(tmp_path, tmp_path / "cache") == before  # no record, no job directory, no file


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf", ""])
def test_a_bad_retry_deadline_is_refused_before_anything_runs(cli, isolated, tmp_path, monkeypatch,
                                                             value):
    monkeypatch.setenv("MMM_ORCH_RETRY_DEADLINE", value)
    write_probe(isolated, "quick", "print('ran')\n")  # a job of a second, not a training
    before = files_under(tmp_path, tmp_path / "cache")
    result = cli("submit", "local", "quick")
    if value == "":  # unset, in effect: the default budget
        assert result.code == 0, result.err
        assert wait_state(cli, 1)["state"] == "completed"
        return
    assert result.code == 2 and f"MMM_ORCH_RETRY_DEADLINE {value!r} is invalid" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert files_under(tmp_path, tmp_path / "cache") == before


def test_files_that_are_not_utf8_are_refused_by_name(cli, isolated, tmp_path):
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "latin.yaml").write_bytes(b"name: latin\n# caf\xe9\n")
    result = cli("render", "latin", "fsdp")
    assert result.code == 2 and "latin.yaml: not UTF-8 text" in result.err
    template = isolated / "job.j2"
    template.write_bytes(b"#!/bin/bash\n# \xff\n")
    result = cli("render", "local", "fsdp", "--template", str(template))
    assert result.code == 2 and "not UTF-8 text" in result.err and "job.j2" in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_a_read_only_out_is_refused(cli, isolated, tmpfs):
    ro = tmpfs("ro", "ro,size=64k")
    result = cli("render", "local", "fsdp", "--out", str(ro / "job.sh"))
    assert result.code == 2 and "cannot write" in result.err
    assert len(result.err.strip().splitlines()) == 1
