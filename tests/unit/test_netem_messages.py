"""The netem backend's netlink messages, decoded by a parser written here from the kernel's
uapi (include/uapi/linux/pkt_sched.h), independent of pyroute2's classes, for every profile
in netem_profiles/ and every path, field by field."""

from __future__ import annotations

import struct

import pytest

from testbed import profiles
from testbed.impair import netem, netem_nla, plan
from testbed.profiles.model import Bernoulli, FourState, GilbertElliott

U32_MAX = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS = 1, 2
NETEM = {1: "CORR", 2: "DELAY_DIST", 3: "REORDER", 4: "CORRUPT", 5: "LOSS", 6: "RATE",
         7: "ECN", 8: "RATE64", 10: "LATENCY64", 11: "JITTER64", 12: "SLOT", 13: "SLOT_DIST",
         14: "PRNG_SEED"}
NLA_F_NESTED = 0x8000
HOSTS = [plan.PlannedHost(f"h{i}", f"10.201.0.{i}", "eth0", 9000) for i in (1, 2, 3)]


def rtattrs(data: bytes) -> list[tuple[int, bytes]]:
    """Split a run of struct rtattr {u16 len; u16 type; data; pad to 4}."""
    out, i = [], 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, i)
        out.append((kind, data[i + 4:i + length]))
        i += (length + 3) & ~3
    return out


def decode_netem(raw: bytes) -> tuple[str, tuple, dict]:
    """(TCA_KIND, struct tc_netem_qopt, {attribute: raw payload}) from a whole message."""
    nlmsg_len, = struct.unpack_from("=I", raw, 0)
    assert nlmsg_len == len(raw)
    family, _, _, index, handle, parent, info = struct.unpack_from("=BBHiIII", raw, 16)
    attrs = dict(rtattrs(raw[16 + 20:]))
    kind = attrs[TCA_KIND].rstrip(b"\0").decode()
    options = attrs[TCA_OPTIONS]
    qopt = struct.unpack_from("=6I", options, 0)  # latency limit loss gap duplicate jitter
    nested = {}
    for attr_type, payload in rtattrs(options[24:]):
        name = NETEM[attr_type & ~NLA_F_NESTED]
        nested[name] = (attr_type, payload)
    return kind, qopt, nested


def pct(value: float) -> int:
    return min(U32_MAX, round(value / 100 * U32_MAX))


def every_path():
    for name in profiles.available():
        prof = profiles.load(name)
        for hp in plan.build(prof, HOSTS, "netem").hosts:
            for rule in hp.rules:
                yield pytest.param(rule.impairment, hp, id=f"{name}:{rule.path(hp.host)}")


@pytest.mark.parametrize("imp,host_plan", list(every_path()))
def test_every_profile_path_decodes_to_the_intended_kernel_structures(imp, host_plan):
    limit = imp.limit_packets or netem_nla.default_limit(imp, 9000, netem.LINE_RATE_MBIT)
    msg = netem_nla.qdisc_message(7, 0x100000, 0xB0ED0010, netem_nla.options(imp, limit))
    kind, qopt, attrs = decode_netem(netem_nla.encode(msg))
    assert kind == "netem"
    latency, q_limit, loss, gap, duplicate, jitter = qopt
    tick = netem_nla.ticks_per_us()
    assert latency == min(U32_MAX, round(imp.delay_ms * 1000 * tick))
    assert jitter == min(U32_MAX, round(imp.jitter_ms * 1000 * tick))
    assert q_limit == limit
    assert duplicate == pct(imp.duplicate_pct)
    assert gap == ((imp.reorder_gap_packets or 1) if imp.reorder_pct else 0)
    expected = set()

    if isinstance(imp.loss, Bernoulli):
        assert loss == pct(imp.loss.loss_pct)
    else:
        assert loss == 0
    if isinstance(imp.loss, GilbertElliott):
        expected.add("LOSS")
        attr_type, payload = attrs["LOSS"]
        assert attr_type & NLA_F_NESTED
        (inner_type, ge), = rtattrs(payload)
        assert inner_type == 2  # NETEM_LOSS_GE
        # struct tc_netem_gemodel: the kernel loses in Bad when a draw exceeds h, so h is
        # P(no loss | Bad) = U32_MAX - (1-h); k1 is P(loss | Good) as given.
        assert struct.unpack("=4I", ge) == (pct(imp.loss.p * 100), pct(imp.loss.r * 100),
                                             U32_MAX - pct(imp.loss.loss_in_bad_pct),
                                             pct(imp.loss.loss_in_good_pct))
    if isinstance(imp.loss, FourState):
        expected.add("LOSS")
        (inner_type, gi), = rtattrs(attrs["LOSS"][1])
        assert inner_type == 1  # NETEM_LOSS_GI: struct order p13 p31 p32 p14 p23
        assert struct.unpack("=5I", gi) == tuple(pct(getattr(imp.loss, f"{k}_pct"))
                                                 for k in ("p13", "p31", "p32", "p14", "p23"))
    loss_corr = imp.loss.correlation_pct if isinstance(imp.loss, Bernoulli) else 0
    if imp.delay_correlation_pct or loss_corr or imp.duplicate_correlation_pct:
        expected.add("CORR")
        assert struct.unpack("=3I", attrs["CORR"][1]) == (
            pct(imp.delay_correlation_pct), pct(loss_corr), pct(imp.duplicate_correlation_pct))
    if imp.delay_distribution not in (None, "uniform"):
        expected.add("DELAY_DIST")
        table = attrs["DELAY_DIST"][1]
        values = struct.unpack(f"={len(table) // 2}h", table)
        assert values == tuple(netem_nla.distribution_table(imp.delay_distribution))
        assert len(values) == 4096  # iproute2's tables are 4096 entries
    if imp.reorder_pct:
        expected.add("REORDER")
        assert struct.unpack("=2I", attrs["REORDER"][1]) == (
            pct(imp.reorder_pct), pct(imp.reorder_correlation_pct))
    if imp.corrupt_pct:
        expected.add("CORRUPT")
        assert struct.unpack("=2I", attrs["CORRUPT"][1]) == (
            pct(imp.corrupt_pct), pct(imp.corrupt_correlation_pct))
    if imp.rate_mbit:
        expected.add("RATE")
        rate_bytes = round(imp.rate_mbit * 1e6 / 8)
        assert struct.unpack("=IiIi", attrs["RATE"][1]) == (min(rate_bytes, U32_MAX), 0, 0, 0)
        if rate_bytes >= U32_MAX:
            expected.add("RATE64")
            assert struct.unpack("=Q", attrs["RATE64"][1]) == (rate_bytes,)
    if imp.ecn:
        expected.add("ECN")
        assert struct.unpack("=I", attrs["ECN"][1]) == (1,)
    if imp.delay_ms:
        expected.add("LATENCY64")
        assert struct.unpack("=q", attrs["LATENCY64"][1]) == (round(imp.delay_ms * 1e6),)
    if imp.jitter_ms:
        expected.add("JITTER64")
        assert struct.unpack("=q", attrs["JITTER64"][1]) == (round(imp.jitter_ms * 1e6),)
    if imp.slot:
        expected.add("SLOT")
        slot = imp.slot
        if slot.distribution:
            expected.add("SLOT_DIST")
            assert struct.unpack("=qqiiqq", attrs["SLOT"][1]) == (
                0, 0, slot.max_packets, slot.max_bytes, round(slot.delay_ms * 1e6),
                round(slot.jitter_ms * 1e6))
            table = attrs["SLOT_DIST"][1]
            assert struct.unpack(f"={len(table) // 2}h", table) == tuple(
                netem_nla.distribution_table(slot.distribution))
        else:
            maximum = slot.max_delay_ms if slot.max_delay_ms is not None else slot.min_delay_ms
            assert struct.unpack("=qqiiqq", attrs["SLOT"][1]) == (
                round(slot.min_delay_ms * 1e6), round(maximum * 1e6),
                slot.max_packets, slot.max_bytes, 0, 0)
    if imp.seed is not None:
        expected.add("PRNG_SEED")
        assert struct.unpack("=Q", attrs["PRNG_SEED"][1]) == (imp.seed,)
    # Nothing else was sent: no attribute the profile did not ask for.
    assert set(attrs) == expected


def test_the_full_profile_covers_every_attribute_and_a_100_gbit_rate():
    imp = profiles.load("lab-full", ["rate_mbit=100000"]).impairment
    _, _, attrs = decode_netem(netem_nla.encode(netem_nla.qdisc_message(
        1, 0x100000, 0xB0ED0010, netem_nla.options(imp, 1000))))
    assert {"LOSS", "CORR", "DELAY_DIST", "REORDER", "CORRUPT", "RATE", "RATE64", "ECN",
            "LATENCY64", "JITTER64", "SLOT", "PRNG_SEED"} == set(attrs)
    assert struct.unpack("=Q", attrs["RATE64"][1]) == (12_500_000_000,)  # 100 Gbit/s in B/s
    assert struct.unpack("=I", attrs["RATE"][1][:4]) == (U32_MAX,)        # "see RATE64"


def _decoded(imp, limit=1000):
    return decode_netem(netem_nla.encode(netem_nla.qdisc_message(
        1, 0x100000, 0xB0ED0010, netem_nla.options(imp, limit))))


def test_a_reorder_gap_reaches_the_kernel_structure():
    imp = profiles.load("clean", ["delay_ms=10", "reorder_pct=25",
                                  "reorder_gap_packets=5"]).impairment
    _, qopt, attrs = _decoded(imp)
    assert qopt[3] == 5  # tc_netem_qopt.gap
    assert struct.unpack("=2I", attrs["REORDER"][1]) == (pct(25), 0)
    # without a gap: 1, as tc sends it
    _, qopt, _ = _decoded(profiles.load("clean", ["delay_ms=10", "reorder_pct=25"]).impairment)
    assert qopt[3] == 1


def test_a_slot_distribution_reaches_the_kernel_with_its_table():
    imp = profiles.load("clean", ["slot={distribution: pareto, delay_ms: 2, jitter_ms: 0.5, "
                                  "max_packets: 8}"]).impairment
    _, _, attrs = _decoded(imp)
    assert struct.unpack("=qqiiqq", attrs["SLOT"][1]) == (0, 0, 8, 0, 2_000_000, 500_000)
    table = attrs["SLOT_DIST"][1]
    assert struct.unpack(f"={len(table) // 2}h", table) == tuple(
        netem_nla.distribution_table("pareto"))
    assert "DELAY_DIST" not in attrs  # the packet delay has no table of its own here
    # and pyroute2's classes decode both back
    opts = netem_nla.decode(netem_nla.encode(netem_nla.qdisc_message(
        1, 0x100000, 0xB0ED0010, netem_nla.options(imp, 1000)))).get_attr("TCA_OPTIONS")
    assert opts.get_attr("TCA_NETEM_SLOT")["dist_jitter"] == 500_000
    assert len(opts.get_attr("TCA_NETEM_SLOT_DIST")) == 4096


def test_pyroute2_classes_round_trip_what_they_encode():
    imp = profiles.load("four-state", ["seed=99", "ecn=true"]).impairment
    decoded = netem_nla.decode(netem_nla.encode(netem_nla.qdisc_message(
        3, 0x100000, 0xB0ED0010, netem_nla.options(imp, 1234))))
    opts = decoded.get_attr("TCA_OPTIONS")
    assert opts["limit"] == 1234
    assert opts.get_attr("TCA_NETEM_PRNG_SEED") == 99
    assert opts.get_attr("TCA_NETEM_ECN") == 1
    gi = opts.get_attr("TCA_NETEM_LOSS").get_attr("NETEM_LOSS_GI")
    assert gi["p13"] == pct(2) and gi["p14"] == pct(0.5) and gi["p23"] == pct(30)


def test_queue_limit_follows_the_bandwidth_delay_product():
    wan = profiles.load("wan").impairment  # 1 Gbit/s, 20 ms + 4 x 5 ms jitter
    # 125 MB/s x 40 ms = 5 MB = 3334 packets of 1500 B; twice that.
    assert netem_nla.default_limit(wan, 1500, 100_000) == 6667
    assert netem_nla.default_limit(profiles.load("clean").impairment, 1500, 100_000) == 1000


def test_u32_filters_pick_the_path_and_the_match():
    prof = profiles.load("random-loss", ["match.include=[{protocol: udp, ports: [5000-5001]}]"])
    hp = plan.build(prof, HOSTS, "netem").hosts[0]
    dev = netem.devices(hp)[0]
    fs = netem.filters(hp, dev)
    excl = [f for f in fs if f["prio"] == netem.PRIO_EXCLUDE]
    assert all(f["target"] == netem.EXEMPT_CLASS for f in excl)  # excluded: counted apart
    paths = [f for f in fs if f["prio"] == netem.PRIO_PATH]
    # source address of h2 at offset 12, udp, port 5000-5001 as one /15 prefix, either end
    assert {"keys": ["0x0ac90002/0xffffffff+12", "0x00110000/0x00ff0000+8",
                     "0x13880000/0xfffe0000+20"], "prio": 10,
            "target": netem.class_id(0)} in paths
    assert any(f["keys"][2] == "0x00001388/0x0000fffe+20" for f in paths)


def test_encoding_survives_pyroute2_using_its_own_tcmsg_first():
    """Regression: pyroute2 caches compiled attribute tables per class; once its tcmsg had
    encoded a message, lossbed's subclass inherited that cache and lost LATENCY64 and more.
    Needs a fresh interpreter, where nothing was encoded before."""
    import subprocess
    import sys

    script = (
        "from pyroute2.netlink.rtnl.tcmsg import tcmsg\n"
        "m = tcmsg(); m['index'] = 1; m['handle'] = 0x10000; m['parent'] = 0xffffffff\n"
        "m['attrs'] = [['TCA_KIND', 'htb'], ['TCA_OPTIONS', {'attrs': [['TCA_HTB_INIT', "
        "{'version': 3, 'rate2quantum': 10, 'defcls': 0, 'debug': 0, 'direct_pkts': 0}]]}]]\n"
        "m.encode()\n"
        "from testbed.impair import netem_nla as n\n"
        "from testbed.profiles.model import Impairment\n"
        "imp = Impairment(delay_ms=40, seed=3)\n"
        "raw = n.encode(n.qdisc_message(1, 0x100000, 0xb0ed0010, n.options(imp, 1000)))\n"
        "print(raw.hex())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.strip()
    _, qopt, attrs = decode_netem(bytes.fromhex(out))
    assert qopt[0] > 0                                      # latency in ticks
    assert struct.unpack("=q", attrs["LATENCY64"][1]) == (40_000_000,)
    assert struct.unpack("=Q", attrs["PRNG_SEED"][1]) == (3,)


class _RecordingNetlink:
    """What _tree asks of netlink, recorded; a filter with an action refused as a kernel
    without act_gact refuses it (ENOENT), where `gact` is False."""

    def __init__(self, gact: bool):
        self.gact, self.filters = gact, []

    def tc(self, command, kind=None, index=None, handle=None, **kwargs):
        from pyroute2.netlink.exceptions import NetlinkError

        if command == "add-filter":
            if "action" in kwargs and not self.gact:
                raise NetlinkError(2, "No such file or directory")
            self.filters.append(kwargs)


@pytest.mark.parametrize("gact", [True, False])
def test_a_paths_filters_count_its_bytes_and_without_act_gact_still_steer_it(gact,
                                                                            monkeypatch):
    monkeypatch.setattr(netem_nla, "create", lambda ipr, msg: None)
    hp = plan.build(profiles.load("random-loss"), HOSTS, "netem").hosts[0]
    dev = netem.devices(hp)[0]
    ipr = _RecordingNetlink(gact)
    netem._tree(ipr, hp, dev, 7)
    paths = [f for f in ipr.filters if f["target"] != netem.EXEMPT_CLASS]
    exempt = [f for f in ipr.filters if f["target"] == netem.EXEMPT_CLASS]
    assert len(ipr.filters) == len(netem.filters(hp, dev)) and paths and exempt
    # each path's filters: an action that only passes the packet on, and counts it
    assert all(f.get("action") == ("ok" if gact else None) for f in paths)
    assert all("action" not in f for f in exempt)  # (its class counts it already)
