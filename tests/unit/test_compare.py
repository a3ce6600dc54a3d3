"""`lossbed compare BASE NEW`: regressions beyond noise, and summaries it cannot compare
refused with the reason. Pure Python: runs without root."""

from __future__ import annotations

import copy
import json

import pytest

from harness import cli
from harness.bench.compare import compare

SUMMARY = {"noise_floor_pct": 2.0, "rows": [
    {"loss": 0.1, "variant": "unbiased", "tokens_per_s": 10000.0, "step_p99_ms": 50.0,
     "step_max_ms": 80.0,
     "ppl_delta_pct": 1.0, "ppl_delta_ci95": 0.5,
     # its reference's chaos check, passed (without one no verdict is given)
     "reference": "reliable", "chaos_check": {"reference": "reliable", "stable": True}},
    {"loss": 0.1, "variant": "reliable", "tokens_per_s": 8000.0, "step_p99_ms": 400.0,
     "step_max_ms": 900.0,
     "ppl_delta_pct": 0.0, "ppl_delta_ci95": 0.0}]}


def test_compare_flags_a_20_percent_throughput_regression_and_passes_identical(tmp_path,
                                                                                  capsys):
    worse = copy.deepcopy(SUMMARY)
    worse["rows"][0]["tokens_per_s"] *= 0.8
    assert not any(f.regressed for f in compare(SUMMARY, SUMMARY))
    flagged = [f for f in compare(SUMMARY, worse) if f.regressed]
    assert [(f.variant, f.metric) for f in flagged] == [("unbiased", "tokens/s")]
    base, new, same = tmp_path / "base.json", tmp_path / "new.json", tmp_path / "same.json"
    base.write_text(json.dumps(SUMMARY))
    same.write_text(json.dumps(SUMMARY))
    new.write_text(json.dumps(worse))
    assert cli.main(["compare", str(base), str(same)]) == 0
    regressed = cli.main(["compare", str(base), str(new)])
    assert regressed == 1 and "REGRESSION" in capsys.readouterr().out
    # a perplexity change inside the noise floor is not a regression; beyond it, it is
    noisy = copy.deepcopy(SUMMARY)
    noisy["rows"][0]["ppl_delta_pct"] = 2.5
    assert not any(f.regressed for f in compare(SUMMARY, noisy))
    noisy["rows"][0]["ppl_delta_pct"] = 4.0
    assert any(f.metric == "Δppl %" and f.regressed for f in compare(SUMMARY, noisy))


def _row(**change):
    return {**SUMMARY["rows"][0], **change}


@pytest.mark.parametrize("content,words", [
    ("{not json", "is not a bench summary"),
    (b"\xff\xfe".decode("latin-1"), "is not a bench summary"),
    (json.dumps({"noise_floor_pct": 1}), "has no list of rows"),
    (json.dumps({"rows": [1]}), "rows[0] is not an object"),
    (json.dumps({"rows": [{"loss": 0.1, "variant": "x", "step_max_ms": 1}]}),
     "rows[0] has no 'tokens_per_s'"),
    (json.dumps({"rows": [_row(tokens_per_s=0)]}), "has tokens_per_s 0"),
    (json.dumps({"rows": [_row(step_p99_ms=-1)]}), "has step_p99_ms -1"),
])
def test_compare_refuses_a_summary_it_cannot_compare(tmp_path, capsys, content, words):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(SUMMARY))
    bad.write_text(content)
    for base, new in ((good, bad), (bad, good)):
        assert cli.main(["compare", str(base), str(new)]) == 2
        err = capsys.readouterr().err
        assert words in err and str(bad) in err and "Traceback" not in err, err


def test_with_too_few_steps_for_a_p99_the_tail_is_compared_by_its_maximum():
    few = copy.deepcopy(SUMMARY)
    for row in few["rows"]:
        row["step_p99_ms"] = None
    slower = copy.deepcopy(few)
    slower["rows"][0]["step_max_ms"] *= 1.5
    flagged = [(f.variant, f.metric) for f in compare(few, slower) if f.regressed]
    assert flagged == [("unbiased", "step max ms")]


def test_compare_of_a_missing_file_says_so(tmp_path, capsys):
    assert cli.main(["compare", str(tmp_path / "nope.json"), str(tmp_path)]) == 2
    assert "no bench summary at" in capsys.readouterr().err


def test_a_claim_that_held_and_no_longer_holds_is_a_regression():
    held = copy.deepcopy(SUMMARY)
    held["rows"][0].update(ppl_delta_pct=0.2, ppl_delta_ci95=0.3, ppl_deltas=[0.2] * 4)
    lost = copy.deepcopy(held)
    lost["rows"][0].update(ppl_delta_pct=1.1, ppl_delta_ci95=0.2)  # 0.9..1.3: outside ±0.8
    verdicts = [f for f in compare(held, lost) if f.metric.startswith("verdict")]
    assert [(f.variant, f.limit, f.regressed) for f in verdicts] == [
        ("unbiased", "holds -> does not hold", True),
        # reliable's own row has no reference, so no chaos check: never a verdict
        ("reliable", "inconclusive -> inconclusive", False)]
    # judged against NEW's band: a wider band keeps the claim
    lost["band_pct"] = 2.0
    assert not any(f.regressed for f in compare(held, lost) if f.metric.startswith("verdict"))


def test_benches_with_nothing_in_common_or_bad_limits_are_refused(tmp_path, capsys):
    base, other = tmp_path / "base.json", tmp_path / "other.json"
    base.write_text(json.dumps(SUMMARY))
    elsewhere = copy.deepcopy(SUMMARY)
    for row in elsewhere["rows"]:
        row["loss"] = 0.3
    other.write_text(json.dumps(elsewhere))
    # the nightly must not pass on a comparison that compared nothing
    assert cli.main(["compare", str(base), str(other)]) == 2
    assert "no (loss, variant) row in common" in capsys.readouterr().err
    for option, value in (("--threshold-pct", "-5"), ("--threshold-pct", "nan"),
                          ("--ppl-points", "nan"), ("--ppl-points", "-1")):
        assert cli.main(["compare", str(base), str(base), option, value]) == 2, option
        assert option in capsys.readouterr().err
