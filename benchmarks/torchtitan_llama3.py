"""torchtitan's side of trainers_gpu.py: a train spec `llama3_bench` that is torchtitan's own
llama3 spec with one flavor, "8B_bench" (Llama 3 8B's dimensions cut to MMM_BENCH_LAYERS layers),
and synthetic tokens instead of a tokenizer and dataset, as our side uses (the GPU machine has no
network, and the token ids do not change the arithmetic).

Loaded with `--experimental.custom_import torchtitan_llama3 --model.name llama3_bench`; written
against torchtitan 0.2.2, the release that runs on torch 2.11.
"""

import os

import torch
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.models import llama3
from torchtitan.models.llama3 import TransformerModelArgs
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec


class SyntheticTokens(IterableDataset):
    """Endless uniform random token ids: (input, labels) one token apart."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            tokens = torch.randint(self.vocab_size, (self.seq_len + 1,), generator=generator)
            yield {"input": tokens[:-1]}, tokens[1:]


def build_synthetic_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite=True):
    return ParallelAwareDataloader(
        SyntheticTokens(BENCH_ARGS.vocab_size, job_config.training.seq_len, seed=dp_rank),
        dp_rank=dp_rank, dp_world_size=dp_world_size,
        batch_size=job_config.training.local_batch_size)


# Llama 3 8B as torchtitan's llama3_args["8B"] defines it, with fewer layers.
BENCH_ARGS = TransformerModelArgs(dim=4096, n_layers=int(os.environ.get("MMM_BENCH_LAYERS", "8")),
                                  n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
                                  multiple_of=1024, rope_theta=500000)

_llama3 = llama3.get_train_spec()
register_train_spec("llama3_bench", TrainSpec(
    model_cls=_llama3.model_cls, model_args={"8B_bench": BENCH_ARGS},
    parallelize_fn=_llama3.parallelize_fn, pipelining_fn=_llama3.pipelining_fn,
    build_optimizers_fn=_llama3.build_optimizers_fn,
    build_lr_schedulers_fn=_llama3.build_lr_schedulers_fn,
    build_dataloader_fn=build_synthetic_dataloader, build_tokenizer_fn=None,
    build_loss_fn=_llama3.build_loss_fn))
