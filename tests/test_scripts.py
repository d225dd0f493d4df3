"""Acceptance checks on rendered job scripts for each facility (issue: core)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from helpers.profiles import facility_profiles
from mmm_orch.config.machine import parse_cpu_bind


def bash_n(script: str, tmp_path: Path) -> None:
    """`script` parses as bash (bash -n)."""
    path = tmp_path / "check.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def render(cli, tmp_path, *args: str) -> str:
    result = cli("render", *args)
    assert result.code == 0, result.err
    assert result.err == ""
    bash_n(result.out, tmp_path)
    return result.out


def directives(script: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in script.splitlines() if line.startswith(prefix)]


def evaluate_environment(script: str, tmp_path, extra_env: dict[str, str] | None = None) -> dict:
    """Run the script's environment section in a clean bash and return the resulting variables."""
    body = script.split("# Environment, grouped by preset", 1)[1].split("# Launch", 1)[0]
    body = body.split("# Screen: ", 1)[0]  # (the screen runs on the job's nodes)
    probe = tmp_path / "env.sh"
    probe.write_text(body + '\nenv -0\n')
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/opt/lib", **(extra_env or {})}
    proc = subprocess.run(["bash", str(probe)], capture_output=True, env=env, check=True)
    pairs = [item.split(b"=", 1) for item in proc.stdout.split(b"\0") if b"=" in item]
    return {k.decode(): v.decode() for k, v in pairs}


def launch_line(script: str) -> str:
    """The launcher command line, unwrapped from the watchdog when the script has one."""
    lines = script.splitlines()
    launch = lines.index("# Launch")  # (after the screen, which has a `set +e` of its own)
    line = next(x for x in lines[lines.index("set +e", launch) + 1:]
                if not x.startswith("#") and not x.startswith("trap "))
    if " -m mmm_orch.injob.watchdog " in line:
        return shlex.split(line)[-1]
    return line


def test_aurora_llama3_8b(cli, tmp_path):
    script = render(cli, tmp_path, "aurora", "llama3_8b", "--nodes", "4", "--account", "MYPROJ")
    assert script.startswith("#!/bin/bash -l\n")
    pbs = directives(script, "#PBS")
    for expected in ["-l select=4", "-l filesystems=home:flare", "-l place=scatter", "-k doe",
                     "-A MYPROJ", "-l walltime=01:00:00", "-q debug-scaling"]:
        assert expected in pbs, (expected, pbs)
    assert re.search(r"^mmm_orch_setup 'module load frameworks/\d{4}\.\d+\.\d+'$", script, re.M)
    env = evaluate_environment(
        script, tmp_path,
        {"PBS_NODEFILE": str(_nodefile(tmp_path, "x4102c5s3b0n0.hostmgmt2102.cm.aurora.alcf.anl.gov"))})
    assert env["CCL_PROCESS_LAUNCHER"] == "pmix"
    assert env["CCL_ATL_TRANSPORT"] == "mpi"
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert env["CCL_KVS_MODE"] == "mpi"
    assert env["MMM_BACKEND"] == "xccl"
    assert env["MMM_DEVICE"] == "xpu"
    assert env["MASTER_ADDR"] == "x4102c5s3b0n0.hsn.cm.aurora.alcf.anl.gov"
    assert env["MASTER_PORT"] == "2345"
    launch = launch_line(script)
    assert launch.startswith("mpiexec -n 48 -ppn 12 ")
    bind = re.search(r"--cpu-bind[= ](\S+)", launch).group(1)
    ranks = parse_cpu_bind(bind)
    assert len(ranks) == 12
    used = set().union(*ranks)
    assert not used & {0, 52}, sorted(used & {0, 52})
    assert "--gpu-bind" not in launch
    # every block checkpointed on Aurora: its math attention kernel (workloads/llama3_8b.yaml)
    assert launch.endswith("python3 -m mmm_orch.trainers.llama3 --tp 1 --pp 1 --cp 1 --config 8b --ac full")
    # -V passes the login environment into the job and breaks startup on ALCF systems.
    assert not re.search(r"(^#PBS.*\s-V\b)|qsub\s+-V", script, re.M)


def _nodefile(tmp_path, *hosts: str):
    path = tmp_path / "nodefile"
    path.write_text("".join(h + "\n" for h in hosts))
    return path


def test_polaris_fsdp_tp(cli, tmp_path):
    script = render(cli, tmp_path, "polaris", "fsdp_tp", "--nodes", "2", "-A", "MYPROJ")
    pbs = directives(script, "#PBS")
    assert "-l select=2:system=polaris" in pbs
    assert "-l filesystems=home:eagle" in pbs
    launch = launch_line(script)
    assert launch.startswith("mpiexec -n 8 -ppn 4 --depth=8 --cpu-bind depth ")
    assert "--tp 2" in launch
    env = evaluate_environment(
        script, tmp_path, {"PBS_NODEFILE": str(_nodefile(tmp_path, "x3004c0s13b0n0", "x3004c0s19b0n0"))})
    assert env["NCCL_NET_GDR_LEVEL"] == "PHB"
    assert env["NCCL_CROSS_NIC"] == "1"
    assert env["NCCL_COLLNET_ENABLE"] == "1"
    assert env["NCCL_NET"] == "AWS Libfabric"
    assert env["LD_LIBRARY_PATH"].startswith("/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:")
    assert env["LD_LIBRARY_PATH"].endswith(":/opt/lib")
    assert env["MASTER_ADDR"] == "x3004c0s13b0n0.hsn.cm.polaris.alcf.anl.gov"
    # The runtime calls set_device(local_rank % visible); visible order is reversed, so rank r -> GPU 3-r.
    visible = [int(x) for x in env["CUDA_VISIBLE_DEVICES"].split(",")]
    assert [visible[r % len(visible)] for r in range(4)] == [3, 2, 1, 0]
    assert "0->3 1->2 2->1 3->0" in script


def test_polaris_nccl_plugin_switch_unsets_the_four_variables(cli, tmp_path):
    script = render(cli, tmp_path, "polaris", "fsdp_tp", "-N", "2", "-A", "P",
                    "--preset", "nccl-aws-ofi-off")
    env = evaluate_environment(script, tmp_path, {"PBS_NODEFILE": str(_nodefile(tmp_path, "h"))})
    for name in ["NCCL_NET_GDR_LEVEL", "NCCL_CROSS_NIC", "NCCL_COLLNET_ENABLE", "NCCL_NET"]:
        assert name not in env
    assert env["FI_CXI_DEFAULT_CQ_SIZE"] == "131072"  # the rest of the preset stays


def test_perlmutter_vit(cli, tmp_path):
    script = render(cli, tmp_path, "perlmutter", "vit", "--nodes", "2", "--account", "m1234")
    sb = directives(script, "#SBATCH")
    assert "-C gpu" in sb
    assert any(re.fullmatch(r"-q \w+", d) for d in sb), sb
    for expected in ["--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--cpus-per-task=32",
                     "-A m1234", "-t 01:00:00"]:
        assert expected in sb, (expected, sb)
    assert launch_line(script).startswith("srun ")
    assert 'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in script
    assert 'export CUDA_VISIBLE_DEVICES="3,2,1,0"' in script


def test_frontier_llama3_8b(cli, tmp_path):
    script = render(cli, tmp_path, "frontier", "llama3_8b", "--nodes", "2", "-A", "ABC123")
    sb = directives(script, "#SBATCH")
    assert "-p batch" in sb
    assert "--network=disable_rdzv_get" in sb
    launch = launch_line(script)
    assert launch.startswith("srun -N2 -n16 -c7 --gpus-per-task=1 --gpu-bind=closest ")
    assert "torchrun" not in script
    assert re.search(r"^mmm_orch_setup 'module load .*\brccl-net-plugin\b", script, re.M)
    assert "export MIOPEN_USER_DB_PATH=/tmp/" in script
    env = evaluate_environment(script, tmp_path)
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert env["NCCL_NET"] == "OFI"  # more than one node
    assert env["MMM_DEVICE_PER_RANK"] == "1"
    assert "set_device index: 0->0 1->0 2->0 3->0 4->0 5->0 6->0 7->0." in script


def test_frontier_single_node_uses_socket_transport(cli, tmp_path):
    script = render(cli, tmp_path, "frontier", "llama3_8b", "--nodes", "1", "-A", "ABC123")
    assert evaluate_environment(script, tmp_path)["NCCL_NET"] == "Socket"


def test_frontier_walltime_bins_by_node_count(cli, tmp_path):
    ok = render(cli, tmp_path, "frontier", "llama3_8b", "-N", "100", "-t", "06:00:00", "-A", "A")
    assert "-p batch" in directives(ok, "#SBATCH")
    refused = cli("render", "frontier", "llama3_8b", "-N", "91", "-t", "06:00:00", "-A", "A")
    assert refused.code == 2
    assert "batch (1-9472 nodes" in refused.err


def test_local_fsdp_runs_here_shape(cli, tmp_path):
    script = render(cli, tmp_path, "local", "fsdp", "--nodes", "1")
    assert not directives(script, "#PBS") and not directives(script, "#SBATCH")
    launch = launch_line(script)
    assert "-m mmm_orch.injob.ranks --standalone --nnodes=1 --nproc-per-node=2 -m mmm_orch.trainers.fsdp" in launch
    assert 'export MMM_BACKEND="gloo"' in script


@pytest.mark.parametrize("machine", [*facility_profiles(), "local"])
@pytest.mark.parametrize("workload", ["fsdp", "fsdp_tp", "vit", "llama3_debug", "llama3_8b", "llama3_70b"])
def test_every_pair_renders_valid_bash_or_is_refused_with_a_reason(cli, tmp_path, machine, workload):
    result = cli("render", machine, workload, "-A", "PROJ")
    if result.code == 0:
        bash_n(result.out, tmp_path)
        assert "\n#PBS -V" not in result.out
        assert 'echo "[mmm-orch] launch_end=$(date +%s.%N) exit_code=${rc}"' in result.out
    else:
        assert result.code == 2
        assert machine == "local" and "needs an accelerator" in result.err


def test_dry_run_prints_the_same_script_as_render_and_records_nothing(cli, tmp_path, isolated):
    rendered = cli("render", "aurora", "llama3_8b", "-N", "4", "-A", "MYPROJ")
    dry = cli("submit", "aurora", "llama3_8b", "-N", "4", "-A", "MYPROJ", "--dry-run")
    assert dry.code == 0 and dry.out == rendered.out
    assert list(isolated.iterdir()) == []
    assert not (tmp_path / "state").exists()


def test_render_out_writes_an_executable_file(cli, isolated):
    result = cli("render", "perlmutter", "vit", "--nodes", "2", "--account", "m1234", "--out", "job.sh")
    assert result.code == 0
    assert (isolated / "job.sh").read_text().startswith("#!/bin/bash -l\n#SBATCH")
    assert (isolated / "job.sh").stat().st_mode & 0o100
    assert list(isolated.iterdir()) == [isolated / "job.sh"]
