"""The corpus: text that ships with Python by default (pydoc_data.topics, ~466 KB), a text
file, or an HF dataset from the local cache (real clusters; nothing is downloaded).

The split is deterministic: the last `heldout_fraction` of the tokens is held out for
perplexity, the rest is cut into one contiguous region per rank, from which each rank draws
its own random windows (seeded by run seed and rank: the same data order for every variant
of a paired comparison).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from testbed.errors import UsageError

HELDOUT_FRACTION = 0.1


def load_text(corpus: str | None = None, hf_dataset: str | None = None,
              hf_split: str = "train", hf_text_field: str = "text") -> tuple[str, str]:
    """(text, where it came from)."""
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
        return text, str(path)
    if hf_dataset:
        return _hf_text(hf_dataset, hf_split, hf_text_field), f"hf:{hf_dataset}"
    from pydoc_data.topics import topics

    return "".join(topics[k] for k in sorted(topics)), "pydoc_data.topics"


def _hf_text(name: str, split: str, field: str) -> str:
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
    text = "\n".join(data[field])
    if not text.strip():
        raise UsageError("--hf-dataset", f"{name} has no text", "Choose another dataset")
    return text


@dataclass
class Corpus:
    train: torch.Tensor
    heldout: torch.Tensor
    source: str

    @classmethod
    def build(cls, text: str, tokenizer, source: str, seq_len: int,
              heldout_fraction: float = HELDOUT_FRACTION) -> Corpus:
        tokens = torch.tensor(tokenizer.encode(text), dtype=torch.long)
        cut = int(len(tokens) * (1 - heldout_fraction))
        corpus = cls(train=tokens[:cut], heldout=tokens[cut:], source=source)
        if len(corpus.heldout) < seq_len + 1:
            raise UsageError("--seq-len", f"the held-out split of {source} has "
                             f"{len(corpus.heldout)} tokens, fewer than one sequence "
                             f"({seq_len} + 1)", "Use a larger corpus or a shorter --seq-len")
        return corpus

    def region(self, rank: int, world: int) -> torch.Tensor:
        n = len(self.train)
        return self.train[rank * n // world:(rank + 1) * n // world]


class Batches:
    """Random windows from one rank's region, in an order fixed by (seed, rank)."""

    def __init__(self, corpus: Corpus, rank: int, world: int, batch: int, seq_len: int,
                 seed: int):
        self.tokens = corpus.region(rank, world)
        if len(self.tokens) < seq_len + 2:
            raise UsageError("--seq-len", f"rank {rank}'s share of the training text has "
                             f"{len(self.tokens)} tokens, fewer than one sequence",
                             "Use fewer hosts, a larger corpus or a shorter --seq-len")
        self.batch, self.seq_len = batch, seq_len
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + rank)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (self.batch,),
                               generator=self.generator)
        windows = torch.stack([self.tokens[s:s + self.seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]
