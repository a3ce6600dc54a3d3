"""A plain PyTorch DDP training script, made lossy with one lossbed call.

    lossbed run --profile random-loss --loss 0.1 -- \
        torchrun examples/plain_pytorch.py --variant unbiased

--variant reliable is the script as it was; each other variant adds one harness.api call
(marked "lossbed:") and changes nothing of the model or the optimizer.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import harness.api as lossbed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="unbiased",
                        choices=["reliable", "zero_fill", "unbiased", "unbiased_drift", "rps"])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same model on every rank
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if args.variant == "reliable":
        lossbed.reliable(model)  # lossbed: only measured
    elif args.variant in ("zero_fill", "unbiased"):
        lossbed.lossy_gradients(model, args.variant)  # lossbed: the lossy reduce
    elif args.variant == "unbiased_drift":
        optimizer = lossbed.bounded_drift(model, optimizer)  # lossbed
    else:
        optimizer = lossbed.rps(model, optimizer)  # lossbed

    teacher = torch.randn(64, 1, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for step in range(args.steps):
        x = torch.randn(32, 64, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x @ teacher)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # lossbed (optional): the samples so far, served live as tokens/s (--metrics-port)
        lossbed.report(tokens=(step + 1) * 32 * dist.get_world_size())

    lossbed.report(final_loss=loss.item(), samples=args.steps * 32 * dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
