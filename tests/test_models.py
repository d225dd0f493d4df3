"""The registry of models (mmm_orch/models/): a model found by its name, a wrong name refused
with the registered ones, in the registry as in a spec, every model's presets built and sized,
no torch on the way to any model, and the page on adding a model (docs/development/adding-a-model.md) run as written, its folder put
in a copy of the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from helpers.manual import blocks

from mmm_orch import models
from mmm_orch.errors import UnknownName
from mmm_orch.models.spec import Shape

PAGE = REPO / "docs" / "development" / "adding-a-model.md"


def test_a_model_is_found_by_its_name_and_a_wrong_one_names_the_registered():
    assert models.get("llama3").name == "llama3"
    with pytest.raises(UnknownName) as refused:
        models.get("llama4", "memory_model")
    assert str(refused.value) == (
        "memory_model 'llama4' is invalid: a registered model: one of " + ", ".join(models.names())
    )


def test_every_model_builds_each_preset_and_sizes_it():
    for model in models.registered().values():
        for name, preset in model.presets.items():
            built, args = model.build(name, False, None, None, None)
            assert built == preset and args.n_layers > 0 and args.n_heads > 0
            shape = Shape(
                args,
                batch=preset.batch_size,
                seq=preset.seq_len,
                dp=1,
                tp=1,
                ac=preset.ac,
                value_bytes=2,
                loss_chunk=1024,
            )
            assert model.memory(shape).total > 0, (model.name, name)


def test_a_spec_naming_an_unregistered_model_is_refused_with_the_names(cli, isolated):
    (isolated / ".mmm-orch" / "workloads").mkdir(parents=True)
    (isolated / ".mmm-orch" / "workloads" / "w.yaml").write_text(
        "name: w\ntrainer: mypkg.train\nresources:\n  memory_model: qwen3\n"
    )
    result = cli("render", "local", "w")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert (
        f"resources.memory_model: Value error, not a registered model: one of "
        f"{', '.join(models.names())} (or '') (got 'qwen3')"
    ) in result.err


def test_the_registry_and_every_model_import_no_torch():
    code = (
        "import sys; from mmm_orch import models; models.registered();"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_adding_a_model(isolated, tmp_path):
    folder, spec, commands, header, refusal = blocks(PAGE, comments=True)[:5]
    assert folder[0] == "# mmm_orch/models/toy_moe/__init__.py"
    assert spec[0] == "# ./.mmm-orch/workloads/toy_moe.yaml"
    site = tmp_path / "site"  # the checkout's package, not this repository's
    shutil.copytree(
        REPO / "mmm_orch", site / "mmm_orch", ignore=shutil.ignore_patterns("__pycache__")
    )
    init = site / folder[0].removeprefix("# ")
    init.parent.mkdir()
    init.write_text("\n".join(folder[1:]) + "\n")
    (isolated / ".mmm-orch" / "workloads").mkdir(parents=True)
    (isolated / ".mmm-orch" / "workloads" / "toy_moe.yaml").write_text("\n".join(spec) + "\n")
    assert commands == [
        "mmm-orch submit polaris toy_moe -A MYPROJ --dry-run",
        "mmm-orch submit polaris toy_moe -A MYPROJ --set batch_size=64 --dry-run",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }

    def run(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", line], cwd=isolated, env=env, capture_output=True, text=True, timeout=120
        )

    review = run(commands[0])
    assert review.returncode == 0, review.stderr
    said = [line for line in review.stdout.splitlines() if line.startswith("# Memory per device")]
    assert said == header, review.stdout[:3000]
    refused = run(commands[1])
    assert (refused.returncode, refused.stderr.strip()) == (2, refusal[0])
