"""Machine profiles and workload specs: loading, errors with file:line:key, overrides, schema."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from helpers.profiles import facility_profiles
from mmm_orch.config import registry
from mmm_orch.config.machine import check_cpu_bind
from mmm_orch.errors import ConfigError


def user_dir(root: Path, kind: str) -> Path:
    path = root / ".mmm-orch" / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_packaged_profiles_and_specs_all_validate():
    assert registry.names("machines") == ["aurora", "frontier", "local", "pbs-local", "perlmutter",
                                        "polaris", "slurm-local"]
    for name in registry.names("machines"):
        assert registry.load_machine(name).name == name
    for name in registry.names("workloads"):
        trainer = registry.load_workload(name).trainer
        assert trainer.startswith("mmm_orch.trainers.") or (name, trainer) == ("command", "")


def test_list_commands_json(cli):
    machines = json.loads(cli("machines", "--json").out)
    aurora = next(m for m in machines if m["name"] == "aurora")
    assert aurora == {"name": "aurora", "facility": "ALCF", "scheduler": "pbs", "max_nodes": 10624,
                      "gpus_per_node": 12, "device": "xpu",
                      "queues": ["debug", "debug-scaling", "prod", "capacity", "visualization"]}
    workloads = {w["name"]: w for w in json.loads(cli("workloads", "--json").out)}
    assert workloads["llama3_8b"]["default_nodes"] == 4
    assert workloads["fsdp_tp"]["parallelism"] == "FSDP2 x TP (tp=2)"
    table = cli("machines").out
    assert "perlmutter" in table and "slurm" in table


def test_show_machine_and_workload(cli):
    shown = cli("show", "machine", "aurora")
    assert shown.code == 0 and "CCL_KVS_MODE: mpi" in shown.out
    data = json.loads(cli("show", "workload", "llama3_70b", "--json").out)
    assert data["machines"]["aurora"]["args"] == {"tp": 4}
    assert data["defaults"]["walltime"] == "01:00:00"
    assert cli("show", "machine", "nope").code == 2


@pytest.mark.parametrize("kind,model", [("machine", "Machine"), ("workload", "Workload")])
def test_schema_export(cli, kind, model):
    schema = json.loads(cli("schema", kind).out)
    assert schema["title"] == model
    assert schema["additionalProperties"] is False
    if kind == "machine":
        assert schema["$defs"]["Queue"]["properties"]["max_walltime"]["type"] == "string"


def test_yaml_syntax_error_names_file_and_line(cli, isolated):
    (user_dir(isolated, "machines") / "broken.yaml").write_text("name: broken\nscheduler: [pbs\n")
    result = cli("render", "broken", "fsdp")
    assert result.code == 2
    assert re.search(r"\.mmm-orch/machines/broken\.yaml:\d+: YAML error", result.err), result.err


def test_unknown_key_names_file_line_and_key(cli, isolated):
    text = (REPO / "machines" / "polaris.yaml").read_text()
    text = text.replace("  gpus: 4 ", "  gpus: 4\n  gpu_count: 4 ", 1)
    (user_dir(isolated, "machines") / "polaris.yaml").write_text(text)
    line = text.splitlines().index("  gpu_count: 4 " + text.split("  gpu_count: 4 ", 1)[1].split("\n")[0]) + 1
    result = cli("render", "polaris", "fsdp", "-A", "P")
    assert result.code == 2
    assert f"polaris.yaml:{line}: unknown key 'node.gpu_count'" in result.err
    assert "allowed: cores, threads_per_core" in result.err


def test_wrong_type_names_the_key(cli, isolated):
    (user_dir(isolated, "workloads") / "w.yaml").write_text(
        "name: w\ntrainer: mmm_orch.trainers.fsdp\ndefaults:\n  nodes: many\n")
    result = cli("render", "local", "w")
    assert result.code == 2
    assert "w.yaml:4: defaults.nodes: Value error, expected a whole number, not a str (got 'many')" in result.err


def test_duplicate_keys_are_errors(isolated):
    (user_dir(isolated, "workloads") / "dup.yaml").write_text(
        "name: dup\ntrainer: a.b\nenv:\n  A: '1'\n  A: '2'\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml:5: duplicate key 'env\.A'"):
        registry.load_workload("dup")


def test_unquoted_yaml_boolean_env_value_is_refused(isolated):
    text = (REPO / "machines" / "perlmutter.yaml").read_text().replace('"FALSE"', "FALSE")
    (user_dir(isolated, "machines") / "perlmutter.yaml").write_text(text)
    with pytest.raises(ConfigError, match="HDF5_USE_FILE_LOCKING.*quote the value"):
        registry.load_machine("perlmutter")


def test_user_profile_extends_and_overrides_the_packaged_one(cli, isolated):
    (user_dir(isolated, "machines") / "polaris.yaml").write_text(
        "extends: polaris\naccount: {default: DEFPROJ}\nsetup: [module load conda/2024-04-29]\n")
    result = cli("render", "polaris", "fsdp")
    assert result.code == 0, result.err
    assert "#PBS -A DEFPROJ" in result.out
    assert "module load conda/2024-04-29" in result.out
    assert "#PBS -l filesystems=home:eagle" in result.out  # inherited


def test_home_config_dir_is_searched_after_the_project_dir(cli, isolated, tmp_path):
    home = tmp_path / "config" / "mmm-orch" / "machines"
    home.mkdir(parents=True)
    (home / "mine.yaml").write_text("extends: local\nranks_per_node: 3\n")
    assert "--nproc-per-node=3" in cli("render", "mine", "fsdp").out
    (user_dir(isolated, "machines") / "mine.yaml").write_text("extends: local\nranks_per_node: 1\n")
    assert "--nproc-per-node=1" in cli("render", "mine", "fsdp").out
    assert "mine" in [m["name"] for m in json.loads(cli("machines", "--json").out)]


def test_user_template_on_the_search_path_and_by_file(cli, isolated):
    tdir = user_dir(isolated, "templates")
    (tdir / "local.sh.j2").write_text("#!/bin/bash -l\n# site header\n{% include '_body.sh.j2' %}")
    assert "# site header" in cli("render", "local", "fsdp").out
    custom = isolated / "mine.j2"
    custom.write_text("#!/bin/bash -l\necho {{ plan.layout.nodes }} {{ plan.not_a_field }}\n")
    result = cli("render", "local", "fsdp", "--template", str(custom))
    assert result.code == 2 and "not_a_field" in result.err


def test_a_template_reading_the_plan_before_its_sections_is_told_where_the_name_went(cli, isolated):
    custom = isolated / "old.j2"
    custom.write_text("#!/bin/bash -l\n#PBS -l walltime={{ plan.walltime_hms }}\n")
    result = cli("render", "local", "fsdp", "--template", str(custom))
    assert result.code == 2 and "plan.walltime_hms is plan.queue.walltime_hms" in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_cpu_bind_lists_are_checked_against_reserved_cores():
    check_cpu_bind("list:1-4:5-8", 2, {0})
    with pytest.raises(ValueError, match=r"rank 0 reserved cores \[0\]"):
        check_cpu_bind("list:0-3:4-7", 2, {0})
    with pytest.raises(ValueError, match="lists 3 ranks but the node runs 2"):
        check_cpu_bind("list:1:2:3", 2, set())
    with pytest.raises(ValueError, match="to two ranks"):
        check_cpu_bind("list:1-4:4-8", 2, set())


def test_profile_with_forbidden_directive_or_bad_placeholder_is_refused(isolated):
    machines = user_dir(isolated, "machines")
    (machines / "a1.yaml").write_text("extends: aurora\ndirectives: ['-l select={nodes}', '-V']\n")
    with pytest.raises(ConfigError, match="'-V' is forbidden on a1"):
        registry.load_machine("a1")
    (machines / "a2.yaml").write_text("extends: aurora\ndirectives: ['-l select={node}']\n")
    with pytest.raises(ConfigError, match=r"a2.yaml:2: directives\[0\]: .*unknown placeholder \{node\}"):
        registry.load_machine("a2")


SOURCE_TAG = re.compile(r"#.*(ALCF-UG|ALCF-WS|ALCF-GS|EZPZ|OLCF-UG|OLCF-AI|NERSC-[LAPT]|\[\?\])")


@pytest.mark.parametrize("machine", facility_profiles())
def test_every_environment_value_carries_a_source_comment(machine):
    """Each exported facility variable cites where it comes from (or is marked [?])."""
    lines = (REPO / "machines" / f"{machine}.yaml").read_text().splitlines()
    in_set = False
    checked = 0
    for line in lines:
        stripped = line.strip()
        if re.match(r"^\s+set:\s*$", line):
            in_set = True
            continue
        if in_set and re.match(r"^\s{6}[A-Z_][A-Z0-9_]*:", line):
            assert SOURCE_TAG.search(line), f"{machine}.yaml: no source on {stripped!r}"
            checked += 1
        elif in_set and not line.startswith("      ") and not stripped.startswith("#"):
            in_set = False
    assert checked >= 3


@pytest.mark.slow
def test_no_cli_path_imports_torch(isolated):
    code = (
        "import sys\n"
        "from mmm_orch.cli import main\n"
        "for args in (['machines'], ['workloads', '--json'], ['show', 'machine', 'frontier'],\n"
        "             ['schema', 'workload'], ['render', 'aurora', 'llama3_8b', '-A', 'X'],\n"
        "             ['submit', 'local', 'fsdp', '--dry-run'], ['render', 'nope', 'fsdp'],\n"
        "             ['render', 'local', 'llama3_debug', '--set', 'wandb=offline', '--set',\n"
        "              'tensorboard=true', '--set', 'data_path=data'],\n"
        "             ['sweep', 'slurm-local', 'fsdp', '--nodes', '1,2', '--dry-run'], ['status']):\n"
        "    main(args)\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('torch'), 'torch must be installed for this check to mean anything'\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'paramiko',\n"
        "               'matplotlib', 'wandb', 'tensorboard', 'tokenizers', 'tiktoken', 'pyarrow'))\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=isolated)
    assert "HEAVY []" in proc.stderr, proc.stderr[-2000:]


def test_version_flag(cli):
    from mmm_orch import __version__

    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"mmm-orch {__version__}"


@pytest.mark.parametrize("name", facility_profiles())
def test_profiles_name_their_scheduler_commands(name):
    machine = registry.load_machine(name)
    expected = {"pbs": ("qsub", "qstat", "qdel"), "slurm": ("sbatch", "squeue", "scancel")}
    commands = machine.scheduler.commands
    assert (commands.submit, commands.query, commands.cancel) == expected[machine.scheduler.kind]


@pytest.mark.slow
def test_non_editable_install_ships_profiles_specs_and_templates(tmp_path):
    """`pip install .` (no symlinks followed at run time) renders from an unrelated directory."""
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for kind, pattern in [("machines", "*.yaml"), ("workloads", "*.yaml"), ("templates", "*.j2")]:
        shipped = target / "mmm_orch" / kind
        assert not shipped.is_symlink() and len(list(shipped.glob(pattern))) >= 5
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", "import mmm_orch, sys; from mmm_orch.cli import main;"
         "print(mmm_orch.__file__, file=sys.stderr); sys.exit(main(['render', 'frontier', 'vit', '-A', 'P']))"],
        capture_output=True, text=True, cwd=elsewhere,
        env={**__import__("os").environ, "PYTHONPATH": str(target)})
    assert run.returncode == 0, run.stderr
    assert str(target) in run.stderr
    assert "#SBATCH --network=disable_rdzv_get" in run.stdout
