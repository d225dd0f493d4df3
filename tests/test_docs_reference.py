"""The generated command-line reference (docs/reference/cli.md) is the parser's: the page in the
repository is what the parser makes today, and an option whose help changes in a scratch copy of
the package makes the check fail until the page is made again."""

from __future__ import annotations

import os
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
