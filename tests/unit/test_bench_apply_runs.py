"""bench_apply runs and measures what it says: every call of the core applies the whole
batch (it asserts that itself: a batch refused as malformed or duplicate would time
nothing), and both sides of its ratio are timed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_bench_apply_prints_both_rates_and_their_ratio():
    for mtu in ("9000", "1500"):
        run = subprocess.run([sys.executable, "-m", "tests.benchmarks.bench_apply", "--mtu", mtu,
                              "--packets", "9"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert result["mtu"] == int(mtu) and result["packets"] == 9
        assert result["core_us"] > 0 and result["numpy_add_us"] > 0
        ratio = result["core_us"] / result["numpy_add_us"]
        assert result["core_over_numpy"] == pytest.approx(ratio)
