"""A small eBPF assembler: enough to write lossbed's loss program by hand in Python, so no
compiler is needed at run time. Encoding per the kernel's uapi (linux/bpf.h, bpf_common.h):
each instruction is 8 bytes: opcode, dst:4|src:4, 16-bit offset, 32-bit immediate.
"""

from __future__ import annotations

import struct

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)
FP = R10  # read-only frame pointer; the stack is the 512 bytes below it

# instruction classes
_LD, _LDX, _ST, _STX, _ALU, _JMP, _ALU64 = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x07
# sizes
SIZES = {1: 0x10, 2: 0x08, 4: 0x00, 8: 0x18}
# modes
_IMM, _MEM, _ATOMIC = 0x00, 0x60, 0xC0
# ALU operations
_ALU_OPS = {"add": 0x00, "sub": 0x10, "mul": 0x20, "or": 0x40, "and": 0x50, "lsh": 0x60,
            "rsh": 0x70, "xor": 0xA0, "mov": 0xB0}
_END, _TO_BE = 0xD0, 0x08
# jumps (unsigned comparisons)
_JUMPS = {"==": 0x10, ">": 0x20, ">=": 0x30, "!=": 0x50, "<": 0xA0, "<=": 0xB0}
_JA, _CALL, _EXIT = 0x00, 0x80, 0x90
_K, _X = 0x00, 0x08
PSEUDO_MAP_FD = 1

HELPER_MAP_LOOKUP_ELEM = 1
HELPER_KTIME_GET_NS = 5


class Asm:
    """Collects instructions; jumps name labels, resolved by assemble()."""

    def __init__(self) -> None:
        self._insns: list[list] = []  # [opcode, dst, src, off, imm, label-or-None]
        self._labels: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._insns)

    def _emit(self, opcode, dst=0, src=0, off=0, imm=0, target=None) -> None:
        self._insns.append([opcode, dst, src, off, imm, target])

    def label(self, name: str) -> None:
        if name in self._labels:
            raise ValueError(f"label {name!r} defined twice")
        self._labels[name] = len(self._insns)

    # -- arithmetic (64-bit) --------------------------------------------------------------

    def alu(self, op: str, dst: int, value: int, *, reg: bool = False) -> None:
        """dst = dst <op> value, where value is a register (reg=True) or a 32-bit constant."""
        self._emit(_ALU64 | _ALU_OPS[op] | (_X if reg else _K), dst,
                   value if reg else 0, 0, 0 if reg else value)

    def mov(self, dst: int, value: int, *, reg: bool = False) -> None:
        self.alu("mov", dst, value, reg=reg)

    def ld_imm64(self, dst: int, value: int) -> None:
        """A full 64-bit constant (two instruction slots)."""
        value &= (1 << 64) - 1
        lo, hi = value & 0xFFFFFFFF, value >> 32
        self._emit(_LD | SIZES[8] | _IMM, dst, 0, 0, _s32(lo))
        self._emit(0, 0, 0, 0, _s32(hi))

    def ld_map_fd(self, dst: int, fd: int) -> None:
        """dst = the map behind file descriptor fd (rewritten by the kernel at load)."""
        self._emit(_LD | SIZES[8] | _IMM, dst, PSEUDO_MAP_FD, 0, fd)
        self._emit(0, 0, 0, 0, 0)

    def to_be16(self, dst: int) -> None:
        """Byte-swap the low 16 bits from network order (and clear the rest)."""
        self._emit(_ALU | _END | _TO_BE, dst, 0, 0, 16)

    # -- memory ---------------------------------------------------------------------------

    def load(self, size: int, dst: int, base: int, off: int) -> None:
        """dst = *(u<size*8> *)(base + off)"""
        self._emit(_LDX | SIZES[size] | _MEM, dst, base, off)

    def store(self, size: int, base: int, off: int, src: int) -> None:
        """*(u<size*8> *)(base + off) = src register"""
        self._emit(_STX | SIZES[size] | _MEM, base, src, off)

    def store_imm(self, size: int, base: int, off: int, value: int) -> None:
        self._emit(_ST | SIZES[size] | _MEM, base, 0, off, value)

    def atomic_add64(self, base: int, off: int, src: int) -> None:
        """*(u64 *)(base + off) += src, atomically (counters shared by CPUs)."""
        self._emit(_STX | SIZES[8] | _ATOMIC, base, src, off, 0)

    # -- control --------------------------------------------------------------------------

    def jump(self, target: str) -> None:
        self._emit(_JMP | _JA, target=target)

    def jump_if(self, dst: int, cmp: str, value: int, target: str, *, reg: bool = False):
        """if (dst <cmp> value) goto target; unsigned comparison."""
        self._emit(_JMP | _JUMPS[cmp] | (_X if reg else _K), dst, value if reg else 0, 0,
                   0 if reg else value, target)

    def call(self, helper: int) -> None:
        self._emit(_JMP | _CALL, imm=helper)

    def exit(self) -> None:
        self._emit(_JMP | _EXIT)

    # -- output ---------------------------------------------------------------------------

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (opcode, dst, src, off, imm, target) in enumerate(self._insns):
            if target is not None:
                if target not in self._labels:
                    raise ValueError(f"jump to undefined label {target!r}")
                off = self._labels[target] - (index + 1)
                if not -32768 <= off <= 32767:
                    raise ValueError(f"jump to {target!r} is too far")
            out += struct.pack("<BBhi", opcode, (src << 4) | dst, off, imm)
        return bytes(out)


def _s32(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def disassemble(code: bytes) -> list[tuple[int, int, int, int, int]]:
    """(opcode, dst, src, off, imm) per slot: for tests and debugging."""
    out = []
    for i in range(0, len(code), 8):
        opcode, regs, off, imm = struct.unpack_from("<BBhi", code, i)
        out.append((opcode, regs & 0xF, regs >> 4, off, imm))
    return out
