"""The lossy collectives' transport over real RDMA queue pairs (`--transport verbs-ud`,
`verbs-uc[:BYTES]`, `verbs-rc[:BYTES]`; `verbs` is verbs-uc).

It has the interface of harness/transport/udp.py, so LossyCollective and RPS run over it
unchanged; only the unit of loss is the hardware's:

    verbs-ud   one UD queue pair per rank; a message is one packet of the device's path MTU
               (1024 B for Soft-RoCE on a 1500-byte link, 4096 B at MTU 9000)
    verbs-uc   one UC queue pair per peer; messages of MESSAGE bytes (default 64 KiB). A
               message with any packet lost never completes: the device drops the rest and
               reuses the receive buffer, so partially placed data is never seen
    verbs-rc   one RC queue pair per peer; the device retransmits (go-back-N for RoCE
               without PFC), and a send completes once the peer acknowledged it

Every message carries lossbed's packet header (header.py) followed by its float32
payload, so the receiver checks it exactly as it checks a datagram (job nonce, source,
step, shard, index, length), and the seeded drop mask (dropmask.py) applies here too.

Queue pair numbers and GIDs are exchanged through the rendezvous store. Receive buffers
are posted before that (a message that finds none posted is dropped by UD and UC, as on
any RDMA NIC, and NAKed for a retry by RC), and each one is posted again as soon as its
message was handed on. The device's own counters (Soft-RoCE: retransmissions, sequence
errors, ...) are read before and after, see device_counters().
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness.transport import endpoints
from harness.transport import header as hdr
from harness.transport.auth import PacketAuth
from harness.transport.dropmask import DropMask
from harness.transport.early import EarlyStash
from harness.transport.endpoints import TransportError
from harness.transport.screening import screen
from harness.transport.semantics import Semantics
from harness.transport.verdicts import Counters, count_verdict
from harness.verbs import api
from harness.verbs.transfer import PORT_NUM, QKEY, UD_GRH_BYTES, find_gid_index

log = logging.getLogger(__name__)

RECEIVE_BYTES_PER_PEER = 32 << 20  # receive buffers posted for each peer's messages ...
MIN_RECEIVES, MAX_RECEIVES = 64, 4096  # ... as this many messages at least and at most
SEND_SLOTS = 256  # messages in flight from this rank (their buffers are reused after)
DRAIN_EVERY = 16  # sends between looks at the receive queue while sending
IDLE_SLEEP_S = 100e-6  # between polls of an empty completion queue
RC_TIMEOUT, RC_RETRIES = 14, 7  # 4.096 us x 2^14 = 67 ms per try; 7 tries, then an error
SYSFS = Path("/sys/class/infiniband")


def devices() -> list[str]:
    """The RDMA devices of this host (Soft-RoCE's rxe0, a NIC's mlx5_0, ...)."""
    return sorted(p.name for p in SYSFS.iterdir()) if SYSFS.is_dir() else []


def _buffer(mr, length: int) -> np.ndarray:
    """The memory of a memory region, as bytes numpy can read and write in place."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(mr.buf))



def read_device_counters(device: str) -> dict[str, int]:
    """The device's own counters (its port's hw_counters in sysfs), as its driver names them."""
    folder = SYSFS / device / "ports" / str(PORT_NUM) / "hw_counters"
    counts = {}
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        try:
            counts[path.name] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return counts

def _queue_pairs(v, pd, qp_kind: str, count: int, send_cq, recv_cq, depth: int) -> list:
    """`count` queue pairs of kind "ud", "uc" or "rc" in their INIT state, each with the
    attributes it goes on with (its port; UD's qkey), as (qp, attr) pairs."""
    e = v.e
    kind = {"ud": e.IBV_QPT_UD, "uc": e.IBV_QPT_UC, "rc": e.IBV_QPT_RC}[qp_kind]
    cap = v.QPCap(max_send_wr=SEND_SLOTS, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
    made = []
    for _ in range(count):
        qp = v.QP(pd, v.QPInitAttr(qp_type=kind, scq=send_cq, rcq=recv_cq, cap=cap))
        attr = v.QPAttr(port_num=PORT_NUM)
        if qp_kind == "ud":
            attr.qkey = QKEY
        else:
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE
        qp.to_init(attr)
        made.append((qp, attr))
    return made

class VerbsTransport:
    batched = False  # one message at a time: each is one work request anyway

    def __init__(self, rank: int, world: int, address: str, store, semantics: Semantics, *,
                 device: str | None = None, drop_mask: DropMask | None = None,
                 key_prefix: str | None = None, receives_per_peer: int | None = None,
                 key: bytes | None = None):
        if not semantics.verbs:
            raise ValueError(f"{semantics} is not a verbs transport")
        if world < 2:
            raise ValueError(f"a verbs transport needs 2 or more ranks (world {world})")
        self.rank, self.world, self.semantics = rank, world, semantics
        # this rank's own verdicts (one mask may be handed to every rank of a process)
        self.drop_mask = drop_mask.for_receiver(rank) if drop_mask is not None else None
        # the job key (harness.transport.auth): every message sealed and checked with it,
        # under a key of this transport's own (its store prefix, its salt)
        prefix = key_prefix or f"lossbed/verbs/{semantics}"
        self.auth = PacketAuth(key, rank, prefix) if key is not None else None
        self.counters = Counters()
        # one thread's at a time, close() included (see UdpTransport.use_lock)
        self.use_lock = threading.RLock()
        self.closed = False
        self.stash = EarlyStash()  # packets of coming steps that came early, kept for them
        self._step = 0
        found = devices()
        # the device asked for (a rank's: LOSSBED_RDMA_DEVICE, harness/rank_protocol.py), else
        # this host's first
        self.device = device or (found or [""])[0]
        if self.device not in found:
            raise TransportError(
                f"rank {rank}: no RDMA device {self.device!r} on this host (found: "
                f"{', '.join(found) or 'none'}). Use hosts with Soft-RoCE (lossbed up --kind "
                "vm --rdma) or RDMA NICs, or LOSSBED_RDMA_DEVICE=NAME to pick one")
        self.v = v = api.load()
        e = v.e
        self.ctx = v.Context(name=self.device)
        self.path_mtu = self.ctx.query_port(PORT_NUM).active_mtu  # an IBV_MTU_* value
        mtu_bytes = 128 << self.path_mtu
        self.qp_kind = semantics.queue_pair
        ud = self.qp_kind == "ud"
        # A message holds a header and float32 values; UD's is one packet at most.
        self.message_bytes = mtu_bytes if ud else semantics.message_bytes
        self.per_packet = (self.message_bytes - hdr.HEADER_BYTES) // 4
        self.fragment_floats = self.per_packet  # a message is never cut: one work request
        if self.per_packet < 1:
            raise TransportError(f"{semantics}: a message of {self.message_bytes} bytes has "
                                 f"no room for values after the {hdr.HEADER_BYTES}-byte "
                                 "header; give a larger :BYTES")
        self._grh = UD_GRH_BYTES if ud else 0  # UD receives start with the route header
        self.slot_bytes = self.message_bytes + self._grh
        peers = [p for p in range(world) if p != rank]
        limits = self.ctx.query_device()
        per_peer = receives_per_peer or max(MIN_RECEIVES, min(
            MAX_RECEIVES, RECEIVE_BYTES_PER_PEER // self.slot_bytes))
        # UD: one queue pair receives from everyone; UC/RC: one per peer
        self._qp_peers: list[list[int]] = [peers] if ud else [[p] for p in peers]
        # (every posted receive may complete at once: the completion queue holds them all)
        depth = min(limits.max_qp_wr, per_peer * (len(peers) if ud else 1),
                    (limits.max_cqe - 16) // len(self._qp_peers))
        self.pd = v.PD(self.ctx)
        self.recv_cq = v.CQ(self.ctx, depth * len(self._qp_peers) + 16)
        self.send_cq = v.CQ(self.ctx, min(limits.max_cqe, SEND_SLOTS + 16))
        self.gid_index = find_gid_index(self.ctx, address)
        self.gid = str(self.ctx.query_gid(PORT_NUM, self.gid_index))
        self.qps = _queue_pairs(v, self.pd, self.qp_kind, len(self._qp_peers), self.send_cq,
                                self.recv_cq, depth)
        self._depth = depth
        # Receive buffers, posted before any peer can know our queue pairs.
        self.recv_mr = v.MR(self.pd, self.slot_bytes * depth * len(self.qps),
                            e.IBV_ACCESS_LOCAL_WRITE)
        self._rx = _buffer(self.recv_mr, self.slot_bytes * depth * len(self.qps))
        self._recv_wrs = [v.RecvWR(wr_id=slot, num_sge=1, sg=[v.SGE(
            self.recv_mr.buf + slot * self.slot_bytes, self.slot_bytes, self.recv_mr.lkey)])
            for slot in range(depth * len(self.qps))]
        for slot, wr in enumerate(self._recv_wrs):
            self.qps[slot // depth][0].post_recv(wr)
        self.send_mr = v.MR(self.pd, self.message_bytes * SEND_SLOTS, e.IBV_ACCESS_LOCAL_WRITE)
        self._tx = _buffer(self.send_mr, self.message_bytes * SEND_SLOTS)
        self._free = deque(range(SEND_SLOTS))
        self._posted = 0
        self._pending: deque = deque()  # (peer, message) taken off the queue while sending
        self._exchange(store, prefix)
        self._counters_at_start = read_device_counters(self.device)
        log.info("rank %d: verbs transport on %s (GID %s), %s, messages of %d B (%d floats), "
                 "%d receives posted per queue pair", rank, self.device, self.gid, semantics,
                 self.message_bytes, self.per_packet, depth)

    # ---- connecting ------------------------------------------------------------------

    def _exchange(self, store, prefix: str) -> None:
        """Publish our queue pairs, connect to the peers', and wait until every rank can
        send: a UC message sent before its receiver's queue pair is ready is lost."""
        v = self.v
        mine = {str(p): qp.qp_num for (qp, _), peers in zip(self.qps, self._qp_peers,
                                                             strict=True) for p in peers}
        self.nonce, published = endpoints.exchange(store, prefix, self.rank, self.world,
                                                   {"gid": self.gid, "qpn": mine}, self.auth)
        remote = {p: published[p] for p in range(self.world) if p != self.rank}
        # Which peer a completion came from: by our queue pair (UC/RC) or, for UD, by the
        # sender's queue pair number.
        self._peer_of_qp, self._peer_of_src = {}, {}
        self._dest: dict[int, tuple] = {}  # peer: (our queue pair, address handle, its qpn)
        for (qp, attr), peers in zip(self.qps, self._qp_peers, strict=True):
            route = [v.GlobalRoute(dgid=v.GID(remote[p]["gid"]), sgid_index=self.gid_index)
                     for p in peers]
            if self.qp_kind != "ud":
                peer = peers[0]
                attr.ah_attr = v.AHAttr(gr=route[0], is_global=1, port_num=PORT_NUM)
                attr.dest_qp_num = remote[peer]["qpn"][str(self.rank)]
                attr.rq_psn, attr.path_mtu = 0, self.path_mtu
                if self.qp_kind == "rc":
                    attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
            qp.to_rtr(attr)
            attr.sq_psn = 0
            if self.qp_kind == "rc":
                attr.timeout, attr.retry_cnt, attr.max_rd_atomic = RC_TIMEOUT, RC_RETRIES, 1
                attr.rnr_retry = 7  # 7: retry for as long as the receiver has no buffer
            qp.to_rts(attr)
            for peer, gr in zip(peers, route, strict=True):
                qpn = remote[peer]["qpn"][str(self.rank)]
                ah = (v.AH(self.pd, attr=v.AHAttr(gr=gr, is_global=1, port_num=PORT_NUM))
                      if self.qp_kind == "ud" else None)
                self._dest[peer] = (qp, ah, qpn)
                if ah is None:
                    self._peer_of_qp[qp.qp_num] = peer
                else:
                    self._peer_of_src[qpn] = peer
        store.set(f"{prefix}/ready/{self.rank}", "1")
        for peer in remote:
            store.get(f"{prefix}/ready/{peer}")

    def take_stash(self) -> EarlyStash:
        """The units kept for coming steps (the contract's take_stash)."""
        stash, self.stash = self.stash, EarlyStash()
        return stash

    def close(self) -> None:
        """Give every resource back to the device (a process that exits does so too)."""
        with self.use_lock:
            self.closed = True
            if self.ctx is not None:
                self.ctx.close()  # closes its queue pairs, memory regions, queues and domain
                self.ctx = None

    def next_step(self) -> int:
        step = self._step
        self._step += 1
        return step

    @property
    def authenticated(self) -> bool:
        return self.auth is not None

    # ---- sending ---------------------------------------------------------------------

    def send(self, dest: int, stage: int, step: int, bucket: int, shard: int, index: int,
             count: int, payload, copy: int = 0) -> None:
        """One message to `dest`: the header, then `payload` (bytes of float32 values)."""
        head = hdr.pack(stage, self.rank, self.nonce, step, bucket, shard, index, count,
                        len(payload), copy=copy, dest=dest)
        if self.auth is not None:
            head = self.auth.seal(head, payload)
        self._post(dest, head, payload)
        if stage in hdr.DATA_STAGE_OF_END:
            self.counters.ends_sent += 1
        else:
            self.counters.packets_sent += 1
            self.counters.bytes_sent += len(payload)

    def send_packets(self, dest: int, stage: int, step: int, bucket: int, shard: int,
                     x: np.ndarray, starts: np.ndarray, ends: np.ndarray, end_copies: int = 0,
                     *, indexes: np.ndarray | None = None, count: int | None = None) -> None:
        """All messages of one shard (or those `indexes` names, of `count`) to `dest`
        (message i: x[starts[i]:ends[i]]), then `end_copies` end markers."""
        view, n = memoryview(x).cast("B"), len(starts) if count is None else count
        numbers = range(len(starts)) if indexes is None else indexes.tolist()
        for index, start, end in zip(numbers, starts.tolist(), ends.tolist(), strict=True):
            self.send(dest, stage, step, bucket, shard, index, n, view[4 * start:4 * end])
        if n and end_copies:
            self.send_end(dest, stage, step, bucket, shard, n, end_copies)

    def send_end(self, dest: int, stage: int, step: int, bucket: int, shard: int, count: int,
                 copies: int, first_copy: int = 0) -> None:
        """`copies` end markers (header-only messages): all `count` messages went out;
        numbered from first_copy (markers sent again later are new transmissions)."""
        for copy in range(first_copy, first_copy + copies):
            self.send(dest, hdr.END_OF[stage], step, bucket, shard, count, count, b"", copy)

    def _post(self, dest: int, head: bytes, payload) -> None:
        v, e = self.v, self.v.e
        while not self._free:  # every buffer is in flight: wait for a send to complete
            if not self._reap_sends():
                time.sleep(IDLE_SLEEP_S)
        slot = self._free.popleft()
        at, size = slot * self.message_bytes, hdr.HEADER_BYTES + len(payload)
        self._tx[at:at + hdr.HEADER_BYTES] = np.frombuffer(head, np.uint8)
        if len(payload):
            self._tx[at + hdr.HEADER_BYTES:at + size] = np.frombuffer(payload, np.uint8)
        wr = v.SendWR(wr_id=slot, opcode=e.IBV_WR_SEND, num_sge=1,
                      sg=[v.SGE(self.send_mr.buf + at, size, self.send_mr.lkey)],
                      send_flags=e.IBV_SEND_SIGNALED)
        qp, ah, qpn = self._dest[dest]
        if ah is not None:
            wr.set_wr_ud(ah, qpn, QKEY)
        qp.post_send(wr)
        self._posted += 1
        if self._posted % DRAIN_EVERY == 0:
            self._drain_receives()

    def _drain_receives(self) -> None:
        """While this rank sends (every rank sends its whole contribution before it
        receives), the peers' messages keep coming: copy them aside and post their buffers
        again, so that the receive queue never runs dry for want of polling. (A queue that
        does run dry loses messages, UD and UC, or has RC senders wait, as on any NIC.)"""
        n, wcs = self.recv_cq.poll(num_entries=64)
        for wc in wcs if n > 0 else []:
            message = self._received(wc)
            if message is not None:
                self._pending.append((self._peer_of(wc), message.tobytes()))
            self._repost(wc.wr_id)

    def _received(self, wc) -> np.ndarray | None:
        """The message of a receive completion, in its receive buffer (valid until the
        buffer is posted again); None, and counted, for a failed completion."""
        if wc.status != self.v.e.IBV_WC_SUCCESS:
            self.counters.malformed += 1
            return None
        at = wc.wr_id * self.slot_bytes + self._grh
        return self._rx[at:at + wc.byte_len - self._grh]

    def _repost(self, slot: int) -> None:
        self.qps[slot // self._depth][0].post_recv(self._recv_wrs[slot])

    def _peer_of(self, wc) -> int | None:
        """The peer a receive completion came from: by the sender's queue pair number (UD)
        or by ours (UC/RC: one per peer)."""
        return (self._peer_of_src.get(wc.src_qp) if self.qp_kind == "ud"
                else self._peer_of_qp.get(wc.qp_num))

    def _reap_sends(self) -> int:
        """Take send completions; their buffers are free again. A send that failed (RC: the
        peer never acknowledged it after every retry) breaks the queue pair: raise."""
        n, wcs = self.send_cq.poll(num_entries=64)
        for wc in wcs if n > 0 else []:
            self._free.append(wc.wr_id)
            if wc.status != self.v.e.IBV_WC_SUCCESS:
                raise TransportError(
                    f"rank {self.rank}: a {self.qp_kind.upper()} send on {self.device} failed "
                    f"with completion status {wc.status} ({_status_name(wc.status)}): the "
                    "peer died, lost the network, or (RC) every retransmission was lost")
        return max(n, 0)

    def flush(self, deadline: float) -> bool:
        """Wait until every message sent has completed (RC: was acknowledged)."""
        while len(self._free) < SEND_SLOTS:
            if time.monotonic() > deadline:
                return False
            if not self._reap_sends():
                time.sleep(IDLE_SLEEP_S)
        return True

    # ---- receiving -------------------------------------------------------------------

    def receive_until(self, deadline: float, done: Callable[[], bool],
                      handle: Callable[[hdr.Header, memoryview], str],
                      handle_batch: Callable | None = None) -> None:
        """Feed the messages of this job to `handle` until `done()` or the deadline
        (time.monotonic()); each receive buffer is posted again once its message was
        handled."""
        while self._pending and not done():
            peer, message = self._pending.popleft()
            self._message(peer, memoryview(message), handle)
        while not done():
            self._reap_sends()
            n, wcs = self.recv_cq.poll(num_entries=64)
            if n <= 0:
                if time.monotonic() >= deadline:
                    return
                time.sleep(IDLE_SLEEP_S)
                continue
            for wc in wcs:
                message = self._received(wc)
                if message is not None:
                    self._message(self._peer_of(wc), memoryview(message), handle)
                self._repost(wc.wr_id)  # its message was handled (applied or copied)

    def _message(self, peer: int | None, data: memoryview, handle) -> str:
        """Check one message from `peer` (its header, then its values), hand it on, count it."""
        c = self.counters
        head = hdr.unpack(data)
        refused = screen(head, data, len(data), rank=self.rank, nonce=self.nonce,
                         from_source=head is not None and head.source == peer, auth=self.auth,
                         drop_mask=self.drop_mask, counters=c, whole_only=True)
        if refused is not None:
            return refused
        c.bytes_received += len(data) - hdr.HEADER_BYTES
        verdict = handle(head, data[hdr.HEADER_BYTES:])
        count_verdict(c, verdict)
        return verdict

    # ---- the device's own counters ----------------------------------------------------

    def device_counters(self) -> dict[str, int]:
        """What the device counted since this transport started, as its driver names it
        (Soft-RoCE: completer_retry_err counts RC retransmission rounds, rcvd_seq_err the
        sequence errors it NAKed, ...). The counters are the device's: other users of the
        device on this host count too."""
        now = read_device_counters(self.device)
        return {k: now[k] - self._counters_at_start.get(k, 0) for k in now
                if now[k] != self._counters_at_start.get(k, 0)}


def _status_name(status: int) -> str:
    try:
        from pyverbs.enums import ibv_wc_status

        return ibv_wc_status(status).name
    except Exception:
        return "see ibv_wc_status"
