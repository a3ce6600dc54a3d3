"""`lossbed reproduce`: run the rows, write reproduction.json and reproduction.md."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from harness.metrics.verdict import FAILS, HOLDS, INCONCLUSIVE

# 4: the training rows (4 and 5), 6: the regime map and 7: RPS training at n = 2, 4, 8,
# which need clusters; 8: the schemes at n = 4 to 64 in the many-rank mode (one process)
ROWS = ("1", "2", "3", "4", "6", "7", "8")


def run(quick: bool, out: Path, rows=ROWS, make_cluster=None, echo=print,
        regime: dict | None = None) -> dict:
    """The chosen rows, in order; the results so far are written after each row (a long
    --full run that stops still leaves what it measured). regime: the training rows'
    BenchSpec regime options (regime, finetune_lr, pretrain_steps); default scratch."""
    from harness.reproduce import (
        aggregation,
        drift,
        regime_map,
        rps_scaling,
        rps_servers,
        scale_rows,
        sentences,
        training,
    )

    out.mkdir(parents=True, exist_ok=True)
    result = {"mode": "quick" if quick else "full", "commit": current_commit(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "claims": [], "seconds": {}}
    steps = {
        "1": ("unbiased aggregation", lambda: aggregation.run(quick)),
        "2": ("bounded drift", lambda: drift.run(quick, echo=echo)),
        "3": ("RPS scaling", lambda: rps_scaling.run(quick, echo=echo)),
        "4": ("perplexity against loss, variants at 10%",
              lambda: training.run(make_cluster, quick, out, echo=echo, regime=regime)),
        "6": ("the regime map", lambda: regime_map.run(make_cluster, quick, out, echo=echo,
                                                        commit=result["commit"])),
        "7": ("RPS training at n = 2, 4, 8", lambda: rps_servers.run(
            make_cluster, quick, out, echo=echo, regime=regime)),
        "8": ("the schemes at n = 4 to 64, many-rank mode",
              lambda: scale_rows.run(quick, out / "many-rank", echo=echo)),
    }
    for row in rows:
        name, work = steps[row]
        echo(f"[reproduce] row {row}: {name} ...")
        started = time.monotonic()
        claims = [{**c, **sentences.about(c["row"])} for c in work()]
        result["seconds"][row] = round(time.monotonic() - started, 1)
        result["claims"] += claims
        echo(f"[reproduce] row {row}: " + ", ".join(f"{c['row']} {c['verdict']}"
                                                    for c in claims)
             + f" ({result['seconds'][row]:.0f} s)")
        write(out, result)
    return result


def write(out: Path, result: dict) -> None:
    (out / "reproduction.json").write_text(json.dumps(result, indent=1))
    (out / "reproduction.md").write_text(markdown(result))


def markdown(result: dict) -> str:
    from harness.reproduce import regime_map

    counts = {v: sum(c["verdict"] == v for c in result["claims"])
              for v in (HOLDS, FAILS, INCONCLUSIVE)}
    lines = [f"# Reproduction ({result['mode']}), commit {result['commit']}, {result['date']}",
             "",
             f"{counts[HOLDS]} hold, {counts[FAILS]} do not hold, {counts[INCONCLUSIVE]} "
             "inconclusive. A check holds when its whole 95% interval lies within the "
             "tolerance of its prediction, does not hold when the whole interval lies "
             "outside, and is inconclusive otherwise (the interval is wider than the effect).",
             "",
             "Each row names the papers' claim it is about and what its test is: the claim "
             "as stated, a weaker test (its 'holds' does not show the claim), or lossbed's "
             "own (harness/reproduce/sentences.py).",
             "",
             "| row | source | claim | the papers' claim | its test is | prediction | "
             "measured (the check furthest from its prediction) | trials | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in result["claims"]:
        m = c["measured"]
        lines.append(f"| {c['row']} | {c['paper']} | {c['claim']} | "
                     f"{c.get('paper_claim', '-')} | {c.get('tests', '-')} | {c['prediction']} | "
                     f"{m['quantity']}: {_number(m['measured'])} ± {_number(m['half_width'])}"
                     f" (predicted {_number(m['predicted'])} ± {_number(m['tolerance'])}) | "
                     f"{m['trials']} | **{c['verdict']}** |")
    lines += regime_map.markdown(result["claims"])
    lines += ["", "Settings:", ""]
    lines += [f"- {c['row']}: {c.get('setting', '')}" for c in result["claims"]]
    lines += ["", "Every check:", ""]
    for c in result["claims"]:
        for k in c["checks"]:
            lines.append(f"- {c['row']} {k['quantity']}: {_number(k['measured'])} ± "
                         f"{_number(k['half_width'])}, predicted {_number(k['predicted'])} "
                         f"± {_number(k['tolerance'])}: {k['verdict']}")
    return "\n".join(lines) + "\n"


def _number(x) -> str:
    if x is None:
        return "-"
    if x != x or x in (float("inf"), float("-inf")):
        return "∞" if x == float("inf") else str(x)
    return f"{x:.4g}"


def current_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
