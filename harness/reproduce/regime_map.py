"""Row 6: where does training under loss keep its perplexity? The map of the regime (#27).

Whether unbiased_drift keeps perplexity at 10% loss depends on how far one step moves the
parameters more than on the scheme: a replica that misses a shard's broadcast computes its
next gradient at stale parameters, and stale costs in proportion to the step. So the map
holds the scheme, and each of its stages alone (the loss on the reduce stage only, or on
the broadcast stage only, the other delivered in full), against the same seed's lossless
run of reliable, at 10% random loss, in each regime:

    scratch   from the seed's initialisation, AdamW at peak 1e-4 (under-trained), 5e-4
              and 2e-3 (the bench's default)
    finetune  from the seed's lossless checkpoint (trained at 2e-3, cached), at peak 1e-4

and the mitigation curve at scratch 2e-3: unbiased_drift with a reliable parameter resync
every 20, 5 and 1 steps (0, never, is the scheme's own cell). Every cell is a verdict
against ±0.8% (2507.07114's bound) with its 95% interval over seeds, withheld by the rules
of harness/bench/withholding.py (each regime's bench runs its own stability twins).
--quick: the subset QUICK_REGIMES at QUICK_STEPS steps and QUICK_SEEDS seeds (measured:
README); --full: every regime and the curve at FULL_STEPS x FULL_SEEDS.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.bench.spec import BENCH_TRAINING, FINETUNE_LR, BenchSpec
from harness.bench.stability import text as stability_text
from harness.bench.training_bench import run_bench
from harness.metrics.verdict import BAND_PCT as PPL_BAND_PCT
from harness.metrics.verdict import claim
from harness.reproduce.training import check

LOSS = 0.1
STAGES = ("unbiased_drift", "unbiased_drift/reduce", "unbiased_drift/broadcast")
RESYNC = (20, 5, 1)
RESYNC_LR = BENCH_TRAINING.lr  # the bench's default peak, 2e-3
# name -> (regime, peak rate): scratch's is the runs' rate, finetune's the fine-tuning rate
# (its checkpoints are trained at RESYNC_LR, the bench's default)
REGIMES = {
    "scratch 1e-4": ("scratch", 1e-4),
    "scratch 5e-4": ("scratch", 5e-4),
    "scratch 2e-3": ("scratch", 2e-3),
    "finetune 1e-4": ("finetune", FINETUNE_LR),
}
# --quick: two regimes, the stages alone and together, no resync curve. Measured here: at
# 60 steps with one resync cell it took 10.8 min (20 runs of ~30 s, most of it set-up and
# scoring), more than the 10 minutes --quick may take
QUICK_REGIMES = ("scratch 1e-4", "scratch 2e-3")
# a regime's row label, by its place in REGIMES: the same in --quick and --full (6c is
# scratch 2e-3 in both)
LABELS = {name: f"6{chr(ord('a') + i)}" for i, name in enumerate(REGIMES)}
QUICK_STEPS, QUICK_SEEDS = 40, 2
FULL_STEPS, FULL_SEEDS = 300, 3


def plans(quick: bool) -> dict[str, BenchSpec]:
    """One bench per regime: the stages at 10%, the resync curve in scratch 2e-3's. No
    `reliable` under loss (its speed is not the question): its lossless runs are the
    references."""
    steps, seeds = (QUICK_STEPS, QUICK_SEEDS) if quick else (FULL_STEPS, FULL_SEEDS)
    names = QUICK_REGIMES if quick else tuple(REGIMES)
    out = {}
    for name in names:
        regime, lr = REGIMES[name]
        variants = list(STAGES)
        if regime == "scratch" and lr == RESYNC_LR and not quick:
            variants += [f"unbiased_drift/resync={k}" for k in RESYNC]
        rates = (dict(lr=RESYNC_LR, finetune_lr=lr, pretrain_steps=steps)
                 if regime == "finetune" else dict(lr=lr))
        out[name] = BenchSpec.make(losses=[LOSS], variants=variants, steps=steps, seeds=seeds,
                                   optimizer="adamw", realisations=1, stability=True,
                                   regime=regime, **rates)
    return out


def run(make_cluster, quick: bool, out: Path, echo=print, commit: str = "unknown"
        ) -> list[dict]:
    """Each regime's bench on a cluster of its own (make_cluster, as rows 4-5), then the
    map's claims. --full takes hours: a regime whose bench already finished in `out` with
    the same spec at the same commit (the code's, as reproduce's report names it) is reused
    (say so), so a run that stopped is resumed by running it again with the same --out."""
    summaries = {}
    for name, spec in plans(quick).items():
        folder = out / ("bench-map-" + name.replace(" ", "-"))
        done = finished(folder, spec, commit)
        if done is not None:
            echo(f"[reproduce] row 6: regime {name!r}: reused its finished bench in {folder} "
                 f"(the same spec, commit {commit})")
            summaries[name] = done
            continue
        with make_cluster(spec) as cluster:
            echo(f"[reproduce] row 6: regime {name!r} ({len(spec.cases())} runs)")
            summaries[name] = run_bench(cluster, spec, folder, echo=echo)
        (folder / MARKER).write_text(json.dumps({"commit": commit, "spec": _spec(spec)}))
    return rows(summaries)


MARKER = "regime-map.json"  # written when a regime's bench has finished: what it ran


def finished(folder: Path, spec: BenchSpec, commit: str) -> dict | None:
    """The summary of the bench in `folder` if it finished with this spec at this commit
    (a known one: "unknown" is never reused), else None."""
    try:
        marker = json.loads((folder / MARKER).read_text())
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if commit == "unknown" or marker != {"commit": commit, "spec": _spec(spec)}:
        return None
    return summary


def _spec(spec: BenchSpec) -> dict:
    """The spec as JSON gives it back."""
    return json.loads(json.dumps(spec.to_dict()))



def cell(row: dict, regime: str) -> dict:
    """One cell of the map: Δppl, its interval, its seeds, and the verdict (or why none)."""
    c = check(row, f"{regime}, {LOSS:.0%} random loss")
    return {"regime": regime, "variant": row["variant"], "seeds": row["seeds"],
            "ppl_delta_pct": row["ppl_delta_pct"], "ppl_delta_ci95": row["ppl_delta_ci95"],
            "ppl_deltas": row.get("ppl_deltas"), "measured_loss": row.get("measured_loss"),
            "verdict": c.verdict, "withheld": c.disturbed, "check": c}


def rows(summaries: dict[str, dict]) -> list[dict]:
    """Row 6's claims: one per regime (its stages), and the resync curve."""
    out = []
    for name, summary in summaries.items():
        stability = summary.get("stability")
        lossy = [r for r in summary["rows"] if r["loss"] > 0]
        stages = [cell(r, name) for r in lossy if r["variant"] in STAGES]
        resync = [cell(r, name) for r in lossy if "/resync=" in r["variant"]]
        label = LABELS[name]
        out.append(claim(label, "lossbed (the regime map, #27)",
                         f"{name}: unbiased_drift, and each stage alone, keeps perplexity "
                         f"at {LOSS:.0%} random loss",
                         f"Δppl within ±{PPL_BAND_PCT}% of reliable's lossless run",
                         [c["check"] for c in stages], setting=_setting(name, summary),
                         regime=summary.get("regime"), stability=stability,
                         cells=[_public(c) for c in stages]))
        if resync:
            plain = [c for c in stages if c["variant"] == "unbiased_drift"]
            out.append(claim(f"{label}-resync", "lossbed (the mitigation curve, #27)",
                             f"{name}: unbiased_drift with a reliable resync every K steps",
                             f"Δppl within ±{PPL_BAND_PCT}% (K = 0: the scheme's own cell)",
                             [c["check"] for c in resync], setting=_setting(name, summary),
                             regime=summary.get("regime"), stability=stability,
                             cells=[_public(c) for c in plain + resync]))
    return out


def _public(c: dict) -> dict:
    return {k: v for k, v in c.items() if k != "check"}


def _setting(name: str, summary: dict) -> str:
    c = summary["config"]
    seen = ", ".join(f"{t:,}" for t in summary.get("tokens_seen") or [])
    twin = "; ".join(stability_text(summary.get("stability") or {}))
    return (f"bench: {c['hosts']} ranks, {c['preset']} preset, {c['seeds']} seeds, "
            f"{c['profile']} {LOSS:.0%}, regime {summary.get('regime') or name}; tokens "
            f"seen per run {seen or '-'}; {twin}")


def markdown(claims: list[dict]) -> list[str]:
    """The map as a table: a line per cell, for reproduction.md."""
    cells = [c for claim_ in claims if claim_["row"].startswith("6")
             for c in claim_.get("cells", [])]
    if not cells:
        return []
    lines = ["", f"Row 6, the regime map (Δppl % at {LOSS:.0%} random loss against the same seed's "
             "lossless reliable run; ± its 95% interval over seeds):", "",
             "| regime | variant | Δppl % | ±95% | per seed | seeds | verdict |",
             "|---|---|---|---|---|---|---|"]
    seen = set()
    for c in cells:
        key = (c["regime"], c["variant"])
        if key in seen:  # the scheme's own cell heads its resync curve too
            continue
        seen.add(key)
        per_seed = ", ".join(f"{d:+.2f}" for d in c.get("ppl_deltas") or [])
        verdict = c["verdict"] + (f" ({c['withheld']})" if c.get("withheld") else "")
        lines.append(f"| {c['regime']} | {c['variant']} | {_num(c['ppl_delta_pct'])} | "
                     f"{_num(c['ppl_delta_ci95'], '.2f')} | {per_seed} | {c['seeds']} | "
                     f"{verdict} |")
    return lines


def _num(x, fmt: str = "+.2f") -> str:
    return "-" if x is None else format(x, fmt)
