"""What each row of `lossbed reproduce` tests (#65): the papers' claim it is about, and
whether its test is that claim as stated, a weaker or a stronger one, or lossbed's own.

The claims are the papers' as lossbed states them (docs/explanation/methodology.md and the
design's summary of arXiv 2507.07114 and arXiv 1810.07766), in their words where a row
tests a sentence the paper states as such ("the harm of the drop rate shrinks as servers
are added"). A row's `tests` starts with one of STRENGTHS, a colon, and what exactly it tests:

    the claim    the test is the claim as the paper states it: "holds" means the paper's
                 sentence was shown here
    weaker       the test asks less than the sentence (a bound instead of a trend, a
                 formula's prediction instead of the training outcome): "holds" does not
                 show the sentence, and the row says what it shows instead
    stronger     the test asks more than the sentence (a reading of it as a scaling law)
    lossbed's    no paper states it: a control, a baseline, or beyond the papers
"""

from __future__ import annotations

UNBIASED = ("2507.07114: unbiased gradient aggregation, each owner rebuilding a gradient "
            "estimate from whatever packets arrive, correct in expectation")
BOUNDED = ("2507.07114: with bounded-drift parameter broadcasts the spread between the "
           "workers' models stays O(1) over any number of steps")
BAND = ("2507.07114: at 10% random loss, perplexity changes by at most 0.8% (LLaMA2-7B, 64 "
        "GPUs)")
SHRINKS = "1810.07766: the harm of the drop rate shrinks as the number of servers grows"
CONVERGES = "1810.07766: RPS under loss converges like reliable training"
NONE = "none: lossbed's own"

# what the regime map's rows, and the trend rows of rows 7 and 8, test (each said once)
REGIME_MAP = "lossbed's: the regime map (where the band holds)"
TREND = ("the claim: as stated, the paired decrease from the smallest to the largest n, "
         "shown by a one-sided test")
BOUND = ("weaker: the harm did not grow by more than 0.4 points (holds also where nothing "
         "shrank)")

# row -> (the claim it is about, what its test is)
SENTENCES: dict[str, tuple[str, str]] = {
    "1a": (UNBIASED, "the claim: its mechanism, each element the mean of what arrived"),
    "1b": (UNBIASED, "the claim: for identically distributed contributions"),
    "1c": (NONE, "lossbed's: received-mean's bias where the ranks' means differ, from "
                 "1b's formula"),
    "1d": (UNBIASED, "the claim: for any contributions (rescale)"),
    "1e": (NONE, "lossbed's: the zero-fill baseline's bias"),
    "1f": (NONE, "lossbed's: what every rank holds after the broadcast"),
    "2a": (BOUNDED, "the claim: the drift's growth exponent 0, its stationary value from "
                    "the formula"),
    "2b": (NONE, "lossbed's: a control, without broadcasts the drift grows like a "
                 "random walk"),
    "3a": (SHRINKS, "weaker: one step's added variance against the formula, not training"),
    "3b": (SHRINKS, "stronger: a reading of the sentence as 1/n scaling"),
    "3c": (NONE, "lossbed's: the formula's limit at large n"),
    "4a": (BAND, "the claim: its band at this model's size, Δppl of unbiased_drift within "
                 "±0.8%"),
    "4b": (CONVERGES, "the claim: read as Δppl within ±0.8% of reliable SGD"),
    "4c": (NONE, "lossbed's: the band applied to other loss rates (the curve)"),
    "4d": (NONE, "lossbed's: burst loss, beyond both papers (they assume independent loss)"),
    "4e": (BOUNDED, "the claim: in training, the drift's growth exponent at most 0.25"),
    "5": (UNBIASED, "weaker: what each part of the scheme buys, each against the band"),
    "6a": (NONE, REGIME_MAP),
    "6b": (NONE, REGIME_MAP),
    "6c": (NONE, REGIME_MAP),
    "6d": (BAND, "the claim: its band in the regime closest to the paper's runs "
                 "(fine-tuning)"),
    "6c-resync": (NONE, "lossbed's: the mitigation curve"),
    "7a": (CONVERGES, "the claim: read as Δppl within ±0.8% of reliable SGD at each n"),
    "7b": (SHRINKS, TREND),
    "7c": (SHRINKS, BOUND),
    "8a": (BAND, "the claim: its band at n = 4 to 64 (many-rank mode)"),
    "8b": (CONVERGES, "the claim: read as Δppl within ±0.8% of reliable SGD at each n "
                      "(many-rank mode)"),
    "8c": (SHRINKS, TREND + " (many-rank mode)"),
    "8d": (SHRINKS, BOUND),
}


STRENGTHS = ("the claim", "weaker", "stronger", "lossbed's")


def about(row: str) -> dict:
    """The row's claim and the strength of its test, for reproduction.json and .md."""
    if row not in SENTENCES:
        raise KeyError(f"reproduce row {row!r} names no claim: add it to "
                       "harness/reproduce/sentences.py")
    sentence, tests = SENTENCES[row]
    return {"paper_claim": sentence, "tests": tests}
