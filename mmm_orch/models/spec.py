"""What a model's folder gives the registry (Model, its MODEL), and what its memory rule is given
(Shape: the model and how a step lays it out over the ranks) and gives back (Estimate). Plain
data, no torch: the planner sizes a plan with it before the queue."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Protocol, cast

from mmm_orch.dataclass_code import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Preset:
    """A named configuration (`--config`): the model's shape and the run's defaults for it."""

    model: Any  # the model's own args
    batch_size: int
    seq_len: int
    lr: float
    ac: str  # activation checkpointing: none, every_other, full


@dataclass(frozen=True)
class Shape:
    """What sizes a step: the model, the micro-batch and the parallel layout."""

    # The model's own args: the planner reads its n_layers (a pipeline splits them) and n_heads
    # (tensor parallel splits them), its memory rule the rest.
    model: Any
    batch: int
    seq: int
    dp: int
    tp: int
    ac: str  # none, every_other, full
    value_bytes: int  # 2 (bf16) or 4 (fp32)
    loss_chunk: int  # tokens of a sequence whose logits exist at once (0: all)
    # Under TP the logits are sharded over the vocabulary (loss_parallel); before that fix the
    # trainer replicated them: False sizes that older trainer.
    loss_sharded: bool = True
    # The math attention kernel saves each head's s x s probabilities (fused kernels do not).
    attention_matrix: bool = False
    pp: int = 1  # pipeline stages
    cp: int = 1  # context-parallel ranks a sequence is split over
    schedule: str = "1f1b"
    microbatches: int = 1  # a step's, on each data-parallel rank

    @property
    def in_flight(self) -> float:
        """Micro-batches whose activations the busiest stage holds at once: GPipe all of a
        step's, 1F1B at most pp, interleaved 1F1B pp (1 + (pp - 1) / 2pp) (Narayanan et al.
        2021)."""
        if self.pp == 1:
            return 1
        if self.schedule == "gpipe":
            return self.microbatches
        held = min(self.pp, self.microbatches)
        return (
            held * (1 + (self.pp - 1) / (2 * self.pp)) if "interleaved" in self.schedule else held
        )


@dataclass(frozen=True)
class Estimate:
    """A step's peak memory per device, in bytes, by what holds them."""

    parts: dict[str, float] = field(hash=False)

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB ("
            + ", ".join(f"{name} {value / GIB:.1f}" for name, value in self.parts.items())
            + ")"
        )


class CheckpointMap(Protocol):
    """How a model is written in pretrained checkpoints (pretrained/ reads and writes the files
    with it): its configuration's fields in Hugging Face's config.json and Meta's params.json,
    its parameters' names, shapes and layouts there. A module of the model's folder is one.
    Each reader raises pretrained_config.PretrainedError, one line naming the file and field."""

    def hf_declared(self, config: dict[str, Any], file: Path) -> dict[str, tuple[str, Any]]:
        """What config.json declares: our field -> (its name there, its value)."""
        ...

    def meta_declared(self, params: dict[str, Any], file: Path) -> dict[str, tuple[str, Any]]:
        """What params.json declares, in the same terms."""
        ...

    def our_values(self, args: Any) -> dict[str, Any]:
        """The run's model in those terms: what a checkpoint's declarations must equal."""
        ...

    def show(self, value: Any) -> str:
        """A declared value as an error message says it."""
        ...

    def shapes(self, args: Any) -> dict[str, tuple[int, ...]]:
        """Every parameter of the trainer's model by name, in the model's order."""
        ...

    def hf_name(self, name: str) -> str:
        """The Hugging Face name of the trainer's parameter `name`."""
        ...

    def rotated_heads(self, name: str, args: Any) -> int:
        """The heads whose rows Hugging Face stores in rotate-half order (0: none)."""
        ...

    def meta_split(self, name: str) -> int | None:
        """The dimension Meta's model-parallel files split `name` along (None: whole)."""
        ...

    def hf_config(self, args: Any) -> dict[str, Any]:
        """config.json's fields for the model (export adds the dtype and the token ids)."""
        ...

    def saved_args(self, saved: dict[str, Any], file: Path) -> Any:
        """The args the trainer saved beside a checkpoint (train.json's "model"), each field
        checked."""
        ...


@dataclass(frozen=True)
class Model:
    """A model of the registry: what the planner, pretrained/ and the trainers read of it by
    its name. Its torch module (the folder's model.py) is not here: only a trainer imports it."""

    name: str  # its folder's; a spec's resources.memory_model
    presets: Mapping[str, Preset]  # by --config name
    # The preset a run starts from and the model it builds, from the run's shape options
    # (config: a preset's name, None its default; tiny; n_layers, vocab_size, seq_len: the
    # preset's where None); InvalidValue for a preset it does not have.
    build: Callable[[str | None, bool, int | None, int | None, int | None], tuple[Preset, Any]]
    memory: Callable[[Shape], Estimate]  # its peak memory per device in a step
    # The module of its folder holding its CheckpointMap ("checkpoint" for checkpoint.py),
    # imported when a checkpoint is read or written, not when a plan is made; "": no pretrained
    # weights in or out.
    checkpoint_map: str = ""

    @property
    def checkpoint(self) -> CheckpointMap | None:
        """Its checkpoint map (the module checkpoint_map names), or None where it has none."""
        if not self.checkpoint_map:
            return None
        module = importlib.import_module(f"mmm_orch.models.{self.name}.{self.checkpoint_map}")
        return cast(CheckpointMap, module)
