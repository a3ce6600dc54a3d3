"""A bench's summary as the text table the bench prints and summary.md shows."""

from __future__ import annotations

from harness.bench import stability
from harness.bench.summary import CURVE_SEEDS, MOST_SEEDS, verdict_cell


def budget_lines(plan: dict) -> list[str]:
    """The budget section of the table: what a seed costs, and the width-versus-minutes
    curve per lossy row."""
    lines = [f"budget: a seed costs {plan['seed_min']:.1f} min of runs (its twins "
             f"included); realisations {plan['realisation_min']:.1f} min and start-up "
             f"{plan['start_up_min']:.1f} min do not grow with seeds (this bench: "
             f"{plan['minutes_now']:.1f} min)"]
    if not plan["rows"]:
        return lines
    lines.append(f"±95% of Δppl projected from each row's seed-to-seed sd (rough with few "
                 f"seeds), and what ±{plan['target_ci95']:.1f} needs:")
    head = f"  {'seeds':>5} {'min':>6} " + " ".join(
        f"{r['variant'] + ' @' + format(r['loss'], '.0%'):>20}" for r in plan["rows"])
    lines.append(head)
    for i, k in enumerate(CURVE_SEEDS):
        lines.append(f"  {k:>5} {plan['rows'][0]['curve'][i]['minutes']:>6.1f} " + " ".join(
            f"{r['curve'][i]['ci95']:>20.2f}" for r in plan["rows"]))
    for r in plan["rows"]:
        need = (f"{r['seeds_for_target']} seeds (~{r['minutes_for_target']:.0f} min)"
                if r["seeds_for_target"] else f"more than {MOST_SEEDS} seeds")
        decide = ""
        if r.get("seeds_to_decide"):
            decide = (f"; inconclusive now, about {r['seeds_to_decide']} seeds "
                      f"(~{r['minutes_to_decide']:.0f} min) would decide it at this mean and sd")
        lines.append(f"  {r['variant']} at {r['loss']:.0%}: sd {r['seed_sd']:.2f} over "
                     f"{r['seeds_now']} seeds; ±{plan['target_ci95']:.1f} needs {need}{decide}")
    return lines


def progress_lines(rows: list[dict]) -> list[str]:
    """Iso-progress: each lossy row's final ppl as steps behind its reference's curve."""
    placed = [r for r in rows if "steps_behind" in r and (r["steps_behind"] is not None
                                                          or r.get("steps_behind_beyond"))]
    if not placed:
        return []

    def cell(r: dict) -> str:
        steps = r.get("steps_behind_of") or "?"
        if r["steps_behind"] is None:
            return (f"{r['variant']} at {r['loss']:.0%}: seeds {r['steps_behind_beyond']} "
                    f"behind the whole curve (more than {steps} steps)")
        return f"{r['variant']} at {r['loss']:.0%} {r['steps_behind']:.1f} of {steps}"

    return ["iso-progress (steps behind: where each seed's final ppl lies on its lossless "
            "reference's held-out curve; 0 at or below its end): "
            + ", ".join(cell(r) for r in placed)]


def chaos_cell(row: dict) -> str:
    """The row's reference's chaos check, as its interval: '-' for a row without a Δppl,
    'unchecked' where its reference had no twins."""
    if row.get("ppl_delta_pct") is None or not row.get("reference"):
        return "-"
    check = row.get("chaos_check")
    if check is None:
        return "unchecked"
    half = check["delta_ci95"]
    return f"{check['delta_pct']:+.3f}±{half:.3f}" if half is not None else (
        f"{check['delta_pct']:+.3f} 1 seed")


def table(summary: dict) -> str:
    width = max([15] + [len(r["variant"]) for r in summary["rows"]])
    head = (f"{'loss':>5} {'variant':<{width}} {'model':<9} {'tok/s vs rel':>12} "
            f"{'p99 vs rel':>10} {'Δppl %':>8} {'±95%':>6} {'real.sd':>7} {'verdict':<13} "
            f"{'chaos ±95%':>13} "
            f"{'ppl':>8} {'worst':>8} {'drift':>6} {'meas.loss':>9} {'cover':>6}")
    lines = []
    if summary.get("question"):  # as it was fixed before the runs
        lines.append(f"question: {summary['question']['text']}")
    if summary.get("regime"):  # every Δppl below is true of this regime
        seen = ", ".join(f"{t:,}" for t in summary.get("tokens_seen") or []) or "-"
        lines.append(f"regime {summary['regime']}; tokens seen per run: {seen}")
    lines += [head, "-" * len(head)]

    def f(x, fmt):
        return format(x, fmt) if x is not None else "-"

    for r in summary["rows"]:
        lines.append(
            f"{r['loss']:>5.0%} {r['variant']:<{width}} {f(r.get('headline'), ''):<9} "
            f"{f(r.get('throughput_vs_reliable'), '.2f'):>12}"
            f" {f(r.get('p99_vs_reliable'), '.2f'):>10} {f(r['ppl_delta_pct'], '+.2f'):>8}"
            f" {f(r['ppl_delta_ci95'], '.2f'):>6} {f(r.get('realisation_sd'), '.2f'):>7}"
            f" {verdict_cell(r):<13} {chaos_cell(r):>13} {f(r['ppl'], '.3f'):>8}"
            f" {f(r.get('ppl_rank_worst'), '.3f'):>8}"
            f" {r['drift']:>6.3f} {r['measured_loss']:>9.2%} {f(r.get('coverage'), '.1%'):>6}")
    if summary.get("test"):
        lines.append(f"verdict: {summary['test']}: holds (inside), does not hold (outside), "
                     "inconclusive (across an edge)")
    lines.append("model: rank0 = rank 0's own (all equal), rank_mean = the ranks' own models "
                 "(mean; worst beside), owners = each shard as its owner holds it. Δppl: "
                 "against the same seed's lossless run of reliable under the same optimizer "
                 "(rps: reliable under SGD; rps/adamw: its own lossless run); real.sd: its "
                 "spread over loss realisations at the first seed; chaos: how far that "
                 "reference's twins moved ppl (mean ± 95% over seeds, below), the check its "
                 "verdict waits for")
    gains = summary.get("reference_gain_pct") or {}
    if gains:  # what the lossless fine-tune itself did: the scale a ±band verdict is read at
        band = summary.get("band_pct") or 0.0
        lines.append("fine-tuning itself, lossless (the references against their checkpoints): "
                     + ", ".join(f"{v} {g:+.2f}%" for v, g in gains.items()))
        for v, g in gains.items():
            if abs(g) < band:
                lines.append(f"! {v}: fine-tuning moved ppl by less than the ±{band:g}% band: "
                             "a 'holds' against it says little")
    speed_steps = sorted({r["speed_steps"] for r in summary["rows"] if r.get("speed_steps")})
    if speed_steps:
        lines.append(f"reliable under loss: speed runs of {', '.join(map(str, speed_steps))} "
                     "steps (no perplexity: its model is checked equal to the lossless one)")
    lines.append("cover: the least share of the hosts' bytes that crossed the impairment "
                 "in the row's runs (their interfaces' counters against the impairment's)")
    for bad in summary.get("invalid_runs") or []:
        lines.append(f"! left out: {bad['variant']} seed {bad['seed']} at {bad['loss']:.0%} "
                     f"({bad['role']}) is no result: {bad['why']}")
    for r in summary["rows"]:
        if r.get("disturbed"):
            lines.append(f"! {r['variant']} at {r['loss']:.0%}: the runs of seeds "
                         f"{r['disturbed']} are disturbed (a rank fell behind: its collective "
                         "missed far more than the network lost; see results.jsonl)")
    for r in summary["rows"]:
        if r.get("wire_warnings"):
            lines.append(f"! {r['variant']} at {r['loss']:.0%}: the ranks of seeds "
                         f"{r['wire_warnings']} got datagrams their peers did not send "
                         "(foreign, unauthenticated, malformed or not finite: none applied; "
                         "see wire_warning in results.jsonl)")
    incomplete = summary["checks"].get("references_missing_packets")
    if incomplete:
        lines.append("! lossless references that missed packets (late): " + ", ".join(
            f"{r['variant']} seed {r['seed']} ({r['packets_lost']} of {r['packets_sent']})"
            for r in incomplete))
    if any(r.get("p99_vs_reliable") is None and r.get("max_vs_reliable") for r in
           summary["rows"]):
        lines.append("p99 vs rel: '-' where fewer than 100 steady steps back a p99 "
                     "(summary.json has max_vs_reliable)")
    floor = summary["noise_floor_pct"]
    exact = summary["checks"]["reliable_exact_under_loss"]
    unpaired = summary["checks"].get("reliable_unpaired")
    if unpaired:
        lines.append("! reliable under loss without a lossless run of its seed and length: "
                     + ", ".join(f"seed {u['seed']} at {u['loss']:.0%} ({u['steps']} steps)"
                                 for u in unpaired))
    paired = [f"{r['variant']} at {r['loss']:.0%} {r['delta_sd']:.2f}"
              for r in summary["rows"] if r.get("delta_sd") is not None]
    if paired:  # what each row's interval is made of
        lines.append("noise of a paired Δppl (sd over seeds, points): " + ", ".join(paired))
    drifts = [r for r in summary["rows"] if r.get("drift_max") is not None]
    if drifts:  # how far the replicas were from their bound's model during training
        lines.append("drift during training (the largest replica's distance from the owners' "
                     "model, or the ranks' mean; growth exponent b over the steps, 0: "
                     "bounded, 0.5: a random walk): " + ", ".join(
                         f"{r['variant']} at {r['loss']:.0%} max {r['drift_max']:.4f}"
                         + (f", b {r['drift_growth']:+.2f}" if r.get("drift_growth") is not None
                            else "")
                         + (f" ± {r['drift_growth_ci95']:.2f}"
                            if r.get("drift_growth_ci95") is not None else "")
                         for r in drifts))
    lines += progress_lines(summary["rows"])
    lines.append(f"noise floor (lossless reliable, seed-to-seed sd): "
                 f"{f'{floor:.2f}%' if floor is not None else 'n/a (one seed)'}; backend "
                 f"{summary['backend']}; reliable under loss == lossless model: "
                 f"{'not run' if exact is None else exact}")
    judged: dict[str, list[str]] = {}
    for r in summary["rows"]:
        if r.get("reference") and r["loss"] > 0:
            judged.setdefault(r["reference"], []).append(r["variant"])
    lines += stability.text(summary.get("stability") or {}, judged)
    if summary.get("budget"):
        lines += budget_lines(summary["budget"])
    return "\n".join(lines)
