"""Llama 3 in pretrained checkpoints (pretrained/ reads and writes the files with it): its
configuration in Hugging Face's config.json and Meta's params.json, each field in LlamaArgs'
terms; its parameters' names (the trainer's are Meta's) with the map to Hugging Face's, their
shapes, the q and k rows Hugging Face stores in rotate-half order, and the dimension Meta's
model-parallel files split each along; config.json for an exported run, and the shape the
trainer saves beside each checkpoint."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from mmm_orch.errors import shown
from mmm_orch.models.llama3.args import LlamaArgs, RopeScaling
from mmm_orch.models.pretrained_config import (
    PretrainedError,
    json_object,
    positive_number,
    whole_number,
)

# Meta's ffn_dim_multiplier: 1.3 (8B), 1.5 (405B); far from these it is not a Llama's.
MAX_FFN_DIM_MULTIPLIER = 64.0


def our_values(args: LlamaArgs) -> dict[str, Any]:
    """The run's model in the terms of hf_declared and meta_declared."""
    return {
        "dim": args.dim,
        "n_layers": args.n_layers,
        "n_heads": args.n_heads,
        "n_kv_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "ffn_dim": args.ffn_dim,
        "norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": args.rope_scaling,
        "tied_embeddings": False,
    }


def show(value: Any) -> str:
    """A declared value as an error message says it."""
    if isinstance(value, RopeScaling):
        return (
            f"llama3 (factor {value.factor:g}, low/high frequency factors "
            f"{value.low_freq_factor:g}/{value.high_freq_factor:g}, original context "
            f"{value.original_context})"
        )
    return "none" if value is None else shown(value)


def hf_declared(config: dict[str, Any], file: Path) -> dict[str, tuple[str, Any]]:
    """What a Hugging Face config.json declares, in our fields. transformers 5 keeps RoPE's
    settings in rope_parameters; earlier releases, and the configs on the Hub, in rope_theta
    and rope_scaling."""
    if config.get("model_type", "llama") != "llama":
        raise PretrainedError(f"{file}: model_type {shown(config.get('model_type'))}, not 'llama'")
    for name, allowed in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if name in config and config[name] != allowed:
            raise PretrainedError(
                f"{file}: {name} is {shown(config[name])}; Llama's is {allowed!r}"
            )
    heads = whole_number(config, "num_attention_heads", file)
    dim = whole_number(config, "hidden_size", file)
    rope = json_object(config, "rope_parameters", file)
    scaling_fields = json_object(config, "rope_scaling", file) or rope
    theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
    declared = {
        "dim": ("hidden_size", dim),
        "n_layers": ("num_hidden_layers", whole_number(config, "num_hidden_layers", file)),
        "n_heads": ("num_attention_heads", heads),
        "n_kv_heads": (
            "num_key_value_heads",
            whole_number(config, "num_key_value_heads", file, heads),
        ),
        "head_dim": ("head_dim", whole_number(config, "head_dim", file, dim // heads)),
        "vocab_size": ("vocab_size", whole_number(config, "vocab_size", file)),
        "ffn_dim": ("intermediate_size", whole_number(config, "intermediate_size", file)),
        "norm_eps": ("rms_norm_eps", positive_number(config, "rms_norm_eps", file, 1e-6)),
        "rope_theta": ("rope_theta", positive_number({"rope_theta": theta}, "rope_theta", file)),
        "rope_scaling": ("rope_scaling", _hf_scaling(scaling_fields, file)),
        "tied_embeddings": ("tie_word_embeddings", bool(config.get("tie_word_embeddings"))),
    }
    return declared


def _hf_scaling(fields: dict[str, Any], file: Path) -> RopeScaling | None:
    kind = fields.get("rope_type", fields.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise PretrainedError(
            f"{file}: RoPE scaling {shown(kind)}; the trainer has Llama 3.1's ('llama3') or none"
        )
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
        if name not in fields:
            raise PretrainedError(f"{file}: rope scaling 'llama3' without a number for {name!r}")
    return RopeScaling(
        positive_number(fields, "factor", file),
        positive_number(fields, "low_freq_factor", file),
        positive_number(fields, "high_freq_factor", file),
        whole_number(fields, "original_max_position_embeddings", file),
    )


def meta_declared(params: dict[str, Any], file: Path) -> dict[str, tuple[str, Any]]:
    """What Meta's params.json declares, in our fields (the same names: Meta's are ours).
    use_scaled_rope is Llama 3.1's scaling with Meta's fixed settings."""
    heads = whole_number(params, "n_heads", file)
    multiplier = params.get("ffn_dim_multiplier")
    shaped = LlamaArgs(
        dim=whole_number(params, "dim", file),
        n_layers=whole_number(params, "n_layers", file),
        n_heads=heads,
        n_kv_heads=whole_number(params, "n_kv_heads", file, heads),
        vocab_size=whole_number(params, "vocab_size", file),
        max_seq_len=1,
        multiple_of=whole_number(params, "multiple_of", file),
        ffn_dim_multiplier=None
        if multiplier is None
        else positive_number(params, "ffn_dim_multiplier", file, limit=MAX_FFN_DIM_MULTIPLIER),
    )
    return {
        "dim": ("dim", shaped.dim),
        "n_layers": ("n_layers", shaped.n_layers),
        "n_heads": ("n_heads", heads),
        "n_kv_heads": ("n_kv_heads", shaped.n_kv_heads),
        "vocab_size": ("vocab_size", shaped.vocab_size),
        "ffn_dim": ("multiple_of and ffn_dim_multiplier's hidden size", shaped.ffn_dim),
        "norm_eps": ("norm_eps", positive_number(params, "norm_eps", file, 1e-5)),
        "rope_theta": ("rope_theta", positive_number(params, "rope_theta", file, 10000.0)),
        "rope_scaling": (
            "use_scaled_rope",
            RopeScaling() if params.get("use_scaled_rope") else None,
        ),
    }


# --- tensors: names and shapes --------------------------------------------------------------

_HF_BLOCK = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_HF_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Meta's model-parallel files split these along a dimension (the rest are whole in each):
# column-parallel layers and the embedding (Llama 3's, unlike Llama 2's) along 0, row-parallel
# along 1.
META_SPLIT = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "wo": 1, "w2": 1,
              "tok_embeddings": 0, "output": 0}  # fmt: skip


def shapes(args: LlamaArgs) -> dict[str, tuple[int, ...]]:
    """Every parameter of the trainer's model (model.py) by name, in the model's order."""
    kv = args.n_kv_heads * args.head_dim
    found: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (args.vocab_size, args.dim)}
    for layer in range(args.n_layers):
        prefix = f"layers.{layer}."
        found.update(
            {
                prefix + "attention.wq.weight": (args.n_heads * args.head_dim, args.dim),
                prefix + "attention.wk.weight": (kv, args.dim),
                prefix + "attention.wv.weight": (kv, args.dim),
                prefix + "attention.wo.weight": (args.dim, args.n_heads * args.head_dim),
                prefix + "feed_forward.w1.weight": (args.ffn_dim, args.dim),
                prefix + "feed_forward.w2.weight": (args.dim, args.ffn_dim),
                prefix + "feed_forward.w3.weight": (args.ffn_dim, args.dim),
                prefix + "attention_norm.weight": (args.dim,),
                prefix + "ffn_norm.weight": (args.dim,),
            }
        )
    found["norm.weight"] = (args.dim,)
    found["output.weight"] = (args.vocab_size, args.dim)
    return found


def hf_name(name: str) -> str:
    """The Hugging Face name of the trainer's parameter `name`."""
    if name in _HF_TOP:
        return _HF_TOP[name]
    _, layer, rest = name.split(".", 2)
    module = rest.removesuffix(".weight")
    return f"model.layers.{layer}.{_HF_BLOCK[module]}.weight"


def rotated_heads(name: str, args: LlamaArgs) -> int:
    """The heads whose rows Hugging Face stores in rotate-half order (q: all heads, k: the KV
    heads); 0 for a parameter stored as Meta's."""
    if name.endswith("attention.wq.weight"):
        return args.n_heads
    if name.endswith("attention.wk.weight"):
        return args.n_kv_heads
    return 0


def meta_split(name: str) -> int | None:
    """The dimension along which Meta's model-parallel files split `name` (None: whole in each)."""
    parts = name.removesuffix(".weight").split(".")
    return META_SPLIT.get(parts[-1])


# --- export and the trainer's saved shape ----------------------------------------------------


def hf_config(args: LlamaArgs) -> dict[str, Any]:
    """config.json for transformers' LlamaForCausalLM (export adds the dtype and the token ids).
    RoPE's settings in rope_theta and rope_scaling, which every transformers release reads (5
    also reads its rope_parameters)."""
    scaling = args.rope_scaling
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": None
        if scaling is None
        else {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_context,
        },
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def saved_args(saved: dict[str, Any], file: Path) -> LlamaArgs:
    """LlamaArgs of the shape the trainer saved, every field checked: a number of its kind,
    or a model this version cannot read (PretrainedError, one line naming the field)."""
    unknown = set(saved) - {f.name for f in fields(LlamaArgs)}
    if unknown:
        raise PretrainedError(
            f"{file}: a model shape this version cannot read (fields {sorted(unknown)!r:.200})"
        )
    checked: dict[str, Any] = {}
    try:
        for name, value in saved.items():
            if name == "rope_scaling":
                checked[name] = None if value is None else _scaling(value, file)
            elif name in ("ffn_dim_multiplier", "norm_eps", "rope_theta"):
                checked[name] = None if value is None else positive_number(saved, name, file)
            else:
                checked[name] = whole_number(saved, name, file)
        return LlamaArgs(**checked)
    except TypeError as exc:  # a field missing
        raise PretrainedError(f"{file}: a model shape this version cannot read ({exc})") from None


def _scaling(saved: Any, file: Path) -> RopeScaling:
    if not isinstance(saved, dict) or set(saved) != {f.name for f in fields(RopeScaling)}:
        raise PretrainedError(
            f"{file}: rope_scaling is not the trainer's (factor, ... of Llama 3.1)"
        )
    return RopeScaling(
        factor=positive_number(saved, "factor", file),
        low_freq_factor=positive_number(saved, "low_freq_factor", file),
        high_freq_factor=positive_number(saved, "high_freq_factor", file),
        original_context=whole_number(saved, "original_context", file),
    )
