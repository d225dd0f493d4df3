"""User values reach the job intact and never execute; secrets never reach scripts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.profiles import write_machine

HOSTILE = '$(touch /tmp/pwned); "quotes" and spaces'
HOSTILE_ENV = "`touch {marker}` $HOME 'single' \\back"

PROBE = '''
import json, os, sys
rank = os.environ["RANK"]
with open(f"argv-{rank}.json", "w") as f:
    json.dump({"argv": sys.argv[1:], "msg": os.environ.get("MSG"), "world": os.environ["WORLD_SIZE"]}, f)
'''


@pytest.mark.slow
def test_hostile_values_reach_every_rank_intact_and_execute_nothing(cli, isolated, tmp_path):
    Path("/tmp/pwned").unlink(missing_ok=True)
    marker = tmp_path / "env-pwned"
    (isolated / "argv_probe.py").write_text(PROBE)
    specs = isolated / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True)
    (specs / "probe.yaml").write_text(
        "name: probe\ntrainer: argv_probe\noptions:\n  run_name: {type: str}\n")
    env_value = HOSTILE_ENV.format(marker=marker)
    result = cli("render", "local", "probe", "--set", f"run_name={HOSTILE}",
                 "--env", f"MSG={env_value}", "--out", "job.sh")
    assert result.code == 0, result.err

    proc = subprocess.run([str(isolated / "job.sh")], capture_output=True, text=True,
                          cwd=isolated, timeout=120, env={**os.environ, "PYTHONPATH": str(isolated)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[mmm-orch] launch_end=" in proc.stdout and "exit_code=0" in proc.stdout
    for rank in (0, 1):
        seen = json.loads((isolated / f"argv-{rank}.json").read_text())
        assert seen == {"argv": ["--run-name", HOSTILE], "msg": env_value, "world": "2"}
    assert not Path("/tmp/pwned").exists()
    assert not marker.exists()


@pytest.mark.slow
def test_launch_failure_exit_code_is_recorded_and_returned(cli, isolated):
    (isolated / "fail_probe.py").write_text("import sys\nsys.exit(3)\n")
    specs = isolated / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True)
    (specs / "fails.yaml").write_text("name: fails\ntrainer: fail_probe\n")
    assert cli("render", "local", "fails", "--out", "job.sh").code == 0
    proc = subprocess.run([str(isolated / "job.sh")], capture_output=True, text=True, cwd=isolated,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(isolated)})
    assert proc.returncode != 0
    assert f"exit_code={proc.returncode}" in proc.stdout
    assert "Job started at: " in proc.stdout


def test_secret_looking_env_names_are_refused(cli, isolated):
    for name in ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY"]:
        result = cli("render", "local", "fsdp", "--env", f"{name}=s3cr3t", "--out", "job.sh")
        assert result.code == 2 and name in result.err and "s3cr3t" not in result.err
    assert list(isolated.iterdir()) == []


def _text_leaves(value, loc=()):
    """Every (path, text) of a profile or spec as plain data (lists and mappings walked)."""
    if isinstance(value, str):
        yield loc, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _text_leaves(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _text_leaves(item, (*loc, index))


def _as_data(kind: str, name: str) -> dict:
    from mmm_orch.config import registry
    from mmm_orch.config.yamlio import adapter

    load, cls = ((registry.load_machine, "Machine") if kind == "machines" else
                 (registry.load_workload, "Workload"))
    obj = load(name)
    return json.loads(json.dumps(adapter(type(obj)).dump_python(obj, mode="json")))


def _put(data, loc, value):
    for part in loc[:-1]:
        data = data[part]
    data[loc[-1]] = value


SHELL_FIELDS = {("setup",), ("scheduler", "node_list"), ("rendezvous", "master_addr"),
                ("rendezvous", "master_port")}


@pytest.mark.slow
def test_a_line_break_in_any_text_of_a_profile_or_spec_is_refused(cli, isolated):
    """Each text field of the packaged profiles and specs, in turn given a line break and a
    command after it (a copy under another name): refused with one line naming the field,
    nothing rendered, nothing run; the shell-line fields alone take it. A field is tried once,
    in the first profile that has it: its other entries (a list's items, the same field in
    another profile) are read by the same check."""
    import yaml

    marker = isolated / "pwned"
    line_breaks = 0
    tried = set()
    for kind, names, render in (
            ("machines", ["aurora", "perlmutter", "slurm-local", "local"],
             lambda n: ("render", n, "dist_check", "-A", "P", "--out", "job.sh")),
            ("workloads", ["llama3_debug", "fsdp", "command"],
             lambda n: ("render", "local", n, "--out", "job.sh") + (
                 ("--", "python3", "x.py") if n.startswith("command") else ()))):
        for name in names:
            data = _as_data(kind, name)
            for loc, text in _text_leaves(data):
                field = loc[:len(loc) - (isinstance(loc[-1], int))]
                if field in SHELL_FIELDS or loc == ("name",) or \
                        (field[:1] in (("profilers",), ("stacks",)) and field[2:] == ("setup",)):
                    continue  # (a profiler's and a stack's setup: shell lines, as the machine's)
                kind_of_field = (kind, *("[]" if isinstance(p, int) else p for p in loc))
                if kind_of_field in tried:
                    continue
                tried.add(kind_of_field)
                copy = json.loads(json.dumps(data))
                _put(copy, loc, f"{text}\ntouch {marker}")
                copy["name"] = f"{name}-x"
                folder = isolated / ".mmm-orch" / kind
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{name}-x.yaml").write_text(yaml.safe_dump(copy))
                result = cli(*render(f"{name}-x"))
                shown = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc)
                assert result.code == 2, (loc, result.out[-300:], result.err)
                assert len(result.err.strip().splitlines()) == 1, result.err
                if "a line break is not allowed" in result.err:
                    assert str(loc[-1]) in result.err, (shown, result.err)
                    line_breaks += 1  # (the others: a choice, a name, a pattern: refused so)
                assert not (isolated / "job.sh").exists() and not marker.exists()
    assert line_breaks > 100, line_breaks  # the walk reached the profiles' free texts


def test_the_shell_line_fields_still_take_several_lines(cli, isolated):
    write_machine(isolated, "multi", "extends: local\nname: multi\n"
                  "setup: ['export A=1\n\n    export B=2']\n")
    result = cli("render", "multi", "dist_check", "--out", "job.sh")
    assert result.code == 0, result.err
    assert "export A=1\nexport B=2" in (isolated / "job.sh").read_text()
