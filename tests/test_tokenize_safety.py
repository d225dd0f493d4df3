"""`tokenize` and the token dataset against bad input and bad luck: corrupt tokenizer files, bad
options and output directories, runs that fail midway (a full disk, an oversized document, a
corrupt line) or are killed at each step of replacing a dataset, and damaged manifests and shards.
Each refusal is one line with exit 2 (ValueError for the reader), and leaves the old dataset
whole and nothing else behind."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import ctypes
import resource
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.text import corpus, hf_tokenizer
from helpers.training import launch

from mmm_orch.runtime.dataset import DatasetError, TokenDataset, replacement_dirs
from mmm_orch.runtime.text import MAX_DOCUMENT_CHARS, MAX_TOKENIZER_BYTES
from mmm_orch.trainers import tokenize


def run_tokenize(args: list[str], cwd: Path, **options) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-m", "mmm_orch.trainers.tokenize", *args],
                          capture_output=True, text=True, timeout=180, cwd=cwd,
                          env={**env, "OMP_NUM_THREADS": "1", **options.pop("env", {})}, **options)


def refused_in_process(args: list[str], capsys) -> str:
    """The one line `tokenize` refuses `args` with, run here (it refuses before it starts the
    process group)."""
    with pytest.raises(SystemExit) as stopped:
        tokenize.main(args)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("[tokenize] error: "), err
    return err


def tree(root: Path) -> dict[str, str]:
    """Every path under root with its SHA-256 (others by their kind: a FIFO is never read)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if stat.S_ISREG(p.lstat().st_mode) else stat.filemode(p.lstat().st_mode)[0]
            for p in sorted(root.rglob("*"))}


# The tests that read the corpora below share them: one worker makes them once.
SHARES_CORPORA = pytest.mark.xdist_group("tokenize-corpora")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A tokenizer, two corpora (old.txt, new.txt) and a dataset made from old.txt."""
    root = tmp_path_factory.mktemp("corpora")
    texts = corpus(200, seed=3)
    (root / "old.txt").write_text("\n\n".join(texts[:100]))
    (root / "new.txt").write_text("\n\n".join(texts[100:]))
    hf_tokenizer(root, texts)
    made = run_tokenize(["--input", "old.txt", "--tokenizer", "tokenizer.json", "--out",
                         "old-dataset", "--val-fraction", "0.1"], root)
    assert made.returncode == 0, made.stderr
    return root


def made_from(root: Path) -> str:
    """The corpus a dataset was made from, once it is checked whole: its files are its manifest
    and the shards it lists, each with its SHA-256, and the reader opens it."""
    manifest = json.loads((root / "manifest.json").read_text())
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    assert {p.name for p in root.iterdir()} == {"manifest.json", *(s["file"] for s in shards)}
    for shard in shards:
        assert hashlib.sha256((root / shard["file"]).read_bytes()).hexdigest() == shard["sha256"]
    TokenDataset(root, seq_len=8, vocab_size=manifest["tokenizer"]["vocab_size"])
    return Path(manifest["inputs"][0]).name


TIKTOKEN_HEAD = "QUJD 0\nQUJE 1\n"  # base64 of b"ABC", b"ABD"


@pytest.mark.timeout(60)  # a FIFO read would hang
@pytest.mark.parametrize("name,content,message", [
    ("tokenizer.json", "hello {", "not a Hugging Face tokenizer.json (expected value"),
    ("tokenizer.json", "{}", "not a Hugging Face tokenizer.json (Model missing"),
    ("tokenizer.json", '{"model": {"type": "BPE", "vocab": [1, 2]}}',
     "not a Hugging Face tokenizer.json (invalid type"),
    ("tokenizer.json", "[" * 100_000 + "]" * 100_000, "not a Hugging Face tokenizer.json"),
    ("tokenizer.json", None, f"bytes, above the {MAX_TOKENIZER_BYTES} this file may have"),
    ("tokenizer.model", TIKTOKEN_HEAD + "!!!! 2\n", "line 3 is not `<base64 token> <rank>`"),
    ("tokenizer.model", TIKTOKEN_HEAD + "QUJF -2\n", "line 3 is not `<base64 token> <rank>`"),
    ("tokenizer.model", TIKTOKEN_HEAD + "QUJF 1\n", "line 3 repeats a token or rank (1)"),
    ("tokenizer.model", TIKTOKEN_HEAD + "QUJD 2\n", "line 3 repeats a token or rank (2)"),
    ("tokenizer.model", TIKTOKEN_HEAD + f"QUJF {2 ** 40}\n",
     f"rank {2 ** 40} with 3 tokens: the ranks must be 0 to 2, each once"),
    ("tokenizer.model", "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n"
                                for b in range(255)),  # no token for the byte 0xff
     "no token for the byte 0xff: a byte-level BPE file holds each of the 256 bytes"),
    ("tokenizer.model", "\x00\x01 not a model", "not a tokenizer.json, tiktoken BPE file or "
                                                 "SentencePiece model"),
    ("tokenizer.model", "fifo", "not a regular file"),
], ids=["not-json", "empty-object", "wrong-schema", "deeply-nested", "too-big",
        "tiktoken-garbage", "tiktoken-negative-rank", "tiktoken-repeated-rank",
        "tiktoken-repeated-token", "tiktoken-huge-rank", "tiktoken-missing-byte",
        "sentencepiece-garbage", "fifo"])
def test_a_corrupt_tokenizer_is_refused_on_one_line_before_anything_is_written(
        tmp_path, capsys, name, content, message):
    (tmp_path / "c.txt").write_text("\n\n".join(corpus(5)))
    tokenizer_file = tmp_path / name
    if content is None:  # sparse: its size is what is refused, before a byte is read
        tokenizer_file.touch()
        os.truncate(tokenizer_file, MAX_TOKENIZER_BYTES + 1)
    elif content == "fifo":
        os.mkfifo(tokenizer_file)
    else:
        tokenizer_file.write_text(content)
    before = tree(tmp_path)
    err = refused_in_process(["--input", str(tmp_path / "c.txt"), "--tokenizer",
                              str(tokenizer_file), "--out", str(tmp_path / "data")], capsys)
    assert f"tokenizer {tokenizer_file}" in err or f"tokenizer {str(tokenizer_file)!r}" in err, err
    assert message in err, err
    assert tree(tmp_path) == before


@pytest.mark.slow
@SHARES_CORPORA
@pytest.mark.timeout(60)  # a FIFO read would hang
@pytest.mark.parametrize("case,message", [
    ("unknown-option", "error: unrecognized arguments: --bogus 1 (see --help)"),
    ("bad-number", "error: argument --val-fraction: invalid float value: 'x' (see --help)"),
    ("input-a-fifo", "input.txt': not a regular file or directory"),
    ("under-a-file", "notes.txt is a file, not a directory"),
    ("a-fifo", "is not a directory"),
    ("foreign-files", "holds files that are not a dataset's (notes.txt): replacing it would "
                      "delete them"),
    ("dataset-without-overwrite", "already holds a dataset: pass --overwrite"),
])
def test_bad_options_inputs_and_output_directories_are_refused_on_one_line(
        corpora, tmp_path, capsys, case, message):
    (tmp_path / "notes.txt").write_text("mine")
    out = tmp_path / "data"
    if case == "a-fifo":
        os.mkfifo(out)
    elif case == "input-a-fifo":
        os.mkfifo(tmp_path / "input.txt")
    elif case == "foreign-files":
        shutil.copytree(corpora / "old-dataset", out)
        shutil.copy(tmp_path / "notes.txt", out)
    elif case == "dataset-without-overwrite":
        shutil.copytree(corpora / "old-dataset", out)
    corpus_file = tmp_path / "input.txt" if case == "input-a-fifo" else corpora / "new.txt"
    args = ["--input", str(corpus_file), "--tokenizer", str(corpora / "tokenizer.json"),
            "--out", str(tmp_path / "notes.txt" / "data") if case == "under-a-file" else str(out)]
    args += {"unknown-option": ["--bogus", "1"],
             "bad-number": ["--val-fraction", "x"]}.get(case, [])
    before = tree(tmp_path)
    assert message in refused_in_process(args, capsys)
    assert tree(tmp_path) == before


def _without_root_overrides() -> None:
    """Root writes anywhere: a child of root without the capabilities to (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH, dropped from the bounding set before exec) meets permissions as others
    do."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0):  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.slow
@SHARES_CORPORA
def test_a_read_only_output_directory_is_refused_on_one_line(corpora, tmp_path):
    (tmp_path / "locked").mkdir()
    os.chmod(tmp_path / "locked", 0o555)
    before = tree(tmp_path)
    proc = run_tokenize(["--input", str(corpora / "new.txt"), "--tokenizer",
                         str(corpora / "tokenizer.json"), "--out", "locked/data"], tmp_path,
                        preexec_fn=_without_root_overrides if os.geteuid() == 0 else None)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"[tokenize] error: --out 'locked/data': cannot write in "
                           f"{tmp_path.resolve() / 'locked'} (read-only, or not yours)\n")
    assert tree(tmp_path) == before


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # writes past 4 KiB: EFBIG


@pytest.mark.slow
@SHARES_CORPORA
@pytest.mark.parametrize("case,message", [
    ("full-disk", "--out 'datasets/data': cannot write the dataset: File too large"),
    ("full-disk-new-directories", "--out 'datasets/a/b/data': cannot write the dataset: File "
                                  "too large"),
    ("long-document", f"document 2 has more than {MAX_DOCUMENT_CHARS} characters; a document "
                      f"may have at most {MAX_DOCUMENT_CHARS} characters"),
    ("deeply-nested-json-line", "huge.jsonl:2: not a JSON line (RecursionError"),
])
def test_a_run_that_fails_midway_leaves_the_old_dataset_and_nothing_else(corpora, tmp_path,
                                                                         case, message):
    """A full disk (a file-size limit: writes fail as on a full disk, with EFBIG), a document
    past the bound (the tokenizer would need GBs), a line JSON cannot parse: each found after
    the run started writing."""
    datasets = tmp_path / "datasets"
    shutil.copytree(corpora / "old-dataset", datasets / "data")
    corpus_file, out, options = corpora / "new.txt", "datasets/data", {}
    if case.startswith("full-disk"):
        options = {"preexec_fn": _limit_file_size}
        out = "datasets/a/b/data" if case == "full-disk-new-directories" else out
    elif case == "long-document":
        corpus_file = tmp_path / "huge.txt"
        corpus_file.write_text("short one\n\n" + "x" * (MAX_DOCUMENT_CHARS + 1) + "\n")
    else:
        corpus_file = tmp_path / "huge.jsonl"
        corpus_file.write_text('{"text": "fine"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    before = tree(datasets)
    proc = run_tokenize(["--input", str(corpus_file), "--tokenizer",
                         str(corpora / "tokenizer.json"), "--out", out, "--overwrite"],
                        tmp_path, **options)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert tree(datasets) == before  # the old dataset, and nothing beside it
    assert made_from(datasets / "data") == "old.txt"


# Run in a process of its own: imports once, then forks a tokenize that SIGKILLs itself before
# its k-th change to the file system (os.mkdir/rename/unlink/rmdir/fsync: the real call is made
# until then), for k = 1, 2, ... until one finishes. Before each, the directory `datasets` is
# reset to the old dataset alone; after each kill it is copied to snapshots/K-killed, and for
# each new kind of leftover a whole run follows (snapshots/K-recovered).
KILLER = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    import torch.distributed, tokenizers
    from mmm_orch.runtime import dist
    from mmm_orch.trainers import tokenize

    work, args = Path(sys.argv[1]), sys.argv[2:]
    datasets, snapshots = work / "datasets", work / "snapshots"

    def run(kill_before):
        pid = os.fork()
        if pid == 0:
            changes = 0
            def counted(real):
                def call(*a, **k):
                    nonlocal changes
                    changes += 1
                    if changes == kill_before:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*a, **k)
                return call
            for name in ("mkdir", "rename", "replace", "unlink", "rmdir", "fsync"):
                setattr(os, name, counted(getattr(os, name)))
            try:
                code = tokenize.main(args)
            except SystemExit as exc:
                code = exc.code
            dist.exit_process(code)
        return os.waitpid(pid, 0)[1]

    recovered = set()
    for k in range(1, 100):
        shutil.rmtree(datasets, ignore_errors=True)
        shutil.copytree(work / "old-dataset", datasets / "data")
        status = run(k)
        if not os.WIFSIGNALED(status):
            assert os.WEXITSTATUS(status) == 0, status
            shutil.copytree(datasets, snapshots / f"{k:02d}-finished")
            break
        shutil.copytree(datasets, snapshots / f"{k:02d}-killed")
        leftover = tuple(sorted(os.listdir(datasets)))
        if leftover not in recovered:
            recovered.add(leftover)
            assert run(0) == 0
            shutil.copytree(datasets, snapshots / f"{k:02d}-recovered")
""")


@pytest.mark.slow
@SHARES_CORPORA
def test_a_replacement_killed_at_any_step_leaves_one_whole_dataset(corpora, tmp_path):
    shutil.copytree(corpora / "old-dataset", tmp_path / "old-dataset")
    out = tmp_path / "datasets" / "data"
    new_dir, aside = (p.name for p in replacement_dirs(out))
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(tmp_path), "--input", str(corpora / "new.txt"),
         "--tokenizer", str(corpora / "tokenizer.json"), "--out", str(out), "--overwrite",
         "--val-fraction", "0.1"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = set()
    for snapshot in sorted((tmp_path / "snapshots").iterdir()):
        entries = {p.name for p in snapshot.iterdir()}
        if snapshot.name.endswith("-killed") and "data" not in entries:
            # Killed between the two renames: the old dataset whole aside, the new one whole.
            assert entries == {aside, new_dir}
            assert (made_from(snapshot / aside), made_from(snapshot / new_dir)) == \
                ("old.txt", "new.txt")
            with pytest.raises(DatasetError, match=f"the old dataset is in {snapshot / aside}, "
                                                   "and running tokenize again restores it"):
                TokenDataset(snapshot / "data", seq_len=8, vocab_size=1000)
            seen.add("between the renames")
        elif snapshot.name.endswith("-killed"):
            which = made_from(snapshot / "data")
            seen.add(which)
            assert entries <= {"data", new_dir if which == "old.txt" else aside}, entries
        else:  # a whole run, after a kill or at the end: the new dataset alone
            assert entries == {"data"} and made_from(snapshot / "data") == "new.txt", snapshot
    assert seen == {"old.txt", "between the renames", "new.txt"}, seen
    assert len(list((tmp_path / "snapshots").glob("*-recovered"))) >= 3


def write_dataset(root: Path, ids: list[int], manifest_changes=None, max_token_id=None) -> Path:
    """A dataset written here, byte for byte as tokenize writes one: a train and a val shard of
    `ids` (uint16), and a manifest (changed by `manifest_changes`)."""
    root.mkdir()
    data = np.array(ids, dtype=np.uint16).tobytes()
    shards = {}
    for split in ("train", "val"):
        (root / f"{split}-00000.bin").write_bytes(data)
        shards[split] = {"tokens": len(ids), "documents": 1, "shards": [
            {"file": f"{split}-00000.bin", "tokens": len(ids), "documents": 1,
             "max_id": max(ids), "sha256": hashlib.sha256(data).hexdigest()}]}
    manifest = {"format": "mmm-orch-tokens/1", "dtype": "uint16",
                "tokenizer": {"kind": "huggingface", "vocab_size": 200, "bos_id": 1, "eos_id": 2},
                "max_token_id": max(ids) if max_token_id is None else max_token_id,
                "splits": shards}
    manifest = manifest_changes(manifest) if manifest_changes else manifest
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (root / "manifest.json").write_text(text)
    return root


def _set(path: str, value):
    """A change to one field of a manifest ("a.b.0.c" = manifest["a"]["b"][0]["c"])."""
    def change(manifest):
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        target = manifest
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
        return manifest
    return change


SHARD = "splits.train.shards.0"


@pytest.mark.timeout(60)  # a FIFO read would hang
@pytest.mark.parametrize("change,message", [
    (lambda m: [m], "manifest.json: the manifest is a list: a JSON object expected"),
    (lambda m: "{", "manifest.json: unreadable: JSONDecodeError"),
    (lambda m: "[" * 100_000 + "]" * 100_000, "manifest.json: unreadable: RecursionError"),
    (_set("splits", KeyError), "manifest.json: splits is missing: a JSON object of splits "
                               "expected"),
    (_set("dtype", "int8"), "manifest.json: dtype is 'int8': uint16 or uint32 expected"),
    (_set("tokenizer.vocab_size", "200"), "manifest.json: tokenizer.vocab_size is '200': a whole "
                                          "number from 1 expected"),
    (_set("max_token_id", True), "manifest.json: max_token_id is True: a whole number from 0"),
    (_set(f"{SHARD}.tokens", "64"), "manifest.json: splits.train.shards[0].tokens is '64': a "
                                    "whole number from 1 expected"),
    (_set(f"{SHARD}.tokens", 64.0), "splits.train.shards[0].tokens is 64.0: a whole number"),
    (_set(f"{SHARD}.file", "../../etc/passwd"), "splits.train.shards[0].file is "
                                                "'../../etc/passwd': a shard's name"),
    (_set("splits.train", []), "manifest.json: splits.train is []: a JSON object expected"),
    ("ids-past-the-manifest", "token id 300 is past the largest its manifest says (99; the "
                              "model's vocabulary has 256 ids): the dataset is damaged, tokenize "
                              "again"),
    ("fifo-shard", "train-00000.bin: not a regular file"),
    ("fifo-manifest", "manifest.json: not a regular file"),
], ids=["a-list", "not-json", "deeply-nested", "no-splits", "dtype-int8", "vocab-a-string",
        "max-id-a-bool", "tokens-a-string", "tokens-a-float", "file-outside", "split-a-list",
        "ids-past-the-manifest", "fifo-shard", "fifo-manifest"])
def test_a_damaged_dataset_is_refused_naming_the_file_and_field(tmp_path, change, message):
    ids = [i % 100 for i in range(64)]
    if change == "ids-past-the-manifest":
        root = write_dataset(tmp_path / "data", ids[:5] + [300] + ids[6:], max_token_id=99)
    else:
        root = write_dataset(tmp_path / "data", ids, None if isinstance(change, str) else change)
    if change == "fifo-shard":
        (root / "train-00000.bin").unlink()
        os.mkfifo(root / "train-00000.bin")
    elif change == "fifo-manifest":
        (root / "manifest.json").unlink()
        os.mkfifo(root / "manifest.json")
    with pytest.raises(DatasetError) as refused:
        # (a manifest that lies about its ids is found by the batch that reads them)
        TokenDataset(root, seq_len=8, vocab_size=256).batch(torch.arange(7))
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert str(refused.value).startswith(str(root)), str(refused.value)


@pytest.mark.slow
def test_llama3_refuses_a_dataset_with_ids_past_its_vocabulary_in_one_line(tmp_path):
    """The QA report's case: ids past the vocabulary failed with IndexError in the first step
    (a manifest that lies: found by the first batch that reads them; one in every window)."""
    root = write_dataset(tmp_path / "data", [300 if i % 32 == 5 else i % 100 for i in range(4096)],
                         max_token_id=99)
    proc = launch("llama3", ["--tiny", "--vocab-size", "256", "--data-path", str(root),
                             "--steps", "1"], 1, "python", tmp_path / "out", timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"[llama3] error: {root}: token id 300 is past the largest its manifest says (99; the "
        "model's vocabulary has 256 ids): the dataset is damaged, tokenize again"], \
        proc.stderr[-3000:]


def test_a_refusal_before_the_process_group_is_said_by_the_first_rank_alone(
        tmp_path, capsys, monkeypatch):
    """Every rank checks the options before the process group; under torchrun's N ranks the
    job's log holds the one line of rank 0, not N copies."""
    args = ["--input", str(tmp_path / "missing.txt"), "--tokenizer", str(tmp_path / "t.json"),
            "--out", str(tmp_path / "data")]
    said = {}
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(SystemExit) as stopped:
            tokenize.main(args)
        assert stopped.value.code == 2
        said[rank] = capsys.readouterr().err
    assert said["1"] == "", said
    assert said["0"].startswith("[tokenize] error: input ") and said["0"].count("\n") == 1, said
    assert not (tmp_path / "data").exists()
