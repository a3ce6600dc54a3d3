"""Tokens: subword tokens by default (byte-level BPE, as LLaMA-style models use, so
perplexity is per subword token like the papers'), bytes, or an HF tokenizer from a local
folder. Specs: "bpe" (DEFAULT_BPE_VOCAB tokens), "bpe:N", "bytes", or a folder path.

The BPE is trained with Hugging Face `tokenizers` on the training split only (never on the
held-out text) and cached under the project's .cache/tokenizers/, keyed by a hash of that
text and the vocabulary size: every rank and every run of a corpus uses the same one, and
training it again gives the same file (the trainer is deterministic).

Every tokenizer knows how many bytes of text each of its tokens stands for (token_bytes), so
a per-token result converts to bits per byte and back.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from testbed.errors import UsageError

DEFAULT_BPE_VOCAB = 2048
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "tokenizers"
SPEC_HELP = "Use bpe (the default), bpe:N (N tokens, 256 < N <= 65536), bytes, or a folder"


class ByteTokenizer:
    name = "bytes"
    vocab_size = 256
    token_bytes = np.ones(256, dtype=np.int64)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE writes every byte as one printable character (GPT-2's table): the
    character -> the byte it stands for."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_level_sizes(vocab: dict[str, int], size: int) -> np.ndarray | None:
    """Bytes per token of a byte-level vocabulary (one character per byte: see above), or
    None if some token has a character that stands for no byte."""
    alphabet = _byte_alphabet()
    sizes = np.zeros(size, dtype=np.int64)
    for token, index in vocab.items():
        if not all(ch in alphabet for ch in token):
            return None
        sizes[index] = len(token)
    return sizes


class BPETokenizer:
    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name
        self.vocab_size = inner.get_vocab_size()
        self.token_bytes = _byte_level_sizes(inner.get_vocab(), self.vocab_size)
        assert self.token_bytes is not None, "a byte-level BPE writes bytes as characters"

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text).ids

    def decode(self, ids) -> str:
        return self.inner.decode([int(i) for i in ids])

    @classmethod
    def trained_on(cls, text: str, vocab: int) -> BPETokenizer:
        from tokenizers import Tokenizer

        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        name = f"bpe{vocab}-{key}"
        path = CACHE / f"{name}.json"
        if path.is_file():
            return cls(Tokenizer.from_file(str(path)), name)
        inner = _train(text, vocab)
        try:  # several ranks of one machine may train at once: whole files only
            CACHE.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            inner.save(str(tmp))
            os.replace(tmp, path)
        except Exception:  # noqa: BLE001 - the tokenizers library's own, for an OSError
            pass  # a cache this user cannot write to (a read-only checkout, a Slurm job's
            # user in root's): train again next time
        return cls(inner, name)


def _train(text: str, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    inner = Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    inner.train_from_iterator(text.split("\n\n"), trainer)
    return inner


class HFTokenizer:
    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self.inner = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.name = f"hf:{path}"
        self.vocab_size = len(self.inner)
        # a byte-level vocabulary (a BPE lossbed trained and saved, GPT-2's) counts exactly,
        # also tokens that are part of a character; any other: as each token decodes alone
        self.token_bytes = _byte_level_sizes(self.inner.get_vocab(), self.vocab_size)
        if self.token_bytes is None:
            self.token_bytes = np.array([len(self.inner.decode([i]).encode())
                                         for i in range(self.vocab_size)], dtype=np.int64)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.inner.decode(list(ids))


def _bpe_vocab(spec: str) -> int | None:
    if spec == "bpe":
        return DEFAULT_BPE_VOCAB
    if spec.startswith("bpe:"):
        try:
            vocab = int(spec[4:])
        except ValueError:
            vocab = 0
        if not 256 < vocab <= 65536:
            raise UsageError("--tokenizer", f"{spec!r}: the vocabulary must be 257..65536",
                             SPEC_HELP)
        return vocab
    return None


def check(spec: str | None) -> None:
    """Refuse a spec that names no tokenizer, before anything starts."""
    spec = spec or "bpe"
    if spec == "bytes" or _bpe_vocab(spec) is not None:
        return
    if not Path(spec).is_dir():
        raise UsageError("--tokenizer", f"{spec!r} is not a tokenizer", SPEC_HELP +
                         " saved with save_pretrained()")


def load(spec: str | None, train_text: str):
    """The tokenizer `spec` names; a BPE is trained on (or cached for) `train_text`."""
    spec = spec or "bpe"
    check(spec)
    if spec == "bytes":
        return ByteTokenizer()
    vocab = _bpe_vocab(spec)
    if vocab is not None:
        return BPETokenizer.trained_on(train_text, vocab)
    return HFTokenizer(spec)


def describe(tok) -> dict:
    return {"tokenizer": tok.name, "vocab_size": tok.vocab_size}
