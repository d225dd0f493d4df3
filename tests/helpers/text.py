"""Text for the tokenizer and the text dataset's tests: documents from a small grammar, and a
tokenizer trained on them here (nothing is downloaded)."""

from __future__ import annotations

import random
from pathlib import Path

ADJECTIVES = ["red", "big", "small", "happy", "old", "quick"]
NOUNS = ["cat", "dog", "bird", "fox", "child", "horse"]
VERBS = ["sees", "chases", "finds", "likes"]


def corpus(documents: int, seed: int = 0) -> list[str]:
    """Documents of sentences from a small grammar: predictable word order, so a model that
    learns from the data does much better than the words' frequencies alone."""
    rng = random.Random(seed)
    texts = []
    for _ in range(documents):
        sentences = [f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
                     f"{rng.choice(NOUNS)}." for _ in range(rng.randint(2, 6))]
        texts.append(" ".join(sentences))
    return texts


def hf_tokenizer(directory: Path, texts: list[str], vocab: int = 96) -> Path:
    """A BPE tokenizer of `vocab` tokens trained on `texts`, saved as `directory`/tokenizer.json
    (Hugging Face's format)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"]))
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    return path
