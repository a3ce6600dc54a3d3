"""A doctor's report as the table `lossbed doctor` prints, and the refusal `train` and
`bench` raise when a check their run needs fails."""

from __future__ import annotations

from testbed.doctor.request import Finding, Report
from testbed.errors import EnvironmentProblem


def blocking_lines(findings: list[Finding]) -> list[str]:
    return [f"  {f.host}: {f.check}: {f.state.rstrip('.')}. Fix: {f.fix}" for f in findings]


def refusal(report: Report) -> EnvironmentProblem:
    return EnvironmentProblem("the hosts cannot run this (lossbed doctor shows all checks):\n"
                              + "\n".join(blocking_lines(report.blocking)))


def render(report: Report) -> str:
    """One table: a check whose state is the same on every host is shown once, as 'all'."""
    rows: list[tuple[str, str, str, str, str]] = []
    by_check: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_check.setdefault(f.check, []).append(f)
    merged: list[Finding] = []
    for check, found in by_check.items():
        same = len({(f.state, f.ok) for f in found}) == 1 and len(found) > 1
        first = found[0]
        merged += [Finding("all", check, first.state, ok=first.ok, needed=first.needed,
                           fix=first.fix)] if same else found
    for f in merged:
        mark = ("?" if f.state.startswith("module lists") else "ok") if f.ok else (
            "MISSING" if f.needed else "-")
        rows.append((f.host, f.check, f.state, mark, "" if f.ok else f.fix))
    header = ("host", "check", "state", "", "fix")
    widths = [min(48, max(len(r[i]) for r in [header, *rows])) for i in range(4)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)) + "  fix"]
    for row in rows:
        cells = [c if len(c) <= w else c[: w - 1] + "…" for c, w in zip(row, widths,
                                                                         strict=False)]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
                     + (f"  {row[4]}" if row[4] else ""))
    blocking = [f for f in merged if f.needed and not f.ok]
    lines.append("")
    if not blocking:
        lines.append("everything this run needs is there")
    else:
        lines.append(f"{len(blocking)} check(s) this run needs fail:")
        lines += blocking_lines(blocking)
    return "\n".join(lines)
