"""The validated-config cache: used only when nothing changed, never stale."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

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
    from mmm_orch.config import registry

    for name in registry.names("machines"):
        assert registry.load_machine(name) == registry.load_machine(name)
    first = registry.load_workload("llama3_70b")
    second = registry.load_workload("llama3_70b")
    assert first == second and first is not second
