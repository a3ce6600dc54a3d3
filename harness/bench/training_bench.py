"""`lossbed bench`: the runs its spec lists (harness/bench/spec.py), in one launch of the
ranks, then the summary (summary.py) and what the bench leaves behind (report.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness import rank_protocol
from harness.bench import report
from harness.bench.question import question
from harness.bench.spec import BenchSpec
from harness.bench.summary import summarise
from harness.train import record, run
from harness.train.record import BenchRecord
from testbed.errors import LossbedError, TimedOut

if TYPE_CHECKING:  # (the contract, for annotations: no import at run time)
    from testbed.clusters.contract import Cluster



def run_bench(cluster: Cluster, spec: BenchSpec, out: Path, echo=print, metrics=None) -> dict:
    """All runs in one launch of the ranks (one start-up): the profile changes between runs
    where the loss does, and each run's loss is measured around that run alone. The spec
    was checked as it was made, and is read, never changed: in the finetune regime the
    seeds' checkpoints are trained (or found) here and handed to its runs. metrics: the
    command's endpoint (harness/live_metrics.Served), fed the runs as they go and the
    verdicts once answered; or None."""
    out.mkdir(parents=True, exist_ok=True)
    settings, regime = spec.to_dict(), spec.regime_text  # (as the summary writes them)
    start_ppl, folders = None, None
    if spec.regime == "finetune":
        from harness.bench import checkpoints

        folders = checkpoints.ensure(
            cluster, {s: spec.pretrain_config(s) for s in spec.seed_list}, echo=echo)
        start_ppl = {s: checkpoints.ppl(folder) for s, folder in folders.items()}
    # the question, fixed before any run: printed now, kept, and printed with the answer
    asked = question(spec)
    (out / "question.json").write_text(json.dumps(asked, indent=2) + "\n")
    echo(f"[bench] question: {asked['text']}")
    cases = spec.cases(folders)
    total = len(cases)
    started = time.monotonic()

    def progress(said: rank_protocol.Progress) -> None:
        index = said.run
        elapsed = time.monotonic() - started
        left = f"; about {elapsed / index * (total - index) / 60:.1f} min left" if index else ""
        case = cases[index]
        echo(f"[bench {index + 1}/{total}] {case.loss:.0%} loss, {case.role}, "
             f"{said.status()}{left}")

    roles = {}
    for case in cases:
        roles[case.role] = roles.get(case.role, 0) + 1
    echo(f"[bench] {total} runs: " + ", ".join(f"{n} {role}" for role, n in roles.items()))
    try:
        # (the ranks' other chatter, library warnings, stays in the ranks' output)
        records = run.train_runs(cluster, [c.train_run() for c in cases], out / "runs",
                                 echo=lambda line: None, on_progress=progress,
                                 min_coverage=spec.min_coverage,
                                 timeout_s=spec.timeout_s, metrics=metrics)
    except TimedOut as err:  # what was asked, and that it timed out, beside the question
        (out / "timed_out.json").write_text(json.dumps(
            {"timed_out": True, "timeout_s": spec.timeout_s, "runs": total,
             "minutes": (time.monotonic() - started) / 60, "error": str(err)}, indent=2) + "\n")
        raise
    # each run's record as the bench's: its target loss, its --variants entry, its role
    records = [record.checked(BenchRecord(
        {**rec, "loss": case.loss, "variant": case.variant, "role": case.role,
         "loss_seed": case.loss_seed, "regime": spec.regime,
         "tokens_seen": case.cfg.steps * case.cfg.batch * case.cfg.seq_len
         * len(rec["ppl_ranks"])}), BenchRecord)
        for rec, case in zip(records, cases, strict=True)]
    wall_s = time.monotonic() - started
    echo(f"[bench] {total} runs done in {wall_s / 60:.1f} min")
    summary = summarise(records, spec_dict=settings, backend=records[-1]["backend"],
                        wall_s=wall_s, regime=regime, band_pct=spec.band_pct,
                        start_ppl=start_ppl)
    summary["question"] = asked
    if metrics is not None:  # served until the command ends (after that: --metrics-push)
        metrics.run.take_verdicts(summary["rows"])
    report.write_outputs(out, records, summary)
    if summary["checks"]["reliable_exact_under_loss"] is False:
        raise LossbedError("reliable training under loss did not produce the lossless model: "
                           "the baseline is not reliable; see summary.json")
    return summary


