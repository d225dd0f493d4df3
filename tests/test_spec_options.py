"""Each workload spec's options are its trainer's: every option a spec declares (its own and the
run options it takes) is a field of the trainer's Config with the same type, choices, default,
bounds and pattern, and every field of the Config is an option of the spec. A spec that extends
another may give an option a default of its own (its preset's); the differences kept on purpose
are named below, each with why."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml

import mmm_orch
from mmm_orch.config import registry
from mmm_orch.paths import search_dirs
from mmm_orch.options.run import described

WITH_TRAINERS = [n for n in registry.names("workloads") if registry.load_workload(n).trainer]

# (trainer, option, rule): why the spec says otherwise than the trainer's Config.
KEPT_APART = {
    ("mmm_orch.trainers.llama3", "ac", "choices"): "the trainer still reads `selective`, "
    "every_other's old name, from scripts written before the rename; a spec offers the new",
    ("mmm_orch.trainers.llama3", "global_batch", "le"): "planning/memory.py refuses a larger "
    "one before the queue, in its own words (limits.MAX_GLOBAL_BATCH)",
    ("mmm_orch.trainers.tokenize", "val_fraction", "ge"): "the program checks the fraction "
    "itself, in its own words (trainers/tokenize.py, _checked)",
    ("mmm_orch.trainers.tokenize", "val_fraction", "le"): "as ge",
}
# (trainer, option): a field of the Config that no spec offers, and why.
LEFT_OUT: dict[tuple[str, str], str] = {}


def _own_options(workload: str) -> set[str]:
    """The options a spec that extends another lists itself: those whose defaults are its own."""
    path = next(d / f"{workload}.yaml" for d in search_dirs("workloads")
                if (d / f"{workload}.yaml").is_file())
    data = yaml.safe_load(path.read_text())
    return set(data.get("options") or ()) if data.get("extends") else set()


def differences(workload: str) -> list[str]:
    """What the spec declares that its trainer's Config does not, one line each."""
    spec = registry.load_workload(workload)
    config = importlib.import_module(spec.trainer).Config
    trainer = described(config)
    found = [f"{name}: not an option of {spec.trainer}" for name in spec.options
             if name not in trainer]
    found += [f"{name}: an option of {spec.trainer} the spec leaves out" for name in trainer
              if name not in spec.options and (spec.trainer, name) not in LEFT_OUT]
    presets = _own_options(workload)
    for name, option in spec.options.items():
        if name not in trainer:
            continue
        declared = dataclasses.asdict(option)
        expected = {"choices": [], "pattern": "", **trainer[name]}
        rules = ["type", "choices", "ge", "gt", "le", "pattern"]
        # None: the trainer's own default (a spec says so where the default is the trainer's
        # to work out, as a size --tiny changes).
        if declared["default"] is not None and name not in presets:
            rules.append("default")
        for rule in rules:
            if (spec.trainer, name, rule) in KEPT_APART:
                continue
            if declared[rule] != expected.get(rule):
                found.append(f"{name}: the spec's {rule} is {declared[rule]!r}, "
                             f"{spec.trainer}'s {expected.get(rule)!r}")
    return found


@pytest.mark.parametrize("workload", WITH_TRAINERS)
def test_a_specs_options_are_its_trainers(workload):
    assert differences(workload) == []


def test_every_trainer_is_held_to_its_spec():
    assert {"fsdp", "fsdp_tp", "vit", "llama3_debug", "dist_check", "tokenize"} <= set(
        WITH_TRAINERS)
    trainers = {registry.load_workload(n).trainer for n in WITH_TRAINERS}
    assert {key[0] for key in KEPT_APART} <= trainers


def test_a_spec_that_differs_from_its_trainer_is_caught(isolated):
    """A copy of fsdp's spec with an option's default, another's type and a third's bound
    changed, an option the trainer lacks, and one of the trainer's left out."""
    data = yaml.safe_load((Path(mmm_orch.__file__).parent / "workloads" / "fsdp.yaml")
                          .read_text())
    data["name"] = "broken_fsdp"
    options = data["options"]
    options["epochs"]["default"] = 11
    options["train_samples"]["type"] = "float"
    options["gamma"]["le"] = 2
    options["momentum"] = {"type": "float", "default": 0.9}
    del options["test_batch_size"]
    folder = isolated / ".mmm-orch" / "workloads"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "broken_fsdp.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert sorted(differences("broken_fsdp")) == [
        "epochs: the spec's default is 11, mmm_orch.trainers.fsdp's 10",
        "gamma: the spec's le is 2.0, mmm_orch.trainers.fsdp's 1",
        "momentum: not an option of mmm_orch.trainers.fsdp",
        "test_batch_size: an option of mmm_orch.trainers.fsdp the spec leaves out",
        "train_samples: the spec's type is 'float', mmm_orch.trainers.fsdp's 'int'",
    ]
