"""`lossbed collective-bench`: the lossy all-reduce and RPS beside reliable (gloo), under loss.

For every profile and loss rate: apply the profile to the cluster, run every algorithm on
every tensor size in one launch of the ranks (so all are measured under the same
conditions), read the applied loss back from the kernel (verify), clear. Prints
p50/p99/max latency, algorithm bandwidth, the measured loss and the ratios to reliable (gloo) from
the same run, plus the collective's packet rate as a fraction of the raw UDP packet rate
between two hosts, also measured in the run.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness import launch
from harness.bench.collective_worker import ALGORITHMS
from harness.train.config import TrainConfig
from harness.transport import header as hdr
from harness.transport.semantics import Semantics
from testbed import checks, profiles
from testbed.errors import LossbedError, UsageError
from testbed.impair import coverage, engine, verify

if TYPE_CHECKING:  # (the contract, for annotations: no import at run time)
    from testbed.clusters.contract import Cluster


log = logging.getLogger(__name__)
MIB = 1 << 20


@dataclass
class BenchSpec:
    sizes_mib: list[float] = field(default_factory=lambda: [1, 4, 16, 64])
    losses: list[float] = field(default_factory=lambda: [0.0, 0.01, 0.1])
    profiles: list[str] = field(default_factory=lambda: ["random-loss", "burst-loss"])
    algorithms: list[str] = field(default_factory=lambda: list(ALGORITHMS))
    iters: int = 10
    warmup: int = 2
    unsealed: bool = False  # datagrams without their MAC (to price it): --unsealed
    # the lossy collectives start every align_every-th step together through the store (0:
    # only the first): as training does by default (TrainConfig.align_every), unless asked
    align_every: int = TrainConfig.align_every

    def __post_init__(self):
        self._check()  # every value, as the spec is made: before a cluster comes up

    def _check(self) -> None:
        unknown = [a for a in self.algorithms if a.partition("@")[0] not in ALGORITHMS]
        if unknown:
            raise UsageError("--algorithms", f"unknown {', '.join(unknown)}",
                             f"Use some of: {', '.join(ALGORITHMS)}, each optionally "
                             "@TRANSPORT (e.g. unbiased@roce-uc)")
        for a in self.algorithms:
            if "@" in a:
                Semantics.parse(a.partition("@")[2])
        checks.loss_fraction("--loss", *self.losses)
        bad = [s for s in self.sizes_mib if not (math.isfinite(s) and s > 0)]
        if bad:  # (nan compares false to everything: it once passed, and 4 hosts came up)
            raise UsageError("--sizes", f"{bad[0]:g} is not a size: sizes are positive "
                             "numbers of MiB", "e.g. --sizes 1 4")
        if self.iters < 1:
            raise UsageError("--iters", f"{self.iters} is too few", "Use --iters 1 or more")
        if self.align_every < 0:
            raise UsageError("--align-every", f"{self.align_every} steps",
                             "Give 0 or more (0: the ranks meet at the first step only, as "
                             "training does; 1: at every step)")
        for name in self.profiles:  # every profile at every loss, before a cluster is built
            for loss in self.losses:
                profiles.load(name, loss=loss)


def raw_udp_rate(cluster: Cluster, seconds: float = 0.5) -> float:
    """MTU-sized datagrams per second from one Python sender to another host, received."""
    h1, h2 = cluster.hosts[0], cluster.hosts[1]
    try:
        rx = h1.socket()
    except LossbedError:  # a VM's or a remote host's sockets are not the controller's
        return float("nan")
    rx.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)
    rx.bind((h1.address, 0))
    rx.setblocking(False)
    tx = h2.socket()
    payload = b"\0" * (cluster.mtu - hdr.IPV4_UDP_OVERHEAD)
    got = 0
    end = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < end:
        for _ in range(32):
            tx.sendto(payload, rx.getsockname())
        while True:
            try:
                rx.recv(65536)
                got += 1
            except BlockingIOError:
                break
    elapsed = time.monotonic() - started
    rx.close()
    tx.close()
    return got / elapsed


def run(cluster: Cluster, spec: BenchSpec, progress=print,
        min_coverage: float = coverage.DEFAULT_MIN_COVERAGE) -> list[dict]:
    """Every (profile, loss) case's rows; a row under an impairment that too little of the
    hosts' traffic crossed carries `invalid` (why, and what carried it instead). The spec
    was checked as it was made."""
    if len(cluster.hosts) < 2:
        raise UsageError("--hosts", "a collective needs 2 or more hosts", "Use --hosts 4")
    from harness.verbs import device

    device.require_for([a.partition("@")[2] for a in spec.algorithms], cluster)
    sizes = [max(int(s * MIB) // 4 * 4, 4) for s in spec.sizes_mib]
    raw_pps = raw_udp_rate(cluster)
    cases = [("clean", 0.0)] if 0.0 in spec.losses else []
    cases += [(p, loss) for loss in spec.losses if loss > 0 for p in spec.profiles]
    rows = []
    for i, (profile_name, loss) in enumerate(cases, start=1):
        progress(f"[{i}/{len(cases)}] {profile_name} at {loss:.0%}: "
                 f"{len(spec.algorithms)} algorithms x {len(sizes)} sizes")
        profile = profiles.load(profile_name, loss=loss)
        the_plan, choice = engine.make_plan(cluster, profile)
        engine.apply(cluster, the_plan, choice)
        try:
            start = verify.read(cluster)
            results = launch.run(cluster, "harness.bench.collective_worker", [
                "--sizes", *map(str, sizes), "--algorithms", *spec.algorithms,
                "--iters", str(spec.iters), "--warmup", str(spec.warmup),
                "--align-every", str(spec.align_every)],
                timeout_s=3600, told=launch.rank_settings(profile),
                authenticate=not spec.unsealed)
            end = verify.read(cluster)
            report = verify.report(cluster, end, start)
            covered = verify.measure_coverage(cluster, end, start, min_coverage)
        finally:
            engine.clear(cluster)
        failed = [r for r in results if r.returncode != 0]
        if failed:
            raise LossbedError(f"rank {failed[0].rank} ({failed[0].host}) failed: "
                               f"{failed[0].stderr.strip()[-2000:]}")
        measured = report.total_dropped / report.total_seen if report.total_seen else 0.0
        for line in results[0].stdout.splitlines():
            row = json.loads(line)
            row.update(profile=profile_name, loss=loss, measured_loss=measured,
                       backend=report.backend, hosts=len(cluster.hosts), mtu=cluster.mtu,
                       sealed=not spec.unsealed, align_every=spec.align_every,
                       raw_udp_pps=raw_pps, coverage=covered.fraction,
                       invalid=covered.no_result(profile),
                       raw_rate_fraction=(row["packets_per_s"] / raw_pps
                                          if row.get("packets_per_s") and raw_pps else None))
            rows.append(row)
    _add_ratios(rows)
    return rows


def _add_ratios(rows: list[dict]) -> None:
    """Each algorithm against `reliable` (gloo's all-reduce) at the same loss and size."""
    reliable = {(r["profile"], r["loss"], r["size_bytes"]): r for r in rows
                if r["algorithm"] == "reliable"}
    for r in rows:
        ref = reliable.get((r["profile"], r["loss"], r["size_bytes"]))
        if ref and r["algorithm"] != "reliable":
            r["p50_vs_reliable"] = r["p50_ms"] / ref["p50_ms"]
            r["max_vs_reliable"] = r["max_ms"] / ref["max_ms"]
            if r["p99_ms"] is not None and ref["p99_ms"] is not None:
                r["p99_vs_reliable"] = r["p99_ms"] / ref["p99_ms"]


def deadlines_cell(hit: dict | None) -> str:
    """A row's deadlines_hit as a table shows it: reduce/broadcast, '-' for gloo."""
    return f"{hit['reduce']}/{hit['broadcast']}" if hit else "-"


def format_table(rows: list[dict]) -> str:
    head = (f"{'profile':<12} {'loss':>5} {'meas':>6} {'size':>6} {'algorithm':<28} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'Gbit/s':>7} {'p50/rel':>8} "
            f"{'p99/rel':>8} {'max/rel':>8} {'raw%':>5} {'dl r/b':>7}")
    lines = [head, "-" * len(head)]

    def f(value, fmt: str) -> str:
        return format(value, fmt) if value is not None else "-"

    for r in rows:
        raw = f"{r['raw_rate_fraction'] * 100:.0f}" if r.get("raw_rate_fraction") else "-"
        hit = deadlines_cell(r.get("deadlines_hit"))
        lines.append(
            f"{r['profile']:<12} {r['loss']:>5.0%} {r['measured_loss']:>6.2%} "
            f"{r['size_bytes'] / MIB:>5.0f}M {r['algorithm']:<28} {r['p50_ms']:>8.1f} "
            f"{f(r['p99_ms'], '.1f'):>8} {r['max_ms']:>8.1f} {r['algbw_gbps']:>7.2f} "
            f"{f(r.get('p50_vs_reliable'), '.2f'):>8} {f(r.get('p99_vs_reliable'), '.3f'):>8} "
            f"{f(r.get('max_vs_reliable'), '.3f'):>8} {raw:>5} {hit:>7}")
    if rows and rows[0].get("p99_ms") is None:
        lines.append(f"p99: '-' with {rows[0]['iterations']} iterations (a p99 needs 100: "
                     "--iters 100); max is the slowest iteration")
    if any(r.get("deadlines_hit") for r in rows):
        lines.append("dl r/b: rank 0's reduce / broadcast stages that ended at their deadline "
                     "(not by their packets or end markers) in the timed iterations")
    if rows:
        lines.append(f"raw UDP rate between two hosts (one Python sender, MTU "
                     f"{rows[0]['mtu']}): {rows[0]['raw_udp_pps']:.0f} packets/s")
    covered = [r["coverage"] for r in rows if r.get("coverage") is not None]
    if covered:
        lines.append(f"coverage (the hosts' bytes that crossed the impairment): "
                     f"{min(covered):.1%} at the least")
    for case in dict.fromkeys((r["profile"], r["loss"], r["invalid"]) for r in rows
                              if r.get("invalid")):
        lines.append(f"! {case[0]} at {case[1]:.0%} is no result: {case[2]}")
    return "\n".join(lines)
