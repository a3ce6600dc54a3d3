"""The Transport contract (harness/transport/contract.py) is declared and kept: the UDP
transport (every loss semantics) and the verbs transport implement every member, the
collective asks them directly (no getattr probing of what a transport might have), and both
exchange endpoints through the one exchange (transport/endpoints.py)."""

from __future__ import annotations

import inspect

import pytest

from harness.transport import contract
from harness.transport.semantics import Semantics
from harness.verbs.transport import VerbsTransport
from tests.helpers import REPO
from tests.unit.test_transport_hostile import make_pair


@pytest.mark.parametrize("semantics", ["udp", "roce-ud", "roce-uc", "roce-rc"])
def test_the_udp_transport_implements_the_contract(semantics):
    _, transports = make_pair(semantics=Semantics.parse(semantics))
    try:
        for t in transports:
            assert isinstance(t, contract.Transport)
            assert t.device_counters() == {}
            assert 0 < t.fragment_floats <= t.per_packet
    finally:
        for t in transports:
            t.close()


def test_the_verbs_transport_has_every_member_of_the_contract():
    """Without an RDMA device here, by its class: every method, and every attribute set in
    __init__ or on the class."""
    source = inspect.getsource(VerbsTransport)
    methods = {n for n, v in vars(contract.Transport).items()
               if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    attributes = set(contract.Transport.__annotations__)
    assert methods >= {"send_packets", "receive_until", "device_counters", "close"}
    for name in methods:
        assert callable(getattr(VerbsTransport, name, None)) or isinstance(
            getattr(VerbsTransport, name, None), property), name
    for name in attributes:
        assert hasattr(VerbsTransport, name) or f"self.{name} =" in source or (
            f"self.{name}," in source), name


def test_one_endpoint_exchange_for_both_transports():
    for path in ("harness/transport/udp.py", "harness/verbs/transport.py"):
        text = (REPO / path).read_text()
        assert "endpoints.exchange(" in text, path
        assert "/nonce" not in text, f"{path} publishes the nonce itself"


def test_the_screening_chain_is_written_once():
    """Every transport refuses a unit from the wire through transport/screening.py: no other
    module of harness/ returns a screening verdict of its own."""
    from tests import source_checks

    screening = (REPO / "harness/transport/screening.py").read_text()
    # the refusals are returned there (the rest of harness/: tests/unit/test_source_checks.py)
    assert source_checks.screening_verdicts(screening, "harness/transport/screening.py")
    for path in ("harness/transport/udp.py", "harness/verbs/transport.py"):
        assert "screen(head, " in (REPO / path).read_text(), path


def test_every_verdict_counts_into_a_declared_counter():
    """count_verdict adds to the Counters field its verdict names (by setattr): each name is
    a field, so a renamed counter fails here rather than at the first packet of that kind."""
    import dataclasses

    from harness.transport import verdicts

    fields = {f.name for f in dataclasses.fields(verdicts.Counters)}
    assert set(verdicts.COUNTER_OF_VERDICT.values()) | {"malformed"} <= fields
    c = verdicts.Counters()
    for verdict in verdicts.COUNTER_OF_VERDICT:
        verdicts.count_verdict(c, verdict, 2)
    verdicts.count_verdict(c, "something else")
    verdicts.count_verdict(c, verdicts.HELD)  # counted with its message
    assert c.packets_received == 2 and c.malformed == 1 and c.masked == 2
