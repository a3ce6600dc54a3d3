"""A bench's plots (PNG): the answer (Δppl ± 95% per variant and loss, with the paper's band),
the loss curves of seed 0 (the short speed runs apart), the step-time CDF at the highest
loss, measured against target loss per run, and Δppl against the loss rate where the bench
ran more than one."""

from __future__ import annotations

from pathlib import Path

from harness.metrics.hdr import Histogram
from harness.metrics.verdict import BAND_PCT


def curve_label(r: dict) -> str:
    """A run's name in a plot: variant, loss, role, and under loss which realisation of it
    (the profile's seed), so that no two of a bench's curves share a label."""
    label = f"{r['variant']} @ {r['loss']:.0%}, {r.get('role') or 'run'}"
    if r["loss"] > 0 and r.get("loss_seed") is not None:
        label += f", loss seed {r['loss_seed']}"
    return label


SPEED_ROLES = ("speed", "speed_reference")  # short runs for throughput: curves of their own


def loss_curves(records: list[dict], shown: float,
                speed: bool = False) -> list[tuple[str, list[float]]]:
    """(label, training losses) of the first seed's runs at the loss rate shown and its
    lossless reliable runs (reference, twin); speed=True: the short speed runs alone (drawn
    apart: over the full-length runs their few steps hide the curves' ends)."""
    first = min((r["seed"] for r in records), default=0)
    return [(curve_label(r), r["losses"]) for r in records
            if r["seed"] == first and r.get("losses")
            and (r.get("role") in SPEED_ROLES) == speed
            and (r["loss"] == shown or (r["variant"] == "reliable" and r["loss"] == 0))]




def plots(out: Path, records: list[dict], summary: dict) -> list[str]:
    """Every plot of a bench into `out`; the files written, in the order a report shows
    them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    rows = [r for r in summary["rows"] if r.get("ppl_delta_pct") is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4))
        # the band the verdicts used (--band-pct; 2507.07114's ±0.8% by default)
        band = summary.get("band_pct") or BAND_PCT
        ax.axhspan(-band, band, color="0.85",
                   label=f"±{band:g}% (the verdicts' band"
                         + (", arXiv 2507.07114's claim)" if band == BAND_PCT else ")"))
        ax.axhline(0, color="0.5", linewidth=0.8)
        labels = [f"{r['variant']}\n@ {r['loss']:.0%}" for r in rows]
        ax.errorbar(range(len(rows)), [r["ppl_delta_pct"] for r in rows],
                    yerr=[r["ppl_delta_ci95"] or 0 for r in rows], fmt="o", capsize=4)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set(ylabel="Δ perplexity vs lossless (%), 95% CI",
               title="the answer: Δppl per variant and loss")
        ax.legend(fontsize=7)
        save(fig, "ppl_delta.png")

    lossy = sorted({r["loss"] for r in records if r["loss"] > 0}) or [0.0]
    shown = lossy[-1]
    for speed, name, title in ((False, "loss_curves.png", "loss curves, seed 0"),
                               (True, "loss_curves_speed.png",
                                "loss curves of the speed runs, seed 0")):
        curves = loss_curves(records, shown, speed)
        if not curves and speed:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, losses in curves:
            ax.plot(_smooth(losses), label=label, linewidth=1)
        ax.set(xlabel="step", ylabel="training loss (smoothed)", title=title)
        if curves:
            ax.legend(fontsize=7)
        save(fig, name)

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in dict.fromkeys(r["variant"] for r in records):
        hist = Histogram.merged(r["step_hist"] for r in records if r["variant"] == variant
                                and r["loss"] == shown and r.get("step_hist"))
        if hist.total:
            qs = [q / 10 for q in range(1, 1000)]
            ax.plot([hist.percentile(q) / 1000 for q in qs], [q / 100 for q in qs],
                    label=variant)
    ax.set(xscale="log", xlabel="step time (ms)", ylabel="fraction of steps",
           title=f"step time CDF at {shown:.0%} loss")
    if ax.lines:
        ax.legend(fontsize=7)
    else:  # records without step times (not a bench's): say so rather than an empty legend
        ax.text(0.5, 0.5, "no step times recorded", transform=ax.transAxes, ha="center")
    save(fig, "step_time_cdf.png")

    measured = [r for r in records if r["loss"] > 0 and r.get("measured_loss") is not None]
    if measured:
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, r in enumerate(measured):
            got = r["measured_loss"]
            low, high = r.get("measured_loss_interval") or (got, got)
            ax.errorbar([i], [got * 100], yerr=[[(got - low) * 100], [(high - got) * 100]],
                        capsize=2, fmt="o", markersize=3, color="C0")
            ax.plot([i - 0.4, i + 0.4], [r["loss"] * 100] * 2, color="C3", linewidth=1)
        ax.set(xlabel="run", ylabel="loss (%)",
               title="measured (kernel counters, 95% CI) vs target (red) per run")
        save(fig, "measured_loss.png")

    if len({r["loss"] for r in summary["rows"]}) > 2:
        fig, ax = plt.subplots(figsize=(7, 4))
        for variant in dict.fromkeys(r["variant"] for r in summary["rows"]):
            vrows = [r for r in summary["rows"] if r["variant"] == variant
                     and r["ppl_delta_pct"] is not None]
            ax.errorbar([r["loss"] * 100 for r in vrows], [r["ppl_delta_pct"] for r in vrows],
                        yerr=[r["ppl_delta_ci95"] or 0 for r in vrows], label=variant,
                        marker="o", capsize=3)
        ax.set(xlabel="loss rate (%)", ylabel="Δ perplexity vs lossless (%)",
               title="perplexity change vs loss rate")
        ax.legend(fontsize=7)
        save(fig, "ppl_vs_loss.png")
    return written


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out
