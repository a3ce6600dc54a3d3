"""Perplexity: exp of the token-weighted mean cross-entropy over the held-out split.

The held-out tokens are cut into consecutive windows; every predicted token counts once.
The sum of the per-token losses is divided by the number of tokens, so a short last window
weighs what its tokens weigh (not the mean of window means).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def cross_entropy_sum(model, tokens: torch.Tensor, seq_len: int, max_tokens: int | None = None,
                      batch: int = 16) -> tuple[float, int]:
    """(sum of per-token cross-entropies in nats, number of tokens predicted)."""
    if max_tokens is not None:
        tokens = tokens[:max_tokens + 1]
    device = next((p.device for p in model.parameters()), torch.device("cpu")) \
        if hasattr(model, "parameters") else torch.device("cpu")
    tokens = tokens.to(device)
    full = (len(tokens) - 1) // seq_len
    groups = [tokens[:full * seq_len + 1].unfold(0, seq_len + 1, seq_len)] if full else []
    tail = tokens[full * seq_len:]
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        batches = [g[i:i + batch] for g in groups for i in range(0, len(g), batch)]
        if len(tail) >= 2:  # a shorter last window: its tokens count like all others
            batches.append(tail.unsqueeze(0))
        for windows in batches:
            inputs, targets = windows[:, :-1], windows[:, 1:]
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   targets.reshape(-1), reduction="sum")
            total += float(loss)
            count += targets.numel()
    finally:
        model.train(was_training)
    return total, count


def perplexity(model, tokens: torch.Tensor, seq_len: int, max_tokens: int | None = None) -> float:
    total, count = cross_entropy_sum(model, tokens, seq_len, max_tokens)
    return math.exp(total / count)
