"""The suite's fixtures and pytest hooks: an isolated home and config search path, an in-process
CLI runner, the live test servers, the test sshd and a tmpfs; the fast tier, the order in which
the tests are handed out and their CPU budget. What the tests share beside these is in
tests/helpers."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO
from helpers.jobs import cancel_leftovers
from helpers.ssh import Sshd
from mmm_orch.cli import main


# What a test needs that the fast tier (`scripts/test.sh --fast`) leaves out: a live server, a
# real sshd or root (a tmpfs mount), asked for as a fixture, statically or by name at run time
# (request.getfixturevalue, in the test or in any fixture it reaches: see live_fixtures), or a
# marker: `slow` for a test that runs trainings, real jobs or processes for seconds, or sleeps.
LIVE_FIXTURES = {"slurm_cluster", "pbs_server", "sshd", "leftovers_cancelled", "tmpfs"}
SLOW_MARKERS = ("live", "slow", "serial", "starts_first")


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="only the tests that need no server, no root and no waiting (the "
                          "developer's loop; CI runs them all)")
    parser.addoption("--store-durations", action="store_true",
                     help="write this run's durations to tests/durations.json (a fresh "
                          "clone's order of the tests)")


# Past these a module is worth splitting along its users' seams, a function into named steps: a
# report at the end of every run (what a reader meets), not a gate that shapes the code.
LONG_MODULE, LONG_FUNCTION = 400, 60


def pytest_terminal_summary(terminalreporter):
    import ast

    modules, functions = [], []
    for path in sorted((REPO / "mmm_orch").rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(REPO))
        if (lines := len(text.splitlines())) > LONG_MODULE:
            modules.append(f"{name} ({lines})")
        functions += [f"{name}:{node.name} ({node.end_lineno - node.lineno + 1})"
                      for node in ast.walk(ast.parse(text))
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.end_lineno - node.lineno + 1 > LONG_FUNCTION]
    terminalreporter.write_sep("-", "sizes")
    terminalreporter.write_line(f"modules over {LONG_MODULE} lines: {', '.join(modules) or 'none'}")
    terminalreporter.write_line(f"functions over {LONG_FUNCTION} lines: "
                                f"{', '.join(functions) or 'none'}")


@functools.cache
def _names_asked_for(function) -> frozenset[str]:
    """The strings in the code of `function` (its nested code too) if it calls getfixturevalue:
    the fixtures it may ask for by name at run time, e.g. `request.getfixturevalue("slurm_cluster"
    if kind == "slurm" else "pbs_server")` in a test or a fixture parametrized by scheduler."""
    function = inspect.unwrap(function)
    function = getattr(getattr(function, "hypothesis", None), "inner_test", function)
    code = getattr(function, "__code__", None)
    if code is None:
        return frozenset()
    names, codes, seen = set(), [code], False
    while codes:
        code = codes.pop()
        seen |= "getfixturevalue" in code.co_names
        consts = list(code.co_consts)
        while consts:
            const = consts.pop()
            if isinstance(const, str):
                names.add(const)
            elif isinstance(const, (tuple, frozenset)):
                consts.extend(const)
            elif inspect.iscode(const):
                codes.append(const)
    return frozenset(names) if seen else frozenset()


def live_fixtures(item) -> set[str]:
    """The LIVE_FIXTURES that `item` asks for or may ask for: its fixture closure, and every
    fixture that it or a fixture it reaches asks for by name (followed to their own requests)."""
    manager = item.session._fixturemanager
    reached, todo = set(), set(item.fixturenames)
    functions = [getattr(item, "function", None)]
    while todo or functions:
        for name in todo - reached:
            reached.add(name)
            try:
                defs = manager.getfixturedefs(name, item) or ()
            except Exception:  # not a fixture here: a string that only looks like one
                defs = ()
            functions += [fixturedef.func for fixturedef in defs]
        todo = set()
        while functions:
            if (function := functions.pop()) is not None:
                todo |= _names_asked_for(function) - reached
    return LIVE_FIXTURES & reached


def pytest_collection_modifyitems(config, items):
    """With --fast, only the fast tier. Then the order in which pytest-xdist hands the tests out
    (scripts/test.sh keeps it: --no-loadscope-reorder): those marked starts_first, then the
    rest longest first by their recorded durations (a group by its tests' sum), so that the run
    does not end with one worker alone on the slowest tests; unrecorded ones keep their order."""
    if config.getoption("--fast"):
        slow = {item for item in items if marked_slow(item) or live_fixtures(item)}
        config.hook.pytest_deselected(items=[item for item in items if item in slow])
        items[:] = [item for item in items if item not in slow]
    recorded = recorded_durations(config)
    scope_seconds: dict[str, float] = {}
    for item in items:
        scope = work_unit(item)
        seconds = recorded.get(test_id(item.nodeid), 0.0)
        scope_seconds[scope] = scope_seconds.get(scope, 0.0) + seconds
    items.sort(key=lambda item: (item.get_closest_marker("starts_first") is None,
                                 -scope_seconds[work_unit(item)]))


def test_id(nodeid: str) -> str:
    """A test's id as collected: pytest-xdist's reports add `@group` to a grouped test's."""
    return nodeid[:nodeid.rfind("@")] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def marked_slow(item) -> bool:
    return any(item.get_closest_marker(name) for name in SLOW_MARKERS)


def work_unit(item) -> str:
    """What pytest-xdist hands to one worker whole: the test's xdist_group, or the test alone."""
    group = item.get_closest_marker("xdist_group")
    return f"@{group.args[0] if group.args else group.kwargs['name']}" if group else item.nodeid


# Time as a budget. Every test's CPU-seconds (its process and the child processes it waited
# for: unlike its wall time, not stretched by a loaded host) are measured; a test not marked
# slow, live or serial that uses more than CPU_BUDGET fails at its teardown. The durations of
# each run are kept in pytest's cache (.pytest_cache) and order the next run; a fresh clone
# orders by tests/durations.json, which `--store-durations` rewrites from a whole run.
CPU_BUDGET = float(os.environ.get("MMM_ORCH_TEST_CPU_BUDGET", "3"))  # (set: the rule's own test)
DURATIONS = REPO / "tests" / "durations.json"
DURATIONS_KEY = "mmm-orch/durations"


def recorded_durations(config) -> dict[str, float]:
    """Wall seconds by test id: this checkout's last runs, else the committed record."""
    cache = getattr(config, "cache", None)
    cached = cache.get(DURATIONS_KEY, None) if cache else None
    if cached:
        return cached
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """This process's CPU-seconds, its reaped children's, and the children it left running
    unwaited (subprocess's list of them: the local executor's supervisors, which wait for their
    jobs' trainings, so that their CPU comes to whichever test reaps them)."""

    own: float
    children: float
    unwaited: frozenset[int]

    @classmethod
    def now(cls) -> CpuUse:
        import resource

        # A child that ended unwaited is reaped, its CPU counted, at the next Popen of any test:
        # reap such children now, so that the test that ran them pays for them.
        getattr(subprocess, "_cleanup", lambda: None)()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(time.process_time(), children.ru_utime + children.ru_stime,
                   frozenset(p.pid for p in getattr(subprocess, "_active", None) or ()))

    def since(self, start: CpuUse) -> float:
        """The CPU-seconds a test used from `start`: its own and its children's; its own alone
        where a child left running before it ended meanwhile (the children's CPU is then not the
        test's alone)."""
        own = self.own - start.own
        return own if start.unwaited - self.unwaited else own + self.children - start.children


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_STARTED] = (time.monotonic(), CpuUse.now())
    yield


_STARTED = pytest.StashKey[tuple[float, CpuUse]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "teardown" or _STARTED not in item.stash:
        return
    started, cpu_at_start = item.stash[_STARTED]
    cpu = CpuUse.now().since(cpu_at_start)
    kind = "live" if live_fixtures(item) else "slow" if marked_slow(item) else "fast"
    report.user_properties += [("seconds", time.monotonic() - started), ("cpu_seconds", cpu),
                               ("kind", kind)]
    if cpu > CPU_BUDGET and report.passed and kind == "fast":
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} used {cpu:.1f} CPU-seconds, over the budget of "
                           f"{CPU_BUDGET:g} for a test of the fast tier: make it quicker, or "
                           f"mark it slow (tests/conftest.py, 'Time as a budget')")


class DurationRecorder:
    """Collects each test's seconds from the reports (on the controller under xdist) and says,
    at the end, what each kind of test cost: live (a test server or sshd), slow (trainings,
    jobs and processes on this host) and fast."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.kinds: dict[str, list[float]] = {}  # kind: [tests, seconds, CPU-seconds]

    def pytest_runtest_logreport(self, report):
        if report.when == "teardown":
            properties = dict(report.user_properties)
            if "seconds" in properties:
                self.seconds[test_id(report.nodeid)] = round(properties["seconds"], 2)
                total = self.kinds.setdefault(properties["kind"], [0, 0.0, 0.0])
                total[0] += 1
                total[1] += properties["seconds"]
                total[2] += properties["cpu_seconds"]

    def pytest_terminal_summary(self, terminalreporter):
        if self.kinds:
            terminalreporter.write_sep("-", "time by kind of test")
        for kind, (tests, seconds, cpu) in sorted(self.kinds.items()):
            terminalreporter.write_line(f"{kind}: {tests} tests, {seconds:.0f} worker-seconds, "
                                        f"{cpu:.0f} CPU-seconds of the tests and their children")

    def pytest_sessionfinish(self, session):
        config = session.config
        if not self.seconds or hasattr(config, "workerinput"):
            return
        if getattr(config, "cache", None):
            config.cache.set(DURATIONS_KEY, {**recorded_durations(config), **self.seconds})
        if config.getoption("--store-durations"):
            worth_ordering = {k: v for k, v in sorted(self.seconds.items()) if v >= 1}
            DURATIONS.write_text(json.dumps(worth_ordering, indent=0) + "\n")


def pytest_configure(config):
    config.pluginmanager.register(DurationRecorder(), "mmm-orch-durations")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test runs in an empty directory with its own HOME and config dirs."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MMM_ORCH_PATH", raising=False)
    monkeypatch.delenv("MMM_ORCH_ACCOUNT", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # only the keys a test names
    # The PBS server's commands are not on PATH, as on a machine that is not its login node
    # (a login shell here may add them): a review of an Aurora script then never counts the
    # test server's jobs against Aurora's queue limits.
    monkeypatch.setenv("PATH", os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not d.startswith("/opt/pbs/")))
    return work


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Run `mmm-orch ARGS...` in this process; returns exit code, stdout and stderr."""

    def run(*args: str) -> Result:
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def leftovers_cancelled():
    yield
    cancel_leftovers()


CLUSTER_SCRIPT = REPO / "scripts" / "slurm-cluster.sh"


@pytest.fixture(scope="session")
def slurm_cluster():
    """The project's real two-node Slurm cluster (scripts/slurm-cluster.sh), started once."""
    if os.geteuid() != 0:
        pytest.skip("REAL SLURM CLUSTER TESTS NOT RUN: they need root to install and start munge, "
                    "MariaDB, slurmdbd, slurmctld and two slurmd (run as root, as CI does)")
    proc = subprocess.run(["bash", str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"slurm-cluster.sh up failed:\n{proc.stdout}\n{proc.stderr}"
    return CLUSTER_SCRIPT


PBS_SCRIPT = REPO / "scripts" / "pbs-server.sh"


@pytest.fixture(scope="session")
def pbs_server():
    """The project's live OpenPBS server (scripts/pbs-server.sh), started once."""
    if os.geteuid() != 0:
        pytest.skip("LIVE PBS SERVER TESTS NOT RUN: they need root to install and start OpenPBS "
                    "(run as root, as CI does)")
    proc = subprocess.run(["bash", str(PBS_SCRIPT), "up"], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"pbs-server.sh up failed:\n{proc.stdout}\n{proc.stderr}"
    return PBS_SCRIPT


@pytest.fixture(scope="session")
def facility_python(tmp_path_factory) -> Path:
    """A Python of its own with torch and numpy and without mmm_orch: what a facility's framework
    module gives a job (Aurora `frameworks`, Polaris `conda`, Perlmutter `pytorch`). It is a
    virtual environment whose packages are links to the test environment's, mmm_orch left out."""
    import sysconfig

    root = tmp_path_factory.mktemp("facility") / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    theirs = Path(subprocess.run([str(root / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if entry.name.startswith(("mmm_orch", "__editable__", "_mmm_orch", "mmm-orch")):
            continue
        (theirs / entry.name).symlink_to(entry)
    python = root / "bin" / "python"
    check = subprocess.run([str(python), "-c", "import torch, numpy"], capture_output=True,
                           text=True, cwd=root)
    assert check.returncode == 0, check.stderr
    assert subprocess.run([str(python), "-c", "import mmm_orch"], capture_output=True,
                          cwd=root).returncode != 0
    return root


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        pytest.skip("REAL SSHD TESTS NOT RUN: they need root and openssh-server (scripts/"
                    "slurm-cluster.sh up installs it as root, as CI does)")
    root = tmp_path_factory.mktemp("sshd")
    keys = {}
    for name in ("host", "client", "other"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)],
                       check=True)
        keys[name] = root / name
    (root / "authorized_keys").write_text((root / "client.pub").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = root / "sshd_config"
    log = root / "sshd.log"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {keys["host"]}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AuthorizedKeysFile {root}/authorized_keys
StrictModes no
UsePAM no
PidFile {root}/sshd.pid
LogLevel VERBOSE
Subsystem sftp internal-sftp
SetEnv HOME={root}/home
""")
    # The sessions' login shells read an empty home, as a new account's would: not the dotfiles of
    # this host's root (a .bashrc that runs `pyenv init` waits 60 s on a stale pyenv lock).
    (root / "home").mkdir()
    Path("/run/sshd").mkdir(exist_ok=True)
    subprocess.run(["/usr/sbin/sshd", "-f", str(config), "-E", str(log)], check=True)
    deadline = time.monotonic() + 10
    while not (root / "sshd.pid").exists() or not (root / "sshd.pid").read_text().strip():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    pid = int((root / "sshd.pid").read_text())
    yield Sshd(port=port, pid=pid, host_key_pub=" ".join((root / "host.pub").read_text().split()[:2]),
               client_key=keys["client"], other_key=keys["other"], log=log)
    os.kill(pid, signal.SIGTERM)


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, options): a real tmpfs at tmp_path/name (`size=64k` for a full disk, `ro`
    for a read-only place), unmounted after the test. Needs root, as CI has."""
    if os.geteuid() != 0:
        pytest.skip("TMPFS TEST NOT RUN: mounting a tmpfs needs root (CI runs as root)")
    mounts = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
        mounts.append(where)
        return where
    yield mount
    for where in reversed(mounts):
        subprocess.run(["umount", "-l", str(where)], check=False)


