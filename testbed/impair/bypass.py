"""The ways a job's traffic goes around the impaired interface, and what keeps it on it.

A qdisc, nft rule or BPF program sees only what crosses the interface it sits on. A job's
collectives can go elsewhere without a word:
- NCCL's IB/RoCE transport talks verbs to the NIC: no host hook sees those packets;
- NCCL between ranks it believes share a host uses P2P/NVLink or shared memory: namespace
  hosts on one machine are one host to NCCL unless each has its own host id;
- gloo and NCCL's socket transport bind whatever interface their variables (or the
  hostname's address) name: a management network is as good to them as the data plane.

So every rank lossbed launches gets `pinned_env`: NCCL over its socket transport on the
impaired interface, gloo on the same interface, and on namespace hosts a host id each
(NVLink/P2P inside one real host is not the lossy network, and stays). A user's variable
that says otherwise is refused before launch (`refuse_contradictions`), never overridden
in silence. Coverage (coverage.py) measures what got through anyway.
"""

from __future__ import annotations

from collections.abc import Mapping

from testbed.errors import UsageError

# What a user may have set that sends a job's traffic elsewhere, and the value lossbed runs
# every job with. (The same for lossless and lossy runs: the two must be comparable.)
SOCKET_ONLY = {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"}
# namespace hosts share one machine: NCCL must not find its P2P or shared-memory paths
ONE_MACHINE_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


def pinned_env(cluster, host) -> dict[str, str]:
    """The environment that keeps a rank's collectives on the host's impaired interface."""
    env = {"GLOO_SOCKET_IFNAME": host.ifname,
           # "=": this interface exactly, not every name that starts with it
           "NCCL_SOCKET_IFNAME": f"={host.ifname}", **SOCKET_ONLY}
    if cluster.shares_this_machine:
        # each namespace host a host of its own to NCCL, so its traffic crosses the veths
        env["NCCL_HOSTID"] = f"lossbed-{cluster.name}-{host.name}"
        env.update(ONE_MACHINE_ONLY)
    return env


def contradictions(environ: Mapping[str, str], cluster) -> list[tuple[str, str, str]]:
    """(variable, its value, what it would do) for each of the user's settings that would
    send the job's traffic around the impaired interface."""
    found = []
    ifnames = sorted({h.ifname for h in cluster.hosts})
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = environ.get(name)
        if value and value.lstrip("=^") not in ifnames:
            found.append((name, value, f"binds the job to {value.lstrip('=^')}, not the "
                          f"impaired {', '.join(ifnames)}"))
    if environ.get("NCCL_IB_DISABLE", "1") not in ("1", "true", "True"):
        found.append(("NCCL_IB_DISABLE", environ["NCCL_IB_DISABLE"],
                      "lets NCCL use IB/RoCE verbs, which no qdisc sees"))
    net = environ.get("NCCL_NET")
    if net and net.lower() != "socket":
        found.append(("NCCL_NET", net, "picks a network plugin other than NCCL's sockets, "
                      "whose traffic no qdisc sees"))
    if cluster.shares_this_machine:
        if environ.get("NCCL_HOSTID"):
            found.append(("NCCL_HOSTID", environ["NCCL_HOSTID"],
                          "makes the namespace hosts one host to NCCL (P2P/SHM between them, "
                          "around the veth links)"))
        for name in ONE_MACHINE_ONLY:
            if environ.get(name, "1") not in ("1", "true", "True"):
                found.append((name, environ[name], "lets NCCL join namespace hosts through "
                              "memory, around the veth links"))
    return found


def inherited_contradictions(environ: Mapping[str, str], cluster) -> list[tuple[str, str, str]]:
    """contradictions() of the controller's environment where ranks inherit it: on namespace
    hosts (this machine); a remote or VM rank starts with lossbed's settings alone."""
    return contradictions(environ, cluster) if cluster.shares_this_machine else []


def refuse_contradictions(environ: Mapping[str, str], cluster) -> None:
    """Refuse, before anything is applied or launched, a setting of the controller's that
    its ranks would inherit and that would route the job around the impairment (the first,
    by name, with the fix)."""
    found = inherited_contradictions(environ, cluster)
    if found:
        name, value, does = found[0]
        others = "".join(f"; also {n}={v}" for n, v, _ in found[1:])
        raise UsageError(name, f"{name}={value} {does}{others}",
                         "Unset it (lossbed sets it for every rank: "
                         "NCCL over sockets on the impaired interface, gloo on the same)")
