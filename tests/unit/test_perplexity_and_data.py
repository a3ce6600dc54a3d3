"""Perplexity against a hand-computed value; the corpus split; the HDR histogram."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.data.corpus import Batches, Corpus, load_text
from harness.eval.perplexity import cross_entropy_sum, perplexity
from harness.metrics.hdr import Histogram
from harness.model.tokenizer import ByteTokenizer
from testbed.errors import UsageError


class FixedModel(torch.nn.Module):
    """Vocabulary 3. Whatever the input, logits [0, ln 2, ln 3]: p = [1/6, 2/6, 3/6]."""

    def forward(self, input_ids):
        logits = torch.log(torch.tensor([1.0, 2.0, 3.0])).expand(*input_ids.shape, 3)
        return SimpleNamespace(logits=logits)


def test_perplexity_matches_a_hand_computed_value():
    tokens = torch.tensor([0, 1, 2, 2, 0, 1, 2])  # 6 predicted tokens: 1, 2, 2, 0, 1, 2
    # cross-entropy: -ln p(target): ln 3 + ln 2 + ln 2 + ln 6 + ln 3 + ln 2
    expected_sum = 2 * math.log(3) + 3 * math.log(2) + math.log(6)
    # seq_len 4: one full window (4 targets) and a short one (2 targets), each token once
    total, count = cross_entropy_sum(FixedModel(), tokens, seq_len=4)
    assert count == 6
    assert total == pytest.approx(expected_sum, rel=1e-6)
    assert perplexity(FixedModel(), tokens, seq_len=4) == pytest.approx(
        math.exp(expected_sum / 6), rel=1e-6)
    # token-weighted, not a mean of window means:
    window_means = [(math.log(3) + 2 * math.log(2) + math.log(6)) / 4,
                    (math.log(3) + math.log(2)) / 2]
    assert perplexity(FixedModel(), tokens, seq_len=4) != pytest.approx(
        math.exp(sum(window_means) / 2), rel=1e-6)


def test_default_corpus_split_is_deterministic_and_per_rank():
    text, source = load_text()
    assert source == "pydoc_data.topics" and len(text) > 400_000
    a = Corpus.build(text, ByteTokenizer(), source, seq_len=128)
    b = Corpus.build(text, ByteTokenizer(), source, seq_len=128)
    assert torch.equal(a.heldout, b.heldout)
    assert abs(len(a.heldout) / (len(a.train) + len(a.heldout)) - 0.1) < 1e-3
    regions = [a.region(r, 4) for r in range(4)]
    assert sum(len(x) for x in regions) == len(a.train)
    first = Batches(a, 1, 4, batch=2, seq_len=16, seed=7).next()
    again = Batches(a, 1, 4, batch=2, seq_len=16, seed=7).next()
    other = Batches(a, 2, 4, batch=2, seq_len=16, seed=7).next()
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])
    assert torch.equal(first[0][:, 1:], first[1][:, :-1])  # targets are inputs shifted


def test_too_short_heldout_split_is_refused():
    with pytest.raises(UsageError, match="fewer than one sequence"):
        Corpus.build("x" * 500, ByteTokenizer(), "short", seq_len=128)


def test_hdr_histogram_percentiles_within_one_percent():
    h = Histogram()
    for v in range(1, 10001):
        h.record(float(v))
    assert h.percentile(50) == pytest.approx(5000, rel=0.01)
    assert h.percentile(99) == pytest.approx(9900, rel=0.01)
    assert h.percentile(99.9) == pytest.approx(9990, rel=0.01)
    merged = Histogram.from_dict(h.to_dict()).merge(h)
    assert merged.total == 20000 and merged.percentile(50) == pytest.approx(5000, rel=0.01)


def test_latencies_below_one_read_back_as_themselves_and_zero_as_zero():
    from harness.metrics.hdr import Histogram

    h = Histogram()
    for _ in range(200):
        h.record(0.5)
    assert abs(h.percentile(50) - 0.5) <= 0.005  # was 0.0: values below 1 shared zero's bucket
    zero = Histogram()
    zero.record(0.0)
    assert zero.percentile(50) == 0.0
    # and they survive a round trip through the record
    assert abs(Histogram.from_dict(h.to_dict()).percentile(99) - 0.5) <= 0.005


def test_a_percentile_too_few_samples_back_is_not_reported():
    from harness.metrics.hdr import Histogram

    h = Histogram()
    for v in range(1, 11):
        h.record(float(v))
    s = h.summary()
    assert s["p50"] is not None and s["p99"] is None and s["p999"] is None and s["max"] == 10
    for _ in range(90):
        h.record(1.0)
    assert h.summary()["p99"] is not None and h.summary()["p999"] is None
