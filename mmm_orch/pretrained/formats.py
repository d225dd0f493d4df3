"""Pretrained Llama checkpoints on disk, read without torch: a Hugging Face model directory
(config.json, *.safetensors with or without model.safetensors.index.json) or Meta's layout
(params.json, consolidated.NN.pth). `open_source` reads the configuration and checks the files
(shards the index names, every safetensors header against its file), so that `mmm-orch submit`
can refuse a mismatch before the queue and the trainer before it trains; read.py reads the
tensors. Names and shapes are the trainer's (Meta's), with the map to Hugging Face's.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from mmm_orch.errors import one_line, shown
from mmm_orch.model_shapes import LlamaArgs, RopeScaling
from mmm_orch.paths import NotReadable, open_regular

HF_CONFIG = "config.json"
HF_INDEX = "model.safetensors.index.json"
META_PARAMS = "params.json"
META_SHARDS = "consolidated.*.pth"
# What a tokenizer needs beside the weights: Hugging Face's files and Meta's tiktoken model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
# safetensors dtype names and their sizes in bytes.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}  # fmt: skip
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # what a weight may be stored as
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
MAX_CONFIG_BYTES = 1 << 20
# Meta's ffn_dim_multiplier: 1.3 (8B), 1.5 (405B); far from these it is not a Llama's.
MAX_FFN_DIM_MULTIPLIER = 64.0


class PretrainedError(ValueError):
    """A checkpoint that cannot start this run: one line naming the file, the field or the
    tensor, what it holds and what was expected."""

    def __str__(self) -> str:
        # One line whatever the file says: its names and values are shown escaped.
        return one_line(super().__str__())


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple[int, ...]
    file: Path  # the file holding it
    start: int  # its bytes in the file: [start, end)
    end: int


@dataclass(frozen=True)
class Source:
    """A pretrained checkpoint: its kind, what its configuration declares (in LlamaArgs' terms,
    each with the configuration's own name for it), and its files."""

    path: Path
    kind: Literal["hf", "meta"]
    declared: dict[str, tuple[str, Any]]  # our field -> (the config's name for it, its value)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)  # hf: by Hugging Face name
    shards: tuple[Path, ...] = ()  # meta: consolidated.00.pth, ...

    @property
    def config_file(self) -> str:
        return HF_CONFIG if self.kind == "hf" else META_PARAMS

    @property
    def tokenizer_files(self) -> list[Path]:
        return [self.path / name for name in TOKENIZER_FILES if (self.path / name).is_file()]


def open_source(path: str | Path) -> Source:
    """The checkpoint at `path` (a directory, or config.json / params.json in one), its
    configuration read and its files checked; PretrainedError when it is not one."""
    where = Path(path)
    if where.name in (HF_CONFIG, META_PARAMS):
        where = where.parent
    if not where.is_dir():
        raise PretrainedError(
            f"--init-from {path}: not a directory (a Hugging Face model directory with "
            f"{HF_CONFIG}, or Meta's with {META_PARAMS} and consolidated.00.pth)"
        )
    if (where / HF_CONFIG).is_file():
        config = read_json(where / HF_CONFIG)
        return Source(where, "hf", hf_declared(config, where / HF_CONFIG), _hf_tensors(where))
    if (where / META_PARAMS).is_file():
        params = read_json(where / META_PARAMS)
        shards = tuple(sorted(where.glob(META_SHARDS)))
        if not shards:
            raise PretrainedError(f"--init-from {where}: {META_PARAMS} but no {META_SHARDS}")
        for shard in shards:
            check_regular(shard)
        return Source(where, "meta", meta_declared(params, where / META_PARAMS), shards=shards)
    raise PretrainedError(
        f"--init-from {where}: neither {HF_CONFIG} (Hugging Face) nor {META_PARAMS} (Meta) in it"
    )


def check_model(source: Source, args: LlamaArgs) -> None:
    """PretrainedError naming the first field where the checkpoint and the run's model differ,
    and then (Hugging Face) the first tensor missing or of another shape."""
    ours = _our_values(args)
    for name, (theirs_name, value) in source.declared.items():
        if not _same(value, ours[name]):
            raise PretrainedError(
                f"--init-from {source.path}: {source.config_file} {theirs_name} is "
                f"{_show(value)}, the run's model {name} is {_show(ours[name])} "
                "(--config, --tiny, --n-layers and --vocab-size choose the model)"
            )
    if source.kind != "hf":
        return  # a .pth says its shapes only once unpickled: read.py checks them
    for ours_name, shape in shapes(args).items():
        name = hf_name(ours_name)
        found = source.tensors.get(name)
        if found is None:
            raise PretrainedError(f"--init-from {source.path}: no tensor {name} in its files")
        if found.shape != shape:
            raise PretrainedError(
                f"--init-from {source.path}: {name} has shape {list(found.shape)}, the run's "
                f"model {list(shape)}"
            )
        if found.dtype not in FLOAT_DTYPES:
            raise PretrainedError(
                f"--init-from {source.path}: {name} holds {found.dtype}; the trainer reads "
                f"floating-point weights ({', '.join(FLOAT_DTYPES)})"
            )


def _our_values(args: LlamaArgs) -> dict[str, Any]:
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


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b)
    return bool(a == b)


def _show(value: Any) -> str:
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
    rope = _object(config, "rope_parameters", file)
    scaling_fields = _object(config, "rope_scaling", file) or rope
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


# A model's sizes (layers, heads, widths, a vocabulary, a context) are far below this; a larger
# one is not a model's, and would overflow the arithmetic of its shapes.
MAX_WHOLE = 1 << 31


def whole_number(config: dict[str, Any], name: str, file: Path, default: int | None = None) -> int:
    """config[name], a whole number from 1 to MAX_WHOLE; `default` where it is absent or null
    (None: it must be there)."""
    value = config.get(name)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WHOLE:
        raise PretrainedError(
            f"{file}: {name} is {shown(value)}, not a whole number from 1 to {MAX_WHOLE}"
        )
    return value


def positive_number(
    config: dict[str, Any],
    name: str,
    file: Path,
    default: float | None = None,
    limit: float = math.inf,
) -> float:
    """config[name], a finite number above 0 (and at most `limit`); `default` where absent."""
    value = config.get(name)
    if value is None:
        value = default
    try:
        number = float(value) if isinstance(value, (int, float)) and value is not True else math.nan
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not (0 < number <= limit and math.isfinite(number)):
        bound = "" if limit == math.inf else f" and at most {limit:g}"
        raise PretrainedError(
            f"{file}: {name} is {shown(value)}, not a finite number above 0{bound}"
        )
    return number


def _object(config: dict[str, Any], name: str, file: Path) -> dict[str, Any]:
    """config[name], a JSON object; {} where it is absent or null."""
    value = config.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PretrainedError(f"{file}: {name} is {shown(value)}, not a JSON object")
    return value


def read_json(file: Path) -> dict[str, Any]:
    """A JSON object of at most MAX_CONFIG_BYTES; PretrainedError naming the file otherwise."""
    with _opened(file) as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise PretrainedError(f"{file}: larger than {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        value = json.loads(data)
    except RecursionError:
        raise PretrainedError(f"{file}: not JSON of a configuration (nested too deep)") from None
    except ValueError as exc:  # not JSON, or a number of over 4,300 digits
        raise PretrainedError(f"{file}: not JSON ({str(exc)[:200]})") from None
    if not isinstance(value, dict):
        raise PretrainedError(f"{file}: holds {type(value).__name__}, not a JSON object")
    return value


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
    """Every parameter of the trainer's model (models/llama.py) by name, in the model's order."""
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


# --- safetensors ----------------------------------------------------------------------------


def _hf_tensors(where: Path) -> dict[str, TensorInfo]:
    """Every tensor of the directory's safetensors files, by name: the index's files (each
    named shard there, each tensor in the shard the index says), or the files themselves."""
    index = where / HF_INDEX
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise PretrainedError(f"{index}: no weight_map of tensor names to files")
        for name in weight_map.values():
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise PretrainedError(f"{index}: {shown(name)} is not a file name in {where}")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (where / name).is_file():
                raise PretrainedError(
                    f"--init-from {where}: shard {name}, named in {HF_INDEX}, is missing"
                )
        headers = {name: read_header(where / name) for name in files}
        found = {}
        for tensor, name in weight_map.items():
            if tensor not in headers[name]:
                raise PretrainedError(
                    f"{where / name}: no tensor {tensor}, which {HF_INDEX} puts in it"
                )
            found[tensor] = headers[name][tensor]
        return found
    found = {}
    for file in sorted(where.glob("*.safetensors")):
        found.update(read_header(file))
    if not found:
        raise PretrainedError(f"--init-from {where}: {HF_CONFIG} but no *.safetensors files")
    return found


def check_regular(file: Path) -> None:
    """PretrainedError unless `file` (a link followed: a Hub cache links its blobs) is a regular
    file that can be read: a FIFO in a checkpoint would block its reader forever."""
    with _opened(file):
        pass


def _opened(file: Path) -> BinaryIO:
    """`file` opened to read, without waiting on a FIFO; PretrainedError, one line, when it is
    no regular file or cannot be opened."""
    try:
        return os.fdopen(open_regular(file), "rb")
    except NotReadable as exc:
        raise PretrainedError(str(exc)) from None
    except OSError as exc:
        raise PretrainedError(f"{file}: cannot read it: {exc.strerror}") from None


def read_header(file: Path) -> dict[str, TensorInfo]:
    """A safetensors file's tensors, its header checked against the file: every tensor's bytes
    inside the file, as many as its dtype and shape take, none overlapping another's."""
    opened = _opened(file)
    try:
        size = os.fstat(opened.fileno()).st_size
        with opened as handle:
            head = handle.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise PretrainedError(
                    f"{file}: not a safetensors file (a header of {length} bytes in a file of "
                    f"{size}: truncated?)"
                )
            text = handle.read(length)
    except OSError as exc:
        raise PretrainedError(f"{file}: cannot read it: {exc.strerror}") from None
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        raise PretrainedError(f"{file}: its safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise PretrainedError(f"{file}: its safetensors header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    found: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        found[name] = _tensor(file, name, entry, data_start, data_size)
    spans = sorted((info.start, info.end, name) for name, info in found.items())
    for (_, end, before), (start, _, after) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise PretrainedError(f"{file}: the header puts {after} inside {before}'s bytes")
    return found


def _tensor(file: Path, name: str, entry: Any, data_start: int, data_size: int) -> TensorInfo:
    try:
        dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BYTES or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise TypeError
        if not (isinstance(start, int) and isinstance(end, int)):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise PretrainedError(f"{file}: the header's entry for {name} is not a tensor's") from None
    if not 0 <= start <= end <= data_size:
        raise PretrainedError(
            f"{file}: the header puts {name}'s bytes at {start}-{end}, past the "
            f"{data_size} bytes of data in the file (truncated?)"
        )
    wanted = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - start != wanted:
        raise PretrainedError(
            f"{file}: the header gives {name} ({dtype} {list(shape)}, {wanted} bytes) "
            f"{end - start} bytes"
        )
    return TensorInfo(dtype, tuple(shape), file, data_start + start, data_start + end)
