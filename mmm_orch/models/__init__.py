"""The registry of models, a folder here for each (torchtitan's layout), found by its name.

A folder's __init__.py gives MODEL (spec.Model): its presets and shapes with their parameter
count, the memory rule a plan is sized by, and the map of its parameters to a pretrained
checkpoint's. Its torch module (model.py) sits beside them, imported only by a trainer: the
registry and every MODEL stay free of torch. The registry imports the ground modules alone, so
config/ (a spec's resources.memory_model), planning/, pretrained/ and the trainers all read a
model by its name. Adding one: docs/development/adding-a-model.md.
"""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path

from mmm_orch.errors import UnknownName
from mmm_orch.models.spec import Model


@functools.cache
def registered() -> dict[str, Model]:
    """Every model, by name: each folder here (a package) and its MODEL."""
    found = {}
    here = Path(__file__).parent
    for name in sorted(os.listdir(here)):  # (pkgutil would cost every plan ~0.5 ms to import)
        if (here / name / "__init__.py").is_file():
            model = importlib.import_module(f"{__name__}.{name}").MODEL
            assert model.name == name, f"models/{name}: MODEL.name is {model.name!r}"
            found[name] = model
    return found


def names() -> list[str]:
    """The registered models' names, sorted."""
    return list(registered())


def get(name: str, field: str = "model") -> Model:
    """The model `name`; UnknownName (one line: `field`, the value and the names allowed)
    where no folder has it."""
    model = registered().get(name) if isinstance(name, str) else None
    if model is None:
        raise UnknownName(field, name, "a registered model: one of " + ", ".join(names()))
    return model
