"""A torchtitan config (for `torchtitan.train --module torchtitan_llama3 --config llama3_8b_bench`)
with the same shape, batch and sequence length as our llama3 run in trainers_gpu.py.

Written against torchtitan 0.3.0 (config registries of `Trainer.Config`). torchtitan calls the
function without arguments, so the shape comes from MMM_BENCH_* variables that trainers_gpu.py sets.
"""

import os

from torchtitan.config import CompileConfig
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.llama3.config_registry import llama3_8b


def llama3_8b_bench():
    config = llama3_8b()
    layers = int(os.environ["MMM_BENCH_LAYERS"])
    config.model_spec.model.layers = config.model_spec.model.layers[:layers]
    config.training.local_batch_size = int(os.environ["MMM_BENCH_BATCH"])
    config.training.seq_len = int(os.environ["MMM_BENCH_SEQ_LEN"])
    config.training.steps = int(os.environ["MMM_BENCH_STEPS"])
    config.compile = CompileConfig(enable=True, components=["model", "loss"])
    # The repo's bundled test tokenizer and c4 sample: no download, so the GPU host needs no network.
    config.hf_assets_path = "./tests/assets/tokenizer"
    config.dataloader = HuggingFaceTextDataLoader.Config(dataset="c4_test")
    config.profiler.enable_profiling = False
    config.metrics.enable_tensorboard = False
    config.metrics.log_freq = 1
    config.checkpoint.enable = False
    config.validator.enable = False
    return config
