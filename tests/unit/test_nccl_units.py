"""The collective bench in nccl-tests' units (harness/bench/nccl_units.py, #67 item 4): sizes
as all_reduce_perf's -b/-e/-f make them, busbw = algbw * 2(n-1)/n, and the table's columns
for planted rows whose every number is known."""

from __future__ import annotations

import argparse

import pytest

from harness.bench import collective_command, nccl_units
from testbed.errors import UsageError


@pytest.mark.parametrize("text, size", [("8", 8), ("64K", 65536), ("1M", 1 << 20),
                                        ("256m", 256 << 20), ("2G", 2 << 30), ("1.5K", 1536),
                                        ("32MB", 32 << 20)])
def test_a_size_is_bytes_or_a_power_of_1024(text, size):
    assert nccl_units.size_bytes("-b", text) == size


@pytest.mark.parametrize("text", ["0", "-8", "x", "K", "nan", "inf", "2T", "2048G"])
def test_a_size_that_is_not_one_is_refused_by_name(text):
    with pytest.raises(UsageError) as refused:
        nccl_units.size_bytes("--maxbytes", text)
    assert (refused.value.field, refused.value.problem) == ("--maxbytes",
                                                            f"{text!r} is not a size")
    assert "64K or 256M" in refused.value.fix


def test_sizes_grow_by_the_factor_from_the_least_to_the_largest():
    assert nccl_units.sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert nccl_units.sizes(8, 100, 2) == [8, 16, 32, 64]
    assert nccl_units.sizes(1 << 20, 16 << 20, 4) == [1 << 20, 4 << 20, 16 << 20]
    assert nccl_units.sizes(64, 64, 2) == [64]
    # whole floats: 1, 2, 3 bytes are one float; 6 is one, 12 three
    assert nccl_units.sizes(1, 12, 2) == [4, 8]
    assert nccl_units.sizes(3, 12, 1.5) == [4, 8]  # 3, 4.5, 6.75, 10.1: twice one float


def test_sizes_that_do_not_grow_or_run_backwards_are_refused():
    with pytest.raises(UsageError, match="below --minbytes"):
        nccl_units.sizes(128, 8, 2)
    for factor in (1.0, 0.5):
        with pytest.raises(UsageError) as refused:
            nccl_units.sizes(8, 128, factor)
        assert refused.value.field == "--stepfactor"


def test_the_bus_factor_is_nccl_tests_all_reduce():
    assert [nccl_units.bus_factor(n) for n in (2, 4, 8)] == [1.0, 1.5, 1.75]


ROW = {"algorithm": "unbiased", "size_bytes": 4 << 20, "mean_ms": 2.0, "hosts": 4,
       "measured_loss": 0.0998, "missing_fraction": 0.1002, "profile": "random-loss",
       "loss": 0.1, "iterations": 10, "cpu_ns_per_byte": 1.25}


def test_a_row_in_nccl_tests_units():
    got = nccl_units.nccl_row(ROW)
    algbw = (4 << 20) / 2e-3 / 1e9
    assert got == {"size": 4 << 20, "count": 1 << 20, "type": "float", "redop": "mean",
                   "time_us": pytest.approx(2000.0), "algbw": pytest.approx(algbw),
                   "busbw": pytest.approx(algbw * 1.5), "loss": 0.0998, "missing": 0.1002,
                   "cpu_ns_per_byte": 1.25}
    gloo = nccl_units.nccl_row({**ROW, "algorithm": "reliable", "missing_fraction": None,
                                "hosts": 2})
    assert gloo["busbw"] == pytest.approx(gloo["algbw"]) and gloo["missing"] is None


def test_the_table_has_a_block_per_case_and_algorithm_its_sizes_in_order():
    rows = [{**ROW, "size_bytes": 8 << 20, "mean_ms": 4.0}, ROW,
            {**ROW, "algorithm": "reliable", "missing_fraction": None}]
    lines = nccl_units.table(rows).splitlines()
    assert lines[0] == ("# all-reduce unbiased, 4 ranks, random-loss at 10% (measured 9.98%), "
                        "10 iterations")
    assert lines[1].split() == ["#", "size", "count", "type", "redop", "time", "algbw",
                                "busbw", "loss", "missing", "cpu"]
    assert lines[3].split() == ["4194304", "1048576", "float", "mean", "2000.0", "2.097",
                                "3.146", "9.98", "10.020", "1.25"]
    assert lines[4].split() == ["8388608", "2097152", "float", "mean", "4000.0", "2.097",
                                "3.146", "9.98", "10.020", "1.25"]
    assert lines[5].startswith("# all-reduce reliable, 4 ranks")
    assert lines[8].split()[-2:] == ["-", "1.25"]
    assert lines[-1].startswith("# time: the mean iteration; algbw = size / time; busbw")
    assert nccl_units.table([]) == ""


def _args(**given):
    values = dict(sizes=None, minbytes=None, maxbytes=None, stepfactor=None)
    return argparse.Namespace(**{**values, **given})


def test_the_command_takes_sizes_one_way():
    assert collective_command.sizes_mib(_args()) == [1, 4, 16, 64]
    assert collective_command.sizes_mib(_args(sizes=[0.5])) == [0.5]
    assert collective_command.sizes_mib(_args(minbytes="256K", maxbytes="1M")) == [
        0.25, 0.5, 1.0]
    assert collective_command.sizes_mib(_args(minbytes="1M", stepfactor=4)) == [1.0]
    assert collective_command.sizes_mib(_args(maxbytes="64K")) == [1 / 16]
    with pytest.raises(UsageError, match="Give the sizes one way"):
        collective_command.sizes_mib(_args(sizes=[1.0], minbytes="8"))
