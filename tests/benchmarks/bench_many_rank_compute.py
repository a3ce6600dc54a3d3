"""Does batching the replicas pay in the many-rank mode (#58's "vectorise over ranks where it
pays")? The forward and backward of one training step at n ranks (the global batch fixed:
GLOBAL sequences over the ranks, one each at n = 64), three ways, in the same run, one
thread (as the mode computes):

    per rank    one call per replica, its own sequences (what harness/scale/training.py does)
    vmap        torch.func: the n replicas' parameters stacked, one vmap'd grad call
    shared      one call of ONE model over all GLOBAL sequences: not the algorithm (its
                replicas differ), the floor a batched compute could reach

Prints each way's median seconds over --repeats and its ratio to `per rank`. The stacking
of the parameters (and of the gradients back) is not counted in vmap's time: a floor.

    .venv/bin/python -m tests.benchmarks.bench_many_rank_compute [--ranks 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

GLOBAL = 64


def measure(n: int, seq_len: int, repeats: int, vocab: int = 4096) -> dict[str, float]:
    """Median seconds of each way at n ranks."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad, stack_module_state, vmap

    from harness.model import presets

    def loss_of(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    replicas = [presets.build("tiny", vocab, seed) for seed in range(n)]
    tokens = torch.randint(0, vocab, (n, GLOBAL // n, seq_len + 1))
    inputs, targets = tokens[..., :-1], tokens[..., 1:]

    def per_rank():
        for r, model in enumerate(replicas):
            loss_of(model(input_ids=inputs[r]).logits, targets[r]).backward()

    params, buffers = stack_module_state(replicas)
    skeleton = presets.build("tiny", vocab, 0).to("meta")

    def one_loss(p, b, x, y):
        return loss_of(functional_call(skeleton, (p, b), args=(),
                                       kwargs={"input_ids": x}).logits, y)

    batched = vmap(grad(one_loss), in_dims=(0, 0, 0, 0))

    def vmapped():
        batched(params, buffers, inputs, targets)

    def shared():
        loss_of(replicas[0](input_ids=inputs.reshape(GLOBAL, -1)).logits,
                targets.reshape(GLOBAL, -1)).backward()

    times = {}
    for name, fn in (("per rank", per_rank), ("vmap", vmapped), ("shared", shared)):
        fn()  # (first call: allocations, lazy initialisation)
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - started)
        times[name] = statistics.median(runs)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    print(f"forward + backward of one step, {GLOBAL} sequences of {args.seq_len} over n "
          f"ranks, tiny preset, 1 thread, median of {args.repeats}")
    print("| n | per rank s | vmap s | vmap / per rank | shared s | shared / per rank |")
    print("|---|---|---|---|---|---|")
    for n in args.ranks:
        times = measure(n, args.seq_len, args.repeats)
        base = times["per rank"]
        print(f"| {n} | {base:.3f} | {times['vmap']:.3f} | {times['vmap'] / base:.2f} | "
              f"{times['shared']:.3f} | {times['shared'] / base:.2f} |")


if __name__ == "__main__":
    main()
