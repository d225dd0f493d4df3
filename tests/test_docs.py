"""The manual: a short README whose first commands are the two a fresh machine needs, and whose
former sections each live on a page of the site; the generated reference pages (docs/reference:
the command line from the parser, the Python API from its docstrings, the schemas, the machines'
queues and limits, the exit codes) are what the code makes today, and an option whose help
changes in a scratch copy of the package makes the check fail until the pages are made again.
(scripts/test.sh checks them too, and builds the site with --strict.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = REPO / "docs" / "reference"


def check(pages: Path, package_root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmm_orch.reference", str(pages), *extra],
                          capture_output=True, text=True, timeout=120, cwd=package_root,
                          env={**os.environ, "PYTHONPATH": str(package_root)})


def test_the_reference_pages_are_the_code_s_today():
    # A profile of this user's own must not change what the pages say.
    own = Path(os.environ["XDG_CONFIG_HOME"]) / "mmm-orch" / "machines"
    own.mkdir(parents=True)
    (own / "aurora.yaml").write_text("extends: aurora\nname: aurora\nmax_nodes: 7\n")
    found = check(PAGES, REPO, "--check")
    assert found.returncode == 0, found.stderr
    cli = (PAGES / "cli.md").read_text()
    for command in ("submit", "sweep", "launch", "profile", "export", "db recover"):
        assert f"## `{command}`" in cli, command
    assert "| `-N NODES`, `--nodes NODES` |" in cli
    python = (PAGES / "python.md").read_text()
    for name in ("### `mmm_orch.submit`\n\n```python\nsubmit(machine: str | Plan",
                 "class `mmm_orch.Job`", "#### `Job.wait`\n\n```python\nwait(timeout",
                 "### `mmm_orch.runtime.report_step`", "mmm_orch.runtime.EXIT_CHECKPOINTED = 75"):
        assert name in python, name
    schemas = (PAGES / "schemas.md").read_text()
    assert "| `login_shell` | boolean | `true` | The job script runs in a login shell" in schemas
    assert "#### `JobLimit` { #machine-joblimit }" in schemas
    machines = (PAGES / "machine-table.md").read_text()
    assert ("| `debug` | 1-2 | 01:00:00 | yes | 1 running or queued job per user (ALCF-UG "
            "running-jobs-aurora: Max 1 job running/accruing/queued per-user)") in machines
    assert "up to 10624" in machines  # the packaged aurora, not this user's
    codes = (PAGES / "exit-codes.md").read_text()
    assert "| 75 | `EXIT_CHECKPOINTED` |" in codes
    assert "| `SchedulerUnavailable` | `MmmError` | 3 |" in codes


@pytest.fixture
def copies(tmp_path) -> tuple[Path, Path]:
    """A scratch copy of the package to change, and of the reference pages to check against it."""
    scratch = tmp_path / "scratch"
    shutil.copytree(REPO / "mmm_orch", scratch / "mmm_orch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    pages = tmp_path / "reference"
    shutil.copytree(PAGES, pages)
    return scratch, pages


@pytest.mark.slow  # three runs of the generator in fresh interpreters
def test_a_changed_help_text_fails_the_check_until_the_pages_are_made_again(copies):
    scratch, pages = copies
    commands = scratch / "mmm_orch" / "cli" / "job_cmds.py"
    old = "then stream the log until the job ends; exit with the job's exit code"
    assert old in commands.read_text()
    commands.write_text(commands.read_text().replace(old, "then stream the log (changed)"))

    stale = check(pages, scratch, "--check")
    assert stale.returncode == 1
    assert stale.stderr.strip() == (f"out of date with the code: {pages / 'cli.md'}; regenerate "
                                    "with `python -m mmm_orch.reference docs/reference`")
    assert check(pages, scratch).returncode == 0
    assert "then stream the log (changed)" in (pages / "cli.md").read_text()
    assert check(pages, scratch, "--check").returncode == 0


def test_a_changed_docstring_or_field_comment_fails_the_check(copies):
    scratch, pages = copies
    api = scratch / "mmm_orch" / "api" / "handles.py"
    api.write_text(api.read_text().replace("The log as it is written", "The log (changed)"))
    queues = scratch / "mmm_orch" / "config" / "queues.py"
    queues.write_text(queues.read_text().replace(
        "    # Needs an allocation or request first; never picked automatically.",
        "    # Asked for first (changed)."))

    stale = check(pages, scratch, "--check")
    assert stale.returncode == 1
    assert f"{pages / 'python.md'}, {pages / 'schemas.md'};" in stale.stderr
    assert check(pages, scratch).returncode == 0
    assert "The log (changed)" in (pages / "python.md").read_text()
    assert "| `by_request` | boolean | `false` | Asked for first (changed). |" in (
        pages / "schemas.md").read_text()


# Where each section of the README as it was (1,600 lines, before the site) now lives.
MOVED = {
    "getting-started.md": ["Fresh machine: two commands", "First time on a facility"],
    "reference/commands.md": ["Commands", "From Python", "Exit codes", "Safe to interrupt"],
    "guides/jobs.md": ["Jobs: submit, status, logs, cancel", "When the job database breaks"],
    "guides/allocation.md": ["Inside an allocation: launch"],
    "guides/long-runs.md": ["Long runs: across walltimes"],
    "guides/node-failures.md": ["Node failures: spare nodes"],
    "guides/studies.md": ["Scaling studies: sweep, report, plot"],
    "guides/profiling.md": ["Where the time goes"],
    "guides/packing.md": ["Many runs in one allocation"],
    "guides/costs.md": ["What runs cost"],
    "guides/queue-rules.md": ["Queue rules"],
    "guides/laptop.md": ["From a laptop: submitting over SSH"],
    "guides/failures.md": ["Startup time, failures and hangs"],
    "development/test-schedulers.md": ["The test schedulers", "Slurm", "PBS Pro (OpenPBS)"],
    "reference/machines.md": ["Machines", "Workloads", "Your own code"],
    "guides/training.md": ["Trainers", "Pipeline parallel", "Context parallel"],
    "guides/data.md": ["Training on your data"],
    "guides/pretrained.md": ["Starting from pretrained weights", "Handing a model on"],
    "guides/memory.md": ["Memory per device, before the queue"],
    "concepts/scripts.md": ["Reviewing a script", "Quoting", "What is refused, and why"],
    "development/adding-a-machine.md": ["Adding or overriding a machine"],
    "development/performance-and-layout.md": ["Performance", "Layout"],
}


def test_the_readme_is_short_and_starts_with_the_two_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    blocks = re.findall(r"^    (\S.*)$", readme, re.M)
    assert blocks[1:3] == ["bash scripts/setup.sh && .venv/bin/mmm-orch submit local fsdp --follow",
                           "bash scripts/test.sh"], blocks[:3]


def test_every_former_readme_section_is_a_heading_of_a_page_the_readme_links():
    readme = (REPO / "README.md").read_text()
    for page, headings in MOVED.items():
        text = (REPO / "docs" / page).read_text()
        for heading in headings:
            assert re.search(rf"^#{{1,3}} {re.escape(heading)}$", text, re.M), (page, heading)
        assert f"(docs/{page})" in readme, page


def _sections(page: Path) -> set[str]:
    """The anchors of a page's headings, as the site's table of contents names them."""
    headings = re.findall(r"^#{1,6} (.*?)(?: \{ #\S+ \})?$", page.read_text(), re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in headings}


def test_each_command_s_help_ends_with_its_page_in_the_manual(cli):
    from mmm_orch.cli import build_parser
    from mmm_orch.cli.manual import commands

    options = _sections(PAGES / "cli.md")
    named = 0
    for name, parser, _ in commands(build_parser()):
        text = " ".join(parser.format_help().split())
        found = re.search(r"The manual: docs/(\S+); every option: docs/reference/cli\.md#(\S+)\.$",
                          text)
        assert found, (name, text[-200:])
        page, _, section = found.group(1).partition("#")
        assert (REPO / "docs" / page).is_file(), (name, page)
        assert not section or section in _sections(REPO / "docs" / page), (name, section)
        assert found.group(2) in options, (name, found.group(2))
        named += 1
    assert named >= 30
    shown = cli("submit", "--help")  # as a user sees it
    assert shown.code == 0
    assert " ".join(shown.out.split()).endswith(
        "The manual: docs/guides/jobs.md; every option: docs/reference/cli.md#submit.")
