"""`make gpu-check`'s instrument (tests/hardware/gpu_check.py), run on the CPU: two ranks on
loopback time backward alone, backward with the lossy hook, and the buckets alone, and the
measures come out of those times as the module says (#67 item 6). The GPU path itself runs
where a GPU is (make gpu-check, the hardware tier); this machine has none."""

from __future__ import annotations

import json

import pytest

from tests.hardware import gpu_check


def test_hidden_and_busbw_from_the_three_times():
    got = gpu_check.measures({"compute_s": 0.10, "hooked_s": 0.12, "alone_s": 0.05,
                              "bytes": 100_000_000})
    assert got["hidden"] == pytest.approx((0.10 + 0.05 - 0.12) / 0.05)
    assert got["algbw_gbps"] == pytest.approx(2.0) and got["busbw_gbps"] == pytest.approx(2.0)
    serial = gpu_check.measures({"compute_s": 0.1, "hooked_s": 0.2, "alone_s": 0.1, "bytes": 8})
    assert serial["hidden"] == 0.0  # nothing overlapped (and never below 0)
    assert gpu_check.measures({"compute_s": 0.1, "hooked_s": 0.05, "alone_s": 0.1,
                               "bytes": 8})["hidden"] == 1.0  # (never above 1)


def test_the_instrument_runs_end_to_end_on_the_cpu(capsys):
    assert gpu_check.main(["--device", "cpu", "--layers", "2", "--width", "64", "--batch",
                           "8", "--steps", "2", "--budget-s", "120"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["device"] == "cpu" and result["missing"] == 0 and result["finite"]
    assert result["bytes"] == 2 * (64 * 64 + 64) * 4 and result["buckets"] == 1
    assert result["compute_s"] > 0 and result["hooked_s"] > 0 and result["alone_s"] > 0
    assert 0.0 <= result["hidden"] <= 1.0 and result["busbw_gbps"] > 0
    assert "hidden" in out and "busbw" in out


def test_without_a_gpu_cuda_is_refused_with_exit_3(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gpu_check.main(["--device", "cuda"]) == 3
    assert "no GPU here" in capsys.readouterr().out
