"""Iso-progress: a lossy run's final perplexity as a number of its reference's steps.

The reference (reliable, lossless, same seed and steps) records its held-out perplexity
every few steps (TrainConfig.progress_every) and scores its final model after the last one.
A lossy run that ends at perplexity p made the progress the reference had made at the first
step k where the reference's curve reached p (interpolated in log-perplexity between the
recorded points); it is N - k steps behind. A lossy run at or below the reference's final
perplexity is 0 steps behind: the curve ends at N, and nothing past it was measured.

What a user reads from it: "at 10% loss this variant needs about that many more steps (of
N) to reach what reliable reached", a cost in training time the ±band verdict does not give.
"""

from __future__ import annotations

import math
import statistics


def steps_behind(curve: list, final_step: int, final_ppl: float, ppl: float) -> float | None:
    """How many steps before `final_step` the reference's curve ([step, ppl] pairs during
    training, then (final_step, final_ppl)) first reached `ppl`; None without a curve, or
    when the curve never came down to `ppl` within its first point (more than its span)."""
    if not curve:
        return None
    points = sorted((int(s), float(p)) for s, p in curve if s < final_step)
    points.append((final_step, final_ppl))
    if ppl <= final_ppl:
        return 0.0
    if ppl > points[0][1]:
        return None  # above the curve's first point: further behind than it measures
    for (s0, p0), (s1, p1) in zip(points, points[1:], strict=False):
        if p0 >= ppl >= p1:  # the first segment that comes down through ppl
            if p0 == p1:
                return float(final_step - s0)
            at = (math.log(p0) - math.log(ppl)) / (math.log(p0) - math.log(p1))
            return float(final_step - (s0 + at * (s1 - s0)))
    return None


def row_progress(runs: list[dict], refs: dict, reference: str) -> dict:
    """A row's iso-progress: per seed, the steps its run is behind the same seed's
    reference, and their mean (None where no seed's reference recorded a curve)."""
    behind = {}
    for r in runs:
        ref = refs.get((reference, r["seed"]))
        if not ref or not ref.get("progress_steps") or r.get("ppl") is None:
            continue
        b = steps_behind(ref["progress_steps"], ref["steps"], ref["ppl"], r["ppl"])
        behind[r["seed"]] = b
    known = [b for b in behind.values() if b is not None]
    return {"steps_behind": statistics.fmean(known) if known and len(known) == len(behind)
            else None,
            "steps_behind_of": runs[0].get("steps") if runs else None,
            "steps_behind_by_seed": {str(s): b for s, b in sorted(behind.items())},
            "steps_behind_beyond": sorted(s for s, b in behind.items() if b is None)}
