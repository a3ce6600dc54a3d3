"""What a bench leaves behind: results.jsonl (one line per run), summary.json (paired Δppl
per variant with a 95% interval and the noise floor, throughput and tail latency against
reliable at the same loss, the checks), summary.md, and PNG plots."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from harness.metrics.hdr import Histogram

# Student's t, two-sided 95%, by degrees of freedom (n - 1)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}
RESULT_FIELDS = ("variant", "profile", "loss", "seed", "steps", "hosts", "tokens_per_s",
                 "step_ms", "collective_ms", "ppl", "ppl_rank0", "ppl_delta_pct",
                 "measured_loss", "measured_loss_interval", "measured_packets", "rcvbuf_drops",
                 "measured_window", "drift", "backend",
                 "packets_sent", "packets_lost", "bytes_sent", "losses", "model_sha")


def t95(n: int) -> float:
    df = max(n - 1, 1)
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


def mean_interval(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95% interval; None for a single value)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, None
    return m, t95(len(values)) * statistics.stdev(values) / math.sqrt(len(values))


def _step_ms(runs: list[dict]) -> dict:
    """Step-time percentiles (ms) over the steps of all these runs (their histograms
    merged)."""
    merged = Histogram()
    for r in runs:
        merged.merge(Histogram.from_dict(r["step_hist"]))
    s = merged.summary()
    return {k: (s[k] / 1000 if s[k] is not None else None) for k in ("p50", "p99", "max")} \
        | {"count": s["count"]}


def summarise(records: list[dict], spec_dict: dict, backend: str) -> dict:
    reference = {r["seed"]: r for r in records if r["variant"] == "reliable" and r["loss"] == 0}
    for r in records:
        ref = reference.get(r["seed"])
        r["ppl_delta_pct"] = (r["ppl"] / ref["ppl"] - 1) * 100 if ref else None
    lossless = [r["ppl"] for r in reference.values()]
    noise_floor = (statistics.stdev(lossless) / statistics.fmean(lossless) * 100
                   if len(lossless) > 1 else None)
    groups = {}
    for r in records:
        groups.setdefault((r["loss"], r["variant"]), []).append(r)
    rows = []
    for (loss, variant), runs in sorted(groups.items()):
        deltas = [r["ppl_delta_pct"] for r in runs if r["ppl_delta_pct"] is not None]
        mean, half = mean_interval(deltas) if deltas else (None, None)
        base = groups.get((loss, "reliable"), [])
        steps = _step_ms(runs)
        row = {
            "loss": loss, "variant": variant, "seeds": len(runs),
            "ppl": statistics.fmean(r["ppl"] for r in runs),
            "ppl_delta_pct": mean, "ppl_delta_ci95": half, "ppl_deltas": deltas,
            "tokens_per_s": statistics.fmean(r["tokens_per_s"] for r in runs),
            # the steps of all seeds together: p99 needs 100 of them, else it is None
            "step_p50_ms": steps["p50"], "step_p99_ms": steps["p99"],
            "step_max_ms": steps["max"], "step_samples": steps["count"],
            "measured_loss": statistics.fmean(r["measured_loss"] for r in runs),
            "drift": statistics.fmean(r["drift"] for r in runs),
        }
        if base:
            base_steps = _step_ms(base)
            row["throughput_vs_reliable"] = row["tokens_per_s"] / statistics.fmean(
                r["tokens_per_s"] for r in base)
            row["p99_vs_reliable"] = (row["step_p99_ms"] / base_steps["p99"]
                                      if row["step_p99_ms"] and base_steps["p99"] else None)
            row["max_vs_reliable"] = row["step_max_ms"] / base_steps["max"]
        rows.append(row)
    # None when no reliable run under loss was made: "not run", never "passed"
    reliable_lossy = [r for r in records if r["variant"] == "reliable" and r["loss"] > 0
                      and r["seed"] in reference]
    exact = (all(r["model_sha"] == reference[r["seed"]]["model_sha"] for r in reliable_lossy)
             if reliable_lossy else None)
    return {"config": spec_dict, "backend": backend, "noise_floor_pct": noise_floor,
            "lossless_ppl": lossless, "rows": rows,
            "checks": {"reliable_exact_under_loss": exact}}


def table(summary: dict) -> str:
    head = (f"{'loss':>5} {'variant':<15} {'tok/s vs rel':>12} {'p99 vs rel':>10} "
            f"{'Δppl %':>8} {'±95%':>7} {'ppl':>7} {'drift':>7} {'meas.loss':>9}")
    lines = [head, "-" * len(head)]
    for r in summary["rows"]:
        def f(x, fmt):
            return format(x, fmt) if x is not None else "-"
        lines.append(
            f"{r['loss']:>5.0%} {r['variant']:<15} {f(r.get('throughput_vs_reliable'), '.2f'):>12}"
            f" {f(r.get('p99_vs_reliable'), '.2f'):>10} {f(r['ppl_delta_pct'], '+.2f'):>8}"
            f" {f(r['ppl_delta_ci95'], '.2f'):>7} {r['ppl']:>7.3f} {r['drift']:>7.3f}"
            f" {r['measured_loss']:>9.2%}")
    if any(r.get("p99_vs_reliable") is None and r.get("max_vs_reliable") for r in
           summary["rows"]):
        lines.append("p99 vs rel: '-' where fewer than 100 steps back a p99 (summary.json "
                     "has max_vs_reliable)")
    floor = summary["noise_floor_pct"]
    exact = summary["checks"]["reliable_exact_under_loss"]
    lines.append(f"noise floor (lossless reliable, seed-to-seed sd): "
                 f"{f'{floor:.2f}%' if floor is not None else 'n/a (one seed)'}; backend "
                 f"{summary['backend']}; reliable under loss == lossless model: "
                 f"{'not run' if exact is None else exact}")
    return "\n".join(lines)


def write_outputs(out: Path, records: list[dict], summary: dict) -> None:
    with open(out / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({k: r.get(k) for k in RESULT_FIELDS}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    text = table(summary)
    (out / "summary.md").write_text(
        "# lossbed bench\n\n```\n" + text + "\n```\n\nConfig: `"
        + json.dumps(summary["config"]) + "`\n\nPlots: loss_curves.png, step_time_cdf.png"
        + (", ppl_vs_loss.png" if len({r["loss"] for r in summary["rows"]}) > 2 else "")
        + "\n")
    plots(out, records, summary)


def plots(out: Path, records: list[dict], summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lossy = sorted({r["loss"] for r in records if r["loss"] > 0}) or [0.0]
    shown = lossy[-1]
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in records:
        if r["seed"] == 0 and (r["loss"] == shown or (r["variant"] == "reliable"
                                                        and r["loss"] == 0)):
            label = f"{r['variant']} @ {r['loss']:.0%}"
            ax.plot(_smooth(r["losses"]), label=label, linewidth=1)
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
    ax.legend(fontsize=7)
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
