"""The few bpf(2) commands lossbed needs, through ctypes: create an array map, read and write
its elements, load a tc classifier program, and find a map again by id. No libbpf, no
compiler: the programs are assembled in Python (bpf_asm.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct

from testbed.errors import EnvironmentProblem

# __NR_bpf per architecture (asm/unistd.h).
_SYSCALL_NUMBERS = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361,
                    "s390x": 351, "riscv64": 280, "loongarch64": 280}

MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM = 0, 1, 2
PROG_LOAD = 5
MAP_GET_FD_BY_ID = 14
OBJ_GET_INFO_BY_FD = 15
MAP_TYPE_ARRAY = 2
PROG_TYPE_SCHED_CLS = 3
ATTR_SIZE = 128  # larger than every layout used here; the tail stays zero as the kernel wants

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class BpfError(EnvironmentProblem):
    def __init__(self, what: str, errno_: int, log: str = ""):
        self.errno = errno_
        detail = f": {log.strip()}" if log.strip() else ""
        super().__init__(f"bpf {what} failed: {os.strerror(errno_)}{detail}")


def _bpf(cmd: int, attr: ctypes.Array, what: str, log: ctypes.Array | None = None) -> int:
    number = _SYSCALL_NUMBERS.get(platform.machine())
    if number is None:
        raise EnvironmentProblem(f"lossbed does not know the bpf syscall on {platform.machine()}")
    result = _libc.syscall(number, cmd, ctypes.byref(attr), ATTR_SIZE)
    if result < 0:
        errno_ = ctypes.get_errno()
        text = log.value.decode(errors="replace") if log is not None else ""
        raise BpfError(what, errno_, text[-4000:])
    return result


def _attr(*chunks: tuple[int, bytes]) -> ctypes.Array:
    buf = ctypes.create_string_buffer(ATTR_SIZE)
    for offset, data in chunks:
        ctypes.memmove(ctypes.addressof(buf) + offset, data, len(data))
    return buf


def create_array_map(name: str, value_size: int, entries: int) -> int:
    """An array map with u32 keys; returns its fd."""
    attr = _attr((0, struct.pack("=IIIIIII", MAP_TYPE_ARRAY, 4, value_size, entries, 0, 0, 0)),
                 (28, name.encode()[:15]))
    return _bpf(MAP_CREATE, attr, f"map create ({name})")


def update(map_fd: int, key: int, value: bytes) -> None:
    k = ctypes.create_string_buffer(struct.pack("=I", key))
    v = ctypes.create_string_buffer(value, len(value))
    attr = _attr((0, struct.pack("=I", map_fd)),
                 (8, struct.pack("=QQQ", ctypes.addressof(k), ctypes.addressof(v), 0)))
    _bpf(MAP_UPDATE_ELEM, attr, "map update")


def lookup(map_fd: int, key: int, value_size: int) -> bytes:
    k = ctypes.create_string_buffer(struct.pack("=I", key))
    v = ctypes.create_string_buffer(value_size)
    attr = _attr((0, struct.pack("=I", map_fd)),
                 (8, struct.pack("=QQ", ctypes.addressof(k), ctypes.addressof(v))))
    _bpf(MAP_LOOKUP_ELEM, attr, "map lookup")
    return v.raw


def load_sched_cls(name: str, code: bytes) -> int:
    """Load a tc classifier program; returns its fd. The verifier's log is in the error."""
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 20)
    attr = _attr(
        (0, struct.pack("=IIQQIIQ", PROG_TYPE_SCHED_CLS, len(code) // 8,
                        ctypes.addressof(insns), ctypes.addressof(license_),
                        1, len(log), ctypes.addressof(log))),
        (48, name.encode()[:15]),
    )
    return _bpf(PROG_LOAD, attr, f"program load ({name})", log)


def map_info(map_fd: int) -> dict:
    """id, name and sizes of a map (struct bpf_map_info)."""
    info = ctypes.create_string_buffer(80)
    attr = _attr((0, struct.pack("=IIQ", map_fd, len(info), ctypes.addressof(info))))
    _bpf(OBJ_GET_INFO_BY_FD, attr, "map info")
    type_, id_, key_size, value_size, entries, flags = struct.unpack_from("=IIIIII", info.raw)
    name = info.raw[24:40].split(b"\0", 1)[0].decode()
    return {"type": type_, "id": id_, "key_size": key_size, "value_size": value_size,
            "max_entries": entries, "name": name}


def map_fd_by_id(map_id: int) -> int:
    attr = _attr((0, struct.pack("=I", map_id)))
    return _bpf(MAP_GET_FD_BY_ID, attr, f"map get by id {map_id}")
