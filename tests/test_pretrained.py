"""Pretrained weights in and out: a tiny Llama 3 and a tiny Llama 3.1 made by Hugging Face
transformers here (random weights, saved with save_pretrained), started from by the llama3
trainer on 1 rank, 2 ranks FSDP, 2 ranks TP=2 and 2 ranks PP=2 (its first loss is transformers'
on the same batch), trained, exported and read back by transformers (its logits are the
trainer's); the same from Meta's consolidated.NN.pth layout, one file or split for model
parallelism; every bad checkpoint refused in one line with exit 2."""

from __future__ import annotations

import functools
import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmm_orch import models
from mmm_orch.models.llama3 import checkpoint
from mmm_orch.models.llama3.args import run_model
from mmm_orch.errors import PretrainedError
from mmm_orch.pretrained import formats
from mmm_orch.pretrained.export import saved_model
from mmm_orch.runtime.data import GlobalBatch, SyntheticTokens
from helpers.jobs import wait_state
from helpers.profiles import write_spec
from helpers.training import launch, steps

transformers = pytest.importorskip("transformers")  # a test dependency (pyproject's test extra)

TOLERANCE = 1e-4  # fp32, as the issue asks


def hf_config(config: str, **changes):
    """transformers' LlamaConfig of the trainer's `--config CONFIG --tiny` model."""
    _, args = run_model(config, True, None, None, None)
    scaling = args.rope_scaling
    fields = dict(
        hidden_size=args.dim,
        intermediate_size=args.ffn_dim,
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.n_kv_heads,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_seq_len,
        rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        rope_scaling=None if scaling is None else {
            "rope_type": "llama3", "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_context},
        tie_word_embeddings=False,
    )
    return transformers.LlamaConfig(**{**fields, **changes})


def hf_model(config: str, seed: int = 0, **changes):
    """A transformers Llama of the `config` preset's tiny shapes (with `changes`), its weights
    drawn from `seed`."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config(config, **changes)).eval()
    # transformers draws every weight with std 0.02: larger ones make the logits, and so a
    # wrong permutation or RoPE, show.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.2)
    return model


@functools.cache
def reference(config: str):
    """hf_model(config), made once: the model every checkpoint of `config` here holds (it is
    only read)."""
    return hf_model(config)


def meta_state(model) -> dict[str, torch.Tensor]:
    """A transformers Llama's weights under Meta's names, q/k rows back in pair order (the
    inverse of transformers' convert_llama_weights_to_hf permute)."""
    config, sd = model.config, model.state_dict()

    def pairs(w, heads):
        rows, cols = w.shape
        return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)

    out = {"tok_embeddings.weight": sd["model.embed_tokens.weight"],
           "norm.weight": sd["model.norm.weight"], "output.weight": sd["lm_head.weight"]}
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        out[ours + "attention.wq.weight"] = pairs(sd[hf + "self_attn.q_proj.weight"],
                                                  config.num_attention_heads)
        out[ours + "attention.wk.weight"] = pairs(sd[hf + "self_attn.k_proj.weight"],
                                                  config.num_key_value_heads)
        for theirs, mine in (("self_attn.v_proj", "attention.wv"), ("self_attn.o_proj", "attention.wo"),
                             ("mlp.gate_proj", "feed_forward.w1"), ("mlp.down_proj", "feed_forward.w2"),
                             ("mlp.up_proj", "feed_forward.w3"), ("input_layernorm", "attention_norm"),
                             ("post_attention_layernorm", "ffn_norm")):
            out[f"{ours}{mine}.weight"] = sd[f"{hf}{theirs}.weight"]
    return {k: v.clone().contiguous() for k, v in out.items()}


def save_meta(model, where: Path, files: int = 1) -> Path:
    """Meta's layout: params.json and consolidated.NN.pth, `files` model-parallel parts (split
    along the dimensions Meta's model-parallel layers split)."""
    where.mkdir(parents=True)
    c = model.config
    scaled = (c.rope_parameters or {}).get("rope_type") == "llama3"
    _, args = run_model("3.1-8b" if scaled else "8b", True, None, None, None)
    (where / "params.json").write_text(json.dumps({
        "dim": c.hidden_size, "n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads, "vocab_size": c.vocab_size,
        "multiple_of": args.multiple_of, "ffn_dim_multiplier": args.ffn_dim_multiplier,
        "norm_eps": c.rms_norm_eps, "rope_theta": args.rope_theta, "use_scaled_rope": scaled}))
    state = meta_state(model)
    for part in range(files):
        piece = {}
        for name, tensor in state.items():
            split = checkpoint.meta_split(name)
            piece[name] = (tensor if split is None else tensor.chunk(files, split)[part]).clone()
        torch.save(piece, where / f"consolidated.{part:02d}.pth")
    return where


def save_hf(config: str, where: Path) -> Path:
    """reference(config) as a Hugging Face model directory with its tokenizer: 3.1's in several
    safetensors files and an index, 3's in one."""
    shard = "40KB" if config == "3.1-8b" else "50MB"
    reference(config).save_pretrained(where, max_shard_size=shard)
    save_tokenizer(where)
    return where


# The tests that start from the checkpoints below share them: one worker makes them once.
SHARES_CHECKPOINTS = pytest.mark.xdist_group("pretrained-checkpoints")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny Llama 3 and 3.1 in Hugging Face's layout (3.1 sharded, with an index) and Meta's
    (3.1 also in two files split for model parallelism)."""
    root = tmp_path_factory.mktemp("pretrained")
    made = {}
    for config in ("8b", "3.1-8b"):
        made[f"hf-{config}"] = save_hf(config, root / f"hf-{config}")
        made[f"meta-{config}"] = save_meta(reference(config), root / f"meta-{config}")
    made["meta-3.1-8b-mp2"] = save_meta(reference("3.1-8b"), root / "meta-3.1-8b-mp2", files=2)
    assert (made["hf-3.1-8b"] / formats.HF_INDEX).exists()
    return made


def save_tokenizer(where: Path) -> None:
    """A small Hugging Face tokenizer.json in `where` (a model directory's own)."""
    tokenizers = pytest.importorskip("tokenizers")
    vocabulary = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "[UNK]": 2, "hi": 3}
    made = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, "[UNK]"))
    made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    made.save(str(where / "tokenizer.json"))


def first_batch(config: str, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples of the trainer's first step, every data-parallel rank's (runtime/data.py)."""
    preset, args = run_model(config, True, None, None, None)
    data = SyntheticTokens(args.vocab_size, preset.seq_len, 1)  # the trainer's default seed
    parts = [data.batch(GlobalBatch.of(0, preset.batch_size, dp, rank).micro(0, 0))
             for rank in range(dp)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def hf_loss(model, inputs, labels) -> float:
    with torch.no_grad():
        logits = model(inputs).logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()


def trainer_logits(run_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    """The trainer's model at its latest checkpoint, read back by the trainer's own classes."""
    import torch.distributed.checkpoint as dcp

    from mmm_orch.models.llama3.model import Transformer

    step = (run_dir / "checkpoints" / "latest").read_text().strip()
    checkpoint = run_dir / "checkpoints" / step
    model = Transformer(saved_model(checkpoint, run_dir)[1])
    state = {"model." + k: v for k, v in model.state_dict().items()}
    dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    with torch.no_grad():
        return model(tokens)


# A pipeline of 2 stages needs 2 micro-batches a step: the tiny preset's batch of 4, twice (the
# samples of a 2-rank dp step, so first_batch(config, 2) is its batch too).
LAYOUTS = {"1 rank": (1, []), "2 ranks FSDP": (2, []), "2 ranks TP=2": (2, ["--tp", "2"]),
           "2 ranks PP=2": (2, ["--pp", "2", "--global-batch", "8"])}
# The starts (a checkpoint of `checkpoints`, a layout): each layout from each format, each format
# and each layout in both configurations (Llama 3's RoPE and 3.1's scaled one; 3.1's Hugging Face
# weights in several files), Meta's TP run from the files split for model parallelism (each
# rank's part joined from both files), and the pipeline once (its stages read whole tensors).
# Each run is exported: every layout's checkpoint, both configurations' RoPE, both formats'
# tokenizer.
STARTS = [("hf-8b", "1 rank"), ("meta-3.1-8b", "1 rank"),
          ("hf-3.1-8b", "2 ranks FSDP"), ("meta-8b", "2 ranks FSDP"),
          ("hf-8b", "2 ranks TP=2"), ("meta-3.1-8b-mp2", "2 ranks TP=2"),
          ("hf-8b", "2 ranks PP=2")]
STEPS = 6  # the fewest in which every layout's loss falls by more than 0.1 from these weights


@pytest.mark.slow
@SHARES_CHECKPOINTS
@pytest.mark.parametrize("start,layout", STARTS)
def test_a_run_started_from_weights_has_their_loss_and_exports_the_trainers_logits(
        checkpoints, tmp_path, cli, start, layout):
    source, config = start.split("-", 1)
    config = config.removesuffix("-mp2")
    ranks, more = LAYOUTS[layout]
    out = tmp_path / "out"
    out.mkdir()
    proc = launch("llama3", ["--config", config, "--tiny", "--dtype", "fp32", "--steps",
                             str(STEPS), "--warmup-steps", "2", "--checkpoint-every", str(STEPS),
                             "--init-from", str(checkpoints[start]), *more],
                  ranks, "torchrun" if ranks > 1 else "python", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dp = ranks // (2 if "--tp" in more else 1)
    first = steps(out)[0]["loss"]
    assert abs(first - hf_loss(reference(config), *first_batch(config, dp))) < TOLERANCE
    assert steps(out)[-1]["loss"] < first - 0.1  # and it trained
    # Rank 0 read its shards' part of the weights, not the model.
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    read = next(r["values_read"] for r in records if r["event"] == "init_from")
    _, args = run_model(config, True, None, None, None)
    assert read == args.params if ranks == 1 else 0.4 * args.params < read < 0.6 * args.params

    exported = cli("export", str(out / "run"), "--to", "hf", str(tmp_path / "hf"))
    assert exported.code == 0, exported.err
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = first_batch(config, 1)[0]
    with torch.no_grad():
        theirs = back(tokens).logits
    assert (theirs - trainer_logits(out / "run", tokens)).abs().max().item() < TOLERANCE
    wanted = "llama3" if config.startswith("3.1") else "default"
    assert back.config.rope_parameters["rope_type"] == wanted
    # The --init-from directory's tokenizer and end-of-text id go with it.
    assert (tmp_path / "hf" / "tokenizer.json").exists() == (source == "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written.get("eos_token_id") == (
        reference(config).config.eos_token_id if source == "hf" else None)


@SHARES_CHECKPOINTS
def test_llama_3_1_rope_scaling_is_transformers_and_survives_a_dtype_change(checkpoints):
    """The trainer's model with Llama 3.1's RoPE gives transformers' logits (plain RoPE's differ
    by far more than the tolerance, at every position); model.to(dtype) keeps the complex table."""
    import warnings

    from mmm_orch.pretrained.read import load_weights, open_reader
    from mmm_orch.models.llama3.model import Transformer

    tokens = first_batch("3.1-8b", 1)[0]
    with torch.no_grad():
        expected = reference("3.1-8b")(tokens).logits
    source = formats.open_source(checkpoints["hf-3.1-8b"], models.get("llama3"))
    differences = {}
    for config in ("3.1-8b", "8b"):
        _, args = run_model(config, True, None, None, None)
        model = Transformer(args)
        load_weights(model, open_reader(source, args))
        with torch.no_grad():
            differences[config] = (model(tokens) - expected).abs().amax(dim=(0, 2))
    assert differences["3.1-8b"].max().item() < TOLERANCE
    assert differences["8b"][1:].min().item() > 10 * TOLERANCE  # every position but the first
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "casting complex values to real discards" warning
        model.to(torch.float64)
    _, args = run_model("3.1-8b", True, None, None, None)
    model = Transformer(args)
    load_weights(model, open_reader(source, args))
    model.to(torch.float64)
    assert model.freqs.is_complex()
    with torch.no_grad():
        assert (model(tokens).float() - expected).abs().max().item() < TOLERANCE


# -- bad input: one line, exit 2, nothing trained ------------------------------------------------


def _refused(start: Path, config: str = "3.1-8b") -> str:
    """The one line the llama3 trainer refuses `--init-from START` with: its own check of the
    checkpoint (llama3.pretrained), run here; any ValueError of it stops the trainer with exit
    2 before it trains (test_a_checkpoint_of_another_shape_is_refused_naming_the_field shows
    that in the trainer's own process)."""
    from mmm_orch.runtime.options import parse
    from mmm_orch.trainers.llama3 import Config, pretrained, resolve

    cfg = parse(Config, ["--config", config, "--tiny", "--steps", "2", "--init-from", str(start)])
    with pytest.raises(PretrainedError) as refused:
        pretrained(cfg, resolve(cfg)[0])
    said = str(refused.value)
    assert "\n" not in said, said
    return said


def _copy(source: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(source, to)
    return to


@pytest.mark.slow
@SHARES_CHECKPOINTS
def test_a_checkpoint_of_another_shape_is_refused_naming_the_field(checkpoints, tmp_path, cli,
                                                                    isolated):
    said = _refused(checkpoints["hf-3.1-8b"], config="8b")
    assert "config.json rope_scaling is llama3 (factor 8" in said and "is none" in said, said
    wider = tmp_path / "wider"
    hf_model("8b", hidden_size=128, intermediate_size=384).save_pretrained(wider)
    # The trainer itself: one line, exit 2, nothing trained (no run directory).
    out = tmp_path / "out"
    out.mkdir()
    proc = launch("llama3", ["--config", "8b", "--tiny", "--steps", "2", "--init-from",
                             str(wider)], 1, "python", out)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    said = proc.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("[llama3] error: "), proc.stderr
    assert "config.json hidden_size is 128, the run's model dim is 64" in said[0], said
    assert not (out / "run").exists()
    # Before the queue: nothing recorded, nothing submitted.
    result = cli("submit", "local", "llama3_debug", "--set", "tiny=true", "--init-from", str(wider))
    assert result.code == 2 and "hidden_size is 128" in result.err, result.err
    assert [line for line in result.err.splitlines() if "mmm-orch" in line] == [
        result.err.strip().splitlines()[-1]]  # (transformers' warnings above it are this test's)
    assert not (isolated.parent / "state" / "mmm-orch" / "jobs.db").exists()


@SHARES_CHECKPOINTS
def test_a_missing_shard_a_truncated_file_and_a_lying_header_are_refused(checkpoints, tmp_path):
    missing = _copy(checkpoints["hf-3.1-8b"], tmp_path / "missing")
    shards = sorted(missing.glob("*.safetensors"))
    shards[1].unlink()
    said = _refused(missing)
    assert f"shard {shards[1].name}, named in model.safetensors.index.json, is missing" in said

    truncated = _copy(checkpoints["hf-8b"], tmp_path / "truncated")
    file = truncated / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    said = _refused(truncated, config="8b")
    assert "past the" in said and "(truncated?)" in said, said

    lying = _copy(checkpoints["hf-8b"], tmp_path / "lying")
    file = lying / "model.safetensors"
    data = file.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + length])
    name = "model.layers.0.self_attn.q_proj.weight"
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 4, end + 4]  # into the next tensor's bytes
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    assert len(text) == length
    file.write_bytes(data[:8] + text + data[8 + length:])
    said = _refused(lying, config="8b")
    assert "the header puts" in said and "inside" in said, said

    integers = _copy(checkpoints["hf-8b"], tmp_path / "integers")
    file = integers / "model.safetensors"
    data = file.read_bytes()
    header = json.loads(data[8:8 + length])
    header[name]["dtype"] = "I32"  # as wide as F32: the header still fits the file
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    file.write_bytes(data[:8] + text + data[8 + length:])
    said = _refused(integers, config="8b")
    assert f"{name} holds I32; the trainer reads floating-point weights" in said, said


class Payload:
    def __reduce__(self):
        return (print, ("unpickled: code ran",))


@SHARES_CHECKPOINTS
def test_a_pth_holding_other_objects_is_refused_unpickled(checkpoints, tmp_path, capsys):
    hostile = _copy(checkpoints["meta-8b"], tmp_path / "hostile")
    with open(hostile / "consolidated.00.pth", "wb") as handle:
        torch.save({"tok_embeddings.weight": torch.zeros(2), "x": Payload()}, handle)
    said = _refused(hostile, config="8b")
    assert "consolidated.00.pth: not a checkpoint of tensors" in said, said
    listed = _copy(checkpoints["meta-8b"], tmp_path / "listed")
    torch.save([torch.zeros(2)], listed / "consolidated.00.pth")
    said = _refused(listed, config="8b")
    assert "holds list, not a dictionary of tensors" in said, said
    raw = _copy(checkpoints["meta-8b"], tmp_path / "raw")
    (raw / "consolidated.00.pth").write_bytes(pickle.dumps(Payload()))
    said = _refused(raw, config="8b")
    assert "not a checkpoint of tensors" in said and "code ran" not in said, said
    assert "code ran" not in capsys.readouterr().out  # the payload never ran, here either


def test_an_export_of_a_run_without_a_checkpoint_is_refused(tmp_path, cli, isolated):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    result = cli("export", str(run), "--to", "hf", str(tmp_path / "hf"))
    assert result.code == 2 and "saved no checkpoint" in result.err, result.err
    assert not (tmp_path / "hf").exists()
    assert cli("export", str(run), "--to", "gguf", str(tmp_path / "x")).code == 2
    assert cli("export", "7", "--to", "hf", str(tmp_path / "x")).code == 2  # no such job


def test_the_tokenize_workload_reads_a_model_directorys_tokenizer(tmp_path):
    from mmm_orch.runtime.text import load_tokenizer

    save_tokenizer(tmp_path)
    assert load_tokenizer(str(tmp_path)).document("hi hi") == [0, 3, 3, 1]


# -- on the live Slurm cluster -------------------------------------------------------------------


@pytest.mark.slow
def test_on_slurm_a_two_node_run_from_weights_stops_resumes_on_one_node_and_exports(
        cli, isolated, slurm_cluster, leftovers_cancelled):
    """Started from a Hugging Face directory on 2 nodes, stopped by its walltime (saving first),
    resumed on 1 node from its checkpoint (not from the weights again), exported from the job.
    (Its own checkpoint, made in a second: the shared ones would hold this test's minutes of
    walltimes on the worker of the trainings that share them.)"""
    save_hf("3.1-8b", isolated / "llama-3.1-tiny")
    write_spec(isolated, "finetune_tiny", """extends: llama3_8b_finetune
name: finetune_tiny
args: {config: 3.1-8b, tiny: true, dtype: fp32, steps: 1000000, warmup_steps: 5}
resources: {accelerator: false}
watchdog: {walltime_margin: "00:00:20"}
""")
    data = isolated / "tokens.bin"
    data.write_bytes(torch.randint(0, 256, (20000,), dtype=torch.int32).numpy().tobytes())
    common = ["--init-from", "llama-3.1-tiny", "--set", "data_path=tokens.bin",
              "--set", "run_name=ft", "--set", "eval_every=0", "--walltime", "00:01:00"]
    first = cli("submit", "slurm-local", "finetune_tiny", "-N", "2", *common, "--json")
    assert first.code == 0, first.err
    row = wait_state(cli, 1, timeout=300)
    assert row["state"] == "timeout" and row["reason"].startswith("resumable at step"), row
    stopped_at = int(row["reason"].split("step ")[1].split()[0])
    run_dir = Path(json.loads(first.out)["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["path"] for r in records if r["event"] == "init_from"] == ["llama-3.1-tiny"]

    again = cli("submit", "slurm-local", "finetune_tiny", "-N", "1", *common,
                "--set", "resume=true", "--json")
    assert again.code == 0, again.err
    second = json.loads(again.out)
    assert second["nodes"] == 1 and second["run_dir"] == str(run_dir)
    row = wait_state(cli, second["id"], timeout=300)
    assert row["state"] == "timeout", row
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    resumed = [json.loads(line) for line in lines[len(records):]]
    assert [r["step"] for r in resumed if r["event"] == "resume"] == [stopped_at]
    assert not [r for r in resumed if r["event"] == "init_from"]  # the checkpoint, not the weights

    result = cli("export", str(second["id"]), "--to", "hf", str(isolated / "handed-on"))
    assert result.code == 0, result.err
    back = transformers.AutoModelForCausalLM.from_pretrained(isolated / "handed-on").eval()
    tokens = first_batch("3.1-8b", 1)[0]
    with torch.no_grad():
        theirs = back(tokens).logits
    assert (theirs - trainer_logits(run_dir, tokens)).abs().max().item() < TOLERANCE


# -- before the queue: Llama 3.1's presets and an 8B download, checked without reading it ------


def test_llama_3_1_presets_have_llama_3s_shapes_a_128k_context_and_meta_s_scaling():
    from mmm_orch.models.llama3.args import PRESETS, RopeScaling

    for size in ("8b", "70b", "405b"):
        three, three_one = PRESETS[size].model, PRESETS[f"3.1-{size}"].model
        assert three_one.params == three.params and three.rope_scaling is None
        assert three_one.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
        assert three_one.max_seq_len == 131072 and three.max_seq_len == 8192


def sparse_hf_download(where: Path, config: str) -> Path:
    """A Hugging Face directory of the `config` preset's shapes: its config.json and one
    safetensors file whose header is real and whose data is a hole (a sparse file), as big as
    the model's bf16 weights but taking no disk."""
    from mmm_orch.models.llama3.args import PRESETS

    args = PRESETS[config].model
    where.mkdir()
    hf = hf_config("3.1-8b").to_dict()
    hf.update(hidden_size=args.dim, intermediate_size=args.ffn_dim,
              num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
              num_key_value_heads=args.n_kv_heads, vocab_size=args.vocab_size,
              max_position_embeddings=args.max_seq_len, head_dim=args.head_dim)
    (where / "config.json").write_text(json.dumps(hf))
    header, offset = {}, 0
    for name, shape in checkpoint.shapes(args).items():
        size = 2 * int(torch.Size(shape).numel())
        header[checkpoint.hf_name(name)] = {"dtype": "BF16", "shape": list(shape),
                                         "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    with open(where / "model.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        handle.truncate(8 + len(text) + offset)
    return where


def test_an_8b_download_is_checked_before_the_queue_and_planned(cli, isolated):
    """Llama 3.1 8B's own shapes pass the check on Polaris, and the plan is the 8B run's;
    under --config 8b (no RoPE scaling) the same directory is refused, nothing written."""
    sparse_hf_download(isolated / "Llama-3.1-8B", "3.1-8b")
    result = cli("submit", "polaris", "llama3_8b_finetune", "-A", "P", "--init-from",
                 "Llama-3.1-8B", "--set", "data_path=data", "--dry-run")
    assert result.code == 0, result.err
    assert "--init-from Llama-3.1-8B" in result.out and "--config 3.1-8b" in result.out
    pretraining = cli("submit", "polaris", "llama3_8b", "-A", "P", "--dry-run").out

    def memory(script: str) -> str:
        return next(line for line in script.splitlines() if line.startswith("# Memory per"))

    assert memory(result.out) == memory(pretraining)  # the 8B run's plan, weights or not
    refused = cli("submit", "polaris", "llama3_8b", "-A", "P", "--init-from", "Llama-3.1-8B",
                  "--dry-run")
    assert refused.code == 2 and "rope_scaling is llama3" in refused.err, refused.err
    import mmm_orch

    planned = mmm_orch.plan("polaris", "llama3_8b_finetune", account="P",
                            init_from="Llama-3.1-8B", options={"data_path": "data"})
    assert planned.launch.args["init_from"] == "Llama-3.1-8B"  # the API's init_from=
    without = cli("submit", "polaris", "llama3_8b_finetune", "-A", "P", "--dry-run")
    assert without.code == 2 and "init_from '' is invalid" in without.err, without.err


def test_a_long_sequence_plan_counts_its_activations():
    """Llama 3.1's context on one sequence: the plan of 3.1-8B at 131072 tokens is refused on
    Polaris with its estimate (activations grow with the sequence), not sized as 8192's."""
    from mmm_orch.usecases import Request, plan

    with pytest.raises(Exception, match=r"memory: llama3_8b needs an estimated (\d{3,})"):
        plan(Request("polaris", "llama3_8b", account="P",
                     options=(("config", "3.1-8b"), ("seq_len", "131072"))))
