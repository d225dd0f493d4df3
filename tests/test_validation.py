"""Every rejection: exit code 2, one line naming the field, the value and what is allowed, no file."""

from __future__ import annotations

import pytest

from helpers.cli import run_cli

PBS = ["-A", "MYPROJ"]

CASES = [
    # (id, args, fragments the one-line message must contain)
    ("unknown machine", ["auroa", "llama3_8b", *PBS], ["unknown machine 'auroa'", "did you mean aurora"]),
    ("unknown workload", ["aurora", "llama3-8b", *PBS], ["unknown workload 'llama3-8b'", "llama3_8b"]),
    ("nodes below 1", ["aurora", "llama3_8b", "--nodes", "0", *PBS], ["--nodes '0' is invalid", ">= 1"]),
    ("nodes above machine", ["polaris", "fsdp", "--nodes", "600", *PBS], ["--nodes 600", "at most 496"]),
    ("nodes above queue", ["aurora", "fsdp", "--queue", "debug", "--nodes", "4", *PBS],
     ["--queue 'debug'", "4 nodes", "takes 1-2 nodes"]),
    ("walltime malformed", ["aurora", "fsdp", "--walltime", "2h", *PBS],
     ["--walltime", "'2h' is malformed", "HH:MM:SS"]),
    ("walltime above queue", ["aurora", "fsdp", "--queue", "debug", "--walltime", "02:00:00", *PBS],
     ["--queue 'debug'", "02:00:00", "at most 01:00:00"]),
    ("walltime below minimum", ["aurora", "fsdp", "--walltime", "00:02:00", *PBS],
     ["--walltime '00:02:00'", "at least 00:05:00"]),
    ("no queue: aurora 64 nodes 2h", ["aurora", "llama3_8b", "--nodes", "64", "--walltime", "02:00:00", *PBS],
     ["no queue on aurora fits 64 nodes for 02:00:00", "debug-scaling (2-256 nodes, <= 01:00:00)"]),
    ("no queue: polaris 10 nodes 24h", ["polaris", "fsdp", "--nodes", "10", "--walltime", "24:00:00", *PBS],
     ["no queue on polaris fits 10 nodes for 24:00:00", "small 10-24: <= 03:00:00"]),
    ("routing tier walltime", ["polaris", "fsdp", "--queue", "prod", "--nodes", "30", "-t", "12:00:00", *PBS],
     ["tier medium", "at most 06:00:00"]),
    ("unknown queue", ["aurora", "fsdp", "--queue", "prd", *PBS], ["unknown queue on aurora 'prd'", "prod"]),
    ("missing account", ["aurora", "llama3_8b"], ["--account is required on aurora"]),
    ("account with shell characters", ["aurora", "fsdp", "-A", "x;rm -rf ~"], ["--account 'x;rm -rf ~'"]),
    ("job name", ["aurora", "fsdp", *PBS, "--name", "a b"], ["--name 'a b'", "start with a letter"]),
    ("tp does not divide gpus per node", ["polaris", "fsdp_tp", "--set", "tp=3", *PBS],
     ["tp 3", "divide the 4 ranks per node"]),
    ("unknown set key", ["aurora", "fsdp", "--set", "epoch=3", *PBS],
     ["unknown --set key for workload fsdp 'epoch'", "did you mean epochs"]),
    ("set value of the wrong type", ["aurora", "fsdp", "--set", "epochs=many", *PBS],
     ["--set option epochs='many' is invalid: an integer >= 1"]),
    ("set without =", ["aurora", "fsdp", "--set", "epochs", *PBS], ["--set 'epochs'", "KEY=VALUE"]),
    ("choice value", ["aurora", "fsdp", "--set", "dtype=fp8", *PBS], ["dtype='fp8'", "one of bf16, fp32"]),
    ("env name", ["aurora", "fsdp", "--env", "1X=2", *PBS], ["--env '1X'"]),
    ("secret in env", ["aurora", "fsdp", "--env", "WANDB_API_KEY=abc", *PBS],
     ["--env WANDB_API_KEY", "refusing to write a secret"]),
    ("unknown preset", ["polaris", "fsdp", "--preset", "nccl", *PBS], ["unknown preset on polaris 'nccl'"]),
    ("conflicting presets", ["aurora", "fsdp", "--preset", "oneccl-app", "--preset", "cassini-eq-overflow", *PBS],
     ["FI_CXI_DEFAULT_CQ_SIZE", "--no-preset"]),
    ("accelerator needed", ["local", "llama3_8b"], ["needs an accelerator", "local has none"]),
    ("template missing", ["aurora", "fsdp", *PBS, "--template", "nope.j2"], ["--template 'nope.j2'"]),
]


@pytest.mark.parametrize("args,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", ["render", "submit"])
def test_rejection(cli, isolated, tmp_path, command, args, fragments):
    out = ["--out", "job.sh"] if command == "render" else []
    result = cli(command, *args, *out)
    assert result.code == 2
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert list(isolated.iterdir()) == []  # no script, no partial file
    assert not (tmp_path / "state").exists()  # no record


def test_tp_times_pp_must_divide_ranks(cli, isolated):
    spec = isolated / ".mmm-orch" / "workloads"
    spec.mkdir(parents=True)
    (spec / "pipe.yaml").write_text(
        "name: pipe\ntrainer: mmm_orch.trainers.llama3\n"
        "options:\n  tp: {type: int, default: 2}\n  pp: {type: int, default: 3}\n")
    result = cli("render", "polaris", "pipe", "--nodes", "2", "-A", "P")
    assert result.code == 2
    assert "pp 3" in result.err and "tp x pp = 6 must divide the 8 ranks" in result.err
    assert cli("render", "polaris", "pipe", "--nodes", "3", "-A", "P").code == 0


def test_argparse_usage_errors_exit_2(cli):
    assert cli("render", "aurora").code == 2
    assert cli("render", "aurora", "fsdp", "--nodes", "four").code == 2


def test_real_process_exit_code_and_single_line(isolated):
    proc = run_cli("render", "aurora", "llama3_8b", "--nodes", "64", "-t", "02:00:00", "-A", "X",
                   "--out", "job.sh", cwd=isolated)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("mmm-orch: error: no queue on aurora fits 64 nodes")
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert not (isolated / "job.sh").exists()


def test_debug_flag_shows_the_traceback(isolated):
    proc = run_cli("--debug", "render", "aurora", "fsdp", cwd=isolated)
    assert proc.returncode != 0 and "Traceback" in proc.stderr
