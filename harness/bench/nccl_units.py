"""The collective bench in nccl-tests' units (#67): its sizes as all_reduce_perf takes them
(-b, -e, -f: from a least to a largest size, each the last times a factor), and its table
(size, count, type, redop, time, algbw, busbw), with what lossbed adds: the loss the
kernel measured and the share of packets the collective missed, per size.

nccl-tests' definitions (its doc/PERFORMANCE.md): time is the mean of the timed
iterations; algbw = size / time; busbw = algbw * 2(n-1)/n for all-reduce, the bandwidth
each rank's link must carry for the ring algorithm to take that time, comparable across
rank counts and with the hardware's peak. Bandwidths are in GB/s of 10^9 bytes; sizes take
K, M, G as nccl-tests does (powers of 1024)."""

from __future__ import annotations

from testbed.errors import UsageError

FLOAT_BYTES = 4  # the benchmark's tensors are float32 ("float" in the type column)
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_bytes(option: str, text: str) -> int:
    """A size as nccl-tests takes one: bytes, or a number with K, M or G (powers of 1024)."""
    value = text.strip().upper().removesuffix("B")
    unit = value[-1:] if value[-1:] in "KMG" else ""
    try:
        number = float(value[:len(value) - len(unit)])
    except ValueError:
        number = float("nan")
    if not (number > 0 and number * _SUFFIXES[unit] < float(1 << 40)):
        raise UsageError(option, f"{text!r} is not a size", f"e.g. {option} 8, 64K or 256M "
                         "(bytes; K, M and G are powers of 1024, as in nccl-tests)")
    return int(number * _SUFFIXES[unit])


def sizes(min_bytes: int, max_bytes: int, step_factor: float) -> list[int]:
    """all_reduce_perf's sizes: min_bytes, then each the last times step_factor, up to
    max_bytes; each rounded down to whole floats (at least one)."""
    if max_bytes < min_bytes:
        raise UsageError("--maxbytes", f"{max_bytes} is below --minbytes {min_bytes}",
                         "Give a largest size at least the least one")
    if not step_factor > 1:
        raise UsageError("--stepfactor", f"{step_factor:g} does not grow the size",
                         "Give a factor above 1, e.g. --stepfactor 2 (doubling)")
    out, size = [], float(min_bytes)
    while size <= max_bytes:
        whole = max(int(size) // FLOAT_BYTES, 1) * FLOAT_BYTES
        if not out or whole != out[-1]:
            out.append(whole)
        size *= step_factor
    return out


def bus_factor(ranks: int) -> float:
    """busbw / algbw for an all-reduce over `ranks` ranks (nccl-tests: 2(n-1)/n)."""
    return 2 * (ranks - 1) / ranks


def nccl_row(row: dict) -> dict:
    """One measured row (the collective bench's) in nccl-tests' units."""
    seconds = row["mean_ms"] / 1e3
    algbw = row["size_bytes"] / seconds / 1e9
    return {"size": row["size_bytes"], "count": row["size_bytes"] // FLOAT_BYTES,
            "type": "float", "redop": "sum" if row["algorithm"] == "reliable" else "mean",
            "time_us": seconds * 1e6, "algbw": algbw,
            "busbw": algbw * bus_factor(row["hosts"]),
            "loss": row["measured_loss"], "missing": row.get("missing_fraction"),
            "cpu_ns_per_byte": row.get("cpu_ns_per_byte")}


def table(rows: list[dict]) -> str:
    """A block per (profile, loss, algorithm), its sizes in order, as all_reduce_perf prints
    its out-of-place columns; gloo (reliable) beside the lossy ones at every loss."""
    blocks: dict[tuple, list[dict]] = {}
    for r in rows:
        blocks.setdefault((r["profile"], r["loss"], r["algorithm"]), []).append(r)
    lines = []
    for (profile, loss, algorithm), block in blocks.items():
        first = block[0]
        lines += [
            f"# all-reduce {algorithm}, {first['hosts']} ranks, {profile} at {loss:.0%} "
            f"(measured {first['measured_loss']:.2%}), {first['iterations']} iterations",
            f"#{'size':>11} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} "
            f"{'algbw':>7} {'busbw':>7} {'loss':>6} {'missing':>8} {'cpu':>7}",
            f"#{'(B)':>11} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>10} "
            f"{'(GB/s)':>7} {'(GB/s)':>7} {'(%)':>6} {'(%)':>8} {'(ns/B)':>7}"]
        for r in sorted(block, key=lambda r: r["size_bytes"]):
            n = nccl_row(r)
            missing = f"{n['missing'] * 100:.3f}" if n["missing"] is not None else "-"
            cpu = (f"{n['cpu_ns_per_byte']:.2f}" if n["cpu_ns_per_byte"] is not None
                   else "-")
            lines.append(f" {n['size']:>11} {n['count']:>12} {n['type']:>6} {n['redop']:>6} "
                         f"{n['time_us']:>10.1f} {n['algbw']:>7.3f} {n['busbw']:>7.3f} "
                         f"{n['loss'] * 100:>6.2f} {missing:>8} {cpu:>7}")
    if rows:
        lines.append("# time: the mean iteration; algbw = size / time; busbw = algbw * "
                     "2(n-1)/n (nccl-tests' all-reduce); GB/s of 10^9 bytes; loss: what the "
                     "kernel dropped in the case; missing: the packets the collective did "
                     "not receive (gloo: none, it retransmits); cpu: rank 0's CPU time per "
                     "byte of one all-reduce (every thread of its process)")
    return "\n".join(lines)
