"""The adaptive deadline: each stage's lateness lengthens only that stage's wait."""

import pytest

from harness.collectives.deadline import MAX_BOOST, Deadline


def test_late_broadcasts_lengthen_only_the_broadcast_wait_and_the_boost_decays_back():
    d = Deadline()
    d.observe("reduce:100", 0.010)
    d.observe("broadcast:100", 0.010)
    reduce_before, broadcast_before = d.budget("reduce:100"), d.budget("broadcast:100")
    assert reduce_before == broadcast_before == 3 * 0.010 + 0.02
    d.late("broadcast")
    d.end_step()
    # An owner's broadcast goes out when its reduce wait ends: a longer reduce wait here
    # would make this rank's broadcast late for everyone else.
    assert d.budget("reduce:100") == reduce_before
    assert d.budget("broadcast:100") == 2 * broadcast_before
    for _ in range(10):
        d.late("broadcast")
        d.end_step()
    assert d.budget("broadcast:100") == min(d.ceiling_s, MAX_BOOST * broadcast_before)
    for _ in range(40):  # no more late packets: back to the plain budget
        d.end_step()
    assert d.budget("broadcast:100") == broadcast_before


def test_late_reduce_packets_lengthen_the_reduce_wait():
    d = Deadline()
    d.observe("reduce:100", 0.010)
    before = d.budget("reduce:100")
    d.late("reduce")
    d.end_step()
    assert d.budget("reduce:100") == 2 * before


def test_a_first_broadcast_waits_at_least_a_multiple_of_the_own_reduce():
    """In VMs under TCG a reduce of 85 messages took 0.3-0.7 s: an owner broadcast that long
    after its reduce began, and a 0.25 s first budget lost its whole first broadcast (85 of
    85 messages, 'late' in the next step). With nothing learned yet, the caller's own
    reduce time is the best guess of the owner's."""
    d = Deadline()
    assert d.budget("broadcast:1000") == pytest.approx(0.25)  # nothing known
    assert d.budget("broadcast:1000", first_at_least=3 * 0.4) == pytest.approx(1.2)
    assert d.budget("broadcast:1000", first_at_least=30.0) == d.ceiling_s  # still capped
    d.observe("broadcast:1000", 0.01)  # once learned, the history decides
    assert d.budget("broadcast:1000", first_at_least=1.2) == pytest.approx(3 * 0.01 + 0.02)
