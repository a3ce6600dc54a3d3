"""`lossbed doctor`: per host, what each lossbed feature needs and whether it is there, judged
against the run that is asked for, with the command that fixes each missing piece.

The facts are gathered on every host at once (testbed/host/checkup.py, the `checkup` agent
operation); this module judges them. A check is *needed* when the requested run cannot work
without it (its failure makes `doctor` exit 3, and `train`/`bench` refuse to launch ranks);
the others are reported for the record (a module the chosen backend does not use, a clock
offset, offloads lossbed turns off itself).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.errors import EnvironmentProblem, UsageError
from testbed.host.checkup import MODULES
from testbed.python_packages import release

PROJECT_ROOT = str(Path(__file__).resolve().parents[1])
MIN_PYTHON = (3, 11)
MIN_TORCH = (2, 4)
CLOCK_TOLERANCE_S = 0.001  # tail latencies across hosts mean little beyond this offset
DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl")

COMMAND_FIX = {
    "ip": "apt-get install iproute2 (make setup-bench does)",
    "tc": "apt-get install iproute2 (make setup-bench does)",
    "nft": "apt-get install nftables (make setup-bench does)",
    "ethtool": "apt-get install ethtool (make setup-bench does)",
}
MODULE_FIX = {
    "sch_netem": "modprobe sch_netem; if it is not there: apt-get install "
                 "linux-modules-extra-$(uname -r) (Ubuntu), or use VM hosts "
                 "(lossbed up --kind vm) for netem-only impairments (delay, rate, reorder)",
    "ifb": "modprobe ifb (ingress impairment with netem)",
    "act_mirred": "modprobe act_mirred (ingress impairment with netem)",
    "cls_bpf": "modprobe cls_bpf (the bpf backend)",
    "nf_tables": "modprobe nf_tables (the nft backend)",
    "sch_htb": "modprobe sch_htb (rate limits)",
    "rdma_rxe": "modprobe rdma_rxe (Soft-RoCE)",
}


@dataclass(frozen=True)
class Request:
    """The run the checks are judged against."""

    profile: object | None = None  # a testbed.profiles.model.Profile, or None: any loss
    device: str = "cpu"
    backend: str = "gloo"
    transport: str = "udp"
    ranks_per_host: int = 1
    loss_backend: str | None = None  # as `apply --backend`: None lets lossbed choose
    force_interface: bool = False  # the run impairs the NIC even if it carries SSH (apply's)

    def __post_init__(self):
        if self.device not in DEVICES:
            raise UsageError("--device", f"{self.device!r} is not a device lossbed trains on",
                             f"Use one of: {', '.join(DEVICES)}")
        if self.backend not in BACKENDS:
            raise UsageError("LOSSBED_BACKEND", f"{self.backend!r} is not a reliable backend",
                             f"Use one of: {', '.join(BACKENDS)}")


@dataclass
class Finding:
    host: str
    check: str
    state: str
    ok: bool
    needed: bool
    fix: str = ""


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.needed and not f.ok]

    def to_dict(self) -> dict:
        return {"ok": not self.blocking, "findings": [asdict(f) for f in self.findings],
                "facts": self.facts}


def ranks_per_host(cluster) -> int:
    """The most ranks one host runs: one per GPU where the inventory gives lossbed_gpus."""
    return max(max(1, h.gpus) for h in cluster.hosts)


def clock_offset(host, rounds: int = 5) -> tuple[float, float]:
    """(the host's clock minus this machine's, ± half the shortest round trip): the round
    trip with the least delay bounds the offset tightest, as NTP takes it. The host reads its
    clock with date(1): one exec, no interpreter starting inside the round trip."""
    best = None
    for _ in range(rounds):
        before = time.time()
        read = host.run(["date", "+%s.%N"], check=True)
        after = time.time()
        there = float(read.stdout.decode().strip())
        if best is None or after - before < best[1] * 2:
            best = (there - (before + after) / 2, (after - before) / 2)
    return best


def gather(cluster, with_python: bool = True) -> dict[str, dict]:
    """Every host's facts, hosts at once; each with its clock offset against this machine."""
    hosts = list(cluster.hosts)
    local = cluster.shares_this_machine

    def one(indexed):
        index, host = indexed
        payload = {"python": cluster.rank_python(host),
                   "project": host.project or PROJECT_ROOT,
                   # hosts on this machine share one interpreter: examine it once
                   "python_facts": with_python and (index == 0 or not local)}
        try:
            facts = host.agent_call("checkup", payload)
            facts["clock_offset_s"], facts["clock_uncertainty_s"] = clock_offset(host)
        except Exception as err:  # an unreachable host is a finding, not a crash
            return host.name, {"host": host.name, "unreachable": str(err)}
        return host.name, facts

    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        found = dict(pool.map(one, enumerate(hosts)))
    if local and with_python and hosts:
        first = found[hosts[0].name].get("python")
        for facts in found.values():
            if first is not None and "unreachable" not in facts:
                facts["python"] = first
    return found


def judge(cluster, facts: dict[str, dict], request: Request) -> Report:
    report = Report(facts=facts)
    add = report.findings.append
    for host in cluster.hosts:
        f = facts[host.name]
        name = host.name
        if "unreachable" in f:
            add(Finding(name, "reachable", f["unreachable"], False, True,
                        "check the inventory's address and SSH key (lossbed_address, "
                        "ansible_host)"))
            continue
        add(Finding(name, "namespaces", "yes" if f["namespaces"] else "no", f["namespaces"],
                    cluster.shares_this_machine, "a kernel with CONFIG_NET_NS"))
        add(Finding(name, "CAP_NET_ADMIN", "yes" if f["cap_net_admin"] else "no",
                    f["cap_net_admin"], True, "run as root (or grant CAP_NET_ADMIN)"))
        for command, path in f["commands"].items():
            needed = command in ("ip", "tc") or (command == "nft" and (
                request.loss_backend == "nft" or _backend_is(f, "nft")))
            add(Finding(name, command, path or "not on PATH", path is not None, needed,
                        COMMAND_FIX[command]))
        for module in MODULES:
            state = f["modules"].get(module)
            shown = {None: "absent", "unknown": "module lists not readable"}.get(state, state)
            add(Finding(name, module, shown, state is not None, False,
                        "" if state == "unknown" else MODULE_FIX[module]))
        _judge_nic(add, name, f.get("nic", {}), request.force_interface)
        _judge_python(add, name, f.get("python"), request, f.get("gpu_driver"))
        if request.transport.startswith("verbs"):
            devices = f.get("rdma_devices", [])
            add(Finding(name, "RDMA devices", ", ".join(devices) or "none", bool(devices), True,
                        "an RDMA NIC with rdma-core, or Soft-RoCE: modprobe rdma_rxe && rdma "
                        "link add rxe0 type rxe netdev IF; or --transport udp/roce-*"))
        offset = f.get("clock_offset_s", 0.0)
        spread = f.get("clock_uncertainty_s", 0.0)
        add(Finding(name, "clock offset", f"{offset * 1e3:+.2f} ms (±{spread * 1e3:.2f})",
                    abs(offset) <= CLOCK_TOLERANCE_S + spread, False,
                    "synchronise the hosts' clocks (chrony or PTP): tail latency across "
                    "hosts needs them"))
    _judge_backend(report, cluster, facts, request)
    _judge_bypasses(add, cluster, facts, request)
    return report


def _judge_bypasses(add, cluster, facts: dict[str, dict], request: Request,
                    environ: dict | None = None) -> None:
    """Every way around the impaired interface that can be seen before a run: a second
    interface that reaches a peer, hardware RDMA devices (NCCL's IB transport), and this
    controller's gloo/NCCL variables that ranks on this machine would inherit. lossbed's
    own launchers keep their ranks on the impaired interface; coverage measures the rest."""
    import ipaddress
    import os

    from testbed.impair import bypass

    def addresses_of(host) -> list:
        f = facts.get(host.name, {})
        return [ipaddress.ip_interface(a).ip for a in f.get("nic", {}).get("addresses", [])
                + [a for listed in f.get("other_interfaces", {}).values() for a in listed]]

    addresses = {host.name: addresses_of(host) for host in cluster.hosts}
    for host in cluster.hosts:
        f = facts.get(host.name, {})
        for ifname, listed in f.get("other_interfaces", {}).items():
            nets = [ipaddress.ip_interface(a).network for a in listed]
            peers = [p.name for p in cluster.hosts if p.name != host.name
                     and any(ip in net for ip in addresses[p.name] for net in nets)]
            if peers:
                add(Finding(host.name, "second path to peers",
                            f"{ifname} ({', '.join(listed)}) reaches {', '.join(peers)} "
                            f"around the impaired {host.ifname}", False, False,
                            f"lossbed's ranks use {host.ifname} (GLOO_SOCKET_IFNAME, "
                            "NCCL_SOCKET_IFNAME); a job that binds "
                            f"{ifname} is not impaired, and coverage makes its run no result"))
        devices = f.get("hardware_rdma", [])
        if devices and not (cluster.shares_this_machine and host is not cluster.hosts[0]):
            add(Finding(host.name, "RDMA bypass",
                        f"{', '.join(devices)}: NCCL's IB/RoCE transport talks to them "
                        "directly, and no qdisc sees it", False, False,
                        "lossbed's ranks run NCCL with NCCL_IB_DISABLE=1 over sockets on the "
                        "impaired interface; --transport verbs-* on these devices needs "
                        "LOSSBED_DROP_MASK=SEED:RATE for its loss"))
    for name, value, does in bypass.inherited_contradictions(
            os.environ if environ is None else environ, cluster):
        add(Finding("controller", name, f"{name}={value} {does}", False, True,
                    f"unset {name}: lossbed sets it for every rank"))


def _backend_is(facts: dict, name: str) -> bool:
    """Whether `name` is the best loss backend this host's kernel offers."""
    from testbed.impair.registry import PREFERENCE

    available = [b for b in PREFERENCE if facts.get("backends", {}).get(b, "absent") is None]
    return bool(available) and available[0] == name


def _judge_nic(add, name: str, nic: dict, forced: bool) -> None:
    if "error" in nic:
        add(Finding(name, "NIC", nic["error"], False, True,
                    "set lossbed_interface to the data-plane NIC"))
        return
    speed = nic.get("speed_mbit")
    add(Finding(name, "NIC", f"{nic.get('name')}, MTU {nic.get('mtu')}, "
                f"{f'{speed} Mbit/s' if speed and speed > 0 else 'speed not reported'}",
                True, False))
    risky = [what for what, key in (("the default route", "carries_default_route"),
                                    ("this SSH session", "carries_ssh_session")) if nic.get(key)]
    add(Finding(name, "NIC carries", " and ".join(risky) or "data traffic only", not risky,
                not forced, "impair the data-plane NIC (lossbed_interface), or pass "
                "--force-interface"))
    merging = nic.get("offloads_on")
    if merging is not None:
        add(Finding(name, "merging offloads on", ", ".join(merging) or "none", not merging,
                    False, f"lossbed turns them off on the links it makes; on a real NIC: "
                    f"ethtool -K {nic.get('name')} gro off gso off tso off"))


def _judge_python(add, name: str, py: dict | None, request: Request,
                  driver: str | None) -> None:
    if py is None:
        return
    if "error" in py:
        add(Finding(name, "Python", f"{py.get('executable')}: {py['error']}", False, True,
                    "set lossbed_python to a Python 3.11+ that has torch (the inventory)"))
        return
    version = release(py["version"])
    add(Finding(name, "Python", f"{py['version']} ({py['executable']})",
                version >= MIN_PYTHON, True, "Python 3.11 or newer"))
    add(Finding(name, "compiled core", "built" if "core" in py else py.get("core_error", ""),
                "core" in py, True,
                "make setup on the host (builds harness/transport/_wire.c for this Python; "
                "needs gcc, python3-dev, libssl-dev)"))
    torch = py.get("torch")
    add(Finding(name, "torch", torch or py.get("torch_error", "not installed"),
                bool(torch) and release(torch) >= MIN_TORCH, True,
                "install torch>=2.4 for this Python (the build for your CUDA)"))
    if not torch:
        return
    gpus = py.get("gpus", [])
    cuda_needed = request.device == "cuda" or request.backend == "nccl"
    add(Finding(name, "CUDA", f"torch built for CUDA {py.get('cuda_build')}, "
                f"{'available' if py.get('cuda_available') else 'not available'}"
                if py.get("cuda_build") else "a CPU build of torch",
                bool(py.get("cuda_available")), cuda_needed,
                "a CUDA build of torch and an NVIDIA driver (nvidia-smi), or --device cpu"))
    shown = f"{len(gpus)}" + (f" x {gpus[0]}" if gpus else "") + (
        f", driver {driver}" if driver else "")
    enough = len(gpus) >= (request.ranks_per_host if request.backend == "nccl" else 1)
    add(Finding(name, "GPUs", shown, enough, cuda_needed,
                "NCCL needs a GPU per rank: fewer ranks per host (lossbed_gpus), or gloo"
                if request.backend == "nccl" else "a GPU, or --device cpu"))
    add(Finding(name, "NCCL", py.get("nccl") or "none", bool(py.get("nccl")),
                request.backend == "nccl", "a CUDA build of torch (it ships NCCL), or "
                "LOSSBED_BACKEND=gloo"))


def _judge_backend(report: Report, cluster, facts: dict, request: Request) -> None:
    """Whether the profile's loss can be applied: the first backend every host has that can
    express it (testbed/impair/engine.py chooses it the same way when it applies)."""
    from testbed.impair import engine

    reachable = [h for h in cluster.hosts if "unreachable" not in facts[h.name]]
    if not reachable:
        return
    per_host = [facts[h.name].get("backends", {}) for h in reachable]
    combined = {}
    for backend in dict.fromkeys(b for probes in per_host for b in probes):
        missing = [(h.name, p.get(backend)) for h, p in zip(reachable, per_host, strict=True)
                   if p.get(backend)]
        combined[backend] = ("; ".join(f"{host}: {why}" for host, why in missing)
                             if missing else None)
    available = [b for b, why in combined.items() if why is None]
    forced = request.loss_backend
    if forced is not None and request.profile is None:
        why = combined.get(forced, "not a loss backend")
        report.findings.append(Finding("all", f"loss backend {forced}", why or "available",
                                       why is None, True, COMMAND_FIX["nft"] if forced == "nft"
                                       else MODULE_FIX.get({"netem": "sch_netem",
                                                            "bpf": "cls_bpf"}[forced], "")))
        return
    if request.profile is None:
        state = ", ".join(available) or "none"
        report.findings.append(Finding("all", "loss backend", state, bool(available), True,
                                       "nftables (nft) or tc with cls_bpf: make setup-bench"))
        return
    try:
        choice = engine.choose(request.profile, cluster.hosts, combined, forced)
    except Exception as err:  # the engine's refusal names what the profile needs
        report.findings.append(Finding("all", f"profile {request.profile.name}", str(err),
                                       False, True, MODULE_FIX["sch_netem"]))
        return
    report.findings.append(Finding("all", f"profile {request.profile.name}",
                                   f"applied by {choice.backend}", True, True))


def examine(cluster, request: Request, with_python: bool = True) -> Report:
    return judge(cluster, gather(cluster, with_python), request)


def require(cluster, request: Request) -> Report:
    """The checks a run needs, before ranks are launched: EnvironmentProblem naming every
    failing one with its fix."""
    report = examine(cluster, request)
    if report.blocking:
        lines = [f"  {f.host}: {f.check}: {f.state.rstrip('.')}. Fix: {f.fix}"
                 for f in report.blocking]
        raise EnvironmentProblem("the hosts cannot run this (lossbed doctor shows all checks):\n"
                                 + "\n".join(lines))
    return report


def render(report: Report) -> str:
    """One table: a check whose state is the same on every host is shown once, as 'all'."""
    rows: list[tuple[str, str, str, str, str]] = []
    by_check: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_check.setdefault(f.check, []).append(f)
    merged: list[Finding] = []
    for check, found in by_check.items():
        same = len({(f.state, f.ok) for f in found}) == 1 and len(found) > 1
        merged += [Finding("all", check, found[0].state, found[0].ok, found[0].needed,
                           found[0].fix)] if same else found
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
        lines += [f"  {f.host}: {f.check}: {f.state.rstrip('.')}. Fix: {f.fix}"
                  for f in blocking]
    return "\n".join(lines)


class _ThisMachine:
    """This machine as a one-host cluster (testbed/clusters/contract.py): what the Ansible
    verify role examines on a host. Its ranks run on this machine's own network, not in
    namespaces of it: it does not share the machine the way namespace hosts do."""

    kind = "local"
    shares_this_machine = False
    lease_s = None
    force_interface = False

    def __init__(self, ifname: str, mtu: int):
        import socket

        from testbed.host.hosts import LocalHost

        self.name = socket.gethostname()
        self.mtu = mtu
        self.hosts = [LocalHost(name=self.name, ifname=ifname)]

    def connect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def rank_python(self, host) -> str:
        return sys.executable

    def status(self) -> dict:
        return {"name": self.name, "kind": self.kind, "mtu": self.mtu}


def main(argv: list[str] | None = None) -> int:
    """`python -m testbed.doctor --interface IF`: the checks on this machine alone (the
    Ansible verify role runs it on every host). Exit 0, or 3 when something is missing."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(prog="python -m testbed.doctor",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--interface", required=True, help="the NIC lossbed impairs here")
    parser.add_argument("--mtu", type=int, default=1500, help="the data-plane MTU")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--process-group", choices=BACKENDS,
                        default=os.environ.get("LOSSBED_BACKEND", "gloo"))
    parser.add_argument("--ranks", type=int, default=1, help="ranks on this host")
    parser.add_argument("--force-interface", action="store_true",
                        help="the run impairs the interface even if it carries SSH")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    machine = _ThisMachine(args.interface, args.mtu)
    report = examine(machine, Request(device=args.device, backend=args.process_group,
                                      ranks_per_host=args.ranks,
                                      force_interface=args.force_interface))
    print(json.dumps(report.to_dict(), indent=2) if args.json else render(report))
    return 3 if report.blocking else 0


if __name__ == "__main__":
    sys.exit(main())
