"""Llama 3 (and 3.1): RMSNorm, rotary embeddings, grouped-query attention, SwiGLU. Its shapes
and presets (args.py), its memory rule (memory.py), its names in Hugging Face's and Meta's
checkpoints (checkpoint.py); the torch module (model.py) is the trainer's alone
(trainers/llama3.py)."""

from __future__ import annotations

from mmm_orch.models.llama3 import memory
from mmm_orch.models.llama3.args import PRESETS, run_model
from mmm_orch.models.spec import Model

MODEL = Model(
    name="llama3",
    presets=PRESETS,
    build=run_model,
    memory=memory.estimate,
    checkpoint_map="checkpoint",  # checkpoint.py
)
