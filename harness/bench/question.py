"""The question a bench asks, fixed before its runs: which Δppl, in which regime, against
which band, by which test, and when it stops. The bench prints it when it starts, writes it
to question.json before the first run, and prints it again with the answer (summary.json's
`question`): what was decided cannot be moved after the numbers are seen.

The stopping rule is a fixed sample: every seed asked for is run and the interval is looked
at once, after all of them. With one look the test's 95% level is spent once; interim looks
(stopping at 4 seeds if the interval already clears an edge, else going on) would each spend
part of it, and the bench does not make them.
"""

from __future__ import annotations

from harness.bench.spec import PILOT_SEEDS, BenchSpec, base_variant, reference_variant
from harness.metrics import verdict


def question(spec: BenchSpec) -> dict:
    """The bench's question as it is written before its runs."""
    lossy = [x for x in spec.losses if x > 0]
    against = []
    for v in spec.variants:
        if base_variant(v) == "reliable":
            continue
        mine = spec.resolved_text(v)
        ref = reference_variant(mine)
        against.append(f"{mine} against {'its own lossless run' if ref == mine else ref}")
    first, last = spec.seed_list[0], spec.seed_list[-1]
    seeds = f"seed {first}" if first == last else f"seeds {first}-{last}"
    pilots = spec.pilot_seeds_used
    seeds += (f" (pilot seeds {', '.join(map(str, pilots))} among them: not a confirmation of "
              "the choices they made)" if pilots else
              f" (confirmatory: none of the pilot seeds {', '.join(map(str, PILOT_SEEDS))} "
              "that chose the defaults)")
    rule = (f"fixed sample: {spec.seeds} seed(s), one look after all of them (no interim "
            "looks, no early stop: the level is spent once)")
    losses = ", ".join(f"{x:.0%}" for x in lossy) or "no loss"
    text = (f"at {losses} ({spec.profile}), is each lossy variant's final held-out perplexity "
            f"within ±{spec.band_pct:g}% of the same seed's lossless run "
            f"({'; '.join(against) or 'no lossy variant'})? regime {spec.regime_text}; "
            f"{seeds}, one loss realisation each; test: {verdict.test_text(spec.band_pct)}; "
            f"stopping rule: {rule}")
    return {"text": text, "regime": spec.regime, "band_pct": spec.band_pct,
            "test": verdict.test_text(spec.band_pct), "seeds": spec.seeds,
            "seed_list": spec.seed_list, "pilot_seeds": list(PILOT_SEEDS),
            "pilot_seeds_used": pilots,
            "losses": lossy, "stopping_rule": rule}
