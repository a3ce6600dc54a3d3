"""Netlink encoding of a netem qdisc, complete: every attribute of the kernel's uapi
(include/uapi/linux/pkt_sched.h), on pyroute2's message classes.

pyroute2's own netem encoder knows only delay, loss, duplicate, reorder, corrupt and rate,
and silently ignores any other keyword. lossbed therefore builds the TCA_OPTIONS payload
itself: struct tc_netem_qopt followed by nested attributes, including the loss models
(NETEM_LOSS_GE, NETEM_LOSS_GI), ECN, 64-bit rate/latency/jitter, slotting, the delay
distribution table and the PRNG seed. The same classes decode a message back, which the
tests use to check every field.
"""

from __future__ import annotations

import math
from pathlib import Path

from pyroute2.netlink import NLA_F_NESTED, nla
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.errors import EnvironmentProblem
from testbed.profiles.model import Bernoulli, FourState, GilbertElliott, Impairment

U32_MAX = 0xFFFFFFFF
NS_PER_MS = 1_000_000
# netem's distribution tables hold s16 values scaled by NETEM_DIST_SCALE (iproute2 ships them).
NETEM_DIST_SCALE = 8192
DIST_DIRS = (Path("/usr/lib/x86_64-linux-gnu/tc"), Path("/usr/lib/tc"), Path("/usr/lib64/tc"),
             Path("/usr/lib/aarch64-linux-gnu/tc"))
PSCHED_FILE = Path("/proc/net/psched")


class NetemOptions(nla):
    """TCA_OPTIONS of a netem qdisc: struct tc_netem_qopt, then TCA_NETEM_* attributes."""

    fields = (
        ("latency", "I"),    # psched ticks (legacy; LATENCY64 is authoritative)
        ("limit", "I"),      # packets
        ("loss", "I"),       # Bernoulli loss, U32_MAX = 100%
        ("gap", "I"),        # reorder gap
        ("duplicate", "I"),
        ("jitter", "I"),     # psched ticks (legacy; JITTER64 is authoritative)
    )
    nla_map = (
        ("TCA_NETEM_UNSPEC", "none"),
        ("TCA_NETEM_CORR", "netem_corr"),
        ("TCA_NETEM_DELAY_DIST", "array(int16)"),
        ("TCA_NETEM_REORDER", "netem_prob_corr"),
        ("TCA_NETEM_CORRUPT", "netem_prob_corr"),
        ("TCA_NETEM_LOSS", "netem_loss"),
        ("TCA_NETEM_RATE", "netem_rate"),
        ("TCA_NETEM_ECN", "uint32"),
        ("TCA_NETEM_RATE64", "uint64"),
        ("TCA_NETEM_PAD", "none"),
        ("TCA_NETEM_LATENCY64", "int64"),
        ("TCA_NETEM_JITTER64", "int64"),
        ("TCA_NETEM_SLOT", "netem_slot"),
        ("TCA_NETEM_SLOT_DIST", "array(int16)"),
        ("TCA_NETEM_PRNG_SEED", "uint64"),
    )

    class int16(nla):
        fields = (("value", "h"),)

    class netem_corr(nla):
        fields = (("delay_corr", "I"), ("loss_corr", "I"), ("dup_corr", "I"))

    class netem_prob_corr(nla):
        fields = (("probability", "I"), ("correlation", "I"))

    class netem_rate(nla):
        fields = (("rate", "I"), ("packet_overhead", "i"), ("cell_size", "I"),
                  ("cell_overhead", "i"))

    class netem_slot(nla):
        fields = (("min_delay", "q"), ("max_delay", "q"), ("max_packets", "i"),
                  ("max_bytes", "i"), ("dist_delay", "q"), ("dist_jitter", "q"))

    class netem_loss(nla):
        nla_flags = NLA_F_NESTED
        nla_map = (
            ("NETEM_LOSS_UNSPEC", "none"),
            ("NETEM_LOSS_GI", "gimodel"),
            ("NETEM_LOSS_GE", "gemodel"),
        )

        class gimodel(nla):
            # struct order, which is not the order of tc's command line (p13 p31 p32 p23 p14)
            fields = (("p13", "I"), ("p31", "I"), ("p32", "I"), ("p14", "I"), ("p23", "I"))

        class gemodel(nla):
            # The kernel wants h itself (P(no loss | Bad): it loses when a draw exceeds h)
            # but k1 = 1-k (P(loss | Good)): tc's "1-h" is converted, as iproute2 does.
            fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))


class NetemTcmsg(tcmsg):
    """tcmsg whose TCA_OPTIONS for kind "netem" is NetemOptions (encode and decode)."""

    # pyroute2 compiles a message class's attribute table on first use and caches it on the
    # class; a subclass first used *after* its parent would find the parent's cache and with
    # it tcmsg's own netem encoder, which silently drops every attribute it does not know
    # (seen for real: delay vanished on VM hosts after pyroute2 had made an HTB qdisc).
    # These give this class a cache of its own.
    _nlmsg_base__compiled_nla = False
    _nlmsg_base__t_nla_map = None
    _nlmsg_base__r_nla_map = None

    @staticmethod
    def get_options(self, *argv, **kwarg):
        if self.get_attr("TCA_KIND") == "netem":
            return NetemOptions
        return tcmsg.get_options(self, *argv, **kwarg)


def percent(value_pct: float) -> int:
    """netem's probability encoding: 0 = never, U32_MAX = always."""
    return min(U32_MAX, round(value_pct / 100 * U32_MAX))


def ticks_per_us() -> float:
    """psched ticks per microsecond, as the kernel reports them (tc does the same)."""
    try:
        t2us, us2t = (int(x, 16) for x in PSCHED_FILE.read_text().split()[:2])
        return t2us / us2t
    except (OSError, ValueError):
        return 1.0


def _ticks(ms: float) -> int:
    return min(U32_MAX, round(ms * 1000 * ticks_per_us()))


def distribution_table(name: str) -> list[int]:
    """iproute2's table for a delay distribution (uniform has none)."""
    for folder in DIST_DIRS:
        path = folder / f"{name}.dist"
        if path.is_file():
            # iproute2's format: '#' comment lines, then whitespace-separated integers
            lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
            return [int(x) for ln in lines for x in ln.split()]
    raise EnvironmentProblem(
        f"the {name!r} delay distribution table ({name}.dist) was not found in "
        f"{', '.join(str(d) for d in DIST_DIRS)}: install iproute2 (make setup does)"
    )


def default_limit(imp: Impairment, mtu: int, line_rate_mbit: float) -> int:
    """netem's queue limit from the bandwidth-delay product, so the queue never drops by
    itself: 2 x BDP in MTU-sized packets, at least 1000 (netem's default)."""
    rate_bytes_s = (imp.rate_mbit or line_rate_mbit) * 1e6 / 8
    hold_s = (imp.delay_ms + 4 * imp.jitter_ms) / 1000
    if imp.slot:
        slot = imp.slot
        hold_s += (slot.delay_ms + 4 * slot.jitter_ms if slot.distribution
                   else slot.uniform_max_delay_ms) / 1000
    bdp_packets = rate_bytes_s * hold_s / max(mtu, 1)
    return max(1000, math.ceil(2 * bdp_packets))


def options(imp: Impairment, limit: int) -> dict:
    """The TCA_OPTIONS content for one impairment: {qopt fields..., 'attrs': [...]}"""
    opts = {"latency": _ticks(imp.delay_ms), "limit": limit, "loss": 0, "gap": 0,
            "duplicate": percent(imp.duplicate_pct), "jitter": _ticks(imp.jitter_ms),
            "attrs": []}
    attrs = opts["attrs"]
    loss = imp.loss
    loss_corr = 0
    if isinstance(loss, Bernoulli):
        opts["loss"] = percent(loss.loss_pct)
        loss_corr = percent(loss.correlation_pct)
    elif isinstance(loss, GilbertElliott):
        attrs.append(["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GE", {
            "p": percent(loss.p * 100), "r": percent(loss.r * 100),
            "h": U32_MAX - percent(loss.loss_in_bad_pct),
            "k1": percent(loss.loss_in_good_pct)}]]}])
    elif isinstance(loss, FourState):
        attrs.append(["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GI", {
            "p13": percent(loss.p13_pct), "p31": percent(loss.p31_pct),
            "p32": percent(loss.p32_pct), "p14": percent(loss.p14_pct),
            "p23": percent(loss.p23_pct)}]]}])
    if imp.delay_correlation_pct or loss_corr or imp.duplicate_correlation_pct:
        attrs.append(["TCA_NETEM_CORR", {
            "delay_corr": percent(imp.delay_correlation_pct), "loss_corr": loss_corr,
            "dup_corr": percent(imp.duplicate_correlation_pct)}])
    if imp.delay_distribution and imp.delay_distribution != "uniform":
        attrs.append(["TCA_NETEM_DELAY_DIST", distribution_table(imp.delay_distribution)])
    if imp.reorder_pct:
        opts["gap"] = imp.reorder_gap_packets or 1  # tc's default gap is 1
        attrs.append(["TCA_NETEM_REORDER", {"probability": percent(imp.reorder_pct),
                                            "correlation": percent(imp.reorder_correlation_pct)}])
    if imp.corrupt_pct:
        attrs.append(["TCA_NETEM_CORRUPT", {"probability": percent(imp.corrupt_pct),
                                            "correlation": percent(imp.corrupt_correlation_pct)}])
    if imp.rate_mbit:
        rate_bytes_s = round(imp.rate_mbit * 1e6 / 8)
        attrs.append(["TCA_NETEM_RATE", {"rate": min(rate_bytes_s, U32_MAX),
                                         "packet_overhead": 0, "cell_size": 0,
                                         "cell_overhead": 0}])
        if rate_bytes_s >= U32_MAX:
            attrs.append(["TCA_NETEM_RATE64", rate_bytes_s])
    if imp.ecn:
        attrs.append(["TCA_NETEM_ECN", 1])
    if imp.delay_ms:
        attrs.append(["TCA_NETEM_LATENCY64", round(imp.delay_ms * NS_PER_MS)])
    if imp.jitter_ms:
        attrs.append(["TCA_NETEM_JITTER64", round(imp.jitter_ms * NS_PER_MS)])
    if imp.slot:
        attrs.extend(_slot_attrs(imp.slot))
    if imp.seed is not None:
        attrs.append(["TCA_NETEM_PRNG_SEED", imp.seed])
    return opts


def _slot_attrs(slot) -> list:
    """TCA_NETEM_SLOT, and with a slot distribution its table (TCA_NETEM_SLOT_DIST), as tc
    sends them: a uniform slot has min/max and no table; a distribution has delay/jitter."""
    if slot.distribution:
        return [["TCA_NETEM_SLOT", {
                    "min_delay": 0, "max_delay": 0, "max_packets": slot.max_packets,
                    "max_bytes": slot.max_bytes,
                    "dist_delay": round(slot.delay_ms * NS_PER_MS),
                    "dist_jitter": round(slot.jitter_ms * NS_PER_MS)}],
                ["TCA_NETEM_SLOT_DIST", distribution_table(slot.distribution)]]
    return [["TCA_NETEM_SLOT", {
        "min_delay": round(slot.min_delay_ms * NS_PER_MS),
        "max_delay": round(slot.uniform_max_delay_ms * NS_PER_MS),
        "max_packets": slot.max_packets, "max_bytes": slot.max_bytes,
        "dist_delay": 0, "dist_jitter": 0}]]


def qdisc_message(index: int, handle: int, parent: int, opts: dict) -> NetemTcmsg:
    msg = NetemTcmsg()
    msg["family"] = 0  # AF_UNSPEC
    msg["index"] = index
    msg["handle"] = handle
    msg["parent"] = parent
    msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", opts]]
    return msg


def create(ipr, msg: NetemTcmsg) -> None:
    """Send a new-qdisc request built here through a pyroute2 IPRoute (waits for the ack)."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    # pyroute2 0.9's sync IPRoute reads this key in nlm_request but never sets it.
    ipr.status.setdefault("nlm_generator", False)
    ipr.nlm_request(msg, RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)


def encode(msg: NetemTcmsg) -> bytes:
    msg.encode()
    return bytes(msg.data[: msg["header"]["length"]])


def decode(data: bytes) -> NetemTcmsg:
    msg = NetemTcmsg(data)
    msg.decode()
    return msg
