"""Perplexity: exp of the token-weighted mean cross-entropy over the held-out windows.

The held-out split is a set of windows of seq_len + 1 tokens (harness.data.corpus; none of
them occurs verbatim in training); every token after a window's first is predicted once.
The sum of the per-token losses is divided by the number of tokens. The bytes those tokens
stand for are counted too, so a score converts between tokens and bytes:
bits per byte = cross-entropy per token / ln 2 / bytes per token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Score:
    ce_sum: float   # nats, over every predicted token
    tokens: int
    bytes: int      # of text the predicted tokens stand for

    @property
    def ce_per_token(self) -> float:
        return self.ce_sum / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.ce_per_token)

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens

    @property
    def bits_per_byte(self) -> float:
        return self.ce_sum / math.log(2) / self.bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "ce_per_token": self.ce_per_token, "ppl": self.ppl,
                "bytes_per_token": self.bytes_per_token, "bits_per_byte": self.bits_per_byte}


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, token_bytes, max_tokens: int | None = None,
             batch: int = 16) -> Score:
    """The model's score on `windows` ([n, seq_len + 1]); with max_tokens, on the first
    windows holding that many predicted tokens."""
    if max_tokens:
        windows = windows[:max(1, math.ceil(max_tokens / (windows.shape[1] - 1)))]
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    sizes = torch.as_tensor(token_bytes, dtype=torch.long)
    was_training = model.training
    model.eval()
    total, tokens, nbytes = 0.0, 0, 0
    try:
        for i in range(0, len(windows), batch):
            chunk = windows[i:i + batch]
            inputs, targets = chunk[:, :-1].to(device), chunk[:, 1:]
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   targets.to(device).reshape(-1), reduction="sum")
            total += float(loss)
            tokens += targets.numel()
            nbytes += int(sizes[targets].sum())
    finally:
        model.train(was_training)
    return Score(total, tokens, nbytes)


def perplexity(model, windows: torch.Tensor, token_bytes, max_tokens: int | None = None
               ) -> float:
    return evaluate(model, windows, token_bytes, max_tokens).ppl
