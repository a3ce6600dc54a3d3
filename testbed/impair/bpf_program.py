"""The loss program for the bpf backend, assembled from a plan: parse the packet, apply the
profile's match, find the path's slot by the peer's address, then decide with the slot's
loss model (Bernoulli or Gilbert-Elliott) and count. Runs as a tc clsact classifier in
direct-action mode: TC_ACT_SHOT drops, TC_ACT_UNSPEC lets the packet go on.

Every slot (one per path) is one element of an array map:

    u64 model          0 clean (count only), 1 Bernoulli, 2 Gilbert-Elliott
    u64 thr_loss       Bernoulli: P(loss) * 2^32
    u64 thr_p, thr_r   GE: P(Good->Bad), P(Bad->Good), each * 2^32
    u64 thr_bad        GE: P(loss | Bad)  (netem's 1-h)
    u64 thr_good       GE: P(loss | Good) (netem's 1-k)
    u64 rng            xorshift64* state: seeded, so a drop pattern can be replayed
    u64 ge_state       0 Good, 1 Bad
    u64 seen_packets, seen_bytes, dropped_packets      (atomic adds)
    u64 bursts, run, max_burst                         runs of consecutive drops
    u64 max_bad_ns     GE: a Bad state older than this is left (0: no time limit)
    u64 bad_since_ns   GE: when the Bad state was entered (bpf_ktime_get_ns)
    u64 dropped_bytes  (atomic add; last: a field added keeps the others' offsets)

The Gilbert-Elliott step mirrors netem's loss_gilb_ell(): in the current state, first draw
the transition, then draw the loss with the probability of the state the packet arrived in.
With a time limit, a packet that finds the Bad state older than the limit is handled as if
the chain had gone back to Good before it arrived (see GilbertElliott.max_burst_ms).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from testbed.impair.bpf_asm import (
    FP,
    HELPER_KTIME_GET_NS,
    HELPER_MAP_LOOKUP_ELEM,
    R0,
    R1,
    R2,
    R3,
    R4,
    R5,
    R6,
    R7,
    R8,
    R9,
    Asm,
)
from testbed.profiles.model import Bernoulli, GilbertElliott, Match

FIELDS = ("model", "thr_loss", "thr_p", "thr_r", "thr_bad", "thr_good", "rng", "ge_state",
          "seen_packets", "seen_bytes", "dropped_packets", "bursts", "run", "max_burst",
          "max_bad_ns", "bad_since_ns", "dropped_bytes")
OFF = {name: 8 * i for i, name in enumerate(FIELDS)}
VALUE_SIZE = 8 * len(FIELDS)
MODEL_CLEAN, MODEL_BERNOULLI, MODEL_GE = 0, 1, 2

TC_ACT_UNSPEC, TC_ACT_SHOT = -1, 2
SKB_DATA, SKB_DATA_END = 76, 80  # offsetof(struct __sk_buff, data / data_end)
ETH_LEN, IP_MIN_LEN = 14, 20
IPPROTO = {"tcp": 6, "udp": 17}
XORSHIFT_MULTIPLIER = 0x2545F4914F6CDD1D
# stack slots (below the frame pointer)
_KEY, _SPORT, _DPORT, _LEN = -4, -16, -24, -32


@dataclass(frozen=True)
class SlotParams:
    model: int
    thr_loss: int = 0
    thr_p: int = 0
    thr_r: int = 0
    thr_bad: int = 0
    thr_good: int = 0
    max_bad_ns: int = 0
    rng_seed: int = 1

    def initial_value(self) -> bytes:
        values = {name: 0 for name in FIELDS}
        values.update(model=self.model, thr_loss=self.thr_loss, thr_p=self.thr_p,
                      thr_r=self.thr_r, thr_bad=self.thr_bad, thr_good=self.thr_good,
                      max_bad_ns=self.max_bad_ns,
                      rng=self.rng_seed or 1)  # xorshift must not start at 0
        return struct.pack(f"={len(FIELDS)}Q", *(values[name] for name in FIELDS))


def threshold(fraction: float) -> int:
    """P(u32 random < threshold) == fraction."""
    return min(round(fraction * 2**32), 2**32)


def slot_params(loss, rng_seed: int) -> SlotParams:
    if loss is None:
        return SlotParams(model=MODEL_CLEAN, rng_seed=rng_seed)
    if isinstance(loss, Bernoulli):
        return SlotParams(model=MODEL_BERNOULLI, thr_loss=threshold(loss.loss_pct / 100),
                          rng_seed=rng_seed)
    if isinstance(loss, GilbertElliott):
        return SlotParams(model=MODEL_GE, thr_p=threshold(loss.p), thr_r=threshold(loss.r),
                          thr_bad=threshold(loss.loss_in_bad_pct / 100),
                          thr_good=threshold(loss.loss_in_good_pct / 100),
                          max_bad_ns=round(loss.max_burst_ms * 1e6), rng_seed=rng_seed)
    raise ValueError(f"the bpf program has no {loss.model} model")


def decode_value(raw: bytes) -> dict[str, int]:
    return dict(zip(FIELDS, struct.unpack(f"={len(FIELDS)}Q", raw), strict=True))


def address_key(address: str) -> int:
    """An IPv4 address as the program reads it from the packet: 4 bytes, little-endian load."""
    return struct.unpack("<I", bytes(int(x) for x in address.split(".")))[0]


def build(direction: str, match: Match, slots: list[tuple[int, str]], map_fd: int,
          exempt_slot: int | None = None) -> bytes:
    """The program for one direction. `slots`: (slot index, peer address); `exempt_slot`:
    where the packets the match's exclusions let through are counted (None: not counted)."""
    a = Asm()
    peer_offset = ETH_LEN + (12 if direction == "ingress" else 16)  # saddr / daddr

    # ---- parse: Ethernet, IPv4, and ports when TCP/UDP and not a later fragment ----------
    a.mov(R6, R1, reg=True)
    a.load(4, R2, R6, SKB_DATA)
    a.load(4, R3, R6, SKB_DATA_END)
    a.mov(R4, R2, reg=True)
    a.alu("add", R4, ETH_LEN + IP_MIN_LEN)
    a.jump_if(R4, ">", R3, "pass", reg=True)
    a.load(2, R5, R2, 12)
    a.jump_if(R5, "!=", 0x0008, "pass")  # ETH_P_IP, as a little-endian load sees it
    a.load(1, R5, R2, ETH_LEN)
    a.alu("and", R5, 0x0F)
    a.alu("lsh", R5, 2)  # IPv4 header length in bytes
    a.jump_if(R5, "<", IP_MIN_LEN, "pass")
    a.load(1, R7, R2, ETH_LEN + 9)  # protocol
    a.load(4, R8, R2, peer_offset)  # peer address
    a.load(2, R9, R2, ETH_LEN + 2)  # total length: what a GSO super-packet would inflate
    a.to_be16(R9)
    a.store(8, FP, _LEN, R9)
    a.store_imm(8, FP, _SPORT, 0)
    a.store_imm(8, FP, _DPORT, 0)
    a.jump_if(R7, "==", IPPROTO["tcp"], "l4")
    a.jump_if(R7, "!=", IPPROTO["udp"], "ports_done")
    a.label("l4")
    a.load(2, R0, R2, ETH_LEN + 6)
    a.to_be16(R0)
    a.alu("and", R0, 0x1FFF)
    a.jump_if(R0, "!=", 0, "ports_done")  # a later fragment carries no ports
    a.mov(R4, R2, reg=True)
    a.alu("add", R4, R5, reg=True)
    a.alu("add", R4, ETH_LEN)
    a.mov(R0, R4, reg=True)
    a.alu("add", R0, 4)
    a.jump_if(R0, ">", R3, "ports_done", reg=True)
    a.load(2, R0, R4, 0)
    a.to_be16(R0)
    a.store(8, FP, _SPORT, R0)
    a.load(2, R0, R4, 2)
    a.to_be16(R0)
    a.store(8, FP, _DPORT, R0)
    a.label("ports_done")
    a.load(8, R4, FP, _SPORT)
    a.load(8, R5, FP, _DPORT)

    # ---- match: exclusions win, then the include list (empty: everything) ---------------
    count_exempt = exempt_slot is not None and bool(match.exclude)
    for i, flow in enumerate(match.exclude):
        _flow(a, flow, f"exclude{i}", on_match="exempt" if count_exempt else "pass")
    if match.include:
        for i, flow in enumerate(match.include):
            _flow(a, flow, f"include{i}", on_match="matched")
        a.jump("pass")
    a.label("matched")

    # ---- which path: the peer's address selects the slot ---------------------------------
    for slot, address in slots:
        a.ld_imm64(R0, address_key(address))
        a.jump_if(R8, "==", R0, f"slot{slot}", reg=True)
    a.jump("pass")
    for slot, _ in slots:
        a.label(f"slot{slot}")
        a.mov(R1, slot)
        a.jump("body")

    # ---- count, decide, count ------------------------------------------------------------
    a.label("body")
    _slot_value(a, map_fd)
    a.mov(R6, R0, reg=True)
    _count_seen(a, R6)
    a.load(8, R1, R6, OFF["model"])
    a.jump_if(R1, "==", MODEL_CLEAN, "keep")
    a.jump_if(R1, "==", MODEL_BERNOULLI, "bernoulli")

    a.load(8, R7, R6, OFF["ge_state"])
    a.jump_if(R7, "!=", 0, "ge_bad")
    a.label("ge_good")
    _random(a)  # Good: maybe go Bad, then lose with P(loss | Good)
    a.load(8, R1, R6, OFF["thr_p"])
    a.jump_if(R0, ">=", R1, "ge_good_loss", reg=True)
    a.mov(R1, 1)
    a.store(8, R6, OFF["ge_state"], R1)
    a.call(HELPER_KTIME_GET_NS)  # clobbers R1-R5; the slot (R6) survives
    a.store(8, R6, OFF["bad_since_ns"], R0)
    a.label("ge_good_loss")
    _random(a)
    a.load(8, R1, R6, OFF["thr_good"])
    a.jump_if(R0, "<", R1, "drop", reg=True)
    a.jump("keep")
    a.label("ge_bad")  # Bad for longer than the time limit: back to Good before this packet
    a.load(8, R1, R6, OFF["max_bad_ns"])
    a.jump_if(R1, "==", 0, "ge_bad_step")
    a.call(HELPER_KTIME_GET_NS)
    a.load(8, R1, R6, OFF["bad_since_ns"])
    a.alu("sub", R0, R1, reg=True)
    a.load(8, R1, R6, OFF["max_bad_ns"])
    a.jump_if(R0, "<=", R1, "ge_bad_step", reg=True)
    a.mov(R1, 0)
    a.store(8, R6, OFF["ge_state"], R1)
    a.jump("ge_good")
    a.label("ge_bad_step")  # Bad: maybe go Good, then lose with P(loss | Bad)
    _random(a)
    a.load(8, R1, R6, OFF["thr_r"])
    a.jump_if(R0, ">=", R1, "ge_bad_loss", reg=True)
    a.mov(R1, 0)
    a.store(8, R6, OFF["ge_state"], R1)
    a.label("ge_bad_loss")
    _random(a)
    a.load(8, R1, R6, OFF["thr_bad"])
    a.jump_if(R0, "<", R1, "drop", reg=True)
    a.jump("keep")

    a.label("bernoulli")
    _random(a)
    a.load(8, R1, R6, OFF["thr_loss"])
    a.jump_if(R0, "<", R1, "drop", reg=True)
    a.jump("keep")

    a.label("drop")
    a.mov(R1, 1)
    a.atomic_add64(R6, OFF["dropped_packets"], R1)
    a.load(8, R1, FP, _LEN)
    a.atomic_add64(R6, OFF["dropped_bytes"], R1)
    a.load(8, R1, R6, OFF["run"])
    a.jump_if(R1, "!=", 0, "drop_run")
    a.mov(R2, 1)
    a.atomic_add64(R6, OFF["bursts"], R2)
    a.label("drop_run")
    a.alu("add", R1, 1)
    a.store(8, R6, OFF["run"], R1)
    a.load(8, R2, R6, OFF["max_burst"])
    a.jump_if(R1, "<=", R2, "drop_out", reg=True)
    a.store(8, R6, OFF["max_burst"], R1)
    a.label("drop_out")
    a.mov(R0, TC_ACT_SHOT)
    a.exit()

    if count_exempt:  # (only then: the verifier refuses code no jump reaches)
        # what the exclusions let through, counted apart (coverage shows it by name)
        a.label("exempt")
        a.mov(R1, exempt_slot)
        _slot_value(a, map_fd)
        _count_seen(a, R0)
        a.jump("pass")

    a.label("keep")
    a.mov(R1, 0)
    a.store(8, R6, OFF["run"], R1)
    a.label("pass")
    a.mov(R0, TC_ACT_UNSPEC)
    a.exit()
    return a.assemble()


def _slot_value(a: Asm, map_fd: int) -> None:
    """R0 = the map value of the slot in R1; on to "pass" if the map has none."""
    a.store(4, FP, _KEY, R1)
    a.ld_map_fd(R1, map_fd)
    a.mov(R2, FP, reg=True)
    a.alu("add", R2, _KEY)
    a.call(HELPER_MAP_LOOKUP_ELEM)
    a.jump_if(R0, "==", 0, "pass")


def _count_seen(a: Asm, value) -> None:
    """One packet of the stored length more in the slot `value` points at. Clobbers R1."""
    a.mov(R1, 1)
    a.atomic_add64(value, OFF["seen_packets"], R1)
    a.load(8, R1, FP, _LEN)
    a.atomic_add64(value, OFF["seen_bytes"], R1)


def _flow(a: Asm, flow, name: str, on_match: str) -> None:
    """Jump to on_match if the packet is of flow.protocol and either port is in range."""
    a.jump_if(R7, "!=", IPPROTO[flow.protocol], f"{name}_next")
    if not flow.ports:
        a.jump(on_match)
    for j, ports in enumerate(flow.ports):
        for reg, end in ((R4, "s"), (R5, "d")):
            skip = f"{name}_{j}{end}_skip"
            a.jump_if(reg, "<", ports.first, skip)
            a.jump_if(reg, "<=", ports.last, on_match)
            a.label(skip)
    a.label(f"{name}_next")


def _random(a: Asm) -> None:
    """R0 = next 32-bit draw of the slot's xorshift64* generator (R6 = slot). Clobbers R1."""
    a.load(8, R0, R6, OFF["rng"])
    for op, shift in (("rsh", 12), ("lsh", 25), ("rsh", 27)):
        a.mov(R1, R0, reg=True)
        a.alu(op, R1, shift)
        a.alu("xor", R0, R1, reg=True)
    a.store(8, R6, OFF["rng"], R0)
    a.ld_imm64(R1, XORSHIFT_MULTIPLIER)
    a.alu("mul", R0, R1, reg=True)
    a.alu("rsh", R0, 32)


def reference_draws(seed: int, count: int) -> list[int]:
    """The same generator in Python: what the program draws from a slot seeded with `seed`."""
    x, out = seed or 1, []
    for _ in range(count):
        x ^= x >> 12
        x ^= (x << 25) & (2**64 - 1)
        x ^= x >> 27
        out.append(((x * XORSHIFT_MULTIPLIER) & (2**64 - 1)) >> 32)
    return out
