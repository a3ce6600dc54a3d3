"""Wait until every rank has reached a point, through the rendezvous store (any object with
TCPStore's `add(key, amount) -> int`: torch's, or harness.verbs.rendezvous for torch-free
tools). One implementation for the run boundaries, the ranks' orderly close and the tools."""

from __future__ import annotations

import time

POLL_S = 0.01


class BarrierTimeout(TimeoutError):
    pass


def wait_for_all(store, key: str, world: int, timeout_s: float, *,
                 must: bool = True) -> bool:
    """Count this rank in at `key`, then wait until `world` ranks are counted. Returns True
    when they all are; after `timeout_s`, raises BarrierTimeout (must=True) or returns
    False. Each key serves one barrier: use a fresh key for each."""
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while int(store.add(key, 0)) < world:
        if time.monotonic() > deadline:
            if must:
                arrived = int(store.add(key, 0))
                raise BarrierTimeout(f"{arrived} of {world} ranks reached {key!r} within "
                                     f"{timeout_s:g} s")
            return False
        time.sleep(POLL_S)
    return True
