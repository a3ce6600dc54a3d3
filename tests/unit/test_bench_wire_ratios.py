"""The ratios `tests/benchmarks/bench_wire.py` prints are the ones its README figures read:
computed here from rows whose answers are known."""

from __future__ import annotations

from tests.benchmarks import bench_wire

MIB = 1 << 20


def _row(algorithm, loss, p50, p99, maximum, hit=None):
    return {"algorithm": algorithm, "loss": loss, "size_bytes": 4 * MIB, "p50_ms": p50,
            "p99_ms": p99, "max_ms": maximum, "missing_fraction": 0.0 if hit else None,
            "deadlines_hit": hit}


def test_the_ratios_of_one_size():
    wire = {"sendmmsg plain": {"gbps": 10.0}, "sendmmsg sealed": {"gbps": 6.0},
            "gso plain": {"gbps": 20.0}, "gso sealed": {"gbps": 8.0}}
    later = {k: {"gbps": v["gbps"] / 2} for k, v in wire.items()}  # best of the two: before
    none = {"reduce": 0, "broadcast": 0}
    sealed = [_row("unbiased", 0.0, 12.0, 18.0, 20.0, none),
              _row("unbiased", 0.1, 13.0, 24.0, 30.0, {"reduce": 1, "broadcast": 2}),
              _row("reliable", 0.0, 15.0, 20.0, 25.0), _row("reliable", 0.1, 400.0, 900.0,
                                                            1000.0)]
    unsealed = [_row("unbiased", 0.0, 10.0, 14.0, 16.0, none),
                _row("unbiased", 0.1, 11.0, 20.0, 22.0, none)]
    [r] = bench_wire.summarise(9000, 4, wire, later, sealed, unsealed)
    # 4 hosts each send 2*3/4 of 4 MiB per all-reduce: 6 x 4 MiB over the p50
    assert r["unsealed_gbps"] == 6 * 4 * MIB * 8 / 0.010 / 1e9
    assert r["unsealed_of_plain_wire"] == r["unsealed_gbps"] / 20.0
    assert r["sealed_of_sealed_wire"] == r["sealed_gbps"] / 8.0
    assert r["unsealed_p50_vs_gloo_0"] == 10.0 / 15.0
    assert r["mac_price"] == 12.0 / 10.0 and r["blaster_mac_price"] == 20.0 / 8.0
    assert r["sealed_p99_10_vs_own_p50_0"] == 24.0 / 12.0
    assert r["sealed_p99_0_vs_own_p50_0"] == 18.0 / 12.0
    assert r["sealed_deadlines_hit_10"] == {"reduce": 1, "broadcast": 2}
    printed = bench_wire.table([r], {9000: (wire, later)}, {9000: {
        "seal_us": 1.0, "check_us": 1.0, "datagram_bytes": 8972,
        "seal_check_gbps_per_core": 35.9, "cores_at_100gbps": 2.8}})
    line = next(x for x in printed.splitlines() if x.startswith(" 9000    4"))
    assert line.split()[-3:] == ["2.00", "1.50", "1/2"], line


def test_every_cell_is_held_to_the_targets_met_missed_or_without_a_value():
    """#67 item 3: each (hosts, MTU, size) cell against each target, both sides of each
    bound planted, and a p99 that too few iterations left out is no verdict."""
    row = {"hosts": 2, "mtu": 1500, "size_mib": 4.0, "unsealed_of_plain_wire": 0.8,
           "sealed_of_sealed_wire": 0.79, "unsealed_p50_vs_gloo_0": 0.81,
           "sealed_p50_vs_gloo_0": 1.0, "sealed_p99_10_vs_own_p50_0": None}
    checked = bench_wire.against_targets([row])
    assert [(c["target"].split(" ")[0] + " " + c["target"].split(" ")[1], c["met"])
            for c in checked] == [("unsealed goodput", True), ("sealed goodput", False),
                                  ("unsealed p50", False), ("sealed p50", True),
                                  ("sealed p99", None)]
    printed = bench_wire.targets_table(checked)
    assert "0.79 MISSED" in printed and "0.80 met" in printed and "- n/a" in printed
    assert "2 of 4 met (1 without a value)" in printed
    assert "2h 1500 4M" in printed
