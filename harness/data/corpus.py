"""The corpus: text that ships with Python by default (pydoc_data.topics, ~466 KB), a text
file, or an HF dataset from the local cache (real clusters; nothing is downloaded).

Text comes as documents (a paragraph of the default corpus or of a text file; a row of an HF
dataset). The held-out split is chosen by a seeded hash of each document, not by position,
so it is spread over the whole corpus; its windows are then checked against the training
text and any window that also occurs there verbatim is dropped, so perplexity never scores
text the model trained on. The record carries a hash of the corpus and of the split.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from testbed.errors import UsageError

HELDOUT_FRACTION = 0.1
SPLIT_SEED = b"lossbed held-out split v1"


def load_documents(corpus: str | None = None, hf_dataset: str | None = None,
                   hf_split: str = "train",
                   hf_text_field: str = "text") -> tuple[list[str], str]:
    """(documents, where they came from)."""
    if corpus and hf_dataset:
        raise UsageError("--corpus", "both --corpus and --hf-dataset are given",
                         "Choose one source of text")
    if corpus:
        path = Path(corpus)
        if not path.is_file():
            raise UsageError("--corpus", f"no file {path}", "Give a text file that exists")
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            raise UsageError("--corpus", f"{path} is empty", "Give a file with text in it")
        return paragraphs(text), str(path)
    if hf_dataset:
        rows = _hf_rows(hf_dataset, hf_split, hf_text_field)
        return [r for r in rows if r.strip()], f"hf:{hf_dataset}"
    from pydoc_data.topics import topics

    return [p for key in sorted(topics) for p in paragraphs(topics[key])], "pydoc_data.topics"


def paragraphs(text: str) -> list[str]:
    """Documents of a plain text: its paragraphs (separated by blank lines)."""
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def _hf_rows(name: str, split: str, field: str) -> list[str]:
    import os

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the local cache only
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise UsageError("--hf-dataset", "the datasets package is missing",
                         "pip install datasets (make setup does)") from None
    try:
        if Path(name).is_dir():
            loaded = datasets.load_from_disk(name)
            data = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            data = datasets.load_dataset(name, split=split)
    except Exception as err:
        raise UsageError("--hf-dataset", f"{name!r} is not in the local cache ({err})",
                         "Download it beforehand (datasets.load_dataset on a machine with "
                         "network, or save_to_disk and give the folder)") from None
    if field not in data.column_names:
        raise UsageError("--hf-text-field", f"the dataset has no column {field!r}",
                         f"Use one of: {', '.join(data.column_names)}")
    rows = list(data[field])
    if not any(r.strip() for r in rows):
        raise UsageError("--hf-dataset", f"{name} has no text", "Choose another dataset")
    return rows


@dataclass
class Split:
    """Documents divided into training and held-out text by a seeded hash of each."""

    train_text: str
    heldout_text: str
    corpus_sha: str   # of every document, in order
    split_sha: str    # of which documents are held out

    @classmethod
    def of(cls, documents: list[str], heldout_fraction: float = HELDOUT_FRACTION) -> Split:
        corpus = hashlib.sha256()
        chosen = hashlib.sha256()
        train, heldout = [], []
        draws = []
        for doc in documents:
            data = doc.encode()
            corpus.update(len(data).to_bytes(8, "little") + data)
            digest = hashlib.blake2b(data, key=SPLIT_SEED, digest_size=8).digest()
            draws.append(int.from_bytes(digest, "little") / 2**64)
        if len(documents) < 2:
            raise UsageError("corpus", f"{len(documents)} document: nothing to hold out",
                             "Give a corpus of several paragraphs (or rows)")
        threshold = heldout_fraction
        if not any(u < threshold for u in draws):  # few documents: hold out the lowest
            threshold = min(draws) + 1e-12
        for i, (doc, u) in enumerate(zip(documents, draws, strict=True)):
            (heldout if u < threshold else train).append(doc)
            if u < threshold:
                chosen.update(i.to_bytes(8, "little"))
        return cls("\n\n".join(train), "\n\n".join(heldout), corpus.hexdigest()[:16],
                   chosen.hexdigest()[:16])


def window_hashes(tokens: np.ndarray, length: int) -> np.ndarray:
    """A 64-bit hash of every window of `length` tokens (polynomial, wrapping uint64
    arithmetic): window i is tokens[i:i+length]. Equal windows hash equal; a collision of
    different windows has odds of about 2^-64 per pair."""
    base = np.uint64(1_000_003)
    n = len(tokens) - length + 1
    if n <= 0:
        return np.zeros(0, np.uint64)
    t = tokens.astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        h = np.zeros(n, np.uint64)
        for j in range(length):  # length passes over all windows at once
            h = h * base + t[j:j + n]
    return h


@dataclass
class Corpus:
    train: torch.Tensor        # the training text's tokens, one stream
    heldout: torch.Tensor      # [windows, seq_len + 1]: none occurs verbatim in training
    source: str
    corpus_sha: str
    split_sha: str
    heldout_dropped: int       # windows dropped because training has them verbatim

    @classmethod
    def build(cls, split: Split, tokenizer, source: str, seq_len: int) -> Corpus:
        train = np.asarray(tokenizer.encode(split.train_text), dtype=np.int64)
        held = np.asarray(tokenizer.encode(split.heldout_text), dtype=np.int64)
        width = seq_len + 1
        count = (len(held) - 1) // seq_len
        if count < 1:
            raise UsageError("--seq-len", f"the held-out split of {source} has {len(held)} "
                             f"tokens, fewer than one sequence ({seq_len} + 1)",
                             "Use a larger corpus or a shorter --seq-len")
        windows = np.stack([held[i * seq_len:i * seq_len + width] for i in range(count)])
        seen = set(window_hashes(train, width).tolist())
        mine = [int(h) for h in window_hashes(windows.reshape(-1), width)[::width]] \
            if count else []
        keep = np.array([h not in seen for h in mine], dtype=bool)
        if not keep.any():
            raise UsageError("corpus", f"every held-out window of {source} also occurs in "
                             "its training text", "Use a corpus with less repeated text")
        return cls(train=torch.from_numpy(train), heldout=torch.from_numpy(windows[keep]),
                   source=source, corpus_sha=split.corpus_sha, split_sha=split.split_sha,
                   heldout_dropped=int((~keep).sum()))


def prepare(documents: list[str], source: str, tokenizer_spec: str | None,
            seq_len: int) -> tuple[object, Corpus]:
    """(tokenizer, corpus): the split, the tokenizer (a BPE trained on the training split
    alone), and the tokens of both splits."""
    from harness.model import tokenizer as tokenizers

    split = Split.of(documents)
    tok = tokenizers.load(tokenizer_spec, split.train_text)
    return tok, Corpus.build(split, tok, source, seq_len)
