"""The judgement: typed facts in (facts.py), findings out, each against the run asked for
(request.py). A check is *needed* when that run cannot work without it (its failure makes
`doctor` exit 3, and `train`/`bench` refuse to launch ranks); the others are reported for
the record (a module the chosen backend does not use, a clock offset, offloads lossbed
turns off itself). Whether a profile's loss can be applied is the engine's own choice
(testbed/impair/engine.py), asked with every host's backends combined."""

from __future__ import annotations

import ipaddress
import os

from testbed.doctor.facts import HostFacts, NicFacts, PythonFacts
from testbed.doctor.request import Finding, Report, Request
from testbed.errors import LossbedError
from testbed.host.checkup import MODULES
from testbed.python_packages import release

MIN_PYTHON = (3, 11)
MIN_TORCH = (2, 4)
CLOCK_TOLERANCE_S = 0.001  # tail latencies across hosts mean little beyond this offset

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
    "act_gact": "modprobe act_gact (netem's dropped bytes; without it only its packets)",
    "cls_bpf": "modprobe cls_bpf (the bpf backend)",
    "nf_tables": "modprobe nf_tables (the nft backend)",
    "sch_htb": "modprobe sch_htb (rate limits)",
    "rdma_rxe": "modprobe rdma_rxe (Soft-RoCE)",
}
BACKEND_FIX = {"nft": COMMAND_FIX["nft"], "netem": MODULE_FIX["sch_netem"],
               "bpf": MODULE_FIX["cls_bpf"]}


def judge(cluster, facts: dict[str, HostFacts], request: Request) -> Report:
    report = Report(facts=facts)
    for host in cluster.hosts:
        report.findings += host_findings(facts[host.name], request,
                                         shares_this_machine=cluster.shares_this_machine)
    report.findings += backend_findings(cluster, facts, request)
    report.findings += bypass_findings(cluster, facts)
    return report


def host_findings(f: HostFacts, request: Request, *,
                  shares_this_machine: bool) -> list[Finding]:
    name = f.host
    if f.unreachable is not None:
        return [Finding(name, "reachable", f.unreachable, ok=False, needed=True,
                        fix="check the inventory's address and SSH key (lossbed_address, "
                            "ansible_host)")]
    found = [
        Finding(name, "namespaces", "yes" if f.namespaces else "no", ok=f.namespaces,
                needed=shares_this_machine, fix="a kernel with CONFIG_NET_NS"),
        Finding(name, "CAP_NET_ADMIN", "yes" if f.cap_net_admin else "no",
                ok=f.cap_net_admin, needed=True, fix="run as root (or grant CAP_NET_ADMIN)")]
    for command, path in f.commands.items():
        needed = command in ("ip", "tc") or (command == "nft" and (
            request.loss_backend == "nft" or f.backend_is_best("nft")))
        found.append(Finding(name, command, path or "not on PATH", ok=path is not None,
                             needed=needed, fix=COMMAND_FIX[command]))
    for module in MODULES:
        state = f.modules.get(module)
        shown = {None: "absent", "unknown": "module lists not readable"}.get(state, state)
        found.append(Finding(name, module, shown, ok=state is not None, needed=False,
                             fix="" if state == "unknown" else MODULE_FIX[module]))
    found += nic_findings(name, f.nic, request.force_interface)
    found += python_findings(name, f.python, request, f.gpu_driver)
    if request.transport.startswith("verbs"):
        found.append(Finding(
            name, "RDMA devices", ", ".join(f.rdma_devices) or "none",
            ok=bool(f.rdma_devices), needed=True,
            fix="an RDMA NIC with rdma-core, or Soft-RoCE: modprobe rdma_rxe && rdma link add "
                "rxe0 type rxe netdev IF; or --transport udp/roce-*"))
    offset, spread = f.clock_offset_s, f.clock_uncertainty_s
    found.append(Finding(name, "clock offset", f"{offset * 1e3:+.2f} ms (±{spread * 1e3:.2f})",
                         ok=abs(offset) <= CLOCK_TOLERANCE_S + spread, needed=False,
                         fix="synchronise the hosts' clocks (chrony or PTP): tail latency "
                             "across hosts needs them"))
    return found


def nic_findings(name: str, nic: NicFacts, forced: bool) -> list[Finding]:
    if nic.error is not None:
        return [Finding(name, "NIC", nic.error, ok=False, needed=True,
                        fix="set lossbed_interface to the data-plane NIC")]
    speed = nic.speed_mbit
    found = [Finding(name, "NIC", f"{nic.name}, MTU {nic.mtu}, "
                     f"{f'{speed} Mbit/s' if speed and speed > 0 else 'speed not reported'}",
                     ok=True, needed=False)]
    risky = [what for what, carries in (("the default route", nic.carries_default_route),
                                        ("this SSH session", nic.carries_ssh_session))
             if carries]
    found.append(Finding(name, "NIC carries", " and ".join(risky) or "data traffic only",
                         ok=not risky, needed=not forced,
                         fix="impair the data-plane NIC (lossbed_interface), or pass "
                             "--force-interface"))
    if nic.offloads_on is not None:
        found.append(Finding(name, "merging offloads on", ", ".join(nic.offloads_on) or "none",
                             ok=not nic.offloads_on, needed=False,
                             fix=f"lossbed turns them off on the links it makes; on a real "
                                 f"NIC: ethtool -K {nic.name} gro off gso off tso off"))
    return found


def venv_of(python: str | None) -> str:
    """The environment a Python belongs to: the folder above its bin/ (VENV= of make)."""
    from pathlib import PurePosixPath

    path = PurePosixPath(python or "/path/to/venv/bin/python")
    return str(path.parent.parent) if path.parent.name == "bin" else "/path/to/venv"


def python_findings(name: str, py: PythonFacts | None, request: Request,
                    driver: str | None) -> list[Finding]:
    if py is None:
        return []
    if py.error is not None:
        return [Finding(name, "Python", f"{py.executable}: {py.error}", ok=False, needed=True,
                        fix="set lossbed_python to a Python 3.11+ that has torch (the "
                            "inventory)")]
    found = [
        Finding(name, "Python", f"{py.version} ({py.executable})",
                ok=release(py.version) >= MIN_PYTHON, needed=True, fix="Python 3.11 or newer"),
        Finding(name, "compiled core", "built" if py.core else (py.core_error or ""),
                ok=py.core is not None, needed=True,
                fix="make setup on the host (builds harness/transport/_wire.c for this Python; "
                    "needs gcc, python3-dev, libssl-dev)"),
        Finding(name, "torch", py.torch or py.torch_error or "not installed",
                ok=bool(py.torch) and release(py.torch) >= MIN_TORCH, needed=True,
                fix="install torch>=2.4 for this Python (the build for your CUDA)"),
        Finding(name, "lossbed's packages", py.api_error or "importable (harness.api)",
                ok=py.api_error is None, needed=True,
                fix=f"make setup VENV={venv_of(py.executable)} (installs lossbed's packages "
                    "into that environment, keeping its torch)")]
    if not py.torch:
        return found
    cuda_needed = request.device == "cuda" or request.backend == "nccl"
    found.append(Finding(
        name, "CUDA", f"torch built for CUDA {py.cuda_build}, "
        f"{'available' if py.cuda_available else 'not available'}"
        if py.cuda_build else "a CPU build of torch", ok=py.cuda_available, needed=cuda_needed,
        fix="a CUDA build of torch and an NVIDIA driver (nvidia-smi), or --device cpu"))
    gpus = py.gpus
    shown = f"{len(gpus)}" + (f" x {gpus[0]}" if gpus else "") + (
        f", driver {driver}" if driver else "")
    enough = len(gpus) >= (request.ranks_per_host if request.backend == "nccl" else 1)
    found.append(Finding(name, "GPUs", shown, ok=enough, needed=cuda_needed,
                         fix="NCCL needs a GPU per rank: fewer ranks per host (lossbed_gpus), "
                             "or gloo" if request.backend == "nccl" else
                             "a GPU, or --device cpu"))
    found.append(Finding(name, "NCCL", py.nccl or "none", ok=bool(py.nccl),
                         needed=request.backend == "nccl",
                         fix="a CUDA build of torch (it ships NCCL), or LOSSBED_BACKEND=gloo"))
    return found


def backend_findings(cluster, facts: dict[str, HostFacts], request: Request) -> list[Finding]:
    """Whether the profile's loss can be applied: the engine's choice (the first backend
    every host has that can express it), asked with the hosts' probes combined."""
    from testbed.impair import engine

    reachable = [h for h in cluster.hosts if facts[h.name].unreachable is None]
    if not reachable:
        return []
    per_host = [facts[h.name].backends for h in reachable]
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
        return [Finding("all", f"loss backend {forced}", why or "available", ok=why is None,
                        needed=True, fix=BACKEND_FIX.get(forced, ""))]
    if request.profile is None:
        return [Finding("all", "loss backend", ", ".join(available) or "none",
                        ok=bool(available), needed=True,
                        fix="nftables (nft) or tc with cls_bpf: make setup-bench")]
    label = f"profile {request.profile.name}"
    try:
        choice = engine.choose(request.profile, cluster.hosts, combined, forced)
    except LossbedError as refusal:  # the engine's refusal names what the profile needs
        return [Finding("all", label, str(refusal), ok=False, needed=True,
                        fix=MODULE_FIX["sch_netem"])]
    return [Finding("all", label, f"applied by {choice.backend}", ok=True, needed=True)]


def bypass_findings(cluster, facts: dict[str, HostFacts],
                    environ: dict | None = None) -> list[Finding]:
    """Every way around the impaired interface that can be seen before a run: a second
    interface that reaches a peer, hardware RDMA devices (NCCL's IB transport), and this
    controller's gloo/NCCL variables that ranks on this machine would inherit. lossbed's
    own launchers keep their ranks on the impaired interface; coverage measures the rest."""
    from testbed.impair import bypass

    def addresses_of(host) -> list:
        f = facts[host.name]
        return [ipaddress.ip_interface(a).ip for a in f.nic.addresses
                + [a for listed in f.other_interfaces.values() for a in listed]]

    found = []
    addresses = {host.name: addresses_of(host) for host in cluster.hosts}
    for host in cluster.hosts:
        f = facts[host.name]
        for ifname, listed in f.other_interfaces.items():
            nets = [ipaddress.ip_interface(a).network for a in listed]
            peers = [p.name for p in cluster.hosts if p.name != host.name
                     and any(ip in net for ip in addresses[p.name] for net in nets)]
            if peers:
                found.append(Finding(
                    host.name, "second path to peers",
                    f"{ifname} ({', '.join(listed)}) reaches {', '.join(peers)} around the "
                    f"impaired {host.ifname}", ok=False, needed=False,
                    fix=f"lossbed's ranks use {host.ifname} (GLOO_SOCKET_IFNAME, "
                        f"NCCL_SOCKET_IFNAME); a job that binds {ifname} is not impaired, and "
                        "coverage makes its run no result"))
        if f.hardware_rdma and not (cluster.shares_this_machine and host is not cluster.hosts[0]):
            found.append(Finding(
                host.name, "RDMA bypass", f"{', '.join(f.hardware_rdma)}: NCCL's IB/RoCE "
                "transport talks to them directly, and no qdisc sees it", ok=False,
                needed=False,
                fix="lossbed's ranks run NCCL with NCCL_IB_DISABLE=1 over sockets on the "
                    "impaired interface; --transport verbs-* on these devices needs "
                    "LOSSBED_DROP_MASK=SEED:RATE for its loss"))
    for name, value, does in bypass.inherited_contradictions(
            os.environ if environ is None else environ, cluster):
        found.append(Finding("controller", name, f"{name}={value} {does}", ok=False,
                             needed=True, fix=f"unset {name}: lossbed sets it for every rank"))
    return found
