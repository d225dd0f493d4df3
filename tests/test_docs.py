"""The manual: a short README whose first commands are the two a fresh machine needs, and whose
former sections each live on a page of the site; the generated command-line reference
(docs/reference/cli.md) is the parser's: the page in the repository is what the parser makes
today, and an option whose help changes in a scratch copy of the package makes the check fail
until the page is made again. (scripts/test.sh builds the site with --strict.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reference" / "cli.md"


def check(page: Path, package_root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmm_orch.cli.reference", str(page), *extra],
                          capture_output=True, text=True, timeout=120, cwd=package_root,
                          env={**os.environ, "PYTHONPATH": str(package_root)})


def test_the_reference_page_is_the_parser_s_today():
    found = check(PAGE, REPO, "--check")
    assert found.returncode == 0, found.stderr
    text = PAGE.read_text()
    for command in ("submit", "sweep", "launch", "profile", "export", "db recover"):
        assert f"## `{command}`" in text, command
    assert "| `-N NODES`, `--nodes NODES` |" in text


def test_a_changed_help_text_fails_the_check_until_the_page_is_made_again(tmp_path):
    scratch = tmp_path / "scratch"
    shutil.copytree(REPO / "mmm_orch", scratch / "mmm_orch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    page = tmp_path / "cli.md"
    shutil.copy(PAGE, page)
    commands = scratch / "mmm_orch" / "cli" / "job_cmds.py"
    old = "then stream the log until the job ends; exit with the job's exit code"
    assert old in commands.read_text()
    commands.write_text(commands.read_text().replace(old, "then stream the log (changed)"))

    stale = check(page, scratch, "--check")
    assert stale.returncode == 1
    assert "is out of date with the parser: regenerate it with" in stale.stderr
    assert check(page, scratch).returncode == 0
    assert "then stream the log (changed)" in page.read_text()
    assert check(page, scratch, "--check").returncode == 0


# Where each section of the README as it was (1,600 lines, before the site) now lives.
MOVED = {
    "getting-started.md": ["Fresh machine: two commands", "First time on a facility"],
    "reference/commands.md": ["Commands", "From Python", "Exit codes", "Safe to interrupt"],
    "guides/jobs.md": ["Jobs: submit, status, logs, cancel", "When the job database breaks"],
    "guides/allocation.md": ["Inside an allocation: launch"],
    "guides/long-runs.md": ["Long runs: across walltimes"],
    "guides/node-failures.md": ["Node failures: spare nodes"],
    "guides/studies.md": ["Scaling studies: sweep, report, plot", "Where the time goes",
                          "Many runs in one allocation"],
    "guides/costs.md": ["What runs cost"],
    "guides/queue-rules.md": ["Queue rules"],
    "guides/laptop.md": ["From a laptop: submitting over SSH"],
    "guides/failures.md": ["Startup time, failures and hangs"],
    "development/test-schedulers.md": ["The test schedulers", "Slurm", "PBS Pro (OpenPBS)"],
    "reference/machines.md": ["Machines", "Workloads", "Your own code"],
    "guides/training.md": ["Trainers", "Training on your data", "Starting from pretrained weights",
                           "Handing a model on", "Memory per device, before the queue",
                           "Pipeline parallel", "Context parallel"],
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
