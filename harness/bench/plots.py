"""A bench's plots (PNG): the loss curves of seed 0, the step-time CDF at the highest loss,
and Δppl against the loss rate where the bench ran more than one."""

from __future__ import annotations

from pathlib import Path

from harness.metrics.hdr import Histogram


def curve_label(r: dict) -> str:
    """A run's name in a plot: variant, loss, role, and under loss which realisation of it
    (the profile's seed), so that no two of a bench's curves share a label."""
    label = f"{r['variant']} @ {r['loss']:.0%}, {r.get('role') or 'run'}"
    if r["loss"] > 0 and r.get("loss_seed") is not None:
        label += f", loss seed {r['loss_seed']}"
    return label


def loss_curves(records: list[dict], shown: float) -> list[tuple[str, list[float]]]:
    """(label, training losses) of seed 0's runs at the loss rate shown and its lossless
    reliable runs (reference, twin)."""
    return [(curve_label(r), r["losses"]) for r in records
            if r["seed"] == 0 and r.get("losses")
            and (r["loss"] == shown or (r["variant"] == "reliable" and r["loss"] == 0))]


def plots(out: Path, records: list[dict], summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lossy = sorted({r["loss"] for r in records if r["loss"] > 0}) or [0.0]
    shown = lossy[-1]
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in loss_curves(records, shown):
        ax.plot(_smooth(losses), label=label, linewidth=1)
    ax.set(xlabel="step", ylabel="training loss (smoothed)", title="loss curves, seed 0")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "loss_curves.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in dict.fromkeys(r["variant"] for r in records):
        hist = Histogram()
        for r in records:
            if r["variant"] == variant and r["loss"] == shown and "step_hist" in r:
                hist.merge(Histogram.from_dict(r["step_hist"]))
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
    fig.tight_layout()
    fig.savefig(out / "step_time_cdf.png", dpi=110)
    plt.close(fig)

    if len({r["loss"] for r in summary["rows"]}) > 2:
        fig, ax = plt.subplots(figsize=(7, 4))
        for variant in dict.fromkeys(r["variant"] for r in summary["rows"]):
            rows = [r for r in summary["rows"] if r["variant"] == variant
                    and r["ppl_delta_pct"] is not None]
            ax.errorbar([r["loss"] * 100 for r in rows], [r["ppl_delta_pct"] for r in rows],
                        yerr=[r["ppl_delta_ci95"] or 0 for r in rows], label=variant,
                        marker="o", capsize=3)
        ax.set(xlabel="loss rate (%)", ylabel="Δ perplexity vs lossless (%)",
               title="perplexity change vs loss rate")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "ppl_vs_loss.png", dpi=110)
        plt.close(fig)


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out
