"""A rank's start-up, the torchrun way: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
environment, a TCPStore for rendezvous, a gloo process group (the reliable baseline and
resyncs), and lossbed's UDP transport bound to the host's address on the emulated link
(LOSSBED_ADDRESS; LOSSBED_MTU), with the loss semantics of LOSSBED_TRANSPORT (udp,
roce-ud, roce-uc[:BYTES], roce-rc[:BYTES]; or real RDMA queue pairs instead: verbs-ud,
verbs-uc[:BYTES], verbs-rc[:BYTES], see harness/verbs/transport.py), an optional seeded
receiver-side drop mask (LOSSBED_DROP_MASK=SEED:RATE), and UDP segmentation offload where
the controller says the impairment allows it (LOSSBED_UDP_SEGMENTATION=1, see
launch.segmentation_faithful)."""

from __future__ import annotations

import gc
import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from harness import barrier
from harness.rank_protocol import RankEnv
from harness.transport.auth import job_key
from harness.transport.dropmask import DropMask, parse_drop_mask
from harness.transport.semantics import Semantics
from harness.transport.udp import UdpTransport

log = logging.getLogger(__name__)
# How long a finished rank keeps its transports open for peers still finishing (more than
# the lossy collective's 60 s RC stage timeout: a peer is never left without answers)
CLOSE_WAIT_S = 90.0


@dataclass
class Rank:
    rank: int
    world: int
    store: object
    transport: UdpTransport
    address: str = ""
    mtu: int = 1500
    drop_mask: DropMask | None = None
    segmentation: bool = False
    key: bytes | None = None  # the launch's key for datagrams (harness.transport.auth)
    rdma_device: str | None = None  # the verbs transports' device (None: the host's first)
    others: dict | None = None

    def transport_for(self, semantics: str) -> UdpTransport:
        """A transport with other loss semantics, made on first use (every rank asks in the
        same order: the endpoints are exchanged through the store then)."""
        wanted = Semantics.parse(semantics)
        if wanted == self.transport.semantics:
            return self.transport
        self.others = self.others or {}
        if wanted not in self.others:
            self.others[wanted] = make_transport(
                self.rank, self.world, self.address, self.store, wanted, mtu=self.mtu,
                drop_mask=self.drop_mask, segmentation=self.segmentation,
                key_prefix=f"lossbed/udp/{wanted}", key=self.key,
                rdma_device=self.rdma_device)
        return self.others[wanted]

    def close(self, linger_s: float = 20.0) -> None:
        """Leave in order: rank 0 hosts the store, so it goes last. Otherwise a rank still
        tearing down its process group finds the store gone, and C++ aborts the process.
        When leaving because of an error, nobody is waited for (a peer may be dead)."""
        import sys

        failing = sys.exc_info()[0] is not None
        # A peer may still need this rank's transports: under RC semantics it waits for the
        # acknowledgement of its last datagrams, which only a running transport sends again
        # when the first was lost, and a peer that finished and closed would leave it to
        # give up after its timeout. So transports close once every rank is done (a
        # failing rank says it is done, and waits for nobody).
        self._wait_for_all("lossbed/done", 0.0 if failing else CLOSE_WAIT_S)
        self.transport.close()
        for other in (self.others or {}).values():
            other.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        try:
            if self.rank != 0 or failing:
                self.store.add("lossbed/exited", 1)
                return
            barrier.wait_for_all(self.store, "lossbed/exited", self.world, linger_s,
                                 must=False)
        except Exception:
            pass  # a rank that died: nothing to wait for


    def _wait_for_all(self, key: str, timeout_s: float) -> None:
        """Count this rank in at `key` and wait until every rank is (or the timeout; a
        store that is gone means rank 0 left, and there is no one left to wait for)."""
        try:
            barrier.wait_for_all(self.store, key, self.world, timeout_s, must=False)
        except Exception:
            pass


def start(timeout_s: float = 60.0) -> Rank:
    told = RankEnv.from_env().required()  # what the launcher said (harness/rank_protocol.py)
    rank, world = told.rank, told.world
    store = dist.TCPStore(told.master_addr, told.master_port, world, is_master=(rank == 0),
                          timeout=timedelta(seconds=timeout_s))
    # gloo by default (it also takes CUDA tensors, and lets ranks share a GPU); NCCL for
    # the reliable baseline when each rank has its own GPU: LOSSBED_BACKEND=nccl.
    dist.init_process_group(told.backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    semantics = Semantics.parse(told.transport)
    mask = parse_drop_mask(told.drop_mask)
    address, mtu = told.address or told.master_addr, told.mtu
    key = job_key(told.key)
    transport = make_transport(rank, world, address, store, semantics, mtu=mtu,
                               drop_mask=mask, segmentation=told.segmentation, key=key,
                               rdma_device=told.rdma_device)
    keep_startup_out_of_collector()
    return Rank(rank, world, store, transport, address=address, mtu=mtu, drop_mask=mask,
                segmentation=told.segmentation, key=key, rdma_device=told.rdma_device)


def keep_startup_out_of_collector() -> int:
    """Move everything made so far (torch's and lossbed's modules, a script's model: over
    100,000 objects) out of the garbage collector's scans, as it lives as long as the rank;
    how many objects that is. A full collection scans it all, tens of milliseconds to over
    a hundred, and a rank stopped for one stalls every peer's step: under a lossy
    collective's deadlines its packets come late and count as lost. Where such a collection
    falls depends on what start-up left behind, so without this a benchmark's tail moves
    with unrelated code (tests/unit/test_rank_startup.py)."""
    gc.freeze()
    return gc.get_freeze_count()


def make_transport(rank: int, world: int, address: str, store, semantics: Semantics, *,
                   mtu: int, drop_mask: DropMask | None, segmentation: bool,
                   key_prefix: str = "lossbed/udp", key: bytes | None = None,
                   rdma_device: str | None = None):
    """The transport for `semantics`: RDMA queue pairs for verbs-*, else UDP datagrams."""
    if semantics.verbs:
        from harness.verbs.transport import VerbsTransport

        # (its store keys are its own, lossbed/verbs/<semantics>: key_prefix is UDP's)
        return VerbsTransport(rank, world, address, store, semantics, drop_mask=drop_mask,
                              key=key, device=rdma_device)
    return UdpTransport(rank, world, address, store, mtu=mtu, semantics=semantics,
                        drop_mask=drop_mask, segmentation=segmentation, key_prefix=key_prefix,
                        key=key)


def run_and_exit(main) -> None:
    """A rank's `if __name__ == "__main__"`: run main(), then leave without the interpreter's
    teardown (os._exit after flushing stdout and stderr).

    Why: after an orderly Rank.close() the work is done and written, but tearing down
    torch's C++ objects at interpreter exit can still abort the process (CI once saw a
    finished rank die with "terminate called without an active exception", SIGABRT, and the
    run reported as failed). An error still prints its traceback and exits 1, as Python would.
    """
    import traceback

    try:
        code = main()
    except SystemExit as stop:
        code = stop.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

