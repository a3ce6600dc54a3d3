"""Which model is measured, named.

Under loss the ranks' models differ, so "the model's perplexity" needs a name. After a run
every rank scores its own model on the held-out windows (in parallel), and rank 0 also
scores the rank-averaged model (one no rank holds: averaged reliably, for reference) and,
for `unbiased_drift`, the owners' model (each shard as its owner holds it: the parameters
the owners broadcast). A variant's headline is the model that variant trains:

    reliable        rank 0's own (every rank holds the same model)
    zero_fill,      the ranks' own models, mean (worst beside it): replicas that never
    unbiased, rps   re-synchronise are what a user of these variants has
    unbiased_drift  the owners' model
"""

from __future__ import annotations

import math

import torch

from harness import variants
from harness.collectives import process_group
from harness.collectives.layout import Layout
from harness.eval.perplexity import Score, evaluate

# which model is each variant's: harness/variants.py (its `headline`)
HEADLINE = {name: kind.headline for name, kind in variants.TABLE.items()}


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])


def load_flat(model, values: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(values[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def owners_model(own: torch.Tensor, models: list[torch.Tensor], world: int,
                 per_packet: int) -> torch.Tensor:
    """The owners' model: each shard as its owner holds it (unbiased_drift's reference)."""
    layout = Layout(own.numel(), world, per_packet)
    assembled = own.clone()
    for owner in range(world):
        start, end = layout.shard_bounds(owner)
        assembled[start:end] = models[owner][start:end]
    return assembled


def replica_distance(r, variant: str, model, per_packet: int) -> float | None:
    """During training (every rank calls it: it gathers over the process group): the
    largest L2 distance of a rank's replica from the model the variant bounds it by, the
    owners' (unbiased_drift) or the ranks' mean (the others). Rank 0 returns it."""
    own = flat(model)
    models = process_group.all_gather(own)
    if r.rank != 0:
        return None
    return largest_distance(models, variant, per_packet)


def largest_distance(models: list[torch.Tensor], variant: str, per_packet: int) -> float:
    """The largest L2 distance of the ranks' flat models (rank order) from the model the
    variant bounds them by: the owners' (unbiased_drift) or the ranks' mean."""
    target = (owners_model(models[0], models, len(models), per_packet)
              if variants.of(variant).bounded_by_owners else torch.stack(models).mean(dim=0))
    return max(float((m - target).norm()) for m in models)


def heldout_ppl(r, model, windows, token_bytes) -> float:
    """During training, of a model every rank holds alike (reliable): its held-out perplexity,
    each rank scoring its share of the windows (every rank calls it: it gathers)."""
    mine = evaluate(model, windows[r.rank::r.world], token_bytes)
    parts = process_group.all_gather(torch.tensor([mine.ce_sum, mine.tokens, mine.bytes],
                                                  dtype=torch.float64))
    total = torch.stack(parts).sum(dim=0)
    return Score(float(total[0]), int(total[1]), int(total[2])).ppl


def measure(r, variant: str, model, windows, token_bytes, eval_tokens: int | None,
            per_packet: int) -> dict | None:
    """Every rank calls this after training (it gathers over the process group); rank 0
    returns the scores of every model named above, the headline, and the ranks' drift."""
    own = flat(model)
    models = process_group.all_gather(own)
    mine = evaluate(model, windows, token_bytes, eval_tokens)
    scores = process_group.all_gather(torch.tensor([mine.ce_sum, mine.tokens, mine.bytes],
                                                   dtype=torch.float64))
    if r.rank != 0:
        return None
    ranks = [Score(float(s[0]), int(s[1]), int(s[2])) for s in scores]
    average = torch.stack(models).mean(dim=0)
    drift = max(float((m - average).norm()) for m in models)
    load_flat(model, average)
    averaged = evaluate(model, windows, token_bytes, eval_tokens)
    owners = None
    if variants.of(variant).bounded_by_owners:
        load_flat(model, owners_model(own, models, r.world, per_packet))
        owners = evaluate(model, windows, token_bytes, eval_tokens)
    load_flat(model, own)
    ppls = [s.ppl for s in ranks]
    mean_ce = sum(s.ce_per_token for s in ranks) / len(ranks)
    by_name = {"rank0": ranks[0], "average": averaged, "owners": owners}
    headline = HEADLINE[variant]
    score = by_name.get(headline)
    result = {
        "headline": headline,
        "ppl_ranks": ppls, "ppl_rank0": ppls[0],
        # the ranks' mean cross-entropy, as a perplexity (the geometric mean of theirs)
        "ppl_rank_mean": math.exp(mean_ce),
        "ppl_rank_worst": max(ppls), "ppl_average_model": averaged.ppl,
        "ppl_owners": owners.ppl if owners else None,
        "drift": drift, "eval_tokens": ranks[0].tokens,
        "bytes_per_token": ranks[0].bytes_per_token,
    }
    if headline == "rank_mean":
        result.update(ppl=result["ppl_rank_mean"], ce_per_token=mean_ce)
    else:
        result.update(ppl=score.ppl, ce_per_token=score.ce_per_token)
    result["bits_per_byte"] = result["ce_per_token"] / math.log(2) / result["bytes_per_token"]
    return result
