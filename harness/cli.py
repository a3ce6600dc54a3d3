"""The experiment half of the `lossbed` command (train, bench, reproduce, compare,
collective-bench), and `lossbed` itself: main() adds these commands to testbed's (testbed/cli.py:
clusters and impairments), so one entry point stands above both halves and testbed never
imports harness. Thin: parse, call the library, print."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path

from harness.bench import collective_command
from harness.bench.own_cluster import own_cluster
from harness.launch import (
    FAILURE_GRACE_MEANS,
    FAILURE_GRACE_S,
    TIMEOUT_MEANS,
    TRAIN_TIMEOUT_S,
)
from testbed import checks
from testbed import cli as testbed_cli
from testbed.cli import (
    add_inventory,
    add_metrics,
    add_min_coverage,
    add_profile_changes,
    add_slurm,
    cluster_of,
    in_slurm,
)
from testbed.errors import NotAResult, TimedOut, UsageError


def _cmd_train(args) -> int:
    checks.loss_fraction("--loss", *checks.given(args.loss))  # (before torch is imported)
    checks.seconds("--grace-s", args.grace_s, FAILURE_GRACE_S, FAILURE_GRACE_MEANS)
    checks.seconds("--timeout-s", args.timeout_s, TRAIN_TIMEOUT_S, TIMEOUT_MEANS, positive=True)
    from harness import options
    from harness.train.config import TrainConfig

    cfg = TrainConfig(**{**options.values(TrainConfig, args),
                         "save_model": checks.new_folder(args.save_model, "--save-model")})
    from harness import launch

    launch.check_environment()
    cluster = cluster_of(args)  # (a cluster that is not up is named before torch loads)
    from harness.train import run

    run.check(cfg, cluster)  # bad input is refused before any process starts
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    served = _served(args, cluster, "train", echo)  # (a port in use: refused here)
    try:
        rec = run.train(cluster, cfg, args.profile, args.set or [], args.out, echo=echo,
                        isolated=args.unsealed, loss=args.loss, failure_grace_s=args.grace_s,
                        min_coverage=args.min_coverage, timeout_s=args.timeout_s,
                        metrics=served)
    except TimedOut as err:  # the record says so, where one was asked for
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"variant": cfg.variant, "profile": args.profile,
                                    "loss": args.loss, "seed": cfg.seed, "steps": cfg.steps,
                                    "timed_out": True, "timeout_s": args.timeout_s,
                                    "error": str(err)}) + "\n")
        raise
    finally:
        if served is not None:
            served.stop()
    summary = {k: rec[k] for k in ("variant", "profile", "loss", "seed", "steps", "ppl",
                                   "ppl_rank0", "drift", "tokens_per_s", "measured_loss")}
    print(json.dumps(summary))
    if rec.get("wire_warning"):
        print(f"warning: {rec['wire_warning']}", file=sys.stderr)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(rec) + "\n")
    if rec["invalid"]:  # measured, but not under the impairment it names
        raise NotAResult(f"the run is no result under {args.profile}: {rec['invalid']}")
    return 0


def _served(args, cluster, what: str, echo):
    """The command's metrics endpoint (--metrics-port), or None; started before anything
    is impaired, so that a port in use is refused first. cluster: None where the command
    makes its own later (the bench attaches it)."""
    from harness.live_metrics import Served

    return Served.if_asked(cluster, args.metrics_port, args.metrics_address,
                           f"{what}-{os.getpid()}", args.min_coverage, echo)


def bench_hosts(asked: int | None, cluster, args) -> int:
    """The bench's host count: a given cluster's own (asked for another: refused, before
    anything runs), else --hosts or the default."""
    from harness.bench.spec import BenchSpec

    if cluster is None:
        return asked if asked is not None else BenchSpec.hosts  # (the declared default)
    if asked is not None and asked != len(cluster.hosts):
        slurm = in_slurm(args)
        where = "the Slurm allocation" if slurm else f"cluster {cluster.name}"
        raise UsageError("--hosts", f"{asked} hosts asked, but {where} has "
                         f"{len(cluster.hosts)}",
                         f"Leave --hosts out (the bench runs on all {len(cluster.hosts)}), "
                         f"or {'allocate' if slurm else 'give a cluster of'} {asked} nodes")
    return len(cluster.hosts)


def _cmd_bench(args) -> int:
    checks.loss_fraction("--loss", *args.loss)  # (before torch is imported)
    checks.at_least(args, ("hosts", 2), ("seeds", 1), ("mtu", 68))
    if args.many_rank:  # the question at n ranks, in this process (no cluster)
        from harness.bench.spec import default_steps

        if args.steps is None:
            args.steps = default_steps(args.regime or "finetune")
        checks.at_least(args, ("steps", 1))
        from harness.reproduce import scale_bench

        return scale_bench.bench(args)
    import time
    from dataclasses import replace
    from pathlib import Path

    from harness import launch, options
    from harness.bench.spec import (
        BENCH_TRAINING,
        DEFAULT_VARIANTS,
        BenchSpec,
        chosen_regime,
        default_steps,
    )
    from harness.bench.table import table
    from harness.train.config import TrainConfig

    given = args.cluster is not None or args.inventory or in_slurm(args)
    cluster = cluster_of(args) if given else None  # (named before torch loads)
    hosts = bench_hosts(args.hosts if options.given(args, "hosts") else None, cluster, args)
    regime, why = chosen_regime(args.regime, cluster is None or cluster.shares_this_machine)
    if why:
        print(f"[bench] {why}", file=sys.stderr, flush=True)
    steps = args.steps if args.steps is not None else default_steps(regime)
    train = replace(BENCH_TRAINING, steps=steps,
                    **options.values(TrainConfig, args, TRAINING_OPTIONS))
    spec = BenchSpec(train=train, losses=args.loss,
                     variants=args.variants or DEFAULT_VARIANTS, isolated=args.unsealed,
                     regime=regime, finetune_lr=args.finetune_lr,
                     pretrain_steps=args.pretrain_steps,
                     min_coverage=args.min_coverage,
                     **{**options.values(BenchSpec, args, BENCH_OPTIONS),
                        "hosts": hosts})  # (checked as made)
    launch.check_environment()
    # absolute: ranks on remote hosts write under it from their own working folder
    out = Path(args.out or f"results/bench-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if cluster is not None:
        place = contextlib.nullcontext(cluster)
    else:  # (what this kernel cannot apply is refused before the cluster is built)
        from testbed import profiles
        from testbed.impair import engine

        for loss in [x for x in spec.losses if x > 0]:
            engine.refuse_for_this_kernel(profiles.load(spec.profile, loss=loss), spec.hosts)
        place = own_cluster("bench", spec)
    from harness.bench.training_bench import run_bench  # (torch: after the cluster is named)

    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    served = _served(args, cluster, "bench", echo)
    try:
        with place as cluster:
            if served is not None:
                served.impairment.attach(cluster)
            summary = run_bench(cluster, spec, out, echo=echo, metrics=served)
    finally:
        if served is not None:
            served.stop()
    if args.metrics_push:  # the answer, where a Pushgateway keeps it for Prometheus
        from harness.live_metrics import RunCollector, push

        answer = RunCollector(f"bench-{out.name}")
        answer.take_verdicts(summary["rows"])
        push(args.metrics_push, answer, f"bench-{out.name}", echo)
    print(table(summary))
    print(f"results in {out}/ (report.html, summary.md, summary.json, results.jsonl, *.png)")
    return 0


# The bench's own options (BenchSpec's fields: each declared there, with its default and help)
BENCH_OPTIONS = ("profile", "hosts", "mtu", "seeds", "first_seed", "realisations",
                 "speed_steps", "speed_seeds", "stability", "band_pct", "sgd_lr", "timeout_s")


def _cmd_reproduce(args) -> int:
    import time
    from pathlib import Path

    from harness.reproduce import report

    rows = sorted(set(args.rows or report.ROWS))
    unknown = [r for r in rows if r not in report.ROWS]
    if unknown:
        raise UsageError("--rows", f"no row {', '.join(unknown)}",
                         f"Use some of {' '.join(report.ROWS)} (4: the training rows 4 and 5; "
                         "6: the regime map; 7: RPS training at n = 2, 4, 8; 8: n = 4 to 64, "
                         "many-rank mode)")
    out = Path(args.out or f"results/reproduce-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    # rows 1-3 start many loopback transports in this process: their start-up lines are
    # noise here (the bench's ranks log in their own processes)
    logging.getLogger("harness.transport").setLevel(logging.WARNING)
    # the training rows' benches each on a cluster of their own
    result = report.run(quick=not args.full, out=out, rows=rows,
                        make_cluster=lambda spec: own_cluster("repro", spec),
                        echo=lambda line: print(line, file=sys.stderr, flush=True),
                        regime=_regime_options(args))
    print(report.markdown(result))
    print(f"results in {out}/ (reproduction.md, reproduction.json)")
    return 0


def _cmd_run(args) -> int:
    checks.loss_fraction("--loss", *checks.given(args.loss))  # (before torch is imported)
    checks.seconds("--grace-s", args.grace_s, FAILURE_GRACE_S, FAILURE_GRACE_MEANS)
    from harness import torchrun

    command = list(args.command)[1 if args.command[:1] == ["--"] else 0:]
    if args.cluster is None and not args.inventory and {"--cluster", "--inventory"} & {
            w.split("=", 1)[0] for w in command}:  # (after --: the script's, not lossbed's)
        raise UsageError("--cluster", "given after --, it goes to your script, not to lossbed",
                         "Put lossbed's options before --: lossbed run --cluster NAME -- ...")
    spec = torchrun.RunSpec(command=command, profile=args.profile, sets=tuple(args.set or ()),
                            loss=args.loss, transport=args.transport, impair_from=args.impair_from,
                            unsealed=args.unsealed, grace_s=args.grace_s,
                            timeout_s=args.timeout_s,
                            min_coverage=args.min_coverage, workdir=args.workdir,
                            metrics_port=args.metrics_port,
                            metrics_address=args.metrics_address,
                            **({"out": Path(args.out)} if args.out else {}))
    checked = spec.validate()  # bad input is refused before any cluster is touched
    cluster = cluster_of(args)
    if args.print:
        from harness.transport import auth
        from testbed.impair import bypass

        print("# lossbed run: one command per host (run them together, e.g. from a Slurm "
              "or Kubernetes job);\n# impair the links around them with `lossbed apply "
              f"{args.profile} ... --lease-s S` and read `lossbed verify`")
        bypass.refuse_contradictions(os.environ, cluster)
        key = None if args.unsealed else auth.new_key()
        for hc in torchrun.commands(cluster, spec, checked, f"lossbed-{os.getpid()}", key,
                                    None, None):
            print(f"# {hc.host.name}\n{hc.shell()}")
        return 0
    return torchrun.run(cluster, spec, checked=checked,
                        echo=lambda line: print(line, file=sys.stderr, flush=True))


def _cmd_report(args) -> int:
    from harness import run_report
    from harness.bench import report

    folder = Path(args.dir)
    kind = run_report.kind_of(folder)
    if kind != "bench":  # a run's folder, or bench --many-rank's
        print(f"redrew {folder}/: {run_report.redraw(folder, kind)}")
        return 0
    records, summary = report.load(folder)
    names = report.redraw(folder, records, summary)
    print(f"redrew {folder}/: report.html, summary.md, {', '.join(names)}")
    return 0


def _cmd_compare(args) -> int:
    import math

    if not (math.isfinite(args.threshold_pct) and args.threshold_pct > 0):
        raise UsageError("--threshold-pct", f"{args.threshold_pct} is not a positive percent",
                         "e.g. --threshold-pct 10: a change beyond 10% regressed")
    if not (math.isfinite(args.ppl_points) and args.ppl_points >= 0):
        raise UsageError("--ppl-points", f"{args.ppl_points} is not a number of points",
                         "e.g. --ppl-points 1.0: a Δppl rise beyond 1 point regressed")
    from harness import run_report
    from harness.bench.compare import compare, format_findings, load_summary

    kinds = {run_report.kind_of(p) for p in (args.base, args.new)}
    if kinds != {"bench"}:  # two runs, or two reproductions, side by side
        print(run_report.compare_folders(Path(args.base), Path(args.new)))
        return 0
    findings = compare(load_summary(args.base), load_summary(args.new),
                       threshold_pct=args.threshold_pct, ppl_points=args.ppl_points)
    print(format_findings(findings))
    if not findings:  # the nightly must not pass on two benches that share no row
        raise UsageError("BASE/NEW", "the two benches have no (loss, variant) row in common: "
                         "nothing was compared", "Compare benches of the same losses and "
                         "variants")
    return 1 if any(f.regressed for f in findings) else 0


def _regime_options(args) -> dict:
    return dict(regime=args.regime or "finetune", finetune_lr=args.finetune_lr,
                pretrain_steps=args.pretrain_steps)


# The model, data and optimisation options `train` and `bench` share (TrainConfig's)
TRAINING_OPTIONS = ("preset", "device", "batch", "seq_len", "lr", "optimizer", "schedule",
                    "tokenizer")


def _add_regime_options(p, default: str) -> None:
    """Where the runs start from (bench: finetune by default; reproduce: scratch)."""
    from harness import options
    from harness.bench.spec import REGIMES, BenchSpec

    p.add_argument("--regime", choices=REGIMES, default=default,
                   help="scratch: every run from its seed's initialisation at --lr; finetune "
                        "(bench's default, but on VM or remote hosts): from its seed's lossless"
                        " checkpoint (--pretrain-steps at --lr, cached in .cache/checkpoints/)"
                        " at --finetune-lr")
    options.add_options(p, BenchSpec, ("finetune_lr", "pretrain_steps"))


def add_commands(sub) -> None:
    """Register the experiment commands on testbed's subparsers."""
    from harness import options
    from harness.bench.spec import (
        BENCH_TRAINING,
        DEFAULT_STEPS,
        SCRATCH_STEPS,
        VARIANT_FORM,
        BenchSpec,
    )
    from harness.train.config import TrainConfig

    p = sub.add_parser("train", help="train a small LLaMA across a cluster under a profile")
    p.add_argument("--cluster", help="default: the only cluster up")
    add_inventory(p)
    add_slurm(p)
    add_metrics(p, "training's step and tokens/s")
    p.add_argument("--profile", default="clean", type=checks.user_name_or_path,
                   help="impairment profile: a name in "
                   "netem_profiles/ or a YAML path")
    add_profile_changes(p)
    p.add_argument("--grace-s", type=float, default=FAILURE_GRACE_S, help=FAILURE_GRACE_MEANS)
    p.add_argument("--timeout-s", type=float, default=TRAIN_TIMEOUT_S, help=TIMEOUT_MEANS)
    options.add_options(p, TrainConfig)  # every setting of a run: declared in TrainConfig
    p.add_argument("--out", type=checks.user_path,
                   help="folder for the ranks' metrics (default: none kept: a "
                   "temporary one, removed)")
    p.add_argument("--json", metavar="FILE", type=checks.user_path,
                   help="append the run's record to this file")
    add_min_coverage(p)
    options.add_unsealed(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("bench", help="the variants (default reliable, unbiased_drift, rps) "
                                     "at LOSS against the same seed's lossless reference")
    p.add_argument("--loss", type=checks.loss_text, nargs="+", default=[0.1],
                   help="loss rates as fractions (0.1 = 10%%), e.g. --loss 0.01 0.05 0.1")
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps of every run (default: {DEFAULT_STEPS} fine-tuning, "
                        f"{SCRATCH_STEPS} with --regime scratch: the length of the record's "
                        "answer in each)")
    p.add_argument("--variants", nargs="+",
                   help="default: reliable unbiased_drift rps; the ablations zero_fill and "
                        "unbiased on request (or all five: make bench-full); each "
                        + VARIANT_FORM)
    p.add_argument("--many-rank", type=int, nargs="+", metavar="N",
                   help="the question at N ranks in the many-rank mode instead (one process, "
                        "no cluster and no clock: Δppl and drift, not speed; reproduce row "
                        "8's method; --steps and --pretrain-steps count the bench's steps, "
                        "run as steps of 64 sequences), e.g. --many-rank 4 16 64")
    # the bench's own settings: declared in BenchSpec, as the runs' are in TrainConfig
    options.add_options(p, BenchSpec, BENCH_OPTIONS, notes={
        "hosts": " (4 by default); a given cluster's (--cluster, --inventory, --slurm) are "
                 "its own: another number is refused"})
    sizes = "; train's is larger: a bench runs tens of runs"
    options.add_options(p, TrainConfig, TRAINING_OPTIONS, defaults=BENCH_TRAINING, notes={
        "optimizer": "; the variants' but rps's, which trains under SGD at --sgd-lr unless "
                     "written rps/adamw", "batch": sizes, "seq_len": sizes})
    _add_regime_options(p, None)
    p.add_argument("--out", type=checks.user_path,
                   help="results folder (default: results/bench-TIME)")
    p.add_argument("--cluster", help="reuse this cluster instead of building one")
    add_inventory(p)
    add_slurm(p)
    add_min_coverage(p)
    options.add_unsealed(p)
    add_metrics(p, "its runs'")
    p.add_argument("--metrics-push", metavar="URL",
                   help="when the bench has answered, push its verdicts to this Prometheus "
                        "Pushgateway (e.g. http://pushgateway:9091)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "run", help="your torchrun job on every host of a cluster, under a profile, measured",
        description="lossbed run [options] -- torchrun [torchrun options] script.py [args]: "
                    "one torchrun per host (c10d rendezvous on the first), the profile "
                    "applied once the job joined (harness.api), a report under --out")
    p.add_argument("--cluster", help="default: the only cluster up")
    add_inventory(p)
    add_slurm(p)
    p.add_argument("--profile", default="random-loss", type=checks.user_name_or_path,
                   help="impairment profile "
                   "(default: random-loss)")
    add_profile_changes(p)
    p.add_argument("--transport", default="udp",
                   help="loss semantics of harness.api's collectives: udp, roce-ud, "
                        "roce-uc[:BYTES], roce-rc[:BYTES] (default: udp)")
    p.add_argument("--impair-from", default="joined", choices=["joined", "start"],
                   help="joined: once the job's ranks met (harness.api.join); start: "
                        "before torchrun starts, for a script without harness.api "
                        "(default: joined)")
    p.add_argument("--out", type=checks.user_path,
                   help="report folder (default: results/run-TIME)")
    p.add_argument("--timeout-s", type=float, default=0.0,
                   help=TIMEOUT_MEANS.replace("launch's", "job's") + "; 0: none")
    p.add_argument("--grace-s", type=float, default=FAILURE_GRACE_S,
                   help=FAILURE_GRACE_MEANS + "; and, once the job is stopped (interrupted, "
                   "timed out, failed), torchrun's time to stop its workers (20 s at most)")
    p.add_argument("--print", action="store_true", help="print each host's command, run none")
    add_metrics(p, "the run's step, collective time and missing share")
    p.add_argument("--workdir", metavar="DIR", type=checks.user_path,
                   help="where the command starts on each host "
                   "(default: here, on hosts that share this machine; else their checkout)")
    add_min_coverage(p)
    options.add_unsealed(p)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- torchrun [torchrun options] script.py [args]")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("report", help="redraw a past bench's report.html, summary.md and "
                                      "plots from its results")
    p.add_argument("dir", metavar="DIR", type=checks.user_path,
                   help="a folder a bench wrote (results/bench-TIME)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("compare", help="regressions between two bench results (exit 1)")
    p.add_argument("base", metavar="BASE", type=checks.user_path,
                   help="summary.json (or its folder)")
    p.add_argument("new", metavar="NEW", type=checks.user_path,
                   help="summary.json (or its folder)")
    p.add_argument("--threshold-pct", type=float, default=10.0,
                   help="a throughput or step-p99 change beyond this many percent regressed")
    p.add_argument("--ppl-points", type=float, default=1.0,
                   help="a Δppl change beyond this many points (or the intervals, if wider) "
                        "regressed")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("reproduce",
                       help="both papers' claims measured here, each with a verdict")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="small sizes and short training rows (the default)")
    mode.add_argument("--full", action="store_true",
                      help="the sizes the claims need (rows 4-5 with 4 seeds; about ten times "
                           "--quick's time)")
    p.add_argument("--rows", nargs="+", metavar="ROW",
                   help="only these rows: 1 aggregation, 2 drift, 3 RPS scaling, "
                        "4 training (rows 4 and 5), 6 the regime map, 7 RPS training at "
                        "n = 2, 4, 8, 8 the schemes at n = 4 to 64 (many-rank mode, one "
                        "process); default all")
    _add_regime_options(p, "scratch")
    p.add_argument("--out", type=checks.user_path,
                   help="results folder (default: results/reproduce-TIME)")
    p.set_defaults(func=_cmd_reproduce)

    collective_command.add_parser(sub)


def build_parser():
    """The parser of `lossbed`: testbed's commands and these."""
    return testbed_cli.build_parser([add_commands])


def main(argv: list[str] | None = None) -> int:
    """`lossbed`: every command, testbed's and these."""
    return testbed_cli.main(argv, more=[add_commands])


if __name__ == "__main__":
    sys.exit(main())
