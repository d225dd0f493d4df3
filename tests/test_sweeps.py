"""Sweeps and reports: every bad sweep refused before anything is submitted; on the live Slurm
cluster, sweeps of dist_check and fsdp over 1 and 2 nodes run to the end, `status` shows each as
one line, and `report` writes a table whose numbers are those of the metrics files, PNG figures
with data drawn on them, and a report.html that a real headless Chromium renders with its
images. Without matplotlib, `report` still prints the table and says how to get the figures."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.jobs import assert_nothing_recorded, wait_state

ROOT = Path(__file__).resolve().parents[1]
BAD_SWEEPS = [
    (["--nodes", ""], "--nodes '' is invalid"),
    (["--nodes", ","], "--nodes ',' is invalid"),
    (["--nodes", "0,2"], "--nodes '0' is invalid"),
    (["--nodes", "1,x"], "--nodes 'x' is invalid"),
    (["--nodes", "1,1"], "--nodes: '1' and '1' are the same value (1)"),
    (["--nodes", "1,01"], "--nodes: '1' and '01' are the same value (1)"),
    (["--nodes", ",".join(map(str, range(1, 1002)))], "--nodes: more than 1000 values"),
    (["--set", "seed=" + ",".join(map(str, range(40))), "--set", "epochs=" + ",".join(map(str, range(1, 41)))],
     "40 seed x 40 epochs is 1600 points, more than 1000"),
    (["--nodes", "1,2", "--set", "bogus=1,2"], "sweep point 1 (nodes=1 bogus=1): unknown --set key"),
    (["--nodes", "1,2", "--set", "batch_size=8,0"], "sweep point 2 (nodes=1 batch_size=0)"),
    (["--nodes", "1,2", "--set", "batch_size"], "--set 'batch_size' is invalid"),
    (["--nodes", "1,2", "--set", "epochs=1", "--set", "epochs=2"], "--set epochs: given twice"),
    (["--nodes", "1,4"], "sweep point 2 (nodes=4): --nodes 4 is invalid"),
    (["--nodes", "1,2", "-q", "nope"], "sweep point 1 (nodes=1)"),
]


@pytest.mark.parametrize("args,message", BAD_SWEEPS, ids=[" ".join(a) or "empty" for a, _ in BAD_SWEEPS])
def test_a_bad_sweep_submits_nothing(cli, isolated, args, message):
    result = cli("sweep", "slurm-local", "fsdp", *args)
    assert result.code == 2, result
    assert message in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert_nothing_recorded()


def _two_spellings(option) -> tuple[str, str] | None:
    """One value of the option written two ways the trainer cannot tell apart."""
    if option.type == "bool":
        return "true", "True"
    if option.type == "int":
        low = int(option.ge if option.ge is not None else (option.gt or 0) + 1)
        return str(low), f"0{low}"
    if option.type == "float":
        return "0.5", "5e-1"
    if option.type == "str" and not option.pattern:
        return "a", "a"
    return None


def _spelling_cases():
    from mmm_orch.config import registry

    cases = []
    for workload in ("fsdp", "llama3_debug", "vit"):
        for name, option in registry.load_workload(workload).options.items():
            if (pair := _two_spellings(option)) is not None:
                cases.append((workload, name, *pair))
    return cases


@pytest.mark.parametrize("workload,name,first,second", _spelling_cases())
def test_one_value_spelled_two_ways_is_refused(cli, isolated, workload, name, first, second):
    """The grid would run the same point twice: every option type, compared as the trainer
    gets the value."""
    result = cli("sweep", "slurm-local", workload, "--set", f"{name}={first},{second}")
    assert result.code == 2, result
    assert f"--set {name}: {first!r} and {second!r} are the same value" in result.err, result.err
    assert_nothing_recorded()


def test_a_point_whose_queue_does_not_fit_submits_nothing(cli, isolated):
    result = cli("sweep", "aurora", "llama3_8b", "--nodes", "1,2,32", "-q", "capacity", "-A", "X")
    assert result.code == 2
    assert "sweep point 3 (nodes=32): --queue 'capacity' cannot run 32 nodes" in result.err, \
        result.err
    assert_nothing_recorded()


def test_dry_run_lists_the_points(cli, isolated):
    result = cli("sweep", "aurora", "llama3_8b", "--nodes", "2,4", "--set", "tp=1,2", "-A", "X",
                 "--dry-run")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == "sweep of llama3_8b on aurora: 4 points (nothing submitted)"
    # debug and debug-scaling take one job per user: the points after the first go on
    assert "nodes=2 tp=1" in lines[1] and "queue debug," in lines[1]
    assert "nodes=2 tp=2" in lines[2] and "queue debug-scaling," in lines[2]
    assert "nodes=4 tp=1" in lines[3] and "queue capacity," in lines[3]
    assert "2 nodes x 12 = 24 ranks, mesh dp=12 tp=2 pp=1" in lines[2], lines[2]
    assert_nothing_recorded()


def test_unknown_sweeps_and_jobs_in_a_report_are_refused(cli, isolated):
    for args, message in ((["s7"], "sweep 7 not found"), (["x1"], "'x1' is invalid"),
                          (["3"], "job 3 not found")):
        result = cli("report", *args)
        assert result.code == 2 and message in result.err, (args, result.err)
    assert not list(isolated.glob("report-*"))


def metrics_steps(run_dir: str) -> list[dict]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["event"] == "step"]


def report_rows(cli, target: str) -> list[dict]:
    result = cli("report", target, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def rgb(image) -> list[tuple[int, int, int]]:
    data = image.convert("RGB").tobytes()
    return [tuple(data[i:i + 3]) for i in range(0, len(data), 3)]


def png_is_drawn(path: Path, size: tuple[int, int]) -> None:
    """A real PNG of the expected size, with data drawn: many colours, most not white."""
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == size, (path, image.size)
        pixels = rgb(image)
        colours = set(pixels)
        coloured = sum(1 for p in pixels if abs(p[0] - p[1]) > 40 or abs(p[1] - p[2]) > 40)
    assert len(colours) > 50, (path, len(colours))
    assert coloured > 500, (path, coloured)  # lines and markers, not only black axes on white


# The tests of the two live sweeps share them: one pytest-xdist worker runs them all (test.sh
# distributes by group), so the sweeps run once.
ON_ONE_WORKER = pytest.mark.xdist_group("live-sweeps")


@pytest.fixture(scope="module")
def sweeps(slurm_cluster, tmp_path_factory):
    """A dist_check sweep and an fsdp sweep over 1 and 2 nodes, submitted by the real command
    (a fresh interpreter, as a user types it): their directory and environment."""
    work = tmp_path_factory.mktemp("sweeps")
    env = {"HOME": str(work / "home"), "XDG_STATE_HOME": str(work / "state"),
           "XDG_CACHE_HOME": str(work / "cache"), "XDG_CONFIG_HOME": str(work / "config")}
    for sweep, workload in enumerate(("dist_check", "fsdp"), start=1):
        proc = run_cli("sweep", "slurm-local", workload, "--nodes", "1,2", env=env, cwd=work)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"sweep {sweep}: 2 jobs submitted"), proc.stdout
    return work, env


@pytest.fixture
def sweeps_here(sweeps, isolated, cli, monkeypatch) -> Path:
    """The sweeps' directory, made this test's working directory and environment, so that `cli`
    runs `mmm-orch ARGS` on them in this process; once their four jobs have ended (the first test
    waits for them, the others find them ended)."""
    work, env = sweeps
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(work)
    for job in (1, 2, 3, 4):
        assert wait_state(cli, job, timeout=600)["state"] == "completed", \
            cli("logs", str(job)).out[-2000:]
    return work


@ON_ONE_WORKER
def test_status_shows_a_sweep_as_one_line_that_expands(sweeps_here, cli):
    lines = cli("status").out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["s1", "s2"], lines
    assert "2 points, nodes 1,2: 2 completed" in lines[1] and "completed" in lines[1].split()[4]
    expanded = cli("status", "--sweep", "2").out.splitlines()
    assert [line.split()[:4] for line in expanded[1:]] == [["3", "slurm-local", "fsdp", "1"],
                                                          ["4", "slurm-local", "fsdp", "2"]]


@ON_ONE_WORKER
def test_report_of_a_training_sweep_matches_the_metrics(sweeps_here, cli):
    work = sweeps_here
    rows = report_rows(cli, "s2")
    assert [(r["job"], r["nodes"], r["ranks"]) for r in rows] == [(3, 1, 2), (4, 2, 4)]
    jobs = {j["id"]: j for j in json.loads(cli("status", "3", "4", "--json").out)}
    for r in rows:
        steps = metrics_steps(jobs[r["job"]]["run_dir"])
        timed = steps[1:]
        assert r["steps"] == len(steps) > 5
        assert r["step_ms"] == pytest.approx(1000 * statistics.median(s["dt"] for s in timed))
        assert r["throughput"] == pytest.approx(statistics.median(s["samples_per_s"] for s in timed))
        assert r["unit"] == "samples/s" and r["mesh"] == f"dp={r['ranks']}"
        assert r["final_loss"] == pytest.approx(steps[-1]["loss"])
        assert r["startup_s"] is not None and 0 < r["startup_s"] < 300
    base, two = rows
    assert base["weak"] == 1.0 and base["strong"] == 1.0
    assert two["weak"] == pytest.approx(base["step_ms"] / two["step_ms"])
    assert two["strong"] == pytest.approx(base["step_ms"] * 2 / (two["step_ms"] * 4))

    out = work / "report-s2"
    assert sorted(p.name for p in out.iterdir()) == ["loss.png", "report.html", "scaling.png",
                                                     "step_time.png"]
    for name in ("loss.png", "scaling.png", "step_time.png"):
        png_is_drawn(out / name, (1200, 675))
    text = cli("report", "s2", "--out", str(work / "again")).out
    assert "per device" in text.splitlines()[0] and "samples/s" in text
    assert f"report: {work / 'again' / 'report.html'}" in text


@ON_ONE_WORKER
def test_report_of_a_dist_check_sweep_draws_the_allreduce(sweeps_here, cli):
    work = sweeps_here
    rows = report_rows(cli, "s1")
    for r in rows:
        log = cli("logs", str(r["job"])).out
        timings = json.loads(log.split("[dist_check] json ", 1)[1].splitlines()[0])["allreduce"]
        assert r["latency_us"] == min(timings, key=lambda t: t["bytes"])["latency_us"]
        assert r["busbw_gbps"] == max(timings, key=lambda t: t["bytes"])["busbw_gbps"]
        assert r["step_ms"] is None and r["final_loss"] is None and r["steps"] is None
    out = work / "report-s1"
    assert sorted(p.name for p in out.iterdir()) == ["allreduce.png", "report.html"]
    png_is_drawn(out / "allreduce.png", (1200, 675))


@ON_ONE_WORKER
def test_plot_draws_one_job(sweeps_here, cli):
    work = sweeps_here
    result = cli("plot", "4", "--out", str(work / "job-4.png"))
    assert result.code == 0, result.err
    png_is_drawn(work / "job-4.png", (1200, 675))
    refused = cli("plot", "1")  # dist_check writes no step metrics
    assert refused.code == 2 and "job 1 has no step metrics" in refused.err


@ON_ONE_WORKER
def test_report_html_renders_in_headless_chromium(sweeps_here, cli, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is installed by scripts/setup.sh (apt package chromium)"
    assert cli("report", "s2", "--out", str(tmp_path / "shared")).code == 0
    page = tmp_path / "shared" / "report.html"
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # nothing fetched from the network
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<tr>") == 3 and dom.stdout.count("<img ") == 3, dom.stdout[:2000]
    shot = tmp_path / "shot.png"
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1300,2400", page.as_uri()],
                   capture_output=True, text=True, timeout=120, check=True)
    # The images were decoded and drawn: the screenshot holds matplotlib's blue lines.
    from PIL import Image

    with Image.open(shot) as image:
        blue = sum(1 for r, g, b in rgb(image)
                   if abs(r - 31) < 30 and abs(g - 119) < 30 and abs(b - 180) < 30)
    assert blue > 300, blue


@ON_ONE_WORKER
def test_without_matplotlib_report_prints_the_table_and_says_how(sweeps_here, tmp_path):
    """A Python with every package of the test environment but matplotlib (linked, not copied),
    running this checkout's mmm_orch."""
    import sysconfig

    work = sweeps_here
    root = tmp_path / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    theirs = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("matplotlib", "mpl_toolkits", "pylab", "mmm_orch",
                                      "__editable__", "_mmm_orch")):
            (theirs / entry.name).symlink_to(entry)
    env = {"XDG_STATE_HOME": str(work / "state"), "XDG_CACHE_HOME": str(work / "cache"),
           "XDG_CONFIG_HOME": str(work / "config"), "PYTHONPATH": str(ROOT)}
    import os

    out = tmp_path / "plain"
    proc = subprocess.run([str(python), "-m", "mmm_orch", "report", "s2", "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, **env}, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "per device" in proc.stdout and len(proc.stdout.splitlines()) >= 3
    assert "pip install 'mmm-orch[plot]'" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]
    refused = subprocess.run([str(python), "-m", "mmm_orch", "plot", "4"], capture_output=True,
                             text=True, env={**os.environ, **env}, cwd=work)
    assert refused.returncode == 2 and "pip install 'mmm-orch[plot]'" in refused.stderr
