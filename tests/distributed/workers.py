"""Rank programs for the multi-process tests: `python -m tests.distributed.workers MODE`,
launched one per host by harness.launch. Rank 0 prints one JSON object (the result)."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from harness import runtime
from harness.collectives.deadline import Deadline
from harness.collectives.lossy import LossyCollective
from harness.collectives.rebuild import ESTIMATORS
from harness.collectives.rps import RPS
from harness.transport.semantics import Semantics
from tests.reference.datagram_transport import DatagramTransport

SIZES = [1, 3, 7, 1000, 12345, 100003]  # below the world size, not multiples of a packet


def data(seed: int, numel: int, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)) + mean


def exact(r) -> dict:
    """0% loss: every estimator, both modes and RPS against torch.distributed."""
    errors = {}
    collectives = {e: LossyCollective(r.transport, r.store, estimator=e) for e in ESTIMATORS}
    rps = RPS(r.transport, r.store)
    for numel in SIZES:
        x = data(1000 * numel + r.rank, numel)
        reference = x.clone()
        dist.all_reduce(reference)
        reference /= r.world
        scale = float(sum(data(1000 * numel + k, numel).abs().max() for k in range(r.world)))
        for name, collective in collectives.items():
            y = x.clone()
            collective.allreduce(y)
            errors[f"gradient/{name}/{numel}"] = float((y - reference).abs().max()) / scale
            # parameter mode: owners take an SGD step with the reduced gradient
            params = data(7, numel)  # the same initial parameters on every rank
            expected = params - 0.1 * reference

            def sgd(start, end, grad, params=params):
                params[start:end] -= 0.1 * grad

            collective.sharded_update(x.clone(), params, sgd)
            errors[f"parameter/{name}/{numel}"] = float((params - expected).abs().max()) / scale
        models = x.clone()
        rps.average(models)
        errors[f"rps/{numel}"] = float((models - reference).abs().max()) / scale
    return {"errors": errors, "counters": r.transport.counters.to_dict()}


def unbiased(r, trials: int, numel: int) -> dict:
    """At real loss, per trial and per shard: the mean error of each estimator's result on
    this rank against the exact mean. Each rank's data has its own mean (RANK_MEANS), so an
    estimator unbiased only for identically distributed data shows its bias. Also the loss
    each stage saw (the prediction's p)."""
    from harness.collectives.layout import Layout

    collectives = {e: LossyCollective(r.transport, r.store, estimator=e) for e in ESTIMATORS}
    errors = {e: [] for e in ESTIMATORS}
    seen = {"reduce": [0, 0], "broadcast": [0, 0]}  # [missing, expected]
    means = np.linspace(-1.0, 2.0, r.world)
    bounds = [Layout(numel, r.world, r.transport.per_packet).shard_bounds(s)
              for s in range(r.world)]
    for t in range(trials):
        # every rank can rebuild the exact mean from the seeds, without a (slow, reliable)
        # all-reduce under loss
        contributions = [data(10_000 * t + k, numel, mean=float(means[k]))
                         for k in range(r.world)]
        truth = torch.stack(contributions).mean(0)
        for name, collective in collectives.items():
            y = contributions[r.rank].clone()
            stats = collective.allreduce(y)
            seen["reduce"][0] += stats.reduce_missing
            seen["reduce"][1] += stats.reduce_expected
            seen["broadcast"][0] += stats.broadcast_missing
            seen["broadcast"][1] += stats.broadcast_expected
            errors[name].append([float((y - truth)[a:b].mean()) for a, b in bounds])
    gathered = [None] * r.world
    dist.all_gather_object(gathered, {"errors": errors, "seen": seen})
    loss = {stage: sum(g["seen"][stage][0] for g in gathered)
            / max(sum(g["seen"][stage][1] for g in gathered), 1) for stage in seen}
    return {"errors": [g["errors"] for g in gathered], "means": means.tolist(),
            "loss": loss, "loss_rate": {e: c.loss_rate for e, c in collectives.items()},
            "counters": r.transport.counters.to_dict()}


def drift(r, steps: int, resync_every: int, out_dir: str, mode: str = "parameter") -> dict:
    """Every rank draws a gradient of fixed statistics each step (harness/reproduce/drift.py:
    mean MU, sd SIGMA, so the drift has a stationary value to reach) and steps its
    parameters: in parameter mode through the owners' broadcasts; in gradient mode (the
    control) with what its all-reduce gave it. Every rank saves its parameters every 5
    steps."""
    from harness.reproduce.drift import LR, MU, SIGMA

    numel = 4 * 12 * r.transport.per_packet  # 12 packets per shard
    params = torch.zeros(numel)
    collective = LossyCollective(r.transport, r.store, estimator="received_mean")
    gen = torch.Generator().manual_seed(r.rank)
    for step in range(steps):
        grad = MU + SIGMA * torch.randn(numel, generator=gen)
        if mode == "parameter":
            def sgd(start, end, g, params=params):
                params[start:end] -= LR * g

            collective.sharded_update(grad, params, sgd)
        else:
            collective.allreduce(grad)
            params -= LR * grad
        if resync_every and (step + 1) % resync_every == 0:
            collective.resync(params)
        if step % 5 == 4:
            np.save(os.path.join(out_dir, f"r{r.rank}-s{step + 1}.npy"), params.numpy())
    return {"counters": r.transport.counters.to_dict(), "loss_rate": collective.loss_rate}


def stages(r, steps: int, lossy_stages: list[str]) -> dict:
    """stage() for each of `lossy_stages`, one after the other in this one launch (each its
    own collective on the one transport, which numbers their steps apart)."""
    return {"by_stage": {s: stage(r, steps, s) for s in lossy_stages},
            "counters": r.transport.counters.to_dict()}


def stage(r, steps: int, lossy_stage: str) -> list[dict]:
    """Parameter mode under the kernel's loss with the loss on `lossy_stage` alone (or both):
    per step, whether the gradient the owner stepped with was the exact mean (every rank
    rebuilds it from the seeds) and a digest of this rank's parameters (all equal: no rank
    kept a stale broadcast slot). Also what each stage counted missing. Every rank's."""
    import hashlib

    numel = 4 * 12 * r.transport.per_packet  # 12 packets per shard
    params = torch.zeros(numel)
    collective = LossyCollective(r.transport, r.store, estimator="received_mean",
                                 lossy_stage=lossy_stage)
    exact_steps, digests = [], []
    missing = {"reduce": 0, "broadcast": 0}
    for step in range(steps):
        grads = [data(100 * step + k, numel) for k in range(r.world)]
        truth = torch.stack(grads).mean(0)
        errors = []

        def sgd(start, end, g, params=params, truth=truth, errors=errors):
            errors.append(float((g - truth[start:end]).abs().max()))
            params[start:end] -= 0.1 * g

        stats = collective.sharded_update(grads[r.rank].clone(), params, sgd)
        missing["reduce"] += stats.reduce_missing
        missing["broadcast"] += stats.broadcast_missing
        exact_steps.append(bool(errors[0] <= 1e-5))
        digests.append(hashlib.sha256(params.numpy().tobytes()).hexdigest())
    gathered = [None] * r.world
    dist.all_gather_object(gathered, {"exact": exact_steps, "digests": digests,
                                      "missing": missing})
    return gathered


def die(r, at_send: int) -> dict:
    """Rank 2 exits in the middle of a collective (after `at_send` packets); the others
    must stop with a clear error, not hang."""
    collective = LossyCollective(r.transport, r.store, deadline=Deadline(ceiling_s=1.0))
    if r.rank == 2:
        real_send_packets = r.transport.send_packets
        sent = [0]

        def send_packets(dest, stage, step, bucket, shard, x, starts, ends, end_copies=0):
            sent[0] += len(starts)
            if sent[0] > at_send:
                os._exit(17)
            real_send_packets(dest, stage, step, bucket, shard, x, starts, ends, end_copies)

        r.transport.send_packets = send_packets
    x = data(r.rank, 200_000)
    for _ in range(1000):
        collective.allreduce(x)
    return {"finished": True}


def datagram_transport(r, semantics: str):
    """A transport like the rank's own for `semantics`, with the datagram-at-a-time paths
    (tests/reference/datagram_transport.py) these checks send and receive unit by unit
    through; made on first use (every rank asks in the same order), closed with the rank's
    others (runtime.Rank.close)."""
    r.others = r.others or {}
    made = ("datagram", semantics)
    if made not in r.others:
        r.others[made] = DatagramTransport(
            r.rank, r.world, r.address, r.store, mtu=r.mtu,
            semantics=Semantics.parse(semantics), drop_mask=r.drop_mask,
            segmentation=r.segmentation, key_prefix=f"lossbed/test/{semantics}", key=r.key)
    return r.others[made]


def receive_units(t, units: int, floats: int, name: str):
    from harness.transport import header as hdr
    from harness.transport.verdicts import APPLIED, END

    got, order, intact, ended = set(), [], 0, False

    def handle(head, payload):
        nonlocal intact, ended
        if head.stage == hdr.STAGE_REDUCE_END:  # the sender sent everything: stop there
            ended = True
            return END
        if head.index in got:
            return "duplicate"
        values = np.frombuffer(payload, dtype=np.float32)
        intact += len(values) == floats and bool((values == head.index).all())
        got.add(head.index)
        order.append(head.index)
        return APPLIED

    t.receive_until(time.monotonic() + (120 if name.startswith("roce-rc") else 20),
                    lambda: len(got) == units or ended, handle)
    return got, order, intact


def semantics(r, names: list[str], units: int, unit_bytes: int) -> dict:
    """Rank 1 sends `units` numbered units to rank 0 under each loss semantics; rank 0
    counts the units that arrived whole and intact (RC: and in order), and how long."""
    from harness.transport import header as hdr

    out = {}
    for name in names:
        t = datagram_transport(r, name)
        floats = unit_bytes // 4
        payloads = [np.full(floats, k, dtype=np.float32) for k in range(units)]
        r.store.set(f"sem/{name}/ready/{r.rank}", "1")
        r.store.wait([f"sem/{name}/ready/{k}" for k in range(r.world)])
        started = time.monotonic()
        if r.rank == 1:
            for k, payload in enumerate(payloads):
                t.send(0, hdr.STAGE_REDUCE, 0, 0, 0, k, units, memoryview(payload).cast("B"))
                if k % 16 == 15:
                    time.sleep(0.002)  # the receiver is one Python process: let it keep up
            if not t.semantics.reliable:
                t.send_end(0, hdr.STAGE_REDUCE, 0, 0, 0, units, copies=4)
            t.flush(time.monotonic() + 120)
            r.store.set(f"sem/{name}/sent", "1")
        elif r.rank == 0:
            got, order, intact = receive_units(t, units, floats, name)
            r.store.wait([f"sem/{name}/sent"])
            seconds = time.monotonic() - started
            out[name] = {"units": units, "arrived": len(got), "intact": intact,
                         "in_order": order == sorted(order), "seconds": seconds,
                         "fragments_per_unit": -(-floats // t.fragment_floats),
                         "counters": t.counters.to_dict()}
        else:
            r.store.wait([f"sem/{name}/sent"])
        r.store.set(f"sem/{name}/done/{r.rank}", "1")
        r.store.wait([f"sem/{name}/done/{k}" for k in range(r.world)])
    return out


def segmented(r, units: int, burst: int) -> dict:
    """Rank 1 sends `units` numbered full-size packets to rank 0 with send_packets, `burst`
    packets per call as shard number `call` (the transport cuts them into its sends as it
    would any shard), then end markers; rank 0 says which arrived."""
    from harness.transport import header as hdr
    from harness.transport.verdicts import APPLIED, END

    t = datagram_transport(r, str(r.transport.semantics))
    per = t.per_packet
    x = np.repeat(np.arange(units, dtype=np.float32), per)
    calls = -(-units // burst)
    r.store.set(f"seg/ready/{r.rank}", "1")
    r.store.wait([f"seg/ready/{k}" for k in range(r.world)])
    out = {}
    if r.rank == 1:
        for call in range(calls):
            starts = np.arange(call * burst, min((call + 1) * burst, units)) * per
            t.send_packets(0, hdr.STAGE_REDUCE, 0, 0, call, x, starts, starts + per)
            time.sleep(0.003)  # the receiver is one Python process: let it keep up
        t.send_end(0, hdr.STAGE_REDUCE, 0, 0, calls - 1, burst, copies=8)
        r.store.set("seg/counters", json.dumps(t.counters.to_dict()))
    elif r.rank == 0:
        got, intact, ended = set(), 0, False

        def handle(head, payload):
            nonlocal intact, ended
            if head.stage == hdr.STAGE_REDUCE_END:
                ended = True
                return END
            unit = head.shard * burst + head.index
            values = np.frombuffer(payload, dtype=np.float32)
            intact += len(values) == per and bool((values == unit).all())
            got.add(unit)
            return APPLIED

        t.receive_until(time.monotonic() + 30, lambda: ended or len(got) == units, handle)
        r.store.wait(["seg/counters"])
        out = {"arrived": sorted(got), "intact": intact,
               "sender": json.loads(r.store.get("seg/counters"))}
    r.store.set(f"seg/done/{r.rank}", "1")
    r.store.wait([f"seg/done/{k}" for k in range(r.world)])
    return out


def main() -> int:
    mode = sys.argv[1]
    r = runtime.start()
    try:
        if mode == "exact":
            result = exact(r)
        elif mode == "unbiased":
            result = unbiased(r, int(sys.argv[2]), int(sys.argv[3]))
        elif mode == "drift":
            result = drift(r, int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:6])
        elif mode == "stages":
            result = stages(r, int(sys.argv[2]), sys.argv[3].split(","))
        elif mode == "die":
            result = die(r, int(sys.argv[2]))
        elif mode == "segmented":
            result = segmented(r, int(sys.argv[2]), int(sys.argv[3]))
        elif mode == "semantics":
            result = semantics(r, sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]))
        else:
            raise SystemExit(f"unknown mode {mode}")
        if r.rank == 0:
            print(json.dumps(result), flush=True)
    finally:
        r.close()
    return 0


if __name__ == "__main__":
    runtime.run_and_exit(main)
