"""User values reach the job intact and never execute; secrets never reach scripts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HOSTILE = '$(touch /tmp/pwned); "quotes" and spaces'
HOSTILE_ENV = "`touch {marker}` $HOME 'single' \\back"

PROBE = '''
import json, os, sys
rank = os.environ["RANK"]
with open(f"argv-{rank}.json", "w") as f:
    json.dump({"argv": sys.argv[1:], "msg": os.environ.get("MSG"), "world": os.environ["WORLD_SIZE"]}, f)
'''


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
