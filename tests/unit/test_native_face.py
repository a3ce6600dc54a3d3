"""The compiled core behind a named face (issue #44, part 4): every call into it from
production goes through native.py, by keyword; the benchmark instrument is a module of its
own, not part of the data plane."""

from __future__ import annotations

import numpy as np
import pytest

from harness.transport import _wire, native


def test_the_data_plane_carries_no_benchmark_functions():
    assert not hasattr(_wire, "blast") and not hasattr(_wire, "mac_cost")
    assert not hasattr(native, "blast")
    from harness.bench import _blaster

    assert callable(_blaster.blast)


def test_a_named_call_reaches_the_core_and_its_checks():
    """The face passes what it is given to the C side, which checks it: a layout that does
    not fit its buffers is refused by name, and the verdicts come back as named fields."""
    rows = np.zeros(0, np.int64)
    fields = dict(step=0, bucket=0, stage=0, owner=0, expected=np.array([0, 1], np.int64),
                  last_floats=np.array([0, 4], np.int64), base=np.array([0, 0], np.int64),
                  per_packet=4, target=np.zeros(4, np.float32),
                  got=np.zeros((2, 1), bool), pending=np.array([0, 1], np.int64), ended=None,
                  add=True, accept=True, leftover=np.zeros(0, np.int64))
    done = native.apply(np.zeros((1, 128), np.uint8), rows, **fields)
    assert done == native.Applied(0, 0, 0, 0, 0, 0, 0) and done.applied == 0
    with pytest.raises(ValueError, match="layout does not fit"):
        native.apply(np.zeros((1, 128), np.uint8), rows,
                     **{**fields, "base": np.array([0, 10**6], np.int64)})
    with pytest.raises(TypeError):
        native.apply(np.zeros((1, 128), np.uint8), rows, 0, 0)  # positional: refused
