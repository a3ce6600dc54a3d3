"""The parts of the verbs transport that need no RDMA device: naming it, refusing it
clearly where there is none, the torch-free rendezvous store, and the check of what the
received-mean estimator may leave behind. (Real queue pairs: tests/netns/test_vm_rdma.py.)"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import pytest

from harness.collectives.layout import Layout
from harness.collectives.lossy import _flat_numpy
from harness.transport.semantics import Semantics
from harness.verbs import collective, device
from harness.verbs.rendezvous import Store
from harness.verbs.transport import SYSFS, TransportError, VerbsTransport
from testbed.errors import EnvironmentProblem, UsageError


@pytest.mark.parametrize("text,name,queue_pair,reliable,message", [
    ("verbs", "verbs-uc", "uc", False, 65536),
    ("verbs-ud", "verbs-ud", "ud", False, 65536),
    ("verbs-uc:8192", "verbs-uc", "uc", False, 8192),
    ("verbs-rc:16384", "verbs-rc", "rc", True, 16384),
    ("roce-rc", "roce-rc", "rc", True, 65536),
    ("udp", "udp", "", False, 65536),
])
def test_transport_names(text, name, queue_pair, reliable, message):
    s = Semantics.parse(text)
    assert (s.name, s.queue_pair, s.reliable, s.message_bytes) == (name, queue_pair, reliable,
                                                                   message)
    assert s.verbs == name.startswith("verbs-")
    assert Semantics.parse(str(s)) == s  # what records say can be read back


@pytest.mark.parametrize("text,says", [("verbs-ud:8192", "has no message size"),
                                       ("verbs-uc:7", "not a positive multiple of 4"),
                                       ("verbs-xx", "unknown transport")])
def test_bad_transport_names_are_refused_with_the_fix(text, says):
    with pytest.raises(UsageError, match=says) as caught:
        Semantics.parse(text)
    assert "--transport" in str(caught.value)


@pytest.mark.skipif(SYSFS.is_dir() and any(SYSFS.iterdir()), reason="this host has RDMA")
def test_without_an_rdma_device_the_transport_says_what_is_missing():
    with pytest.raises(TransportError, match=r"no RDMA device .* \(found: none\).*--rdma"):
        VerbsTransport(0, 2, "127.0.0.1", store=None, semantics=Semantics.parse("verbs-ud"))


class FakeHost:
    def __init__(self, name: str, devices: str):
        self.name, self.devices, self.calls = name, devices, []

    def run(self, argv):
        self.calls.append(argv)
        return SimpleNamespace(returncode=0, stdout=self.devices.encode(), stderr=b"")


def _cluster(*hosts):
    return SimpleNamespace(hosts=list(hosts), rank_python=lambda host: f"/py/{host.name}")


def test_hosts_are_asked_for_a_device_only_when_a_verbs_transport_is_chosen():
    host = FakeHost("h1", "")
    device.require_for(["udp", "roce-uc:65536", ""], _cluster(host))
    assert host.calls == []
    with pytest.raises(EnvironmentProblem, match="host h1 has no RDMA device.*--kind vm --rdma"):
        device.require_for(["udp", "verbs-rc"], _cluster(host))
    ready = FakeHost("h2", "rxe0\n")
    device.require_for(["verbs"], _cluster(ready))  # a device, and pyverbs loads (fake: 0)
    assert len(ready.calls) == 2 and "pyverbs.device" in ready.calls[1][-1]
    # in the Python that will run the host's ranks
    assert ready.calls[1][0] == "/py/h2"
    device.require_for(["verbs"], None)  # no cluster: nothing to ask


def test_the_collective_takes_numpy_arrays_and_refuses_what_it_cannot_send():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    flat = _flat_numpy(x)
    flat[0] = 9  # a view: the collective writes its result into the caller's array
    assert x[0, 0] == 9
    with pytest.raises(ValueError, match="contiguous float32"):
        _flat_numpy(np.zeros(4, dtype=np.float64))
    with pytest.raises(ValueError, match="contiguous float32"):
        _flat_numpy(np.zeros((4, 4), dtype=np.float32)[:, 1])


def test_the_torch_free_store_does_what_the_collectives_ask_of_a_store():
    master = Store("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    other = Store("127.0.0.1", master.port, timeout=timedelta(seconds=5))
    try:
        threading.Timer(0.3, other.set, args=("late", "here")).start()
        started = time.monotonic()
        assert master.get("late") == b"here"  # get waits for the key, as TCPStore's does
        assert time.monotonic() - started >= 0.25
        assert [master.add("n", 1), other.add("n", 2), master.add("n", 0)] == [1, 3, 3]
        assert master.check(["late", "n"]) and not master.check(["never"])
        with pytest.raises(TimeoutError, match="'never' not set within 0.2 s"):
            other.wait(["never"], timedelta(seconds=0.2))
        assert other.delete_key("late") and not master.check(["late"])
        assert not other.delete_key("late")
    finally:
        other.close()
        master.close()
    with pytest.raises(TimeoutError, match=f"no rendezvous store at 127.0.0.1:{master.port}"):
        Store("127.0.0.1", master.port, timeout=timedelta(seconds=0.5))


def test_the_estimator_check_accepts_every_possible_outcome_and_nothing_partial():
    """3 ranks, received-mean: a message of an owner's shard holds the mean over the owner
    and any subset of the others; on another rank it may also hold that rank's own values
    (the broadcast was lost). Half of one and half of another is never possible."""
    world, numel = 3, 30
    x = collective.contributions(seed=1, step=0, world=world, numel=numel)
    layout = Layout(numel, world, per_packet=4)
    rank = 1
    result = x.mean(axis=0)
    assert collective.consistent(result, x, layout, rank)
    # own shard: only rank 2's contribution arrived in its first message
    first, last = layout.packet_bounds(rank, 0)
    result[first:last] = x[[1, 2], first:last].mean(axis=0)
    # shard 0: the broadcast of its second message was lost, our own values stay
    first, last = layout.packet_bounds(0, 1)
    result[first:last] = x[rank, first:last]
    assert collective.consistent(result, x, layout, rank)
    # half a message of one kind, half of another: never what the collective does
    first, last = layout.packet_bounds(2, 0)
    result[first] = x[rank, first]
    assert not collective.consistent(result, x, layout, rank)


def test_the_drop_mask_and_device_chosen_on_the_controller_reach_every_rank(monkeypatch):
    """Remote and VM ranks do not inherit the controller's environment: the seeded drop
    mask (the loss of hardware RoCE, which host tc never sees) is passed on explicitly."""
    from harness import launch

    hosts = [SimpleNamespace(name=f"h{i}", address=f"10.0.0.{i}", ifname="eth0", gpus=0,
                             project="/p") for i in (1, 2)]
    cluster = SimpleNamespace(hosts=hosts, mtu=1500, shares_this_machine=False)
    monkeypatch.delenv("LOSSBED_RDMA_DEVICE", raising=False)
    monkeypatch.setenv("LOSSBED_DROP_MASK", "7:0.1")
    envs = [launch.rank_env(cluster, rank) for rank in (0, 1)]
    assert [e["LOSSBED_DROP_MASK"] for e in envs] == ["7:0.1", "7:0.1"]
    assert all("LOSSBED_RDMA_DEVICE" not in e for e in envs)  # unset stays unset
    monkeypatch.setenv("LOSSBED_RDMA_DEVICE", "mlx5_1")
    monkeypatch.setenv("LOSSBED_BACKEND", "nccl")
    envs = [launch.rank_env(cluster, rank) for rank in (0, 1)]
    assert [e["LOSSBED_RDMA_DEVICE"] for e in envs] == ["mlx5_1", "mlx5_1"]
    assert [e["LOSSBED_BACKEND"] for e in envs] == ["nccl", "nccl"]


def test_a_verbs_message_passes_the_one_screening_chain():
    """VerbsTransport._message on an object with just what it reads: each link of the chain
    (transport/screening.py) refuses its case and counts it; a good message reaches the
    handler. Mutation caught: a source other than the queue pair's peer taken as genuine."""
    from harness.transport import header as hdr
    from harness.transport.auth import PacketAuth
    from harness.transport.verdicts import Counters

    key, nonce = bytes(range(32)), 0x1234
    sender = PacketAuth(key, 0, "lossbed/verbs")
    me = SimpleNamespace(rank=1, nonce=nonce, drop_mask=None, counters=Counters(),
                         auth=PacketAuth(key, 1, "lossbed/verbs"))
    me.auth.know_peers([sender.salt.hex(), me.auth.salt.hex(), sender.salt.hex()])
    payload = np.arange(4, dtype=np.float32).tobytes()

    def message(source=0, dest=1, fragments=1, length=16, sealed=True):
        head = hdr.pack(hdr.STAGE_REDUCE, source, nonce, 3, 0, 1, 0, 1, length,
                        fragments=fragments, dest=dest)
        head = sender.seal(head, payload) if sealed else head
        return memoryview(head + payload)

    handled = []

    def handle(head, values):
        handled.append(bytes(values))
        return "applied"

    def verdict(peer, data):
        return VerbsTransport._message(me, peer, data, handle)

    assert verdict(0, message()) == "applied" and handled == [payload]
    assert verdict(2, message()) == "foreign"              # not the queue pair's peer
    assert verdict(0, message(sealed=False)) == "unauthenticated"
    assert verdict(0, message(dest=2)) == "misdirected"
    assert verdict(0, message(fragments=2)) == "malformed"  # verbs never cuts a message
    assert verdict(0, message(length=8)) == "malformed"
    c = me.counters
    assert (c.packets_received, c.foreign, c.unauthenticated, c.misdirected, c.malformed) \
        == (1, 1, 1, 1, 2)
    assert len(handled) == 1
