"""`--profile TOOL` with a facility's profiler (machines/*.yaml `profilers:`): each facility's
profile renders its tool's lines with their source and starts every rank through
injob/facility_profiler.py, which runs the chosen ranks under the tool (their output named by host and
rank in the run's profile/) and the others as they are; the trainer opens and closes the tool's
collection at the window; a machine without the tool named is refused with the tools it has.
Live: the test cluster's own profiler (GNU time) around your own command on 2 Slurm nodes (the
proof that a command runs under srun on both) and 2 PBS vnodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.jobs import wait_state
from helpers.profiles import facility_profiles, write_machine
from mmm_orch.config import registry
from mmm_orch.config.registry import ConfigError
from mmm_orch.injob import protocol

FACILITY_TOOLS = {
    "polaris": ("nsys", "cuda-profiler-api", "ALCF-UG polaris/performance-tools/NVIDIA-Nsight.md"),
    "perlmutter": ("nsys", "cuda-profiler-api", "NERSC/sc23-dl-tutorial"),
    "aurora": ("unitrace", "pti-collection", "ALCF-UG aurora/performance-tools/unitrace.md"),
    "frontier": ("rocprof", "roctx", "OLCF-UG systems/frontier_user_guide.rst"),
}


@pytest.mark.parametrize("machine", facility_profiles())
def test_each_facility_renders_its_profiler_with_its_source(cli, isolated, machine):
    tool, window, source = FACILITY_TOOLS[machine]
    result = cli("render", machine, "llama3_8b", "-A", "P1", "--profile", tool,
                 "--set", "profile_ranks=0,5")
    assert result.code == 0, result.err
    script = result.out
    words = registry.load_machine(machine).profilers[tool].command
    exported = f"export {protocol.PROFILER_VAR}='{' '.join(words)}'"
    assert exported in script, script
    assert f"export {protocol.PROFILE_WINDOW_VAR}={window}" in script
    assert f"export {protocol.PROFILE_RANKS_VAR}=0,5" in script
    assert f"#    source: {source}" in script
    launch = next(line for line in script.splitlines() if line.startswith("echo \"[mmm-orch] launch: "))
    # every rank through the wrapper, the trainer told the same tool
    assert f"-m {protocol.MODULES['profiled']} -- python3 -m mmm_orch.trainers.llama3" in launch
    assert f"--profile {tool}" in launch and "--profile-ranks 0,5" in launch


def test_a_machine_without_the_tool_exits_2_naming_the_tools_it_has(cli, isolated):
    result = cli("submit", "frontier", "llama3_8b", "-A", "P1", "--profile", "nsys")
    assert result.code == 2
    assert result.err.strip() == ("mmm-orch: error: --profile 'nsys' is invalid: frontier has "
                                  "off, torch, rocprof"), result.err
    by_set = cli("render", "local", "llama3_debug", "--set", "profile=unitrace")
    assert by_set.code == 2 and "local has off, torch" in by_set.err, by_set.err
    assert not (isolated.parent / "state" / "mmm-orch").exists()


@pytest.mark.parametrize("args,said", [
    (["llama3_debug", "--profile", "torch", "--set", "profile=nsys"], "one tool: --set profile=nsys"),
    (["tokenize", "--profile", "torch"], "workload tokenize has no steps"),
    (["llama3_debug", "--set", "profile=Nsys"], "option profile='Nsys' is invalid"),
    (["llama3_debug", "--profile", "torch", "--set", "profile_ranks=7"], "--profile-ranks '7'"),
])
def test_a_profile_that_cannot_run_is_refused_before_the_queue(cli, isolated, args, said):
    result = cli("submit", "local", *args)
    assert result.code == 2 and said in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (isolated.parent / "state" / "mmm-orch").exists()


def test_your_own_command_gets_the_tool_and_the_job_tells_it(cli, isolated):
    script = cli("render", "slurm-local", "-N", "2", "--profile", "time", "--env",
                 f"{protocol.PROFILE_RANKS_VAR}=1", "--", "python3", "train.py").out
    assert f"export {protocol.PROFILE_VAR}=time" in script
    assert f"{protocol.MODULES['profiled']} -- python3 train.py" in script
    refused = cli("render", "slurm-local", "-N", "2", "--profile", "time", "--env",
                  f"{protocol.PROFILE_RANKS_VAR}=4", "--", "python3", "train.py")
    assert refused.code == 2 and "--profile-ranks '4'" in refused.err, refused.err
    torch_only = cli("render", "slurm-local", "--profile", "torch", "--", "python3", "train.py").out
    assert f"export {protocol.PROFILE_VAR}=torch" in torch_only
    assert protocol.MODULES["profiled"] not in torch_only  # torch.profiler runs in the program


@pytest.mark.parametrize("profilers,said", [
    ("{nsys: {description: x, command: [nsys, profile], window: none}}",
     "name {output} or {output_dir} once"),
    ("{nsys: {description: x, command: [nsys, '-o', '{output}', '{output_dir}'], window: none}}",
     "not 2 times"),
    ("{nsys: {description: x, command: [nsys, '{outdir}'], window: none}}",
     "unknown placeholder {outdir}"),
    ("{nsys: {description: x, command: [nsys, '{output}'], window: later}}",
     "window 'later': expected one of cuda-profiler-api, pti-collection, roctx, none"),
    ("{torch: {description: x, command: [t, '{output}'], window: none}}",
     "not off or torch"),
])
def test_a_broken_profiler_in_a_profile_is_refused_when_loaded(isolated, profilers, said):
    write_machine(isolated, "mine", f"extends: slurm-local\nprofilers: {profilers}\n")
    with pytest.raises(ConfigError) as caught:
        registry.load_machine("mine")
    assert said in str(caught.value), caught.value


def test_torchrun_cannot_start_a_rank_under_a_profiler(isolated):
    write_machine(isolated, "mine", "extends: local\nprofilers: {t: {description: x, "
                  "command: [t, '{output}'], window: none}}\n")
    with pytest.raises(ConfigError, match="starts Python itself"):
        registry.load_machine("mine")


def run_profiled(tmp_path: Path, rank: int, local_rank: int, profiler: str, ranks: str = ""):
    """One rank of a 4-rank launch started as the job starts it, through injob/facility_profiler.py."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PMI_", "SLURM_"))}
    env.update({"PMI_RANK": str(rank), "PMI_SIZE": "4", "PMI_LOCAL_RANK": str(local_rank),
                protocol.RUN_DIR_VAR: str(tmp_path), protocol.PROFILER_VAR: profiler,
                protocol.PROFILE_RANKS_VAR: ranks, "SLURMD_NODENAME": f"node{rank // 2}"})
    return subprocess.run([sys.executable, "-m", protocol.MODULES["profiled"], "--", sys.executable,
                           "-c", "import sys; print('ran'); sys.exit(7)"],
                          capture_output=True, text=True, env=env, timeout=60)


def test_the_wrapper_runs_the_chosen_ranks_under_the_tool_and_the_others_as_they_are(tmp_path):
    time = "/usr/bin/time --verbose --output={output}.time"
    for rank in range(4):
        proc = run_profiled(tmp_path, rank, rank % 2, time)
        assert proc.returncode == 7 and proc.stdout == "ran\n", proc.stderr  # the program's own
    made = sorted(p.name for p in (tmp_path / protocol.PROFILE_DIR).iterdir())
    assert made == ["node0_rank0.time", "node1_rank2.time"]  # local rank 0 of each node
    assert "Maximum resident set size" in (tmp_path / "profile" / made[0]).read_text()
    named = tmp_path / "named"
    for rank in range(4):
        run_profiled(named, rank, rank % 2, "mkdir {output_dir}/here", ranks="1,3")
    assert sorted(p.name for p in (named / "profile").iterdir()) == ["node0_rank1",
                                                                     "node1_rank3"]


def test_the_wrapper_says_what_it_cannot_run(tmp_path):
    missing = run_profiled(tmp_path, 0, 0, "no-such-profiler -o {output}")
    assert missing.returncode == 127
    assert "cannot run no-such-profiler: No such file or directory" in missing.stderr
    empty = run_profiled(tmp_path, 0, 0, "")
    assert empty.returncode == 2 and f"{protocol.PROFILER_VAR} is empty" in empty.stderr
    bad_rank = run_profiled(tmp_path, 0, 0, "t {output}", ranks="9")
    assert bad_rank.returncode == 2 and "--profile-ranks '9'" in bad_rank.stderr


def ranks_of(rank: int, local_rank: int) -> SimpleNamespace:
    """What the profiler reads of a rank's runtime."""
    return SimpleNamespace(world_size=4, rank=rank, hostname="n1",
                           launch=SimpleNamespace(local_rank=local_rank),
                           device=SimpleNamespace(type="cpu"))


def test_the_window_opens_at_its_first_step_and_closes_after_its_last(tmp_path, monkeypatch):
    """unitrace's conditional collection (PTI_ENABLE_COLLECTION) around steps 3-4 of 6, on the
    chosen rank only; no torch.profiler trace is written."""
    from mmm_orch.runtime import profiling

    monkeypatch.setenv(protocol.PROFILE_WINDOW_VAR, "pti-collection")
    monkeypatch.delenv("PTI_ENABLE_COLLECTION", raising=False)
    for rt, expected in ((ranks_of(0, 0), [None, None, "1", "1", "0", "0"]),
                         (ranks_of(1, 1), [None] * 6)):
        os.environ.pop("PTI_ENABLE_COLLECTION", None)
        profiler = profiling.profiler("unitrace", "3:4", "", 6, tmp_path, rt)
        seen = []
        for step in range(1, 7):
            profiler.begin(step)
            with profiling.region("forward"):
                seen.append(os.environ.get("PTI_ENABLE_COLLECTION"))
            profiler.end(step)
        assert seen == expected
    assert not (tmp_path / protocol.PROFILE_DIR).exists()


def test_a_facility_tool_outside_a_job_that_wraps_the_ranks_is_refused(tmp_path, monkeypatch):
    from mmm_orch.runtime import profiling

    monkeypatch.delenv(protocol.PROFILE_WINDOW_VAR, raising=False)
    with pytest.raises(ValueError, match="--profile 'nsys': off, torch, or a machine's profiler"):
        profiling.profiler("nsys", "", "", 6, tmp_path, ranks_of(0, 0))


def profiled_files(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / protocol.PROFILE_DIR).iterdir())


# One write of one whole line: ranks share the log (the rank and its node, as Slurm names it).
RANK_AND_NODE = ("import os; os.write(1, ('rank %s %s\\n' % (os.environ['SLURM_PROCID'], "
                 "os.environ['SLURMD_NODENAME'])).encode())")


@pytest.mark.live
@pytest.mark.slow
def test_on_slurm_your_command_runs_on_two_nodes_and_the_tool_on_local_rank_0_of_each(
        cli, isolated, slurm_cluster, leftovers_cancelled):
    """Your own command (no trainer: the tool wraps the rank, whatever it runs) through srun on 2
    nodes x 2 ranks, under GNU time: ranks 0 and 2, one file each, named by host and rank;
    `mmm-orch profile` points at them. (The trainers' side of a tool, its window: above.)"""
    result = cli("submit", "slurm-local", "-N", "2", "--profile", "time", "--json", "--",
                 sys.executable, "-c", RANK_AND_NODE)
    assert result.code == 0, result.err
    job = json.loads(result.out)
    row = wait_state(cli, job["id"], timeout=600)
    log = cli("logs", str(job["id"])).out
    assert (row["state"], row["exit_code"]) == ("completed", 0), log[-3000:]
    ranks = [line.split() for line in log.splitlines() if line.startswith("rank ")]
    assert sorted(r[1] for r in ranks) == ["0", "1", "2", "3"]
    assert len({r[2] for r in ranks}) == 2  # both nodes
    assert "srun --nodes=2 --ntasks=4" in log
    run = Path(job["run_dir"])
    made = profiled_files(run)
    assert [name.split("_rank")[1] for name in made] == ["0.time", "2.time"]
    assert len({name.split("_rank")[0] for name in made}) == 2  # one on each node
    assert all("Exit status: 0" in (run / "profile" / name).read_text() for name in made)
    pointed = cli("profile", str(job["id"]))
    assert pointed.code != 0 and "a profiler's files: " + ", ".join(made) in pointed.err


@pytest.mark.live
@pytest.mark.slow
def test_on_pbs_your_command_runs_under_the_tool_on_the_ranks_named(cli, isolated, pbs_server,
                                                                    leftovers_cancelled):
    """mpiexec (Hydra) on 2 PBS vnodes, your own program, rank 3 chosen through the job's
    variable: only it runs under the tool."""
    result = cli("submit", "pbs-local", "-N", "2", "--profile", "time", "--env",
                 f"{protocol.PROFILE_RANKS_VAR}=3", "--json", "--", "python3", "-c",
                 "import os; print('rank', os.environ['PMI_RANK'], os.environ['MMM_ORCH_PROFILE'])")
    assert result.code == 0, result.err
    job = json.loads(result.out)
    assert wait_state(cli, job["id"], timeout=600)["state"] == "completed", \
        cli("logs", str(job["id"])).out[-3000:]
    assert [name.split("_rank")[1] for name in profiled_files(Path(job["run_dir"]))] == ["3.time"]
    log = cli("logs", str(job["id"])).out
    assert all(f"rank {r} time" in log for r in range(4)), log
