"""Perplexity against a hand-computed value; the HDR histogram."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.eval.perplexity import evaluate, perplexity
from harness.metrics.hdr import Histogram


class FixedModel(torch.nn.Module):
    """Vocabulary 3. Whatever the input, logits [0, ln 2, ln 3]: p = [1/6, 2/6, 3/6]."""

    def forward(self, input_ids):
        logits = torch.log(torch.tensor([1.0, 2.0, 3.0])).expand(*input_ids.shape, 3)
        return SimpleNamespace(logits=logits)


def test_perplexity_matches_a_hand_computed_value():
    windows = torch.tensor([[0, 1, 2, 2, 0], [0, 1, 2, 2, 2]])  # 8 predicted tokens
    # -ln p(target) for targets 1, 2, 2, 0 and 1, 2, 2, 2
    expected = (math.log(3) + 2 * math.log(2) + math.log(6)) + (math.log(3) + 3 * math.log(2))
    score = evaluate(FixedModel(), windows, token_bytes=[1, 2, 3])
    assert score.tokens == 8 and score.ce_sum == pytest.approx(expected, rel=1e-6)
    assert score.ppl == pytest.approx(math.exp(expected / 8), rel=1e-6)
    assert perplexity(FixedModel(), windows, [1, 2, 3]) == pytest.approx(score.ppl)
    # bytes of the predicted tokens: 2+3+3+1 + 2+3+3+3
    assert score.bytes == 20 and score.bytes_per_token == 2.5
    assert score.bits_per_byte == pytest.approx(expected / math.log(2) / 20)
    # max_tokens takes whole windows from the front
    assert evaluate(FixedModel(), windows, [1, 2, 3], max_tokens=4).tokens == 4


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


def test_a_histogram_is_hdrhistograms_and_an_old_record_is_refused_by_name():
    # the buckets are the hdrhistogram package's (its encoding in the record); a record of
    # lossbed's old hand-made buckets says what wrote it instead of reading as empty
    h = Histogram()
    h.record(1234.5)
    assert set(h.to_dict()) == {"hdr", "total", "max", "min"}
    with pytest.raises(ValueError, match="'hdr'"):
        Histogram.from_dict({"counts": {"100": 1}, "total": 1, "max": 1.0, "min": 1.0})
    with pytest.raises(ValueError, match="hang"):
        h.record(4e9)  # over an hour in µs
    assert Histogram.from_dict(Histogram().to_dict()).summary()["count"] == 0


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


def test_histograms_written_apart_merge_into_one_and_read_in_milliseconds():
    from harness.metrics.hdr import Histogram

    ranks = []
    for rank in range(4):  # each rank 50 steps of 1000 µs, rank 3 one of 9000 µs more
        h = Histogram()
        for _ in range(50):
            h.record(1000.0)
        if rank == 3:
            h.record(9000.0)
        ranks.append(h.to_dict())
    merged = Histogram.merged(ranks)
    assert merged.total == 201
    ms = merged.summary_ms()
    assert ms["count"] == 201 and ms["max"] == 9.0
    assert abs(ms["p50"] - 1.0) < 0.01 and ms["p999"] is None
    assert Histogram.merged([]).summary_ms() == {"p50": None, "p99": None, "p999": None,
                                                 "max": None, "count": 0}
