"""`make gpu-check`: on one GPU host, how much of the lossy collective the DDP hook hides
behind backward, and the collective's bus bandwidth (#67 item 6), in a few minutes.

Two ranks on loopback (127.0.0.1) share the host's GPU (a GPU each where there are two),
train a stack of --layers linear layers of --width under DDP with lossbed's hook
(harness/ddp/hooks.py: each bucket copied to pinned memory on a copy stream, reduced by the
lossy all-reduce on the hook's thread while backward goes on), and measure, per step:

    compute    forward and backward with a hook that reduces nothing (completed at once)
    hooked     forward and backward with the lossy hook, until every bucket is back
    alone      the same buckets through the same staging and collective, one after the
               other, after backward (nothing to hide behind)

    hidden = (compute + alone - hooked) / min(compute, alone), within [0, 1]: the share of
             the shorter of the two that ran at the same time as the other
    busbw  = algbw * 2(n-1)/n, algbw = the gradients' bytes / the collective's time alone
             (nccl-tests' all-reduce units, harness/bench/nccl_units.py)

    python -m tests.hardware.gpu_check [--device cuda|cpu] [--layers 8] [--width 2048]
        [--steps 10] [--budget-s 480]

Prints a table and one JSON line. Exit 3 where --device cuda finds no GPU; --device cpu
runs the same measurement on the CPU (the hook then stages nothing: a check of the
instrument, not of the GPU path)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from datetime import timedelta

PORT = 29781
WORLD = 2


def _model(args, device):
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def rank_main(rank: int, args, out) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from harness.collectives.lossy import LossyCollective
    from harness.ddp.hooks import LossyHookState, lossy_allreduce_hook
    from harness.ddp.staging import staging_for
    from harness.transport.udp import UdpTransport

    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if cuda else \
        torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", PORT, WORLD, is_master=rank == 0,
                          timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    transport = UdpTransport(rank, WORLD, "127.0.0.1", store, mtu=9000, key=bytes(32),
                             segmentation=True)
    collective = LossyCollective(transport, store, align_every=0)
    model = DDP(_model(args, device), device_ids=[device.index] if cuda else None)
    x = torch.randn(args.batch, args.width, device=device)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def step() -> float:
        sync()
        started = time.perf_counter()
        model(x).square().mean().backward()
        sync()
        return time.perf_counter() - started

    def nothing(state, bucket):  # a hook that reduces nothing: backward's own time
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    model.register_comm_hook(None, nothing)
    for _ in range(3):
        step()
    dist.barrier()
    compute = [step() for _ in range(args.steps)]

    # (DDP takes one hook: a fresh wrap of the same module for the lossy one)
    hooked_model = DDP(model.module, device_ids=[device.index] if cuda else None)
    state = LossyHookState(collective)
    hooked_model.register_comm_hook(state, lossy_allreduce_hook)
    model = hooked_model
    for _ in range(3):
        step()
    dist.barrier()
    hooked = [step() for _ in range(args.steps)]

    # the same buckets alone, one after the other, after backward
    grads = [p.grad.detach().reshape(-1).float() for p in model.module.parameters()]
    flat = torch.cat(grads)
    buckets = torch.split(flat, max(1, (25 << 20) // 4))
    alone = []
    for i in range(args.steps + 3):
        dist.barrier()
        sync()
        started = time.perf_counter()
        for index, bucket in enumerate(buckets):
            staging = staging_for(bucket, state.host, state.cuda)
            if staging is None:
                collective.allreduce(bucket, bucket=index)
                continue
            host, copied = staging.to_host(index, bucket)
            if copied is not None:
                copied.synchronize()
            collective.allreduce(host, bucket=index)
            staging.to_device(host, bucket)
        sync()
        if i >= 3:
            alone.append(time.perf_counter() - started)
    if rank == 0:
        out.put({"compute_s": statistics.median(compute), "hooked_s": statistics.median(hooked),
                 "alone_s": statistics.median(alone), "bytes": flat.numel() * 4,
                 "buckets": len(buckets), "missing": transport.counters.missing,
                 "pinned": bool(state.staging) and all(b.is_pinned()
                                                       for b in state.staging.values()),
                 "device": str(device), "finite": bool(np.isfinite(flat.cpu().numpy()).all())})
    collective.finish()
    transport.close()
    dist.destroy_process_group()


def measures(result: dict) -> dict:
    """hidden and busbw from the three times (see the module's text)."""
    from harness.bench.nccl_units import bus_factor

    compute, hooked, alone = result["compute_s"], result["hooked_s"], result["alone_s"]
    hidden = (compute + alone - hooked) / min(compute, alone) if min(compute, alone) else 0.0
    algbw = result["bytes"] / alone / 1e9
    return {"hidden": min(1.0, max(0.0, hidden)), "algbw_gbps": algbw,
            "busbw_gbps": algbw * bus_factor(WORLD)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=480)
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no GPU here (torch.cuda.is_available() is False): nothing measured; "
                  "--device cpu checks the instrument on the CPU")
            return 3
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, out)) for r in range(WORLD)]
    started = time.monotonic()
    for p in procs:
        p.start()
    try:
        result = out.get(timeout=args.budget_s)
    finally:
        for p in procs:
            p.join(max(1.0, args.budget_s - (time.monotonic() - started)))
            if p.is_alive():
                p.kill()
    if any(p.exitcode for p in procs):
        print(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        return 1
    result.update(measures(result))
    print(f"{args.device}: {WORLD} ranks on {result['device']}, {args.layers} x {args.width} "
          f"linear, {result['bytes'] / 2**20:.0f} MiB of gradients in {result['buckets']} "
          f"buckets")
    for name in ("compute_s", "hooked_s", "alone_s"):
        print(f"  {name[:-2]:<8} {result[name] * 1e3:9.1f} ms per step (median)")
    print(f"  hidden   {result['hidden']:9.0%} of the shorter behind the longer")
    print(f"  busbw    {result['busbw_gbps']:9.3f} GB/s (algbw {result['algbw_gbps']:.3f})")
    print(json.dumps({**result, "layers": args.layers, "width": args.width,
                      "wall_s": time.monotonic() - started}))
    return 0 if result["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
