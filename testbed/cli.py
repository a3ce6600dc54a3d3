"""The `lossbed` command. Thin: parse, call the library, print, map errors to exit codes."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from testbed.errors import LossbedError, UsageError

log = logging.getLogger("lossbed")


def _cluster(args):
    """The cluster a command works on: an inventory of real hosts, or a local cluster."""
    if getattr(args, "inventory", None):
        from testbed.clusters import remote

        return remote.from_inventory(args.inventory, lease_s=args.lease_s,
                                     force_interface=args.force_interface)
    return clusters.load(getattr(args, "cluster", None))


def _add_inventory(p) -> None:
    p.add_argument("--inventory", metavar="FILE",
                   help="real hosts from an (Ansible-format) inventory, over SSH")
    p.add_argument("--lease-s", type=float, default=120.0,
                   help="remote hosts revert the impairment after this long without renewal")
    p.add_argument("--force-interface", action="store_true",
                   help="impair an interface even if it carries the default route or SSH")


def _cmd_up(args) -> int:
    if args.kind == "vm":
        from testbed.clusters.vm import cluster as vm_cluster

        cluster = vm_cluster.up(vm_cluster.VMSpec(
            hosts=args.hosts, name=args.name, mtu=args.mtu, subnet=args.subnet, ssh=args.ssh,
            rdma=args.rdma, memory_mb=args.memory_mb))
        extra = f", {cluster.accel.upper()}, kernel {cluster.kernel}"
    else:
        if args.rdma:
            raise UsageError("--rdma", "namespace hosts cannot carry Soft-RoCE traffic "
                             "(kernel 6.1 rxe devices do not work from namespaces)",
                             "Use --kind vm --rdma")
        cluster = netns_cluster.up(netns_cluster.ClusterSpec(
            hosts=args.hosts, name=args.name, mtu=args.mtu, subnet=args.subnet, ssh=args.ssh))
        extra = ""
    print(f"cluster {cluster.name} ({cluster.kind}): {len(cluster.hosts)} hosts on "
          f"{cluster.subnet}, MTU {cluster.mtu}{extra}"
          f"{', sshd on each host' if cluster.ssh else ''}")
    return 0


def _cmd_down(args) -> int:
    if args.all:
        names = clusters.known_clusters()
    else:
        names = [clusters.resolve_name(args.name, "lossbed down NAME")]
    for name in names:
        report = clusters.down(name)
        print(f"cluster {name}: removed {report['namespaces']} namespaces, "
              f"stopped {report['processes']} processes")
    if args.all and not names:
        print("no lossbed cluster or leftover found")
    return 0


def _cmd_status(args) -> int:
    cluster = clusters.load(args.name, "lossbed status NAME")
    status = cluster.status()
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"cluster {status['name']} ({status['kind']}), subnet {status['subnet']}, "
          f"MTU {status['mtu']}")
    print(f"{'host':<6} {'address':<16} {'if':<6} {'mtu':>6} {'offloads':<9} {'state':<6} sshd")
    for h in status["hosts"]:
        offloads = "on" if any(h["offloads"].values()) else "off"
        sshd_pid = h["sshd_pid"]
        sshd_text = f"pid {sshd_pid}" if sshd_pid else ("down" if "ssh" in status else "-")
        print(f"{h['name']:<6} {h['address']:<16} {h['interface']:<6} {h['mtu']:>6} "
              f"{offloads:<9} {h['state']:<6} {sshd_text}")
    if "ssh" in status:
        s = status["ssh"]
        print(f"ssh: ssh -i {s['key']} -o UserKnownHostsFile={s['known_hosts']} "
              f"{s['user']}@ADDRESS")
    return 0


def _cmd_exec(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("CMD", "no command given", "Use: lossbed exec HOST -- CMD ...")
    host = clusters.load(args.cluster).host(args.host)
    sys.stdout.flush()
    return host.exec_passthrough(command)


def _cmd_apply(args) -> int:
    from testbed import profiles
    from testbed.impair import engine

    profile = profiles.load(args.profile, args.set or [])
    cluster = _cluster(args)
    only = [h for item in args.only or [] for h in item.split(",") if h]
    the_plan, choice = engine.make_plan(cluster, profile, backend=args.backend, only=only)
    print(f"backend: {choice.backend} ({choice.reason})")
    if args.dry_run:
        print(the_plan.describe())
        if args.json:
            print(json.dumps(the_plan.to_dict(), indent=2))
        return 0
    engine.apply(cluster, the_plan, choice)
    print(f"applied profile {profile.name} on {len(the_plan.hosts)} hosts of {cluster.name}")
    if cluster.kind == "remote":
        print(f"the hosts revert by themselves in {cluster.lease_s:.0f} s unless renewed "
              "(lossbed renew --inventory …; train and bench renew while they run)")
    return 0


def _cmd_clear(args) -> int:
    from testbed.impair import engine

    cluster = _cluster(args)
    if cluster.kind == "remote":
        cluster.connect()
    cleared = engine.clear(cluster)
    print(f"cleared {len(cleared)} host impairments on {cluster.name}" if cleared
          else f"nothing was applied on {cluster.name}")
    return 0


def _cmd_show(args) -> int:
    from testbed.impair import engine

    cluster = _cluster(args)
    record = engine.read_record(cluster)
    if record is None:
        print(json.dumps(None) if args.json else f"nothing is applied on {cluster.name}")
        return 0
    the_plan, record = engine.applied_plan(cluster)
    if args.json:
        print(json.dumps({"record": record, "plan": the_plan.to_dict()}, indent=2))
    else:
        print(f"backend: {record['backend']} ({record['reason']})")
        print(the_plan.describe())
    return 0


def _cmd_verify(args) -> int:
    from testbed.impair import verify

    report = verify.verify(_cluster(args))
    print(json.dumps(report.to_dict(), indent=2) if args.json else verify.format_report(report))
    return 0


def _cmd_collective_bench(args) -> int:
    from harness.bench import collective_bench as cb
    from testbed.clusters import netns as netns_cluster

    spec = cb.BenchSpec(sizes_mib=args.sizes, losses=args.loss, profiles=args.profiles,
                        algorithms=args.algorithms, iters=args.iters, unsealed=args.unsealed)
    spec.validate()
    if args.cluster is None and args.hosts < 2:
        raise UsageError("--hosts", f"{args.hosts} host cannot run a collective",
                         "Use --hosts 2 or more (4 by default)")
    own = None
    if args.cluster is not None:
        cluster = clusters.load(args.cluster)
    else:
        own = f"cb{os.getpid() % 100000}"
        cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=args.hosts, name=own,
                                                             mtu=args.mtu))
    try:
        rows = cb.run(cluster, spec, progress=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        if own:
            clusters.down(own)
    print(cb.format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"wrote {len(rows)} rows to {args.json}")
    return 0


def _cmd_train(args) -> int:
    from harness.train import run
    from harness.train.config import TrainConfig

    cfg = TrainConfig(variant=args.variant, steps=args.steps, seed=args.seed,
                      transport=args.transport, resync_every=args.resync_every,
                      eval_tokens=args.eval_tokens, corpus=args.corpus,
                      hf_dataset=args.hf_dataset, hf_text_field=args.hf_text_field,
                      warmup_steps=args.warmup_steps, lossy_stage=args.lossy_stage,
                      save_model=_new_folder(args.save_model, "--save-model"),
                      **_training_options(args))
    cfg.validate()  # the options and LOSSBED_* settings first, before any cluster is touched
    from harness import launch

    launch.check_environment()
    cluster = _cluster(args)
    run.check(cfg, cluster)  # bad input is refused before any process starts
    sets = [*(args.set or []), *(["isolated=true"] if args.unsealed else [])]
    rec = run.train(cluster, cfg, args.profile, sets, args.out,
                    echo=lambda line: print(line, file=sys.stderr, flush=True))
    summary = {k: rec[k] for k in ("variant", "profile", "loss", "seed", "steps", "ppl",
                                   "ppl_rank0", "drift", "tokens_per_s", "measured_loss")}
    print(json.dumps(summary))
    if rec.get("wire_warning"):
        print(f"warning: {rec['wire_warning']}", file=sys.stderr)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return 0


def _new_folder(path: str | None, option: str) -> str | None:
    """An absolute path for a folder a run writes, refused if it holds anything already (a
    run never overwrites what another left)."""
    if path is None:
        return None
    folder = Path(path).resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(option, f"{folder} exists and is not an empty folder",
                         "Give a new folder (nothing is overwritten)")
    return str(folder)


@contextlib.contextmanager
def _bench_cluster(prefix: str, spec):
    """A local cluster made for one bench alone (spec.hosts, spec.mtu), removed after, also
    on Ctrl-C and on failure. Its datagrams are sealed like any others unless the bench
    was asked for --unsealed (spec.isolated: then its profiles say isolated)."""
    name = f"{prefix}{os.getpid() % 100000}"
    cluster = netns_cluster.up(netns_cluster.ClusterSpec(hosts=spec.hosts, name=name,
                                                         mtu=spec.mtu))
    try:
        yield cluster
    finally:
        clusters.down(name)


def _cmd_bench(args) -> int:
    import time
    from pathlib import Path

    from harness.bench import report
    from harness.bench.spec import DEFAULT_VARIANTS, BenchSpec
    from harness.bench.training_bench import run_bench

    spec = BenchSpec(losses=args.loss, profile=args.profile, hosts=args.hosts, steps=args.steps,
                     seeds=args.seeds, variants=args.variants or list(DEFAULT_VARIANTS),
                     mtu=args.mtu, realisations=args.realisations,
                     speed_steps=args.speed_steps, isolated=args.unsealed,
                     stability=args.stability,
                     **_regime_options(args), **_training_options(args))
    spec.validate()  # bad input is refused before anything is built
    # absolute: ranks on remote hosts write under it from their own working folder
    out = Path(args.out or f"results/bench-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if args.cluster is not None or args.inventory:
        place = contextlib.nullcontext(_cluster(args))
    else:
        place = _bench_cluster("bench", spec)
    with place as cluster:
        summary = run_bench(cluster, spec, out,
                            echo=lambda line: print(line, file=sys.stderr, flush=True))
    print(report.table(summary))
    print(f"results in {out}/ (results.jsonl, summary.json, summary.md, *.png)")
    return 0


def _cmd_reproduce(args) -> int:
    import time
    from pathlib import Path

    from harness.reproduce import report

    rows = sorted(set(args.rows or report.ROWS))
    unknown = [r for r in rows if r not in report.ROWS]
    if unknown:
        raise UsageError("--rows", f"no row {', '.join(unknown)}",
                         f"Use some of {' '.join(report.ROWS)} (4: the training rows 4 and 5; "
                         "6: the regime map)")
    out = Path(args.out or f"results/reproduce-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    # rows 1-3 start many loopback transports in this process: their start-up lines are
    # noise here (the bench's ranks log in their own processes)
    logging.getLogger("harness.transport").setLevel(logging.WARNING)
    # the training rows' benches each on a cluster of their own
    result = report.run(quick=not args.full, out=out, rows=rows,
                        make_cluster=lambda spec: _bench_cluster("repro", spec),
                        echo=lambda line: print(line, file=sys.stderr, flush=True),
                        regime=_regime_options(args))
    print(report.markdown(result))
    print(f"results in {out}/ (reproduction.md, reproduction.json)")
    return 0


def _cmd_compare(args) -> int:
    from harness.bench.compare import compare, format_findings
    from harness.bench.training_bench import load_summary

    findings = compare(load_summary(args.base), load_summary(args.new),
                       threshold_pct=args.threshold_pct, ppl_points=args.ppl_points)
    print(format_findings(findings))
    return 1 if any(f.regressed for f in findings) else 0


def _cmd_renew(args) -> int:
    cluster = _cluster(args)
    renewed = [h.name for h in cluster.hosts if h.agent_call("renew", {})]
    print(f"renewed the lease on {', '.join(renewed) or 'no host (nothing applied)'}")
    return 0


def _cmd_inventory(args) -> int:
    """An inventory of a local cluster started with --ssh: its hosts as real ones."""
    import yaml

    from testbed.clusters import sshd

    cluster = clusters.load(args.cluster)
    if not getattr(cluster, "ssh", False):
        raise UsageError("--cluster", f"cluster {cluster.name} has no sshd",
                         "Start it with lossbed up --ssh")
    project = str(Path(__file__).resolve().parents[1])
    # namespace hosts: SSH over the management network; VM hosts: over their one NIC
    hosts = {h.name: {"ansible_host": getattr(h, "mgmt_address", "") or h.address,
                      "lossbed_interface": h.ifname, "lossbed_address": h.address}
             for h in cluster.hosts}
    doc = {"all": {"vars": {
        "ansible_user": "root", "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_private_key_file": str(sshd.client_key(cluster.state_dir)),
        "lossbed_known_hosts": str(sshd.known_hosts(cluster.state_dir)),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={sshd.known_hosts(cluster.state_dir)}"
                                   " -o StrictHostKeyChecking=yes",
        "lossbed_project": project, "lossbed_python": sys.executable,
        "lossbed_mtu": cluster.mtu}, "hosts": hosts}}
    print(f"# hosts of local cluster {cluster.name}; run the controller in its management "
          f"namespace: ip netns exec lossbed-{cluster.name}-ctl lossbed … --inventory FILE")
    print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def _add_training_options(p, defaults) -> None:
    """The model, data and optimisation options `train` and `bench` share."""
    p.add_argument("--preset", default=defaults.preset,
                   help="tiny, small, or a local HF model folder")
    p.add_argument("--device", default=defaults.device, help="cpu, or cuda (GPU hosts)")
    p.add_argument("--batch", type=int, default=defaults.batch,
                   help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=defaults.seq_len)
    p.add_argument("--lr", type=float, default=defaults.lr, help="the peak learning rate")
    p.add_argument("--optimizer", default=defaults.optimizer,
                   help="adamw or sgd (momentum 0.9; RPS's paper uses SGD)")
    p.add_argument("--schedule", default=defaults.schedule,
                   help="cosine (warm-up, then decay to 10%%) or constant")
    p.add_argument("--tokenizer", default=defaults.tokenizer,
                   help="bpe (subword, trained on the training split), bpe:N, bytes, or a "
                        "local HF tokenizer folder")


def _add_regime_options(p) -> None:
    """Where the runs start from (bench and reproduce)."""
    from harness.bench.spec import DEFAULT_STEPS, FINETUNE_LR, REGIMES

    p.add_argument("--regime", choices=REGIMES, default="scratch",
                   help="scratch: every run from its seed's initialisation at --lr; "
                        "finetune: from its seed's lossless checkpoint (--pretrain-steps at "
                        "--lr, trained once and cached in .cache/checkpoints/) at "
                        "--finetune-lr")
    p.add_argument("--finetune-lr", type=float, default=FINETUNE_LR,
                   help=f"finetune: the runs' peak rate (default {FINETUNE_LR:g})")
    p.add_argument("--pretrain-steps", type=int, default=DEFAULT_STEPS,
                   help=f"finetune: the checkpoints' steps (default {DEFAULT_STEPS})")


def _regime_options(args) -> dict:
    return dict(regime=args.regime, finetune_lr=args.finetune_lr,
                pretrain_steps=args.pretrain_steps)


def _training_options(args) -> dict:
    return {k: getattr(args, k) for k in ("preset", "device", "batch", "seq_len", "lr",
                                          "optimizer", "schedule", "tokenizer")}


def build_parser() -> argparse.ArgumentParser:
    from harness.bench.spec import BenchSpec
    from harness.train.config import TrainConfig

    parser = argparse.ArgumentParser(
        prog="lossbed", description="Kernel-level network emulation for training under loss."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="build a local cluster of namespace hosts")
    p.add_argument("--hosts", type=int, required=True, help="number of hosts (1 or more)")
    p.add_argument("--name", default="local", help="cluster name (default: local)")
    p.add_argument("--mtu", type=int, default=1500, help="link MTU, 68..65535 (default 1500)")
    p.add_argument("--subnet", help="IPv4 CIDR for host addresses (default: a free 10.201.x.0/24)")
    p.add_argument("--ssh", action="store_true", help="run sshd on each host's address")
    p.add_argument("--kind", choices=["netns", "vm"], default="netns",
                   help="netns: namespaces on this kernel (default); vm: qemu VMs with the "
                        "distribution's kernel (netem, IFB, Soft-RoCE)")
    p.add_argument("--rdma", action="store_true", help="VM hosts: a Soft-RoCE device each")
    p.add_argument("--memory-mb", type=int, default=768, help="VM hosts: memory per VM")
    p.set_defaults(func=_cmd_up)

    p = sub.add_parser("down", help="remove a cluster and any leftovers of it")
    p.add_argument("name", nargs="?", metavar="NAME", help="default: the only cluster up")
    p.add_argument("--all", action="store_true", help="every lossbed cluster on this machine")
    p.set_defaults(func=_cmd_down)

    p = sub.add_parser("status", help="show a cluster's hosts as the kernel reports them")
    p.add_argument("name", nargs="?", metavar="NAME", help="default: the only cluster up")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("exec", help="run a command inside a host")
    p.add_argument("--cluster", help="default: the only cluster up")
    p.add_argument("host", metavar="HOST")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD")
    p.set_defaults(func=_cmd_exec)
    p = sub.add_parser("apply", help="impair a cluster's links with a profile")
    p.add_argument("profile", metavar="PROFILE", help="a name in netem_profiles/ or a path")
    p.add_argument("--cluster", help="default: the only cluster up")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a profile field, e.g. --set loss_pct=10 (repeatable)")
    p.add_argument("--only", action="append", metavar="H1,H2",
                   help="impair only at these hosts (default: all)")
    p.add_argument("--backend", choices=["netem", "bpf", "nft"],
                   help="force a backend (default: the most capable one the kernel has)")
    _add_inventory(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    p.set_defaults(func=_cmd_apply)

    p = sub.add_parser("clear", help="remove the impairment from every host")
    p.add_argument("--cluster", help="default: the only cluster up")
    _add_inventory(p)
    p.set_defaults(func=_cmd_clear)

    p = sub.add_parser("show", help="show the profile applied now")
    p.add_argument("--cluster", help="default: the only cluster up")
    _add_inventory(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("verify", help="measure the applied loss from the kernel's counters")
    p.add_argument("--cluster", help="default: the only cluster up")
    _add_inventory(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser("train", help="train a small LLaMA across a cluster under a profile")
    p.add_argument("--cluster", help="default: the only cluster up")
    _add_inventory(p)
    p.add_argument("--variant", default="reliable",
                   help="reliable, zero_fill, unbiased, unbiased_drift or rps")
    p.add_argument("--profile", default="clean", help="impairment profile (default: clean)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="profile override")
    p.add_argument("--steps", type=int, default=TrainConfig.steps)
    p.add_argument("--seed", type=int, default=0)
    _add_training_options(p, TrainConfig)
    p.add_argument("--warmup-steps", type=int,
                   help="learning-rate warm-up (default: 5%% of the steps)")
    p.add_argument("--transport", default="udp",
                   help="loss semantics of the lossy variants: udp, roce-ud, roce-uc[:BYTES], "
                        "roce-rc[:BYTES]; or real RDMA queue pairs: verbs-ud, verbs-uc[:BYTES], "
                        "verbs-rc[:BYTES] (verbs = verbs-uc)")
    p.add_argument("--resync-every", type=int, default=0,
                   help="unbiased_drift: reliable parameter resync every K steps (0: never)")
    p.add_argument("--save-model", metavar="DIR",
                   help="write rank 0's trained model and its tokenizer to DIR (on rank 0's "
                        "host), for a later --preset DIR --tokenizer DIR")
    p.add_argument("--lossy-stage", default="both", choices=["both", "reduce", "broadcast"],
                   help="lossy variants: the stage that crosses the lossy transport; the "
                        "other goes over gloo, delivered in full (default: both)")
    p.add_argument("--eval-tokens", type=int, default=0, help="0: the whole held-out split")
    p.add_argument("--corpus", help="a text file (default: pydoc_data.topics)")
    p.add_argument("--hf-dataset", help="an HF dataset in the local cache, or a saved folder")
    p.add_argument("--hf-text-field", default="text",
                   help="the HF dataset's column with the text (default: text)")
    p.add_argument("--out", help="folder for the ranks' metrics (default: a temporary one)")
    p.add_argument("--json", metavar="FILE", help="append the run's record to this file")
    _add_unsealed(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("bench", help="every variant at LOSS vs the lossless reference")
    p.add_argument("--loss", type=float, nargs="+", default=[0.1],
                   help="loss rates as fractions (0.1 = 10%%), e.g. --loss 0.01 0.05 0.1")
    p.add_argument("--profile", default="random-loss", help="random-loss or burst-loss")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--steps", type=int, default=BenchSpec.steps)
    p.add_argument("--seeds", type=int, default=BenchSpec.seeds)
    p.add_argument("--variants", nargs="+",
                   help="default: reliable unbiased_drift rps; the ablations zero_fill and "
                        "unbiased on request (or all five: make bench-full); each "
                        "NAME[/reduce|/broadcast][/resync=K][@TRANSPORT]")
    p.add_argument("--realisations", type=int, default=BenchSpec.realisations,
                   help="loss seeds at seed 0 for unbiased_drift and rps (1: no more)")
    p.add_argument("--speed-steps", type=int, default=BenchSpec.speed_steps,
                   help="steps of reliable under loss (its speed; its model is checked)")
    p.add_argument("--stability", action="store_true",
                   help="one run more: seed 0's lossless reference with its initial weights "
                        "moved by 1e-6, to check that the regime is not chaotic (summary: "
                        "stability; reproduce always runs it)")
    _add_training_options(p, BenchSpec)
    _add_regime_options(p)
    p.add_argument("--out", help="results folder (default: results/bench-TIME)")
    p.add_argument("--cluster", help="reuse this cluster instead of building one")
    _add_inventory(p)
    _add_unsealed(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("renew", help="renew the impairment lease on remote hosts")
    p.add_argument("--inventory", metavar="FILE", required=True)
    p.set_defaults(func=_cmd_renew, lease_s=120.0, force_interface=False)

    p = sub.add_parser("inventory", help="print an inventory of a local --ssh cluster")
    p.add_argument("--cluster", help="default: the only cluster up")
    p.set_defaults(func=_cmd_inventory)

    p = sub.add_parser("compare", help="regressions between two bench results (exit 1)")
    p.add_argument("base", metavar="BASE", help="summary.json (or its folder)")
    p.add_argument("new", metavar="NEW", help="summary.json (or its folder)")
    p.add_argument("--threshold-pct", type=float, default=10.0)
    p.add_argument("--ppl-points", type=float, default=1.0)
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("reproduce",
                       help="both papers' claims measured here, each with a verdict")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="small sizes and a short training row (the default; ~10 min)")
    mode.add_argument("--full", action="store_true",
                      help="the sizes the claims need (hours: rows 4-5 train 8 seeds)")
    p.add_argument("--rows", nargs="+", metavar="ROW",
                   help="only these rows: 1 aggregation, 2 drift, 3 RPS scaling, "
                        "4 training (rows 4 and 5), 6 the regime map; default all")
    _add_regime_options(p)
    p.add_argument("--out", help="results folder (default: results/reproduce-TIME)")
    p.set_defaults(func=_cmd_reproduce)

    p = sub.add_parser("collective-bench",
                       help="lossy all-reduce, RPS and gloo side by side under loss")
    p.add_argument("--cluster", help="use this cluster (default: build a local one)")
    p.add_argument("--hosts", type=int, default=4, help="hosts of the local cluster")
    p.add_argument("--mtu", type=int, default=9000, help="MTU of the local cluster")
    p.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64], metavar="MIB")
    p.add_argument("--loss", type=float, nargs="+", default=[0, 0.01, 0.1],
                   help="loss rates as fractions (0.1 = 10%%)")
    p.add_argument("--profiles", nargs="+", default=["random-loss", "burst-loss"])
    p.add_argument("--algorithms", nargs="+",
                   default=["reliable", "zero_fill", "unbiased", "rescale", "rps"],
                   help="reliable (gloo's all-reduce), zero_fill, unbiased (received mean), "
                        "rescale (1/(1-p)), rps; each optionally @TRANSPORT")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", metavar="FILE", help="also write one JSON object per line")
    _add_unsealed(p)
    p.set_defaults(func=_cmd_collective_bench)
    return parser


def _add_unsealed(p) -> None:
    p.add_argument("--unsealed", action="store_true",
                   help="send the datagrams without their MAC (default: every datagram "
                        "sealed with a key drawn for the launch); to price the MAC, on a "
                        "network only the experiment uses")


_MAIN_PID = os.getpid()


def _raise_interrupt(signum, frame):
    # SIGTERM takes the same path as Ctrl-C, so half-built work is torn down. A forked child
    # (pyroute2 forks to open sockets in namespaces) inherits this handler: it must simply
    # die, never run the parent's cleanup.
    if os.getpid() != _MAIN_PID:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt(f"signal {signum}")


def _check_arguments(args) -> None:
    """What argparse cannot check, before anything runs. Every cluster name obeys the rule:
    a name reaches state paths, namespace names and `down`'s removals (exit 2 otherwise)."""
    import math

    from testbed.clusters import naming

    lease_s = getattr(args, "lease_s", None)
    if lease_s is not None and not (math.isfinite(lease_s) and lease_s > 0):
        raise UsageError("--lease-s", f"{lease_s} is not a positive number of seconds",
                         "e.g. --lease-s 120 (hosts revert that long after the last renewal)")
    if getattr(args, "cluster", None) is not None:
        naming.check_cluster_name(args.cluster, "--cluster")
    if args.command in ("down", "status") and args.name is not None:
        naming.check_cluster_name(args.name, "NAME")
    if args.command == "up":
        naming.check_cluster_name(args.name, "--name")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    # pyroute2 logs every netlink retry at INFO; keep the console for lossbed's own lines.
    logging.getLogger("pyroute2").setLevel(logging.WARNING)
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        _check_arguments(args)
        return args.func(args)
    except LossbedError as err:
        print(f"lossbed: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("lossbed: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
