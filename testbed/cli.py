"""The network half of the `lossbed` command: clusters, impairments and their measurement
(up, down, status, exec, apply, clear, show, verify, renew, inventory). Thin: parse, call the
library, print, map errors to exit codes.

The experiment commands (train, bench, reproduce, compare, collective-bench) live in
harness/cli.py, whose main() is the `lossbed` entry point: it registers them beside these
(build_parser's `more`). testbed never imports harness; `python -m testbed.cli` is lossbed
without the training half.

Why one file of this length: each command is a parser and a handler of a few lines, and the
options several commands share (the cluster: --cluster, --inventory, --slurm; the profile's
changes) are defined once beside them; a reader finds every network command here."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from testbed import checks, clusters, version
from testbed.clusters import netns as netns_cluster
from testbed.errors import LossbedError, UsageError

log = logging.getLogger("lossbed")


def cluster_of(args):
    """The cluster a command works on: the Slurm allocation it runs in, an inventory of real
    hosts, or a local cluster."""
    if in_slurm(args):
        from testbed.clusters import slurm

        return clusters.opened(slurm.from_allocation(lease_s=args.lease_s))
    if getattr(args, "inventory", None):
        from testbed.clusters import remote

        return clusters.opened(remote.from_inventory(
            args.inventory, lease_s=args.lease_s, force_interface=args.force_interface))
    return clusters.load(getattr(args, "cluster", None))


def in_slurm(args) -> bool:
    """Whether a command that takes --slurm runs on its Slurm allocation: asked with --slurm,
    or found (SLURM_JOB_ID set) where no other cluster is named."""
    if not hasattr(args, "slurm"):
        return False
    named = getattr(args, "cluster", None) is not None or getattr(args, "inventory", None)
    if args.slurm and named:
        raise UsageError("--slurm", "the allocation is the cluster: --cluster and --inventory "
                         "name another", "Give --slurm alone, or leave it out")
    from testbed.clusters.slurm import in_allocation

    return bool(args.slurm or (not named and in_allocation()))


def add_slurm(p) -> None:
    """--slurm: the command's cluster is the Slurm allocation it runs in."""
    p.add_argument("--slurm", action="store_true",
                   help="run on this Slurm job's nodes (ranks through srun, the impairment "
                        "by the nodes' lossbed agent); the default inside a job when no "
                        "--cluster or --inventory is given")


def add_inventory(p, impairs: bool = True) -> None:
    """--inventory, and where the command applies an impairment (impairs) the options that
    act on it: --lease-s and --force-interface (elsewhere they would mean nothing)."""
    p.add_argument("--inventory", metavar="FILE", type=checks.user_path,
                   help="real hosts from an (Ansible-format) inventory, over SSH")
    if not impairs:
        p.set_defaults(lease_s=120.0, force_interface=False)
        return
    p.add_argument("--lease-s", type=float, default=120.0,
                   help="remote hosts revert the impairment after this long (seconds) "
                        "without renewal")
    p.add_argument("--force-interface", action="store_true",
                   help="impair an interface even if it carries the default route or SSH")


def add_profile_changes(p) -> None:
    """What a command that applies one profile takes to change it: --set and --loss (a
    fraction; testbed/checks.py holds the rule)."""
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a profile field, e.g. --set delay_ms=5 (repeatable)")
    p.add_argument("--loss", type=checks.loss_text, default=None,
                   help="every path's loss rate as a fraction, 0.1 = 10%%; 0: no loss "
                        "(default: the profile's own rates)")


def add_metrics(p, what: str) -> None:
    """--metrics-port and --metrics-address: Prometheus' endpoint while the command runs."""
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help=f"serve Prometheus metrics (the impairment's, {what}) on this port "
                        "while it runs (0: a free port, printed); docs/guides/monitoring.md")
    p.add_argument("--metrics-address", default="127.0.0.1", metavar="IP",
                   help="where --metrics-port listens (default: 127.0.0.1, this machine "
                        "only; 0.0.0.0: every interface)")


def _cmd_metrics(args) -> int:
    """Serve the impairment's metrics until Ctrl-C (or SIGTERM)."""
    import threading

    from testbed.exporter import server
    from testbed.exporter.impairment import ImpairmentCollector

    checks.port("--port", args.port)
    cluster = cluster_of(args)
    endpoint = server.start([ImpairmentCollector(cluster, min_coverage=args.min_coverage)],
                            args.port, args.address, option="--port")
    print(f"metrics of cluster {cluster.name} on {endpoint.url} (Ctrl-C ends)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    endpoint.stop()
    return 0


def add_min_coverage(p) -> None:
    """What a command that measures under an impairment takes to say how much of the hosts'
    traffic must have crossed it for a run to count (testbed/impair/coverage.py)."""
    from testbed.impair.coverage import DEFAULT_MIN_COVERAGE

    p.add_argument("--min-coverage", type=float, default=DEFAULT_MIN_COVERAGE,
                   help="the least fraction of the hosts' bytes that must cross the "
                        "impairment for a lossy run to count; a run below it fails (bench: "
                        "is left out of every verdict) naming what carried the rest "
                        f"(default: {DEFAULT_MIN_COVERAGE})")


class DefaultsShown(argparse.HelpFormatter):
    """--help says every option's default, where its help text does not already."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default in (None, False, argparse.SUPPRESS)
                or isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction))
                or "default" in text.lower()):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".strip()


def show_defaults(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every command's --help with its defaults (DefaultsShown), and no option taken for
    another by its first letters (`doctor --loss 0.1` is not `--loss-backend 0.1`)."""
    parser.formatter_class = DefaultsShown
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                show_defaults(sub)
    return parser


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
    if args.inventory and args.name:
        raise UsageError("NAME", f"a cluster name ({args.name}) and --inventory",
                         "Give one: NAME for a local cluster, --inventory for real hosts")
    cluster = cluster_of(args) if args.inventory else clusters.load(args.name,
                                                                     "lossbed status NAME")
    status = cluster.status()
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    if args.inventory:
        _print_remote_status(status)
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


def _print_remote_status(status: dict) -> None:
    """Real hosts: what lossbed would impair on each, and a watchdog's failed clear."""
    print(f"inventory {status['inventory']}, MTU {status['mtu']}")
    for h in status["hosts"]:
        carries = [what for what, key in (("the default route", "carries_default_route"),
                                          ("this SSH session", "carries_ssh_session")) if h[key]]
        print(f"{h['name']}: ssh {h['ssh']}, {h['interface']} {h['address']}"
              + (f", carries {' and '.join(carries)}" if carries else "")
              + (f", lease_failure: {h['lease_failure']}" if h["lease_failure"] else ""))


def _cmd_exec(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("CMD", "no command given", "Use: lossbed exec HOST -- CMD ...")
    host = clusters.load(args.cluster).host(args.host)
    sys.stdout.flush()
    return host.exec_passthrough(command)


def _cmd_apply(args) -> int:
    from testbed import profiles
    from testbed.impair import engine, plan

    checks.loss_fraction("--loss", *checks.given(args.loss))
    if args.json and not args.dry_run:
        raise UsageError("--json", "prints the plan of --dry-run; apply itself prints a line",
                         "Add --dry-run to see the plan as JSON, or drop --json")
    profile = profiles.load(args.profile, args.set or [], loss=args.loss)
    cluster = cluster_of(args)
    only = [h for item in args.only or [] for h in item.split(",") if h]
    the_plan, choice = engine.make_plan(cluster, profile, backend=args.backend, only=only)
    print(f"backend: {choice.backend} ({choice.reason})")
    print(plan.stated_loss(profile, args.loss))
    if args.dry_run:
        print(the_plan.describe())
        if args.json:
            print(json.dumps(the_plan.to_dict(), indent=2))
        return 0
    engine.apply(cluster, the_plan, choice)
    print(f"applied profile {profile.name} on {len(the_plan.hosts)} hosts of {cluster.name}")
    if cluster.lease_s is not None:
        print(f"the hosts revert by themselves in {cluster.lease_s:.0f} s unless renewed "
              "(lossbed renew --inventory …; train and bench renew while they run)")
    return 0


def _cmd_clear(args) -> int:
    from testbed.impair import engine

    cluster = cluster_of(args)
    cluster.connect()
    cleared = engine.clear(cluster)
    print(f"cleared {len(cleared)} host impairments on {cluster.name}" if cleared
          else f"nothing was applied on {cluster.name}")
    return 0


def _cmd_show(args) -> int:
    from testbed.impair import engine

    cluster = cluster_of(args)
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

    report = verify.verify(cluster_of(args))
    print(json.dumps(report.to_dict(), indent=2) if args.json else verify.format_report(report))
    return 0


def _cmd_doctor(args) -> int:
    from testbed import doctor
    from testbed.profiles import loading

    if args.set and not args.profile:
        raise UsageError("--set", "changes a profile, and no --profile was given",
                         "Add --profile NAME (the one the run will use), or drop --set")
    profile = loading.load(args.profile, args.set) if args.profile else None
    if args.slurm:  # (what is missing is said, not raised at the first of it)
        from testbed.doctor import slurm as slurm_doctor

        report = slurm_doctor.examine()
        print(json.dumps(report.to_dict(), indent=2) if args.json else doctor.render(report))
        return 3 if report.blocking else 0
    cluster = cluster_of(args)
    report = doctor.examine(cluster, doctor.Request(
        profile=profile, device=args.device, backend=args.process_group,
        transport=args.transport, ranks_per_host=doctor.ranks_per_host(cluster),
        loss_backend=args.loss_backend, force_interface=args.force_interface))
    print(json.dumps(report.to_dict(), indent=2) if args.json else doctor.render(report))
    return 3 if report.blocking else 0


def _cmd_renew(args) -> int:
    cluster = cluster_of(args)
    renewed = [h.name for h in cluster.hosts if h.agent_call("renew", {})]
    print(f"renewed the lease on {', '.join(renewed) or 'no host (nothing applied)'}")
    return 0


def _cmd_inventory(args) -> int:
    """An inventory of a local cluster started with --ssh: its hosts as real ones."""
    import yaml

    from testbed.clusters import sshd

    cluster = clusters.load(args.cluster)
    if not cluster.ssh:
        raise UsageError("--cluster", f"cluster {cluster.name} has no sshd",
                         "Start it with lossbed up --ssh")
    project = str(Path(__file__).resolve().parents[1])
    # namespace hosts: SSH over the management network; VM hosts: over their one NIC
    hosts = {h.name: {"ansible_host": h.mgmt_address or h.address,
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


def build_parser(more=()) -> argparse.ArgumentParser:
    """The parser of testbed's commands, and of those each of `more` (functions of the
    subparsers) adds."""
    parser = argparse.ArgumentParser(
        prog="lossbed", description="Kernel-level network emulation for training under loss."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action=version.Version, nargs=0,
                        help="lossbed's version and the commit of its checkout, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="build a local cluster of namespace hosts")
    p.add_argument("--hosts", type=int, required=True, help="number of hosts (1 or more)")
    p.add_argument("--name", default="local", help="cluster name (default: local)")
    p.add_argument("--mtu", type=int, default=1500, help="link MTU, 68..65535 (default 1500)")
    p.add_argument("--subnet", help="IPv4 CIDR for host addresses (default: a free 10.201.x.0/24)")
    p.add_argument("--ssh", action="store_true", help="run sshd on each host's address")
    p.add_argument("--kind", choices=["netns", "vm"], default="netns",
                   help="netns: namespaces on this kernel; vm: qemu VMs with the "
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
    add_inventory(p, impairs=False)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("exec", help="run a command inside a host")
    p.add_argument("--cluster", help="default: the only cluster up")
    p.add_argument("host", metavar="HOST")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD")
    p.set_defaults(func=_cmd_exec)
    p = sub.add_parser("apply", help="impair a cluster's links with a profile")
    p.add_argument("profile", metavar="PROFILE", type=checks.user_name_or_path,
                   help="a name in netem_profiles/ or a path")
    p.add_argument("--cluster", help="default: the only cluster up")
    add_profile_changes(p)
    p.add_argument("--only", action="append", metavar="H1,H2",
                   help="impair only at these hosts (default: all)")
    p.add_argument("--backend", choices=["netem", "bpf", "nft"],
                   help="force a backend (default: the most capable one the kernel has)")
    add_inventory(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    p.set_defaults(func=_cmd_apply)

    p = sub.add_parser("clear", help="remove the impairment from every host")
    p.add_argument("--cluster", help="default: the only cluster up")
    add_inventory(p, impairs=False)
    p.set_defaults(func=_cmd_clear)

    p = sub.add_parser("show", help="show the profile applied now")
    p.add_argument("--cluster", help="default: the only cluster up")
    add_inventory(p, impairs=False)
    p.add_argument("--json", action="store_true", help="the applied plan as JSON")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("metrics", help="serve the applied impairment's measurements to "
                                       "Prometheus until Ctrl-C")
    p.add_argument("--cluster", help="default: the only cluster up")
    add_inventory(p, impairs=False)
    p.add_argument("--port", type=int, default=9400, help="(default 9400; 0: a free one)")
    p.add_argument("--address", default="127.0.0.1", metavar="IP",
                   help="where it listens (default: 127.0.0.1, this machine only)")
    add_min_coverage(p)
    p.set_defaults(func=_cmd_metrics)

    p = sub.add_parser("verify", help="measure the applied loss from the kernel's counters")
    p.add_argument("--cluster", help="default: the only cluster up")
    add_inventory(p, impairs=False)
    p.add_argument("--json", action="store_true", help="the per-path report as JSON")
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser(
        "doctor", help="check every host for what a run needs, with the fix for what is missing",
        description="Per host: namespaces, kernel modules, ip/tc/nft/ethtool, CAP_NET_ADMIN, "
                    "the NIC, Python, the compiled core, torch, CUDA, GPUs, NCCL, RDMA "
                    "devices and the clock offset, judged against the run described by the "
                    "options. Exit 0: the run can work; 3: something it needs is missing "
                    "(each named with its fix); 2: bad options; 4: no such cluster.")
    p.add_argument("--cluster", help="default: the only cluster up")
    p.add_argument("--inventory", metavar="FILE", type=checks.user_path,
                   help="real hosts from an (Ansible-format) inventory, over SSH")
    p.add_argument("--force-interface", action="store_true",
                   help="the run impairs the interface even if it carries the default route "
                        "or SSH (as apply's): then that is not a failing check")
    p.add_argument("--slurm", action="store_true",
                   help="check this Slurm job's nodes: srun, the allocation, the admin's "
                        "lossbed agent on every node, its policy and the Epilog")
    p.set_defaults(lease_s=120.0)  # doctor applies nothing
    p.add_argument("--profile", type=checks.user_name_or_path,
                   help="a profile the run applies (default: none; any loss "
                                     "backend will do)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="profile override")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where ranks train (default: cpu)")
    p.add_argument("--process-group", choices=("gloo", "nccl"),
                   default=os.environ.get("LOSSBED_BACKEND", "gloo"),
                   help="the reliable baseline's torch.distributed backend (default: "
                        "$LOSSBED_BACKEND or gloo)")
    p.add_argument("--loss-backend", choices=("netem", "bpf", "nft"),
                   help="the loss backend the run forces, as apply --backend (default: "
                        "lossbed chooses)")
    p.add_argument("--transport", default="udp",
                   help="the lossy variants' transport (default: udp; verbs-* need RDMA "
                        "devices)")
    p.add_argument("--json", action="store_true", help="the findings and facts as JSON")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("renew", help="renew the impairment lease on remote hosts")
    p.add_argument("--inventory", metavar="FILE", required=True, type=checks.user_path,
                   help="the hosts, as apply --inventory was given them")
    p.set_defaults(func=_cmd_renew, lease_s=120.0, force_interface=False)

    p = sub.add_parser("inventory", help="print an inventory of a local --ssh cluster")
    p.add_argument("--cluster", help="default: the only cluster up")
    p.set_defaults(func=_cmd_inventory)
    for add in more:
        add(sub)

    return show_defaults(parser)


_MAIN_PID = os.getpid()


def _raise_interrupt(signum, frame):
    # SIGTERM takes the same path as Ctrl-C, so half-built work is torn down. lossbed itself
    # never forks (testbed/host/namespaces.py), but a library's forked child would inherit
    # this handler: it must simply die, never run the parent's cleanup.
    if os.getpid() != _MAIN_PID:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt(f"signal {signum}")


def _check_arguments(args) -> None:
    """What argparse cannot check, before anything runs. Every cluster name obeys the rule:
    a name reaches state paths, namespace names and `down`'s removals (exit 2 otherwise)."""
    from testbed.clusters import naming

    lease_s = getattr(args, "lease_s", None)
    if lease_s is not None:
        checks.seconds("--lease-s", lease_s, 120, "hosts revert that long after the last "
                       "renewal", positive=True)
    min_coverage = getattr(args, "min_coverage", None)
    if min_coverage is not None:
        checks.share("--min-coverage", min_coverage, checks.MIN_COVERAGE_EXAMPLE)
    if isinstance(getattr(args, "json", None), str):  # (elsewhere --json is a switch)
        checks.writable_file("--json", args.json)
    if getattr(args, "out", None):
        checks.writable_folder("--out", args.out)
    if getattr(args, "cluster", None) is not None:
        naming.check_cluster_name(args.cluster, "--cluster")
    if args.command in ("down", "status") and args.name is not None:
        naming.check_cluster_name(args.name, "NAME")
    if args.command == "up":
        naming.check_cluster_name(args.name, "--name")


def main(argv: list[str] | None = None, more=()) -> int:
    args = build_parser(more).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    except Exception as err:  # noqa: BLE001 - a bug of lossbed's: one line, the rest in a log
        if args.verbose:
            raise
        log_path = _write_traceback()
        print(f"lossbed: internal error: {type(err).__name__}: {err} (the traceback is in "
              f"{log_path}; -v prints it here). Please report it with that file",
              file=sys.stderr)
        return 1
    finally:
        clusters.close_opened()  # (a remote cluster's connections: let go of, always)


def _write_traceback() -> str:
    """The current exception's traceback in a file of its own (this process's)."""
    import tempfile
    import traceback

    path = os.path.join(tempfile.gettempdir(), f"lossbed-error-{os.getpid()}.log")
    with open(path, "w") as f:
        traceback.print_exc(file=f)
    return path


if __name__ == "__main__":
    sys.exit(main())
