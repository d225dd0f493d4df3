"""The page on adding a scheduler, run as written: its Flux folder is written into a copy of the
installed package (the repository's stays as it is), where the registry finds it; the kind is then
registered, a profile of it validated and reviewed (`submit --dry-run`: its directives, and the
job id every kind's script asks), and its parsers read the outputs Flux's documentation records
(the page's doctest). Flux's own commands are not run: Flux is not installed here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from helpers.manual import blocks

import mmm_orch

PAGE = REPO / "docs" / "development" / "adding-a-scheduler.md"
FOLDER = "mmm_orch/schedulers/flux/"


def page_parts() -> dict[str, list[str]]:
    """The page's blocks by what they are: each file of the folder by its path, the template,
    the profile, the commands and the doctest."""
    parts: dict[str, list[str]] = {}
    for block in blocks(PAGE, comments=True):
        first = block[0]
        if first.startswith(f"# {FOLDER}"):
            parts[first.removeprefix("# ")] = block
        elif first.startswith("#!/bin/bash"):
            parts[f"{FOLDER}flux.sh.j2"] = block
        elif first.startswith("# ./.mmm-orch/machines/"):
            parts["profile"] = block
        elif first.startswith(">>> "):
            parts["doctest"] = block
        else:
            parts["commands"] = block
    return parts


def test_the_page_has_the_blocks_this_test_runs():
    parts = page_parts()
    assert sorted(parts) == sorted([f"{FOLDER}__init__.py", f"{FOLDER}parse.py",
                                    f"{FOLDER}scheduler.py", f"{FOLDER}flux.sh.j2", "profile",
                                    "commands", "doctest"])
    assert parts["commands"] == ["mmm-orch machines", "mmm-orch submit myflux fsdp --dry-run"]


@pytest.mark.slow
def test_adding_a_scheduler(isolated, tmp_path):
    parts = page_parts()
    package = tmp_path / "package"
    shutil.copytree(Path(mmm_orch.__file__).parent, package / "mmm_orch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name, block in parts.items():
        if name.startswith(FOLDER):
            path = package / name
            path.parent.mkdir(exist_ok=True)
            path.write_text("\n".join(block) + "\n")
    profile = isolated / ".mmm-orch" / "machines" / "myflux.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text("\n".join(parts["profile"]) + "\n")
    bin_dir = Path(sys.prefix) / "bin"  # the installed `mmm-orch`, importing from PYTHONPATH first
    env = {**os.environ, "PYTHONPATH": str(package),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def run(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", line], cwd=isolated, env=env, capture_output=True,
                              text=True, timeout=300)

    # Without the folder (the repository's own package), the profile is refused as the page says.
    refused = subprocess.run([sys.executable, "-m", "mmm_orch", "submit", "myflux", "fsdp",
                              "--dry-run"], cwd=isolated, capture_output=True, text=True)
    said = re.search(r"\(before the folder existed, `([^`]*)`, exit 2\)", PAGE.read_text())
    assert refused.returncode == 2 and said and " ".join(said[1].split()) in refused.stderr

    listed, review = (run(line) for line in parts["commands"])
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^│ myflux .*│ flux ", listed.stdout, re.M), listed.stdout
    assert review.returncode == 0, review.stderr
    script = review.stdout
    for directive in ("--job-name=fsdp", "--queue=batch", "--time-limit=1800s", "--nodes=1",
                      "--exclusive"):
        assert f"# flux: {directive}\n" in script
    assert script.startswith("#!/bin/bash")
    assert "job=${FLUX_JOB_ID:-${PBS_JOBID:-${SLURM_JOB_ID:-local}}}" in script

    doctest = tmp_path / "parsers.txt"
    doctest.write_text("\n".join(parts["doctest"]) + "\n")
    read = run(f"{sys.executable} -m doctest {doctest}")
    assert read.returncode == 0, read.stdout + read.stderr
