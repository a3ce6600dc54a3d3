"""The perplexity-vs-loss plot appears once a bench has two loss rates besides 0 (the
end-to-end bench test runs one, to stay short)."""

from __future__ import annotations

import pytest

from harness.bench.plots import plots


@pytest.mark.filterwarnings("error::UserWarning")  # (an empty legend warned: no step times)
def test_ppl_vs_loss_plot_with_two_lossy_rates(tmp_path):
    records = [{"variant": v, "loss": loss, "seed": 0, "losses": [3.0, 2.5, 2.2]}
               for v, loss in (("reliable", 0.0), ("unbiased", 0.05), ("unbiased", 0.1))]
    rows = [{"variant": "reliable", "loss": 0.0, "ppl_delta_pct": None, "ppl_delta_ci95": None},
            {"variant": "unbiased", "loss": 0.05, "ppl_delta_pct": 1.0, "ppl_delta_ci95": 0.5},
            {"variant": "unbiased", "loss": 0.1, "ppl_delta_pct": 2.0, "ppl_delta_ci95": 0.7}]
    plots(tmp_path, records, {"rows": rows})
    for name in ("loss_curves.png", "step_time_cdf.png", "ppl_vs_loss.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    (tmp_path / "one").mkdir()
    plots(tmp_path / "one", records[:2], {"rows": rows[:2]})  # one lossy rate: no such plot
    assert not (tmp_path / "one" / "ppl_vs_loss.png").exists()


def test_every_loss_curve_of_a_bench_has_a_label_of_its_own():
    # the bench's own plan (references, twin, speed runs, second loss realisations): seed
    # 0's curves once repeated "reliable @ 0%", "unbiased_drift @ 10%" and "rps @ 10%"
    # (mutation caught: a label of variant and loss alone)
    from harness.bench.plots import loss_curves
    from harness.bench.spec import BenchSpec

    spec = BenchSpec.make(stability=True, seeds=2, steps=10, realisations=2)
    records = [{"variant": c.variant, "loss": c.loss, "seed": c.cfg.seed, "role": c.role,
                "loss_seed": c.loss_seed, "losses": [3.0, 2.0]} for c in spec.cases()]
    # (the short speed runs are drawn on a plot of their own: both plots together)
    curves = loss_curves(records, 0.1) + loss_curves(records, 0.1, speed=True)
    labels = [label for label, _ in curves]
    shown = [r for r in records if r["seed"] == spec.first_seed and (r["loss"] == 0.1 or (
        r["variant"] == "reliable" and r["loss"] == 0))]
    assert len(labels) == len(shown) >= 6 and len(set(labels)) == len(labels), labels
    assert any("twin" in label for label in labels)
    assert any("loss seed 1000" in label for label in labels)  # the second realisation
