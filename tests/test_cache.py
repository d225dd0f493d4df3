"""The validated-config cache: used only when nothing changed, never stale."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO

PROBE = (
    "import sys\n"
    "from mmm_orch.cli import main\n"
    "sys.stdout = open('/dev/null', 'w')\n"
    "code = main(['render', 'polaris', 'fsdp', '-A', 'P'])\n"
    "sys.stdout = sys.__stdout__\n"
    "print(code, 'pydantic' in sys.modules, 'yaml' in sys.modules)\n"
)


def probe(cwd) -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.slow
def test_second_render_skips_validation_libraries(isolated):
    assert probe(isolated) == "0 True True"  # first run validates and fills the cache
    assert probe(isolated) == "0 False False"  # then neither pydantic nor yaml is imported


def test_an_edited_profile_is_revalidated(cli, isolated):
    user = isolated / ".mmm-orch" / "machines"
    user.mkdir(parents=True)
    text = (REPO / "machines" / "polaris.yaml").read_text()
    (user / "polaris.yaml").write_text(text)
    assert "#PBS -l filesystems=home:eagle" in cli("render", "polaris", "fsdp", "-A", "P").out
    (user / "polaris.yaml").write_text(text.replace("filesystems=home:eagle", "filesystems=home:grand:eagle"))
    assert "#PBS -l filesystems=home:grand:eagle" in cli("render", "polaris", "fsdp", "-A", "P").out
    (user / "polaris.yaml").write_text(text.replace("  gpus: 4 ", "  gpus: four "))
    broken = cli("render", "polaris", "fsdp", "-A", "P")
    assert broken.code == 2 and "node.gpus" in broken.err


def test_a_new_file_on_the_search_path_invalidates_extends(cli, isolated):
    user = isolated / ".mmm-orch" / "machines"
    user.mkdir(parents=True)
    (user / "mine.yaml").write_text("extends: local\n")
    assert "--nproc-per-node=2" in cli("render", "mine", "fsdp").out
    (user / "local.yaml").write_text("extends: local\nranks_per_node: 1\n")
    assert "--nproc-per-node=1" in cli("render", "mine", "fsdp").out


def test_a_base_file_edit_invalidates_files_that_extend_it(cli, isolated):
    user = isolated / ".mmm-orch" / "machines"
    user.mkdir(parents=True)
    (user / "base.yaml").write_text("extends: local\nranks_per_node: 2\n")
    (user / "child.yaml").write_text("extends: base\n")
    assert "--nproc-per-node=2" in cli("render", "child", "fsdp").out
    (user / "base.yaml").write_text("extends: local\nranks_per_node: 3\n")
    assert "--nproc-per-node=3" in cli("render", "child", "fsdp").out


def test_cached_and_fresh_objects_are_equal(isolated):
    from mmm_orch.config import cache, registry

    cache._memo.clear()  # what earlier tests in this process read
    for name in registry.names("machines"):
        assert registry.load_machine(name) == registry.load_machine(name)
    cache._memo.clear()
    first = registry.load_workload("llama3_70b")  # validated (this test's cache is empty)
    second = registry.load_workload("llama3_70b")  # from the disk cache
    assert first == second and first is not second
    assert registry.load_workload("llama3_70b") is second  # kept in the process


def test_a_profile_changed_in_the_same_clock_tick_is_read_again(cli, isolated):
    """The in-process copy is trusted only for files older than RACY_S: a rewrite within the
    same tick of the file system's clock leaves mtime, size and inode as they were."""
    from mmm_orch.config import registry

    user = isolated / ".mmm-orch" / "machines"
    user.mkdir(parents=True)
    path = user / "mine.yaml"
    path.write_text("extends: local\nname: mine\nranks_per_node: 2\n")
    stamp = path.stat().st_mtime_ns
    assert registry.load_machine("mine").ranks_per_node == 2
    assert registry.load_machine("mine").ranks_per_node == 2
    path.write_text("extends: local\nname: mine\nranks_per_node: 3\n")
    os.utime(path, ns=(stamp, stamp))  # the same stat as before
    assert registry.load_machine("mine").ranks_per_node == 3
