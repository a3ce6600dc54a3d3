"""The profile's instruments (tests/benchmarks/flamegraph.py, bench_core_profile's parts):
a flame graph's boxes are as wide as their samples, under their callers, and a stack is
counted under the first part any of its frames names."""

from __future__ import annotations

import re

from tests.benchmarks import bench_core_profile, flamegraph

FOLDED = "main;send_packets;sendmmsg 30\nmain;receive;recvmmsg 10\nmain;other 60\nbad line\n"


def test_folded_stacks_are_read_and_summed():
    assert flamegraph.parse(FOLDED + "main;other 5\n") == {
        ("main", "send_packets", "sendmmsg"): 30, ("main", "receive", "recvmmsg"): 10,
        ("main", "other"): 65}


def test_each_box_is_as_wide_as_its_samples_and_sits_on_its_caller():
    svg = flamegraph.svg(FOLDED, "a title")
    found = re.findall(r"<title>([^<]+?) \((\d+) samples, ([0-9.]+)%\)</title><rect "
                       r"x=\"([0-9.]+)\" y=\"(\d+)\" width=\"([0-9.]+)\"", svg)
    boxes = {name: (int(n), float(x), int(y), float(w)) for name, n, _, x, y, w in found}
    assert boxes["all"][0] == 100 and boxes["all"][3] == flamegraph.WIDTH
    assert boxes["main"][3] == flamegraph.WIDTH and boxes["main"][2] < boxes["all"][2]
    assert boxes["sendmmsg"][3] == 0.3 * flamegraph.WIDTH
    assert boxes["recvmmsg"][3] == 0.1 * flamegraph.WIDTH
    # a callee sits one row above its caller, inside its caller's span
    assert boxes["sendmmsg"][2] == boxes["send_packets"][2] - flamegraph.ROW
    assert boxes["send_packets"][1] <= boxes["sendmmsg"][1] < (
        boxes["send_packets"][1] + boxes["send_packets"][3])
    assert "a title" in svg and svg.startswith("<svg") and svg.rstrip().endswith("</svg>")


def test_a_stack_counts_under_the_first_part_its_frames_name():
    shares = bench_core_profile.stack_shares(FOLDED)
    assert shares["send (build, seal, sendmmsg)"] == 30.0
    assert shares["receive (recvmmsg)"] == 10.0
    assert shares["other (Python, numpy)"] == 60.0
    assert bench_core_profile.heaviest_leaves(FOLDED, 2) == [("other", 60.0),
                                                             ("sendmmsg", 30.0)]
