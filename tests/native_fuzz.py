"""Hostile datagrams for the compiled core, run by tests/unit/test_native_sanitized.py in a
process whose _wire was built with AddressSanitizer and UndefinedBehaviorSanitizer.

    python -m tests.native_fuzz PATH_TO_SANITIZED_WIRE.so EXAMPLES

Every example is a batch of BATCH datagrams: genuine packets of a 4-rank job (both stages,
sealed with each source's key, for rank 0; half of them fragments of RoCE UC messages, cut
in FRAGMENT floats), of which hypothesis mutates any header field to
any value of its width, truncates, grows (payload lengths beyond the datagram), breaks
tags, redirects (another destination, sealed as genuine), or replaces with random bytes.
Each batch goes through the real receive path (a loopback socket: recvmmsg, with datagrams
longer than a row among them), screen(), and apply() of both stages, on the screened rows
and on every row unscreened (apply checks everything itself), once as a layout of whole
packets and once as one of messages reassembled in a staging area (fragment streams), and
RC's in_order() on both (any source, any psn). The sender is given packets outside x and
resends from fragments that do not exist. Prints the count fed.
"""

from __future__ import annotations

import importlib.util
import socket
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.transport import header as hdr

WORLD, RANK, NONCE, STEP, BUCKET = 4, 0, 0x1234_5678_9ABC_DEF0, 7, 1
PER_PACKET, SHARD, SLOT, BATCH = 16, 40, 256, 256
FRAGMENT = 6  # floats per fragment of a UC message of PER_PACKET floats (6, 6, 4)
# (offset, bytes) of every header field but the tag
FIELDS = [(0, 4), (4, 1), (5, 1), (6, 2), (8, 8), (16, 4), (20, 2), (22, 2), (24, 2), (26, 2),
          (28, 4), (32, 4), (36, 4), (40, 4), (44, 2), (46, 2), (48, 8)]


def load(path: str):
    spec = importlib.util.spec_from_file_location("_wire", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wire = load(sys.argv[1])
KEYS = [bytes([r]) * 16 for r in range(WORLD)]
MACS = [None] + [wire.Mac(k) for k in KEYS[1:]]
PACKETS = -(-SHARD // PER_PACKET)
LAST = SHARD - (PACKETS - 1) * PER_PACKET


def genuine(rng: np.random.Generator) -> bytes:
    """A sealed data packet or end marker from a random source for rank 0."""
    source = int(rng.integers(1, WORLD))
    stage = int(rng.choice([hdr.STAGE_REDUCE, hdr.STAGE_BROADCAST, hdr.STAGE_REDUCE_END]))
    index = int(rng.integers(0, PACKETS))
    floats = LAST if index == PACKETS - 1 else PER_PACKET
    if stage == hdr.STAGE_REDUCE_END:
        index, floats = PACKETS, 0
    shard = RANK if stage != hdr.STAGE_BROADCAST else source
    values = rng.standard_normal(floats).astype(np.float32)
    fragment, fragments = 0, 1
    if floats > FRAGMENT and rng.integers(2):  # a fragment of a UC message
        fragments = -(-floats // FRAGMENT)
        fragment = int(rng.integers(fragments))
        values = values[fragment * FRAGMENT:(fragment + 1) * FRAGMENT]
    payload = values.tobytes()
    head = bytearray(hdr.pack(stage, source, NONCE, STEP, BUCKET, shard, index, PACKETS,
                              len(payload), fragment=fragment, fragments=fragments,
                              dest=RANK))
    return seal(head, payload, source, int(rng.integers(0, 2**40)))


def seal(head: bytearray, payload: bytes, source: int, seq: int) -> bytes:
    head[hdr.SEQ_OFFSET:hdr.TAG_OFFSET] = seq.to_bytes(8, "big")
    mac = MACS[source] if 0 < source < WORLD else MACS[1]
    return bytes(head[:hdr.TAG_OFFSET]) + mac.tag(bytes(head) + payload) + payload


mutation = st.one_of(
    st.tuples(st.just("field"), st.sampled_from(FIELDS), st.integers(0, 2**64 - 1),
              st.booleans()),
    st.tuples(st.just("truncate"), st.integers(0, SLOT), st.just(0), st.just(False)),
    st.tuples(st.just("grow"), st.integers(1, 70_000), st.just(0), st.booleans()),
    st.tuples(st.just("tag"), st.integers(0, 15), st.integers(1, 255), st.just(False)),
    st.tuples(st.just("redirect"), st.integers(1, 0xFFFF), st.just(0), st.just(True)),
    st.tuples(st.just("random"), st.integers(0, SLOT + 64), st.just(0), st.just(False)),
)


def mutate(datagram: bytes, kind, a, b, reseal, rng) -> bytes:
    d = bytearray(datagram)
    if kind == "field":
        offset, width = a
        d[offset:offset + width] = (b % (1 << (8 * width))).to_bytes(width, "big")
    elif kind == "truncate":
        d = d[:a]
    elif kind == "grow":
        d[36:40] = (a % 2**32).to_bytes(4, "big")  # a length beyond what came
    elif kind == "tag":
        if len(d) > hdr.TAG_OFFSET + a:  # (an earlier mutation may have cut it short)
            d[hdr.TAG_OFFSET + a] ^= b
    elif kind == "redirect":
        d[hdr.DEST_OFFSET:hdr.DEST_OFFSET + 2] = a.to_bytes(2, "big")
    else:
        return rng.bytes(a)
    if reseal and len(d) >= hdr.HEADER_BYTES:  # a genuine-looking tag over the mutation
        source = int.from_bytes(d[6:8], "big")
        return seal(bytearray(d[:hdr.HEADER_BYTES]), bytes(d[hdr.HEADER_BYTES:]), source,
                    int.from_bytes(d[48:56], "big"))
    return bytes(d)


class Receiving:
    """One rank 0 receiver on loopback (127.0.0.1 only), fed by one sender socket."""

    def __init__(self):
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind(("127.0.0.1", 0))
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tx.bind(("127.0.0.1", 0))
        self.data = np.zeros((BATCH, SLOT), np.uint8)
        self.sizes = np.zeros(BATCH, np.int64)
        self.addrs = np.zeros(BATCH, np.uint32)
        self.ports = np.zeros(BATCH, np.uint16)
        self.classes = np.zeros(BATCH, np.int8)
        self.receiver = wire.Receiver(self.rx.fileno(), self.data, SLOT, self.sizes,
                                      self.addrs, self.ports)
        address = int.from_bytes(socket.inet_aton("127.0.0.1"), "big")
        self.peer_addrs = np.full(WORLD, address, np.uint32)
        self.peer_ports = np.full(WORLD, self.tx.getsockname()[1], np.uint16)

    def through_the_socket(self, datagrams: list[bytes]) -> int:
        for d in datagrams:
            self.tx.sendto(d, self.rx.getsockname())
        n = got = 0
        while got < len(datagrams):
            n = self.receiver.receive()
            if n == 0:
                break
            got += n
        return n


receiving = Receiving()
fed = 0


def stage_state(stage: int):
    if stage == hdr.STAGE_REDUCE:
        expected = np.array([0] + [PACKETS] * (WORLD - 1), np.int64)
        base = np.zeros(WORLD, np.int64)
        target = np.zeros(SHARD, np.float32)
    else:
        expected = np.array([0] + [PACKETS] * (WORLD - 1), np.int64)
        base = np.arange(WORLD, dtype=np.int64) * SHARD
        target = np.zeros(WORLD * SHARD, np.float32)
    last = np.full(WORLD, LAST, np.int64)
    got = np.zeros((WORLD, PACKETS), np.uint8)
    return expected, last, base, target, got, expected.copy(), np.zeros(WORLD, np.uint8)


def staging_for(expected: np.ndarray) -> tuple:
    """A UC staging area for this layout: per source a region of its messages, which
    fragments came (none yet), how many."""
    room = expected * PER_PACKET
    most = -(-PER_PACKET // FRAGMENT)
    return (FRAGMENT, np.full(int(room.sum()), np.nan, np.float32), np.cumsum(room) - room,
            np.zeros(WORLD * PACKETS * most, np.uint8), np.zeros(WORLD * PACKETS, np.int32))


def apply_both(data, rows, accept):
    leftover = np.zeros(len(rows), np.int64)
    for fragments in (False, True):
        for stage in (hdr.STAGE_REDUCE, hdr.STAGE_BROADCAST):
            expected, last, base, target, got, pending, ended = stage_state(stage)
            reduce = stage == hdr.STAGE_REDUCE
            staged = staging_for(expected) if fragments else ()
            # twice: the second time every fragment the first one kept is there already
            for _ in range(2):
                wire.apply(data, SLOT, rows, STEP, BUCKET, stage, RANK if reduce else -1,
                           expected, last, base, PER_PACKET, target, got, PACKETS, pending,
                           None if reduce else ended, reduce, accept, leftover, *staged)
            assert np.isfinite(target).all()  # nothing non-finite is ever applied
            assert (pending >= 0).all()


def in_order_both(data, screened, rng):
    """RC's go-back-N receiver on the screened rows and on all of them (sources and psns
    as hostile as the headers), from flows that expect psns near what came."""
    for rows in (screened, np.arange(BATCH, dtype=np.int64)):
        expected = rng.integers(0, 4, WORLD).astype(np.int64)
        delivered = np.full(len(rows), -1, np.int64)
        duplicates, gap_max = np.zeros(WORLD, np.int64), np.full(WORLD, -1, np.int64)
        k = wire.in_order(data, SLOT, rows, expected, delivered, duplicates, gap_max)
        assert 0 <= k <= len(rows) and set(delivered[:k].tolist()) <= set(rows.tolist())


@settings(max_examples=int(sys.argv[2]), deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), mutations=st.lists(mutation, min_size=1, max_size=24),
       accept=st.booleans())
def fuzz(seed, mutations, accept):
    global fed
    rng = np.random.default_rng(seed)
    batch = [genuine(rng) for _ in range(BATCH)]
    for i, (kind, a, b, reseal) in enumerate(mutations):
        row = int(rng.integers(BATCH)) if i else 0
        batch[row] = mutate(batch[row], kind, a, b, reseal, rng)
    # 1. straight into the rows, sizes as given (the core's own checks, no kernel between)
    data = np.zeros((BATCH, SLOT), np.uint8)
    sizes = np.zeros(BATCH, np.int64)
    for row, d in enumerate(batch):
        data[row, :min(len(d), SLOT)] = np.frombuffer(d[:SLOT], np.uint8)
        sizes[row] = len(d) if len(d) <= SLOT else -1
    classes = np.zeros(BATCH, np.int8)
    wire.screen(data, SLOT, sizes, np.full(BATCH, receiving.peer_addrs[0], np.uint32),
                np.full(BATCH, receiving.peer_ports[0], np.uint16), BATCH, RANK, WORLD, NONCE,
                MACS, receiving.peer_addrs, receiving.peer_ports, classes)
    apply_both(data, np.flatnonzero(classes == wire.CLS_DATA), accept)
    apply_both(data, np.arange(BATCH, dtype=np.int64), accept)  # unscreened, all of them
    in_order_both(data, np.flatnonzero(classes == wire.CLS_DATA), rng)
    for row in range(0, BATCH, 16):
        MACS[1].check(data[row], int(rng.integers(0, SLOT + 1)))
    # 2. some of them through a real socket (recvmmsg, one longer than a row)
    n = receiving.through_the_socket(batch[:15] + [bytes(SLOT + 100)])
    if n:
        wire.screen(receiving.data, SLOT, receiving.sizes, receiving.addrs, receiving.ports, n,
                    RANK, WORLD, NONCE, MACS, receiving.peer_addrs, receiving.peer_ports,
                    receiving.classes)
    fed += BATCH + 16


if __name__ == "__main__":
    fuzz()
    sender = wire.Sender(receiving.tx.fileno(), 1, NONCE, hdr.HEADER_BYTES + 4 * PER_PACKET, 1)
    x = np.zeros(SHARD, np.float32)
    for starts, ends, cut in (([0], [SHARD + 1], 0), ([-1], [3], 0), ([5], [2], 0),
                              ([0, 1], [1], 0), ([0], [SHARD], -1), ([0], [SHARD], 1 << 62)):
        try:
            sender.send(bytes(16), 0, MACS[1], 0, 0, STEP, BUCKET, 0, x,
                        np.array(starts, np.int64), np.array(ends, np.int64), 1, 4, 1, 0, cut)
        except ValueError:
            pass
        else:
            if cut != 1 << 62:  # (a cut beyond the packet: sent whole, which is right)
                raise AssertionError(f"packets {starts}-{ends} outside x were sent")
    # resends (RC) from a fragment the first packet does not have, indexes past 32 bits
    for first_fragment, index_first, copy in ((3, 0, 0), (-1, 0, 0), (0, 2**32 - 1, 0),
                                              (0, -1, 0), (0, 0, 1 << 16), (0, 0, -1)):
        try:
            sender.send(bytes(16), 0, MACS[1], 0, 0, STEP, BUCKET, 0, x,
                        np.array([0, 6], np.int64), np.array([6, 12], np.int64), 2, 4, 0, 0,
                        3, 0, index_first, first_fragment, copy)
        except ValueError:
            pass
        else:
            raise AssertionError(f"a resend from fragment {first_fragment}, index "
                                 f"{index_first}, copy {copy} was sent")
    # sends by index (a pipelined broadcast): too few or too many, negative, past 32 bits,
    # not an int64 array
    for indexes in (np.array([3], np.int64), np.array([3, 4, 5], np.int64),
                    np.array([3, -1], np.int64), np.array([3, 2**32], np.int64),
                    np.array([3, 4], np.int32)):
        try:
            sender.send(bytes(16), 0, MACS[1], 0, 0, STEP, BUCKET, 0, x,
                        np.array([0, 6], np.int64), np.array([6, 12], np.int64), 9, 4, 0, 0,
                        0, -1, 0, 0, 0, indexes)
        except ValueError:
            pass
        else:
            raise AssertionError(f"a send by indexes {indexes.tolist()} was sent")
    sender.send(bytes(16), 0, MACS[1], 0, 0, STEP, BUCKET, 0, x, np.array([0, 6], np.int64),
                np.array([6, 12], np.int64), 9, 4, 1, 0, 0, -1, 0, 0, 0,
                np.array([2, 8], np.int64))  # and one that fits, sent
    big = np.zeros(70_000, np.float32)  # 70,000 fragments of one value: over 65535
    try:
        sender.send(bytes(16), 0, MACS[1], 0, 0, STEP, BUCKET, 0, big,
                    np.array([0], np.int64), np.array([len(big)], np.int64), 1, 4, 0, 0, 1)
    except ValueError:
        pass
    else:
        raise AssertionError("a message of more than 65535 fragments was sent")
    print(f"fed {fed} hostile datagrams")
