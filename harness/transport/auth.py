"""Authenticated datagrams: a per-job secret key and a MAC on every packet.

Why: the job nonce travels in clear, so anyone who can read one datagram of a job (on-path:
a shared switch, a mirrored port) could forge packets with a peer's source address that the
collective would apply: poisoned values, NaN, end markers that turn delivered data into
"lost". With the key only the job's ranks can make a packet that a rank accepts.

The key: 32 random bytes the controller draws per launch and hands to every rank in its
launch environment (LOSSBED_KEY, hex; over SSH for remote hosts), never through the
rendezvous store or any other path lossbed does not authenticate.

Each transport seals with a key of its own: keyed BLAKE2b (the job key) of the transport's
name and a random salt it draws at start and publishes with its endpoint. Its receivers
derive the same key from the salt. The nonce is the source rank and seq, the count of
datagrams that transport sealed, which the header carries and the tag covers. So no
(key, nonce) pair ever signs two datagrams: not within a transport (seq only grows), not
across two transports of one rank (their names differ), and not across launches or reruns
that reuse a job key (their salts differ; a reused key with seq restarting at 0 would give
GHASH's key away).

The MAC: GMAC (AES-128-GCM with nothing to encrypt, OpenSSL's EVP, in _wire.c) of the
whole datagram with its tag field zero, destination rank included: a genuine datagram
copied to another rank is refused there. The values travel readable (confidentiality is
not a goal). Chosen by measurement, per 1444-byte packet, the primitives alone, one call
each from Python (`python -m tests.benchmarks.bench_auth`, which prints them first; eight
runs on the 2-core development machine while nothing else ran, 2026-12-03): AES-GCM
0.8-2.3 µs, ChaCha20-Poly1305 2.0-4.3 µs, keyed BLAKE2b 3.4-7.3 µs, HMAC-SHA256 4.0-7.5 µs.
The machine's speed moves all four together by up to 2.8×; their order is the same in
every run (the compiled core's GMAC, without Python's call, costs less).

A replayed datagram (a copy of one the sender sent to this rank) passes the check; the
collective takes it as the duplicate, late or early packet it is, and the drop mask gives
it the verdict of the original (dropmask.py).
"""

from __future__ import annotations

import hashlib
import os

from harness.transport import header as hdr
from harness.transport import native

KEY_BYTES = 32
_SOURCE = slice(6, 8)  # the header's source rank


def new_key() -> str:
    """A fresh job key, as the hex text a rank's environment carries."""
    return os.urandom(KEY_BYTES).hex()


def parse_key(text: str) -> bytes:
    """A job key from its hex text; ValueError unless it is KEY_BYTES of it."""
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError(f"not {2 * KEY_BYTES} hex digits")
    return key


def job_key(text: str | None, name: str = "LOSSBED_KEY") -> bytes | None:
    """The job key a rank was launched with, from the hex text its environment carries
    under `name` (harness/rank_protocol.py reads it); None: a transport made outside a
    launch."""
    if not text:
        return None
    try:
        return parse_key(text)
    except ValueError:
        raise ValueError(f"{name} must be {2 * KEY_BYTES} hex digits: the controller sets "
                         "it for every launch, do not set it by hand") from None


SALT_BYTES = 16


def transport_key(job_key: bytes, purpose: str, salt: bytes) -> bytes:
    """The AES-128 key a transport seals with: keyed BLAKE2b (the job key) of its name and
    salt."""
    return hashlib.blake2b(purpose.encode() + b"\0" + salt, key=job_key,
                           digest_size=16).digest()


def parse_salt(text: str, who: str) -> bytes:
    """A peer's published salt (hex); ValueError naming the peer otherwise."""
    try:
        salt = bytes.fromhex(text)
    except ValueError:
        salt = b""
    if len(salt) != SALT_BYTES:
        raise ValueError(f"{who} published no valid salt ({text!r}): it runs without the "
                         "job key, or another lossbed version")
    return salt


class PacketAuth:
    """Seals the datagrams of one transport (its own key: `mac`) and checks those it
    receives (each source's key: `macs`, once know_peers has the peers' salts)."""

    def __init__(self, key: bytes, rank: int, purpose: str, salt: bytes | None = None):
        self._job_key, self.purpose, self.rank = key, purpose, rank
        self.salt = os.urandom(SALT_BYTES) if salt is None else salt
        self.mac = native.Mac(transport_key(key, purpose, self.salt))
        self.macs: list = []  # per source rank (None: itself)
        self.seq = 0  # the next datagram's nonce

    def know_peers(self, published: list[str]) -> None:
        """The salt each rank published, as hex (index: rank; this rank's own is ignored).
        ValueError naming the rank whose salt is not one (it runs without the key)."""
        self.macs = [None if r == self.rank else native.Mac(transport_key(
            self._job_key, self.purpose, parse_salt(text, f"rank {r}")))
            for r, text in enumerate(published)]

    def reserve(self, n: int) -> int:
        """The first of n consecutive seqs for datagrams about to be sealed."""
        first, self.seq = self.seq, self.seq + n
        return first

    def seal(self, head: bytes, payload) -> bytes:
        """`head` (header.pack: tag zero) with this datagram's seq and tag filled in."""
        signed = head[:hdr.SEQ_OFFSET] + self.reserve(1).to_bytes(8, "big") + hdr.NO_TAG
        return signed[:hdr.TAG_OFFSET] + self.mac.tag(signed + bytes(payload))

    def check(self, datagram, size: int) -> bool:
        """True if this datagram (`size` bytes: header, then payload) was sealed by the
        transport of the rank its header names. `datagram`: any bytes-like object (a
        receive buffer's row)."""
        if size < hdr.HEADER_BYTES:
            return False
        view = memoryview(datagram).cast("B")
        source = int.from_bytes(view[6:8], "big")
        mac = self.macs[source] if source < len(self.macs) else None
        return mac is not None and mac.check(view, size)
