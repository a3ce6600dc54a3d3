"""The bench summary claims only what it checked: the reliable-under-loss equality is
"not run" when no reliable run under loss was made, and the table says so."""

from __future__ import annotations

from harness.bench import report
from harness.metrics.hdr import Histogram


def _record(variant: str, loss: float, seed: int, sha: str) -> dict:
    steps = Histogram()
    for us in (1000.0, 1100.0, 1200.0):
        steps.record(us)
    return {"variant": variant, "loss": loss, "seed": seed, "ppl": 10.0 + seed,
            "tokens_per_s": 100.0, "step_hist": steps.to_dict(), "measured_loss": loss,
            "drift": 0.0, "model_sha": sha}


def test_reliable_equality_is_not_run_without_a_reliable_run_under_loss():
    records = [_record("reliable", 0.0, s, f"ref{s}") for s in (0, 1)]
    records += [_record("unbiased", 0.1, s, f"u{s}") for s in (0, 1)]
    summary = report.summarise(records, {}, "bpf")
    assert summary["checks"]["reliable_exact_under_loss"] is None
    assert "reliable under loss == lossless model: not run" in report.table(summary)


def test_reliable_equality_holds_or_fails_by_the_models_it_compared():
    records = [_record("reliable", 0.0, s, f"ref{s}") for s in (0, 1)]
    same = records + [_record("reliable", 0.1, s, f"ref{s}") for s in (0, 1)]
    assert report.summarise(same, {}, "bpf")["checks"]["reliable_exact_under_loss"] is True
    differs = records + [_record("reliable", 0.1, 0, "ref0"), _record("reliable", 0.1, 1, "x")]
    assert report.summarise(differs, {}, "bpf")["checks"]["reliable_exact_under_loss"] is False


def test_with_three_steps_a_row_has_no_p99_but_its_maximum():
    records = [_record("reliable", 0.0, 0, "a"), _record("unbiased", 0.1, 0, "b")]
    row = report.summarise(records, {}, "bpf")["rows"][-1]
    assert row["step_p99_ms"] is None and row["step_samples"] == 3
    assert abs(row["step_max_ms"] - 1.2) < 0.001
