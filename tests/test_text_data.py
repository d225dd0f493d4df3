"""Text data from a corpus to the trainer: `python -m mmm_orch.trainers.tokenize` with the three
tokenizer formats and the three input formats, on one rank and several; the dataset it writes
(shards, manifest, validation split); and llama3 reading it: each window once per epoch, the
same global batch on any number of ranks, a run resumed on fewer ranks continuing with exactly
the next samples. Tokenizers are trained here from the corpus: nothing is downloaded."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers.text import corpus, hf_tokenizer
from helpers.training import free_port, launch, steps


def tokenize(args: list[str], ranks: int = 1, cwd: Path | None = None) -> subprocess.CompletedProcess:
    module = ["-m", "mmm_orch.trainers.tokenize", *args]
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={ranks}", *module] if ranks > 1 else [sys.executable, *module])
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**env, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())})


def read_split(root: Path, split: str) -> list[int]:
    import torch

    manifest = json.loads((root / "manifest.json").read_text())
    ids: list[int] = []
    for shard in manifest["splits"][split]["shards"]:
        data = (root / shard["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        ids += torch.frombuffer(bytearray(data), dtype=getattr(torch, manifest["dtype"])).tolist()
    return ids


def documents_of(ids: list[int], eos: int) -> list[tuple[int, ...]]:
    docs, current = [], []
    for token in ids:
        current.append(token)
        if token == eos:
            docs.append(tuple(current))
            current = []
    assert not current, "a shard ends inside a document"
    return docs


# The tests that read the corpus or the dataset below share them: one worker makes them once.
SHARES_DATASET = pytest.mark.xdist_group("text-dataset")


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    """300 documents as blank-line-separated text, JSON lines and Parquet, and a tokenizer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp_path = tmp_path_factory.mktemp("text")
    texts = corpus(300)
    (tmp_path / "part-a.txt").write_text("\n\n".join(texts[:100]) + "\n")
    (tmp_path / "part-b.jsonl").write_text(
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts[100:200])))
    pq.write_table(pa.table({"text": texts[200:]}), tmp_path / "part-c.parquet")
    return tmp_path, texts, hf_tokenizer(tmp_path, texts)


@pytest.fixture(scope="module")
def dataset(text_corpus, tmp_path_factory):
    """The corpus's directory tokenized on 2 ranks, a tenth held out for validation."""
    root, _, tokenizer = text_corpus
    out = tmp_path_factory.mktemp("dataset")
    proc = tokenize(["--input", str(root), "--tokenizer", str(tokenizer), "--out", str(out),
                     "--val-fraction", "0.1"], 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def checked_splits(out: Path, ranks: int, texts: list[str]) -> dict[str, list[tuple[int, ...]]]:
    """The documents of each split of the dataset tokenize wrote on `ranks` ranks in `out`,
    sorted, once its manifest is checked against its shards."""
    manifest = json.loads((out / "manifest.json").read_text())
    eos, bos = manifest["tokenizer"]["eos_id"], manifest["tokenizer"]["bos_id"]
    assert (manifest["tokenizer"]["kind"], manifest["dtype"]) == ("huggingface", "uint16")
    assert manifest["ranks"] == ranks and len(manifest["splits"]["train"]["shards"]) == ranks
    splits = {s: documents_of(read_split(out, s), eos) for s in ("train", "val")}
    assert all(doc[0] == bos for docs in splits.values() for doc in docs)
    assert len(splits["train"]) + len(splits["val"]) == len(texts)
    assert 15 <= len(splits["val"]) <= 45  # 10% of 300, by a hash of the document's index
    for split, docs in splits.items():
        assert manifest["splits"][split]["documents"] == len(docs)
        assert manifest["splits"][split]["tokens"] == sum(map(len, docs))
    assert manifest["max_token_id"] == max(max(d) for d in splits["train"] + splits["val"])
    return {s: sorted(docs) for s, docs in splits.items()}


@pytest.mark.slow
@SHARES_DATASET
def test_tokenize_writes_a_dataset_whose_splits_do_not_depend_on_the_ranks(text_corpus, dataset,
                                                                           tmp_path):
    """The corpus's three files named on 1 rank, and its directory on 2 (the shared dataset):
    the same documents in each split, only their order differs."""
    root, texts, tokenizer = text_corpus
    inputs = ",".join(str(root / f) for f in ("part-a.txt", "part-b.jsonl", "part-c.parquet"))
    proc = tokenize(["--input", inputs, "--tokenizer", str(tokenizer), "--out",
                     str(tmp_path / "data"), "--val-fraction", "0.1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = checked_splits(tmp_path / "data", 1, texts)
    assert one == checked_splits(dataset, 2, texts)

    from tokenizers import Tokenizer

    decoded = Tokenizer.from_file(str(tokenizer)).decode(list(one["train"][0][1:-1]))
    assert decoded.replace(" .", ".") in {t for t in texts}


def _tiktoken_file(path: Path, texts: list[str]) -> Path:
    """A byte-level BPE file in tiktoken's format (Llama 3's tokenizer.model is one): the 256
    bytes, then the most frequent words as merged tokens."""
    words = Counter(w.encode() for t in texts for w in (" " + t).split(" ")[1:])
    tokens = [bytes([b]) for b in range(256)]
    for word, _ in words.most_common(20):
        for end in range(2, len(word) + 1):  # every prefix: tiktoken merges pair by pair
            if word[:end] not in tokens:
                tokens.append(word[:end])
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n"
                            for rank, t in enumerate(tokens)))
    return path


def _sentencepiece_model(directory: Path, texts: list[str]) -> Path:
    import sentencepiece

    (directory / "sp.txt").write_text("\n".join(texts))
    sentencepiece.SentencePieceTrainer.train(
        input=str(directory / "sp.txt"), model_prefix=str(directory / "sp"), vocab_size=64,
        model_type="bpe", minloglevel=2)
    return directory / "sp.model"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tiktoken", "sentencepiece"])
def test_tiktoken_and_sentencepiece_models_tokenize_with_their_own_markers(tmp_path, kind):
    texts = corpus(60)
    (tmp_path / "c.txt").write_text("\n\n".join(texts))
    model = (_tiktoken_file(tmp_path / "tokenizer.model", texts) if kind == "tiktoken"
             else _sentencepiece_model(tmp_path, texts))
    proc = tokenize(["--input", str(tmp_path / "c.txt"), "--tokenizer", str(model), "--out",
                     str(tmp_path / "data"), "--val-fraction", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    described = manifest["tokenizer"]
    assert described["kind"] == kind
    if kind == "tiktoken":  # Llama 3's layout: 256 special tokens after the base, BOS then EOS
        base = len((tmp_path / "tokenizer.model").read_text().splitlines())
        assert (described["vocab_size"], described["bos_id"], described["eos_id"]) == \
            (base + 256, base, base + 1)
    docs = documents_of(read_split(tmp_path / "data", "train"), described["eos_id"])
    assert len(docs) == 60 and manifest["splits"]["val"]["documents"] == 0
    if kind == "tiktoken":
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        from mmm_orch.runtime.text import LLAMA3_PATTERN

        plain = tiktoken.Encoding("t", pat_str=LLAMA3_PATTERN, special_tokens={},
                                  mergeable_ranks=load_tiktoken_bpe(str(tmp_path / "tokenizer.model")))
        assert plain.decode(list(docs[0][1:-1])) == texts[0]


@SHARES_DATASET
@pytest.mark.parametrize("args,message", [
    (["--tokenizer", "nope.json"], "tokenizer 'nope.json': no such file"),
    (["--input", "corpus.csv"], "input 'corpus.csv': no such file"),
    (["--input", "bad.csv"], "suffix '.csv'; allowed: .txt, .md, .jsonl, .parquet"),
    (["--val-fraction", "0.9"], "--val-fraction 0.9 is invalid: a fraction from 0 to 0.5"),
    (["--out", ""], "--out is missing"),
])
def test_bad_input_is_refused_with_exit_2_and_nothing_written(text_corpus, isolated, capsys,
                                                              args, message):
    """Refused before the process group starts, so run here (tokenize.main); an --out that
    already holds a dataset: test_tokenize_safety's dataset-without-overwrite."""
    from mmm_orch.trainers import tokenize as tokenize_main

    root, _, tokenizer = text_corpus
    (isolated / "bad.csv").write_text("text\nhello\n")
    base = {"--input": str(root / "part-a.txt"), "--tokenizer": str(tokenizer), "--out": "fresh"}
    given = dict(zip(args[::2], args[1::2]))
    before = sorted(p.name for p in isolated.iterdir())
    with pytest.raises(SystemExit) as stopped:
        tokenize_main.main([x for k, v in {**base, **given}.items() for x in (k, v)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and message in err, err
    assert err.count("\n") == 1  # one line
    assert sorted(p.name for p in isolated.iterdir()) == before  # no --out made


def test_a_json_line_without_the_text_field_is_refused_naming_its_line(isolated):
    """Found as the documents are read, after tokenize started writing: TextError, which
    tokenize turns into its one line, exit 2, the old dataset kept (test_tokenize_safety's
    runs that fail midway)."""
    from mmm_orch.runtime.text import TextError, documents, input_files

    (isolated / "bad.jsonl").write_text('{"body": "hello"}\n')
    with pytest.raises(TextError, match="bad.jsonl:1: no text field 'text'; name it with "
                                        "--text-field"):
        list(documents(input_files(["bad.jsonl"])))


@pytest.mark.slow
@SHARES_DATASET
def test_each_window_once_per_epoch_and_ids_checked_against_the_model(dataset, tmp_path):
    import torch

    from mmm_orch.runtime.dataset import DatasetError, TokenDataset

    data = TokenDataset(dataset, seq_len=16, vocab_size=256, seed=5)
    n = data.windows
    for epoch in range(3):
        windows = data.window_ids(torch.arange(epoch * n, (epoch + 1) * n))
        assert sorted(windows.tolist()) == list(range(n))
    assert not torch.equal(data.window_ids(torch.arange(n)), data.window_ids(torch.arange(n, 2 * n)))
    inputs, labels = data.batch(torch.arange(4))
    assert torch.equal(inputs[:, 1:], labels[:, :-1]) and inputs.shape == (4, 16)
    vocab = json.loads((dataset / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    with pytest.raises(DatasetError, match=f"its tokenizer has {vocab} ids, the model's "
                                           f"vocabulary {vocab - 1}: set the trainer's vocab_size"):
        TokenDataset(dataset, seq_len=16, vocab_size=vocab - 1)
    flat = tmp_path / "flat.bin"
    flat.write_bytes(torch.tensor([1, 2, 300, 4] * 10, dtype=torch.uint16).numpy().tobytes())
    with pytest.raises(DatasetError, match="token id 300 is outside the model's vocabulary of 256"):
        TokenDataset(flat, seq_len=4, vocab_size=256, dtype="uint16")


@pytest.mark.slow
@SHARES_DATASET
def test_a_damaged_shard_is_refused_naming_it(dataset, tmp_path):
    import shutil

    from mmm_orch.runtime.dataset import DatasetError, TokenDataset

    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    shard = sorted(copy.glob("train-*.bin"))[-1]
    shard.write_bytes(b"")  # cut short to nothing
    with pytest.raises(DatasetError, match=f"{shard}: 0 bytes, not a whole number of uint16"):
        TokenDataset(copy, seq_len=16, vocab_size=256)
    shard.unlink()
    with pytest.raises(DatasetError, match=f"{shard}: cannot read"):
        TokenDataset(copy, seq_len=16, vocab_size=256)


def test_the_trainer_takes_a_vocabulary_and_the_old_name_of_every_other():
    from mmm_orch.runtime.options import parse
    from mmm_orch.trainers.llama3 import Config, resolve

    model, *_, ac = resolve(parse(Config, ["--tiny", "--vocab-size", "300", "--ac", "selective"]))
    assert (model.vocab_size, ac) == (300, "every_other")


@pytest.mark.slow
def test_sample_ids_are_logged_on_synthetic_data_too(tmp_path):
    records = _llama(["--steps", "2", "--log-sample-ids"], 1, tmp_path / "out")
    assert len(records) == 2
    lines = (tmp_path / "out" / "run" / "samples" / "dp-0.jsonl").read_text().splitlines()
    assert [json.loads(line)["samples"] for line in lines] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def _llama(args: list[str], ranks: int, out: Path) -> list[dict]:
    proc = launch("llama3", ["--tiny", "--dtype", "fp32", "--warmup-steps", "2", *args], ranks,
                  "torchrun" if ranks > 1 else "python", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return steps(out)


def on_the_dataset(dataset: Path) -> list[str]:
    """llama3's options for steps of 16 samples of the dataset (4 a micro-batch)."""
    return ["--data-path", str(dataset), "--global-batch", "16", "--batch-size", "4"]


CURVE = ["--steps", "5", "--eval-every", "2", "--eval-samples", "16"]  # validated at 2, 4 and 5
RESUMABLE = ["--log-sample-ids", "--checkpoint-every", "5", "--keep-checkpoints", "1"]


@pytest.fixture(scope="module")
def two_ranks(dataset, tmp_path_factory) -> Path:
    """The out directory of CURVE on 2 ranks, resumable: one of the curves compared, and the
    run a resume on 1 rank continues (in a copy)."""
    out = tmp_path_factory.mktemp("two-ranks") / "out"
    _llama([*on_the_dataset(dataset), *CURVE, *RESUMABLE], 2, out)
    return out


@pytest.mark.slow
@SHARES_DATASET
def test_the_same_global_batch_on_1_2_and_4_ranks_gives_the_same_loss_curve(dataset, two_ranks,
                                                                            tmp_path):
    curves = {ranks: _llama([*on_the_dataset(dataset), *CURVE], ranks, tmp_path / f"r{ranks}")
              for ranks in (1, 4)}
    curves[2] = steps(two_ranks)
    for ranks, records in curves.items():
        assert [r["loss"] for r in records] == pytest.approx(
            [r["loss"] for r in curves[1]], rel=2e-4, abs=2e-4), ranks
        assert [r["val_loss"] for r in records if "val_loss" in r] == pytest.approx(
            [r["val_loss"] for r in curves[1] if "val_loss" in r], rel=2e-4, abs=2e-4)
    assert [r["step"] for r in curves[1] if "val_loss" in r] == [2, 4, 5]
    config = json.loads((two_ranks / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert (config["config"]["global_batch"], config["config"]["accumulation"]) == (16, 2)


def test_a_global_batch_the_ranks_cannot_split_evenly_is_refused():
    """The trainer's own check (llama3 refuses its ValueError with exit 2 before it trains, as
    test_pretrained's test_a_checkpoint_of_another_shape_is_refused_naming_the_field shows)."""
    from mmm_orch.runtime.data import GlobalBatch

    for rank in (0, 1):  # every rank finds the same
        with pytest.raises(ValueError, match="--global-batch 12 is not a multiple of batch_size "
                                             "4 x 2 data-parallel ranks = 8"):
            GlobalBatch.of(12, 4, 2, rank)
    assert GlobalBatch.of(16, 4, 2, 1).accumulation == 2


@pytest.mark.slow
@SHARES_DATASET
def test_a_run_stopped_on_2_ranks_and_resumed_on_1_sees_every_window_once_per_epoch(
        dataset, two_ranks, tmp_path):
    import shutil

    from mmm_orch.runtime.dataset import TokenDataset

    windows = TokenDataset(dataset, seq_len=64, vocab_size=256).windows
    total = math.ceil(2.5 * windows / 16)  # steps of 16 samples: past two epochs
    out = tmp_path / "out"
    shutil.copytree(two_ranks, out)  # ended at step 5 with its checkpoint
    assert sorted(p.name for p in (out / "run" / "checkpoints").iterdir()) == ["latest", "step-5"]
    resumed = _llama([*on_the_dataset(dataset), *RESUMABLE, "--steps", str(total), "--resume"],
                     1, out)
    assert [r["step"] for r in resumed] == list(range(1, total + 1))
    assert sorted(p.name for p in (out / "run" / "checkpoints").iterdir()) == \
        ["latest", f"step-{total}"]

    lines = [json.loads(line) for f in sorted((out / "run" / "samples").iterdir())
             for line in f.read_text().splitlines()]
    samples = sorted(s for line in lines for s in line["samples"])
    assert samples == list(range(total * 16))  # every sample once: none repeated, none skipped
    by_epoch: dict[int, list[int]] = {}
    for line in lines:
        for sample, window in zip(line["samples"], line["windows"]):
            by_epoch.setdefault(sample // windows, []).append(window)
    for epoch in (0, 1):  # each complete epoch: each window exactly once
        assert sorted(by_epoch[epoch]) == list(range(windows)), epoch
    assert len(set(by_epoch[2])) == len(by_epoch[2])  # and the third, begun, repeats none
    assert math.isfinite(resumed[-1]["loss"])


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_tokenize_on_two_nodes_then_llama3_learns_below_the_unigram_entropy(isolated):
    """The issue's path on the live Slurm cluster: the `tokenize` workload across 2 nodes on a
    corpus written here, then llama3_debug (tiny) on 2 nodes reading it, validated on its
    held-out split."""
    import mmm_orch

    texts = corpus(1500, seed=1)
    (isolated / "corpus").mkdir()
    (isolated / "corpus" / "stories.txt").write_text("\n\n".join(texts))
    hf_tokenizer(isolated, texts)
    made = mmm_orch.submit("slurm-local", "tokenize", nodes=2, options={
        "input": "corpus", "tokenizer": "tokenizer.json", "out": "data", "val_fraction": 0.05})
    assert made.wait(timeout=300, poll=1).state == "completed", made.logs()
    manifest = json.loads((isolated / "data" / "manifest.json").read_text())
    assert manifest["ranks"] == 4 and manifest["splits"]["val"]["documents"] > 30

    counts = Counter(read_split(isolated / "data", "train"))
    total = sum(counts.values())
    unigram = -sum(c / total * math.log(c / total) for c in counts.values())  # nats, as the loss

    trained = mmm_orch.submit("slurm-local", "llama3_debug", nodes=2, options={
        "tiny": True, "dtype": "fp32", "data_path": "data", "steps": 80, "warmup_steps": 5,
        "global_batch": 16, "batch_size": 4, "eval_every": 40, "eval_samples": 32})
    assert trained.wait(timeout=600, poll=2).state == "completed", trained.logs()
    validated = [row["val_loss"] for row in trained.metrics() if "val_loss" in row]
    assert len(validated) == 2
    print(f"validation loss {validated} against the unigram entropy {unigram:.3f} nats")
    assert validated[-1] < 0.6 * unigram, (validated, unigram)
    rows = mmm_orch.report([trained], out=isolated / "report")
    assert rows[0]["val_loss"] == pytest.approx(validated[-1])
    assert (isolated / "report" / "loss.png").stat().st_size > 0


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_on_the_slurm_cluster_1_and_2_nodes_train_alike_and_a_run_moves_between_them(isolated):
    """Nodes, not only ranks: the same global batch on 1 node and on 2 gives the same curve, and
    a run stopped on 2 nodes and resumed on 1 trains on every sample once."""
    import mmm_orch

    texts = corpus(300, seed=2)
    (isolated / "corpus.txt").write_text("\n\n".join(texts))
    hf_tokenizer(isolated, texts)
    made = mmm_orch.submit("slurm-local", "tokenize", options={
        "input": "corpus.txt", "tokenizer": "tokenizer.json", "out": "data"})
    assert made.wait(timeout=300, poll=1).state == "completed", made.logs()

    common = {"tiny": True, "dtype": "fp32", "data_path": "data", "warmup_steps": 2,
              "global_batch": 16, "batch_size": 4}
    curves = {}
    for nodes in (1, 2):
        job = mmm_orch.submit("slurm-local", "llama3_debug", nodes=nodes,
                              options={**common, "steps": 6})
        assert job.wait(timeout=300, poll=1).state == "completed", job.logs()
        curves[nodes] = [row["loss"] for row in job.metrics()]
    assert len(curves[1]) == 6 and curves[2] == pytest.approx(curves[1], rel=2e-4, abs=2e-4)

    moving = {**common, "run_name": "moving", "log_sample_ids": True, "checkpoint_every": 5}
    first = mmm_orch.submit("slurm-local", "llama3_debug", nodes=2, options={**moving, "steps": 5})
    assert first.wait(timeout=300, poll=1).state == "completed", first.logs()
    second = mmm_orch.submit("slurm-local", "llama3_debug", nodes=1,
                             options={**moving, "steps": 12, "resume": True})
    assert second.wait(timeout=300, poll=1).state == "completed", second.logs()
    run = Path(second.record.run_dir)
    lines = [json.loads(line) for f in sorted((run / "samples").iterdir())
             for line in f.read_text().splitlines()]
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["dp-0.jsonl", "dp-1.jsonl",
                                                                    "dp-2.jsonl", "dp-3.jsonl"]
    assert sorted(s for line in lines for s in line["samples"]) == list(range(12 * 16))
