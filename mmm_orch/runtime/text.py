"""Text in, token ids out: the tokenizers a user points at and the documents of a corpus.

Tokenizers (the format found from the file, nothing downloaded):
- a Hugging Face `tokenizer.json` (or a directory holding one): the `tokenizers` package;
- a tiktoken BPE file (lines of `<base64 token> <rank>`), such as Llama 3's `tokenizer.model`:
  Llama 3's split pattern and its 256 special tokens after the base vocabulary, BOS
  <|begin_of_text|> and EOS <|end_of_text|> first among them (meta-llama/llama3,
  llama/tokenizer.py);
- a SentencePiece model (any other file): the `sentencepiece` package, its own BOS and EOS.

Documents: `.txt`/`.md` files are split at blank lines (a paragraph is a document), `.jsonl`
files give one document per line (the field `text_field`), `.parquet` files one per row (the
column `text_field`). A directory stands for the files in it, in name order. A document may
have at most MAX_DOCUMENT_CHARS characters (8 Mi): the tokenizers take ~150 bytes of memory per
character of one document (a 200 MB one ran the Hugging Face tokenizer out of memory), and real
documents (a book, an article, a source file) stay far below it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mmm_orch.paths import NotReadable, read_regular

# meta-llama/llama3, llama/tokenizer.py: Tokenizer.pat_str and num_reserved_special_tokens.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIAL_TOKENS = 256
# Names Hugging Face tokenizers give their document markers, most common first.
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
TEXT_SUFFIXES = (".txt", ".md")
MAX_DOCUMENT_CHARS = 8 << 20
# A JSON line holds one document, escaped (\uXXXX: 6 characters for one), and other fields.
MAX_JSON_LINE_CHARS = 8 * MAX_DOCUMENT_CHARS
# The largest published tokenizer files are ~35 MB (Gemma 3's tokenizer.json): a bigger one is
# not a tokenizer, and would be read whole into memory.
MAX_TOKENIZER_BYTES = 128 << 20
INPUT_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".parquet")


class TextError(ValueError):
    """A corpus or tokenizer that cannot be read as asked; the message names the file and fix."""


@dataclass(frozen=True)
class Tokenizer:
    kind: str  # huggingface, tiktoken, sentencepiece
    path: str
    sha256: str
    vocab_size: int
    bos_id: int | None  # None: the tokenizer has no BOS; documents start without one
    eos_id: int
    encode: Callable[[str], list[int]]

    def document(self, text: str) -> list[int]:
        """A document's ids between its BOS (where there is one) and its EOS."""
        return (
            ([self.bos_id] if self.bos_id is not None else []) + self.encode(text) + [self.eos_id]
        )

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "path": self.path,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }


def load_tokenizer(path: str, eos: str = "", bos: str = "") -> Tokenizer:
    """The tokenizer in `path`; `eos`/`bos` name a Hugging Face tokenizer's markers when they
    are not among the usual names."""
    file = Path(path)
    if file.is_dir():  # a model directory: Hugging Face's file, else Meta's tiktoken model
        found = [file / name for name in ("tokenizer.json", "tokenizer.model")]
        file = next((f for f in found if f.exists()), found[0])
    try:  # (a FIFO is refused unread, a file past the bound unread whole)
        data = read_regular(file, MAX_TOKENIZER_BYTES)
    except FileNotFoundError:
        raise TextError(
            f"tokenizer {path!r}: no such file (a tokenizer.json, a tiktoken BPE file "
            "such as Llama 3's tokenizer.model, or a SentencePiece model)"
        ) from None
    except NotReadable as exc:
        raise TextError(f"tokenizer {path!r}: {exc}") from None
    except OSError as exc:
        raise TextError(f"tokenizer {path!r}: cannot read it: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if file.suffix == ".json":
        return _huggingface(file, data, digest, eos, bos)
    if re.match(rb"[A-Za-z0-9+/=]+ \d+\r?\n", data[:4096]):
        return _tiktoken(file, data, digest)
    return _sentencepiece(file, data, digest)


def _huggingface(file: Path, data: bytes, digest: str, eos: str, bos: str) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer  # optional: only for tokenizer.json

    try:
        tokenizer = HFTokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - the tokenizers package raises bare Exception
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TextError(f"tokenizer {file}: not a Hugging Face tokenizer.json ({reason})") from None

    def marker(given: str, names: tuple[str, ...], what: str) -> int | None:
        for name in (given,) if given else names:
            found = tokenizer.token_to_id(name)
            if found is not None:
                return found
        if given:
            raise TextError(f"tokenizer {file}: no token {given!r} for the {what}")
        return None

    eos_id = marker(eos, EOS_NAMES, "end of a document")
    if eos_id is None:
        raise TextError(
            f"tokenizer {file}: none of {', '.join(EOS_NAMES)} is in its vocabulary: "
            "name its end-of-document token with --eos-token"
        )
    return Tokenizer(
        "huggingface",
        str(file.resolve()),
        digest,
        tokenizer.get_vocab_size(True),
        marker(bos, BOS_NAMES, "start of a document"),
        eos_id,
        lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
    )


def _tiktoken_ranks(file: Path, data: bytes) -> dict[bytes, int]:
    """The token -> rank table of a tiktoken BPE file, checked line by line: tiktoken itself
    panics or overflows on a repeated rank or one past 2**32, and Llama 3's layout needs the ranks
    to be 0..n-1, each once (its special tokens take the ids after them)."""
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for number, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank_text = line.split()
            if not rank_text.isdigit():
                raise ValueError(rank_text)
            token_bytes, rank = base64.b64decode(token, validate=True), int(rank_text)
        except (ValueError, binascii.Error):
            raise TextError(
                f"tokenizer {file}: line {number} is not `<base64 token> <rank>`: "
                "not a tiktoken BPE file"
            ) from None
        if token_bytes in ranks or rank in seen:
            raise TextError(
                f"tokenizer {file}: line {number} repeats a token or rank ({rank}) "
                "of an earlier line: each must appear once"
            )
        ranks[token_bytes] = rank
        seen.add(rank)
    largest = max(seen)
    if largest >= len(ranks):
        raise TextError(
            f"tokenizer {file}: rank {largest} with {len(ranks)} tokens: the ranks "
            f"must be 0 to {len(ranks) - 1}, each once"
        )
    missing = next((b for b in range(256) if bytes([b]) not in ranks), None)
    if missing is not None:  # tiktoken's encoder panics (in Rust) on a byte it has no token for
        raise TextError(
            f"tokenizer {file}: no token for the byte {missing:#04x}: a byte-level BPE file "
            "holds each of the 256 bytes as a token"
        )
    return ranks


def _tiktoken(file: Path, data: bytes, digest: str) -> Tokenizer:
    import tiktoken  # optional: only for a tiktoken BPE file

    ranks = _tiktoken_ranks(file, data)
    base = len(ranks)
    names = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(LLAMA3_SPECIAL_TOKENS - 2)
    ]
    encoding = tiktoken.Encoding(
        name=file.stem,
        pat_str=LLAMA3_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={n: base + i for i, n in enumerate(names)},
    )
    # Text that spells a special token is text: encode it as such, never as the marker.
    return Tokenizer(
        "tiktoken",
        str(file.resolve()),
        digest,
        base + LLAMA3_SPECIAL_TOKENS,
        base,
        base + 1,
        lambda text: encoding.encode(text, disallowed_special=()),
    )


def _sentencepiece(file: Path, data: bytes, digest: str) -> Tokenizer:
    import sentencepiece  # optional: only for a SentencePiece model

    try:
        model = sentencepiece.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, OSError) as exc:
        raise TextError(
            f"tokenizer {file}: not a tokenizer.json, tiktoken BPE file or "
            f"SentencePiece model ({exc})"
        ) from None
    if model.eos_id() < 0:
        raise TextError(f"tokenizer {file}: this SentencePiece model has no EOS piece")
    return Tokenizer(
        "sentencepiece",
        str(file.resolve()),
        digest,
        model.get_piece_size(),
        model.bos_id() if model.bos_id() >= 0 else None,
        model.eos_id(),
        lambda text: model.encode(text),
    )


def input_files(inputs: list[str]) -> list[Path]:
    """The corpus's files, directories expanded in name order; each must be a known format."""
    files: list[Path] = []
    for given in inputs:
        path = Path(given)
        if path.exists() and not (path.is_dir() or path.is_file()):  # a FIFO would hang the read
            raise TextError(f"input {given!r}: not a regular file or directory")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in INPUT_SUFFIXES and p.is_file())
            if not found:
                raise TextError(f"input {given!r}: no {', '.join(INPUT_SUFFIXES)} files in it")
            files += found
        elif path.is_file():
            if path.suffix not in INPUT_SUFFIXES:
                raise TextError(
                    f"input {given!r}: suffix {path.suffix or '(none)'!r}; allowed: "
                    f"{', '.join(INPUT_SUFFIXES)}"
                )
            files.append(path)
        else:
            raise TextError(f"input {given!r}: no such file or directory")
    return files


def documents(files: list[Path], text_field: str = "text") -> Iterator[str]:
    """Every document of the corpus, in order (files in the order given), read a line at a time
    so that no more than a bounded document is held (TextError past MAX_DOCUMENT_CHARS)."""
    for file in files:
        if file.suffix in TEXT_SUFFIXES:
            yield from _paragraphs(file)
        elif file.suffix == ".jsonl":
            with open(file, encoding="utf-8") as handle:
                number = 0
                while line := handle.readline(MAX_JSON_LINE_CHARS + 2):
                    number += 1
                    if len(line.rstrip("\n")) > MAX_JSON_LINE_CHARS:
                        raise TextError(
                            f"{file}:{number}: a line of more than "
                            f"{MAX_JSON_LINE_CHARS} characters; {_TOO_LONG}"
                        )
                    if line.strip():
                        yield _bounded(
                            _field(_json(line, f"{file}:{number}"), text_field, f"{file}:{number}"),
                            f"{file}:{number}",
                        )
        else:
            import pyarrow.parquet as pq  # optional: only for .parquet inputs

            table = pq.ParquetFile(file)
            if text_field not in table.schema_arrow.names:
                raise TextError(
                    f"{file}: no column {text_field!r} (columns: "
                    f"{', '.join(table.schema_arrow.names)}); name it with --text-field"
                )
            row = 0
            for chunk in table.iter_batches(columns=[text_field]):
                for text in chunk.column(0).to_pylist():
                    row += 1
                    if text:
                        yield _bounded(text, f"{file}: row {row}")


_TOO_LONG = (
    f"a document may have at most {MAX_DOCUMENT_CHARS} characters (the tokenizer needs "
    "~150 bytes of memory per character): split it"
)


def _bounded(text: str, where: str) -> str:
    if len(text) > MAX_DOCUMENT_CHARS:
        raise TextError(f"{where}: a document of {len(text)} characters; {_TOO_LONG}")
    return text


def _paragraphs(file: Path) -> Iterator[str]:
    """The blank-line-separated documents of a text file (a line of whitespace is blank)."""
    with open(file, encoding="utf-8", errors="replace") as handle:
        lines: list[str] = []
        size, number = 0, 1
        # A line longer than a document comes in pieces (readline's limit): never held whole.
        while line := handle.readline(MAX_DOCUMENT_CHARS + 1):
            if line.strip() or not line.endswith("\n"):
                lines.append(line)
                size += len(line)
                if size > MAX_DOCUMENT_CHARS:
                    raise TextError(
                        f"{file}: document {number} has more than "
                        f"{MAX_DOCUMENT_CHARS} characters; {_TOO_LONG}"
                    )
                continue
            if text := "".join(lines).strip():
                yield text
                number += 1
            lines, size = [], 0
        if text := "".join(lines).strip():
            yield text


def _json(line: str, where: str) -> object:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise TextError(f"{where}: not a JSON line ({type(exc).__name__}: {exc})") from None


def _field(row: object, name: str, where: str) -> str:
    if not isinstance(row, dict) or not isinstance(row.get(name), str):
        raise TextError(f"{where}: no text field {name!r}; name it with --text-field")
    return row[name]
