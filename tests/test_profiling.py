"""Where the step time goes: `--profile torch` on CPU (gloo), traces of the chosen ranks only,
`mmm-orch profile` splitting each profiled step into data, forward, backward, optimizer, exposed
communication and idle (adding up to the step time the run logged), a communication-heavy run
showing more exposed communication than a compute-heavy one, a slow data loader in user code
showing in data, the report's two columns, and bad windows and ranks refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.jobs import wait_state
from helpers.training import free_port, launch, steps


def profile_json(cli, run_dir: Path, *more: str) -> dict:
    """`mmm-orch profile RUN_DIR --json`, as a user runs it."""
    result = cli("profile", str(run_dir), "--json", *more)
    assert result.code == 0, result.err
    return json.loads(result.out)


# The tests that read the 4-rank run below share it: one worker makes it once.
SHARES_FOUR_RANKS = pytest.mark.xdist_group("profiled-four-ranks")


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> Path:
    """The out directory of a run on 4 ranks of one sample each (much to communicate, little to
    compute), steps 3 to 7 of 7 profiled on ranks 0 and 3."""
    out = tmp_path_factory.mktemp("four-ranks")
    proc = launch("llama3", ["--tiny", "--steps", "7", "--batch-size", "1", "--n-layers", "4",
                             "--profile", "torch", "--profile-steps", "3:7", "--profile-ranks",
                             "0,3"], 4, "torchrun", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
@SHARES_FOUR_RANKS
def test_traces_of_the_chosen_ranks_add_up_to_the_logged_step_time(four_ranks, cli):
    out = four_ranks
    traces = sorted(p.name for p in (out / "run" / "profile").iterdir())
    assert [t.split("_rank")[1] for t in traces] == ["0.pt.trace.json", "3.pt.trace.json"]
    found = profile_json(cli, out / "run")
    logged = {s["step"]: 1000 * s["dt"] for s in steps(out)}
    for rank in found["ranks"]:
        assert [s["step"] for s in rank["steps"]] == [3, 4, 5, 6, 7]
        for step in rank["steps"]:
            assert sum(step["parts_ms"].values()) == pytest.approx(step["ms"], rel=1e-6)
            assert 0 <= step["hidden_comm_ms"] <= step["comm_ms"] <= step["ms"]
        assert sum(rank["shares"].values()) == pytest.approx(1.0, abs=1e-6)
    # Rank 0's profiled steps are the steps it logged, within 5%.
    rank0 = found["ranks"][0]
    for step in rank0["steps"]:
        assert step["ms"] == pytest.approx(logged[step["step"]], rel=0.05), (step, logged)
    assert rank0["shares"]["forward"] > 0 and rank0["shares"]["backward"] > 0
    assert any(name.startswith("gloo:") for name, _ in rank0["top_collectives"])
    assert found["slowest"]["rank"] in (0, 3)


@pytest.mark.slow
@SHARES_FOUR_RANKS
def test_more_ranks_with_a_small_batch_expose_more_communication(four_ranks, cli, tmp_path):
    """The same model on one rank (nothing to communicate) and on four with one sample each;
    the one rank's window the default: 3 steps after the first 2."""
    out = tmp_path / "out"
    out.mkdir()
    proc = launch("llama3", ["--tiny", "--steps", "7", "--batch-size", "8", "--n-layers", "4",
                             "--profile", "torch"], 1, "python", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone = profile_json(cli, out / "run")["ranks"][0]
    assert [s["step"] for s in alone["steps"]] == [3, 4, 5]
    shares = {1: alone["shares"]["exposed_comm"],
              4: profile_json(cli, four_ranks / "run")["ranks"][0]["shares"]["exposed_comm"]}
    assert shares[4] > 0.05 and shares[4] > 3 * shares[1], shares


def test_by_default_local_rank_0_of_each_node_is_profiled_3_steps_after_the_first_2(tmp_path):
    """The choice every rank makes (runtime/profiling.py) without --profile-ranks and
    --profile-steps, on 2 nodes of 2 ranks (the live Slurm test below runs one)."""
    from mmm_orch.injob.windows import Window
    from mmm_orch.runtime import profiling

    chosen = []
    for rank in range(4):
        runtime = SimpleNamespace(rank=rank, world_size=4, hostname=f"n{rank // 2}",
                                  launch=SimpleNamespace(local_rank=rank % 2),
                                  device=SimpleNamespace(type="cpu"))
        profiler = profiling.profiler("torch", "", "", 6, tmp_path, runtime)
        assert profiler.window == Window(3, 5)
        chosen.append(profiler.here)
    assert chosen == [True, False, True, False]


USER_PROGRAM = textwrap.dedent("""
    import time
    import torch
    from mmm_orch import runtime

    rt = runtime.setup()
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runtime.profile_window(8)
    for step in range(1, 9):
        with runtime.profiled_step(step):
            started = time.perf_counter()
            with runtime.region("data"):
                time.sleep(0.5)  # a deliberately slow loader
                batch = torch.randn(32, 64)
            with runtime.region("forward"):
                loss = model(batch).square().mean()
            with runtime.region("backward"):
                loss.backward()
            with runtime.region("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
        runtime.report_step(step, loss=loss.item(), dt=time.perf_counter() - started)
    runtime.finish(0)
""")


@pytest.mark.slow
def test_a_user_program_with_a_slow_loader_shows_it_in_data(tmp_path, cli):
    program = tmp_path / "train.py"
    program.write_text(USER_PROGRAM)
    run = tmp_path / "run"
    env = {**os.environ, "MMM_ORCH_RUN_DIR": str(run), "MMM_ORCH_PROFILE": "torch",
           "MMM_ORCH_PROFILE_STEPS": "3:6", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank = profile_json(cli, run)["ranks"][0]
    assert [s["step"] for s in rank["steps"]] == [3, 4, 5, 6]
    # However loaded the host, the loader's sleep is in data, and it is the largest part.
    assert max(rank["shares"], key=rank["shares"].get) == "data", rank["shares"]
    for step in rank["steps"]:
        assert step["parts_ms"]["data"] >= 500, step


@pytest.mark.parametrize("option,value,said", [
    ("--profile-steps", "7:9", "1 <= A <= B <= 6"),
    ("--profile-steps", "5:2", "1 <= A <= B <= 6"),
    ("--profile-steps", "0:2", "1 <= A <= B <= 6"),
    ("--profile-ranks", "2", "from 0 to 1"),
])
def test_a_window_or_rank_the_run_does_not_have_is_refused(tmp_path, option, value, said):
    """The check every rank of a 6-step run on 2 ranks makes before it trains (its refusal on
    every rank: the next test)."""
    from mmm_orch.runtime import profiling

    chosen = {"--profile-steps": "", "--profile-ranks": "", option: value}
    for rank in (0, 1):
        runtime = SimpleNamespace(rank=rank, world_size=2, hostname="n0",
                                  launch=SimpleNamespace(local_rank=rank),
                                  device=SimpleNamespace(type="cpu"))
        with pytest.raises(ValueError) as refused:
            profiling.profiler("torch", chosen["--profile-steps"], chosen["--profile-ranks"], 6,
                               tmp_path, runtime)
        assert f"{option} '{value}': expected" in str(refused.value), str(refused.value)
        assert said in str(refused.value)


@pytest.mark.slow
def test_a_run_refuses_a_rank_it_does_not_have_before_it_trains(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = launch("llama3", ["--tiny", "--steps", "6", "--profile", "torch", "--profile-ranks",
                             "2"], 2, "torchrun", out)
    assert proc.returncode != 0
    assert "--profile-ranks '2': expected" in proc.stderr and "from 0 to 1" in proc.stderr, \
        proc.stderr
    assert not (out / "run" / "metrics.jsonl").exists()  # nothing trained, no metrics


@pytest.mark.parametrize("sets,said", [
    (["profile_steps=30:40"], "--profile-steps '30:40'"),
    (["profile_steps=4:2"], "--profile-steps '4:2'"),
    (["profile_steps=0"], "--profile-steps '0'"),
    (["profile_ranks=9"], "--profile-ranks '9'"),
    (["profile_steps=a:b"], "option profile_steps='a:b' is invalid"),
])
def test_before_the_queue_a_bad_window_rank_or_tool_writes_nothing(cli, isolated, sets, said):
    args = [item for s in ["profile=torch", *sets] for item in ("--set", s)]
    result = cli("submit", "local", "llama3_debug", *args)
    assert result.code == 2 and said in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (isolated.parent / "state" / "mmm-orch").exists()
    unknown = cli("submit", "local", "llama3_debug", "--set", "profile=nsys")
    assert unknown.code == 2 and "local has off, torch" in unknown.err, unknown.err


@pytest.mark.slow
def test_the_report_of_a_profiled_sweep_has_the_two_columns(cli, isolated):
    """Two points on this computer: the table and report.html show each point's exposed
    communication and data loading, as `mmm-orch profile` gives them."""
    result = cli("sweep", "local", "llama3_debug", "--set", "tiny=true", "--set", "steps=6",
                 "--set", "profile=torch", "--set", "batch_size=1,4")
    assert result.code == 0, result.err
    for job in (1, 2):
        assert wait_state(cli, job, timeout=600)["state"] == "completed", cli("logs", str(job)).out
    rows = json.loads(cli("report", "s1", "--json").out)
    assert len(rows) == 2
    jobs = {j["id"]: j for j in json.loads(cli("status", "1", "2", "--json").out)}
    for row in rows:
        shares = profile_json(cli, Path(jobs[row["job"]]["run_dir"]))["ranks"][0]["shares"]
        assert row["comm_pct"] == pytest.approx(100 * shares["exposed_comm"])
        assert row["data_pct"] == pytest.approx(100 * shares["data"])
    text = cli("report", "s1").out
    assert "exposed comm %" in text.splitlines()[0] and "data %" in text.splitlines()[0], text
    assert cli("report", "s1", "--out", "report").code == 0
    assert "exposed comm %" in (isolated / "report" / "report.html").read_text()


@pytest.mark.slow
def test_on_slurm_two_nodes_profile_local_rank_0_of_each(cli, isolated, slurm_cluster,
                                                          leftovers_cancelled):
    """2 nodes x 2 ranks: by default ranks 0 and 2 are profiled, one trace each, and `mmm-orch
    profile JOB` splits their steps into parts that add up to the logged step time."""
    result = cli("submit", "slurm-local", "llama3_debug", "-N", "2", "--set", "tiny=true",
                 "--set", "steps=8", "--set", "profile=torch", "--set", "profile_steps=4:6",
                 "--json")
    assert result.code == 0, result.err
    job = json.loads(result.out)
    assert wait_state(cli, job["id"], timeout=600)["state"] == "completed", \
        cli("logs", str(job["id"])).out[-3000:]
    run = Path(job["run_dir"])
    assert sorted(p.name.split("_rank")[1] for p in (run / "profile").iterdir()) == \
        ["0.pt.trace.json", "2.pt.trace.json"]
    found = json.loads(cli("profile", str(job["id"]), "--json").out)
    assert [r["rank"] for r in found["ranks"]] == [0, 2]
    assert len({r["host"] for r in found["ranks"]}) == 2  # one on each node
    logged = {r["step"]: 1000 * r["dt"] for r in map(json.loads, (run / "metrics.jsonl")
              .read_text().splitlines()) if r["event"] == "step"}
    for step in found["ranks"][0]["steps"]:
        assert sum(step["parts_ms"].values()) == pytest.approx(step["ms"], rel=1e-6)
        assert step["ms"] == pytest.approx(logged[step["step"]], rel=0.05)
    assert found["ranks"][1]["shares"]["exposed_comm"] > 0  # across nodes, over TCP


def test_a_pipeline_stage_waiting_on_its_neighbour_is_the_bubble_and_shown_only_then():
    """A stage's send or receive in flight while nothing computes is the pipeline's bubble; an
    all-reduce alone is exposed communication; the text's bubble column is there only for a
    rank that had one."""
    from mmm_orch.cli.view import profile_text
    from mmm_orch.reporting.trace_summary import rank_profile
    from mmm_orch.usecases.step_profiles import Profile

    def span(name, ts, dur, tid=1, cat="user_annotation"):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}

    stage = {"traceEvents": [
        span("mmm:step#4", 0, 100), span("mmm:forward", 0, 80), span("mmm:optimizer", 80, 20),
        span("aten::mm", 0, 30, cat="cpu_op"), span("aten::mm", 50, 30, cat="cpu_op"),
        span("aten::add_", 90, 10, cat="cpu_op"),
        span("gloo:recv", 25, 30, tid=9),        # 30-50 with nothing computing: the bubble
        span("gloo:all_reduce", 80, 10, tid=9),  # 80-90 alone: exposed communication
    ]}
    piped = rank_profile(stage, 1, "n2")
    parts = {k: v * 1000 for k, v in piped.steps[0].parts_ms.items()}
    assert parts["bubble"] == pytest.approx(20) and parts["exposed_comm"] == pytest.approx(10)
    assert parts["forward"] == pytest.approx(60) and parts["optimizer"] == pytest.approx(10)
    assert sum(parts.values()) == pytest.approx(100)
    stage["traceEvents"] = [e for e in stage["traceEvents"] if e["name"] != "gloo:recv"]
    plain = rank_profile(stage, 0, "n1")
    text = profile_text(Profile(Path("/runs/r/profile"), [piped, plain], None))
    piped_part, plain_part = text.split("rank 0 (n1)")
    assert "bubble" in piped_part and "bubble" not in plain_part, text


def test_on_a_gpu_trace_kernels_decide_what_computed():
    """The summary's device path, on a trace laid out as CUDA's are (kernels on a stream beside
    the CPU thread, each range repeated on the stream as the H200's were): an NCCL kernel
    overlapping compute kernels is hidden where they overlap and exposed where it runs alone;
    the step's parts still add up to it, each step counted once; the kernels listed apart."""
    from mmm_orch.reporting.trace_summary import rank_profile

    def span(name, ts, dur, tid=1, cat="user_annotation"):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}

    trace = {"traceEvents": [
        span("mmm:step#3", 0, 100),
        span("mmm:data", 0, 10), span("mmm:forward", 10, 30), span("mmm:backward", 40, 50),
        span("mmm:optimizer", 90, 8),
        span("ampere_sgemm", 12, 28, tid=7, cat="kernel"),     # compute, 12-40
        span("ampere_sgemm", 45, 15, tid=7, cat="kernel"),     # compute, 45-60
        span("ncclDevKernel_AllGather", 30, 50, tid=8, cat="kernel"),  # 30-80
        span("aten::mm", 12, 20, tid=1, cat="cpu_op"),  # the CPU's ops do not count on a GPU
        # the stream's copies of the ranges: from their first kernel to their last
        span("mmm:step#3", 12, 68, tid=7, cat="gpu_user_annotation"),
        span("mmm:forward", 12, 28, tid=7, cat="gpu_user_annotation"),
        span("nccl:all_gather", 30, 50, tid=8, cat="gpu_user_annotation"),
    ]}
    found = rank_profile(trace, 0, "gpu01")
    assert len(found.steps) == 1
    assert found.top_ops == [("aten::mm", pytest.approx(0.020))]
    assert found.top_kernels == [("ncclDevKernel_AllGather", pytest.approx(0.050)),
                                 ("ampere_sgemm", pytest.approx(0.043))]
    step = found.steps[0]
    assert step.comm_ms * 1000 == pytest.approx(50)
    assert step.hidden_comm_ms * 1000 == pytest.approx(10 + 15)  # 30-40 and 45-60
    parts = {k: v * 1000 for k, v in step.parts_ms.items()}
    assert parts["exposed_comm"] == pytest.approx(5 + 20)  # 40-45 and 60-80
    assert parts["forward"] == pytest.approx(30) and parts["backward"] == pytest.approx(50 - 25)
    assert parts["data"] == pytest.approx(10) and parts["optimizer"] == pytest.approx(8)
    assert parts["idle"] == pytest.approx(2) and sum(parts.values()) == pytest.approx(100)
