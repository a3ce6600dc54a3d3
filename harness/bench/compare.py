"""`lossbed compare BASE NEW`: regressions between two bench summaries, beyond noise.

Per (loss, variant) found in both:
    throughput   NEW tokens/s below BASE by more than the threshold (default 10%)
    tail         NEW step p99 above BASE by more than the threshold (the maximum step
                 time where either bench has fewer than the 100 steps a p99 needs)
    perplexity   NEW Δppl above BASE's by more than the larger of: the threshold in points
                 of Δppl (default 1.0), both 95% half-widths, and the lossless noise floor
    verdict      the row's claim, both judged against NEW's band (harness/metrics/verdict.py):
                 it held in BASE and does not hold in NEW
Exit status 1 when anything regressed (the nightly hardware CI fails on it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from harness.bench.summary import judge
from harness.metrics import verdict
from testbed.errors import UsageError


@dataclass
class Finding:
    loss: float
    variant: str
    metric: str
    base: float
    new: float
    limit: str
    regressed: bool


def compare(base: dict, new: dict, threshold_pct: float = 10.0,
            ppl_points: float = 1.0) -> list[Finding]:
    base_rows = {(r["loss"], r["variant"]): r for r in base["rows"]}
    band = new.get("band_pct") or verdict.BAND_PCT
    findings = []
    floor = max(base.get("noise_floor_pct") or 0.0, new.get("noise_floor_pct") or 0.0)
    for r in new["rows"]:
        b = base_rows.get((r["loss"], r["variant"]))
        if b is None:
            continue
        key = (r["loss"], r["variant"])
        drop = 1 - r["tokens_per_s"] / b["tokens_per_s"]
        findings.append(Finding(*key, "tokens/s", b["tokens_per_s"], r["tokens_per_s"],
                                f"-{threshold_pct:g}%", drop * 100 > threshold_pct))
        # the tail: p99 where both benches had the 100 steps it needs, else the maximum
        tail = "step_p99_ms" if b.get("step_p99_ms") and r.get("step_p99_ms") else \
            "step_max_ms"
        rise = r[tail] / b[tail] - 1
        label = "step p99 ms" if tail == "step_p99_ms" else "step max ms"
        findings.append(Finding(*key, label, b[tail], r[tail], f"+{threshold_pct:g}%",
                                rise * 100 > threshold_pct))
        if r.get("ppl_delta_pct") is not None and b.get("ppl_delta_pct") is not None:
            allowed = max(ppl_points, b.get("ppl_delta_ci95") or 0.0,
                          r.get("ppl_delta_ci95") or 0.0, floor)
            findings.append(Finding(*key, "Δppl %", b["ppl_delta_pct"], r["ppl_delta_pct"],
                                    f"+{allowed:.2f} points",
                                    r["ppl_delta_pct"] - b["ppl_delta_pct"] > allowed))
            # the claim itself, both judged against NEW's band: one that held and now does
            # not hold regressed (an inconclusive either side is no evidence of it)
            was, now = (judge(row, band).verdict for row in (b, r))
            findings.append(Finding(*key, f"verdict ±{band:g}%", b["ppl_delta_pct"],
                                    r["ppl_delta_pct"], f"{was} -> {now}",
                                    was == verdict.HOLDS and now == verdict.FAILS))
    return findings


def format_findings(findings: list[Finding]) -> str:
    lines = [f"{'loss':>5} {'variant':<15} {'metric':<12} {'base':>10} {'new':>10} "
             f"{'limit':>14} verdict"]
    for f in findings:
        lines.append(f"{f.loss:>5.0%} {f.variant:<15} {f.metric:<12} {f.base:>10.3f} "
                     f"{f.new:>10.3f} {f.limit:>14} {'REGRESSION' if f.regressed else 'ok'}")
    bad = sum(f.regressed for f in findings)
    lines.append(f"{bad} regression(s) in {len(findings)} checks" if findings
                 else "nothing in common to compare")
    return "\n".join(lines)


def load_summary(path: Path) -> dict:
    """A bench's summary.json (or its folder), checked: `compare` refuses what it cannot
    compare with the reason, instead of failing on a missing key or a division by zero."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    fix = "Give a summary.json written by lossbed bench, or its folder"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError("BASE/NEW", f"no bench summary at {path}", fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError("BASE/NEW", f"{path} is not a bench summary: {err}", fix) from None
    rows = summary.get("rows") if isinstance(summary, dict) else None
    if not isinstance(rows, list):
        raise UsageError("BASE/NEW", f"{path} has no list of rows", fix)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise UsageError("BASE/NEW", f"{path}: rows[{i}] is not an object", fix)
        for key in ("loss", "variant", "tokens_per_s", "step_max_ms"):
            if key not in row:
                raise UsageError("BASE/NEW", f"{path}: rows[{i}] has no {key!r}", fix)
        for key in ("tokens_per_s", "step_max_ms", "step_p99_ms"):
            value = row.get(key)
            if key == "step_p99_ms" and value is None:
                continue  # fewer than 100 steps: compare uses the maximum
            value = row[key]
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise UsageError("BASE/NEW", f"{path}: rows[{i}] ({row['variant']} at "
                                 f"{row['loss']}) has {key} {value!r}: a ratio against it "
                                 "means nothing", "Compare benches whose runs completed")
    return summary
