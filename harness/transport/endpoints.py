"""The one exchange every transport makes at start, through the rendezvous store (never the
impaired network): each rank publishes where it receives and the salt of its datagrams' MAC
key, rank 0 publishes the job's nonce, and every rank reads its peers' and keys their MACs.
What an endpoint is belongs to the transport: "host:port" for UDP, queue pair numbers and a
GID for verbs."""

from __future__ import annotations

import json
import os

from harness.transport.auth import PacketAuth


class TransportError(RuntimeError):
    """A transport that cannot start: the reason names the rank and what it lacked."""


def exchange(store, prefix: str, rank: int, world: int, endpoint,
             auth: PacketAuth | None) -> tuple[int, list]:
    """(the job's nonce, every rank's endpoint by rank, this rank's own included). Blocks
    until every rank has published."""
    salt = auth.salt.hex() if auth is not None else ""
    store.set(f"{prefix}/ep/{rank}", json.dumps({"endpoint": endpoint, "salt": salt}))
    if rank == 0:
        store.set(f"{prefix}/nonce", str(int.from_bytes(os.urandom(8), "big")))
    nonce = int(store.get(f"{prefix}/nonce"))
    published = [json.loads(store.get(f"{prefix}/ep/{peer}")) for peer in range(world)]
    if auth is not None:
        try:
            auth.know_peers([p.get("salt", "") for p in published])
        except ValueError as err:
            raise TransportError(f"rank {rank}: {err}") from None
    return nonce, [p["endpoint"] for p in published]
