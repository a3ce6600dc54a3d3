"""Byte-level tokens by default (no download: a token is a byte, vocabulary 256), or an HF
tokenizer from a local folder."""

from __future__ import annotations

from pathlib import Path

from testbed.errors import UsageError


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self.inner = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.vocab_size = len(self.inner)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.inner.decode(list(ids))


def load(path: str | None):
    if path is None:
        return ByteTokenizer()
    if not Path(path).is_dir():
        raise UsageError("--tokenizer", f"no tokenizer folder {path}",
                         "Give a local folder saved with save_pretrained(), or leave it out "
                         "for byte-level tokens")
    return HFTokenizer(path)
