"""bench_core_profile --perf sorts perf's samples by where they landed: the kernel's copies
apart from the rest of the kernel, the MAC, the compiled core's apply apart from its other
functions, the interpreter. Each rule is shown by a line it must take and one it must not."""

from __future__ import annotations

import pytest

from tests.benchmarks.bench_core_profile import categorise

REPORT = """\
    20.00%  [kernel.kallsyms]                            [k] copy_user_enhanced_fast_string
    10.00%  [kernel.kallsyms]                            [k] __skb_datagram_iter
     7.50%  [kernel.kallsyms]                            [k] skb_copy_datagram_iter
    15.00%  libcrypto.so.3                               [.] gcm_ghash_avx
    12.00%  _wire.cpython-311-x86_64-linux-gnu.so        [.] apply
     3.00%  _wire.cpython-311-x86_64-linux-gnu.so        [.] screen
     9.00%  libpython3.11.so.1.0                         [.] _PyEval_EvalFrameDefault
     4.00%  libc.so.6                                    [.] __memmove_avx_unaligned_erms
     2.00%  libtorch_cpu.so                              [.] c10d::TCPStore::add
     1.50%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so  [.] npy_copy
     1.00%  libsomething.so                              [.] mystery
# a comment line perf prints
"""


def test_every_sample_lands_in_the_category_of_its_object_and_symbol():
    shares = categorise(REPORT)
    assert shares["kernel: copies"] == pytest.approx(27.5)  # copy_user + skb_copy_datagram
    assert shares["kernel: the rest"] == pytest.approx(10.0)  # not a copy: the stack
    assert shares["MAC (libcrypto)"] == pytest.approx(15.0)
    assert shares["core: apply (place, sum)"] == pytest.approx(12.0)
    assert shares["core: the rest"] == pytest.approx(3.0)
    assert shares["Python interpreter"] == pytest.approx(9.0)
    assert shares["C library"] == pytest.approx(4.0)
    assert shares["torch (store, tensors)"] == pytest.approx(2.0)
    assert shares["numpy"] == pytest.approx(1.5)
    assert shares["other"] == pytest.approx(1.0)
    assert sum(shares.values()) == pytest.approx(85.0)  # every line counted once


def test_a_report_without_samples_gives_zero_everywhere():
    assert set(categorise("# nothing\n").values()) == {0.0}


def test_a_line_with_its_sample_count_is_read_like_one_without():
    """--perf asks perf for the counts too (--show-nr-samples): the count between the
    percent and the object must not be taken for the object."""
    counted = "     9.96%   511  libc.so.6  [.] __memmove_avx512_unaligned_erms\n"
    assert categorise(counted)["C library"] == pytest.approx(9.96)


def test_every_feature_a_backend_offers_or_a_profile_needs_is_a_declared_one():
    """The features are a declared set (testbed/impair/features.py): a backend offering
    'loss:bernouli' would never match what a profile needs, and is caught here."""
    from testbed.impair import features
    from testbed.impair.registry import BACKENDS
    from testbed.profiles.model import Impairment

    assert set(features.DESCRIPTIONS) == set(features.FEATURES)
    for name, backend in BACKENDS.items():
        assert backend.SUPPORTS <= set(features.FEATURES), (name, backend.SUPPORTS)
    everything = Impairment.model_validate({
        "loss": {"model": "gilbert_elliott", "p_pct": 1, "r_pct": 50, "max_burst_ms": 5},
        "delay_ms": 5, "jitter_ms": 1, "rate_mbit": 100, "reorder_pct": 1,
        "duplicate_pct": 1, "corrupt_pct": 1, "seed": 1, "limit_packets": 100})
    assert features.needed(everything) <= set(features.FEATURES)
    # the set is known: every field given, each its feature (#71: it was `>= 9`)
    assert features.needed(everything) == {
        "loss:gilbert_elliott", "loss:burst_time_limit", "delay", "jitter", "rate",
        "reorder", "duplicate", "corrupt", "seed", "limit"}
