"""A Hugging Face transformers model trained with a plain loop under DDP, made lossy with one
lossbed call: the lossy gradient reduce, or the bounded-drift parameter broadcast.

    lossbed run --profile random-loss --loss 0.1 -- \
        torchrun examples/hf_finetune.py --variant unbiased_drift

The model is a tiny Llama built from its config (no download), trained on the text that ships
with Python (pydoc_data.topics) as bytes; rank 0 reports its held-out perplexity.
"""

import argparse
import math
from pydoc_data.topics import topics

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import LlamaConfig, LlamaForCausalLM

import harness.api as lossbed

SEQ, BATCH = 64, 8


def windows(data: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    return torch.stack([data[s:s + SEQ + 1] for s in starts.tolist()])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="unbiased_drift",
                        choices=["reliable", "unbiased", "unbiased_drift"])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    text = torch.tensor(list("\n".join(topics.values()).encode()[:400_000]), dtype=torch.long)
    train, heldout = text[:-20_000], text[-20_000:]
    torch.manual_seed(0)  # the same model on every rank
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=SEQ)
    model = DDP(LlamaForCausalLM(config), broadcast_buffers=False)
    if args.variant == "unbiased":
        lossbed.lossy_gradients(model, "unbiased")  # lossbed: the lossy reduce
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if args.variant == "unbiased_drift":
        optimizer = lossbed.bounded_drift(model, optimizer)  # lossbed
    if args.variant == "reliable":
        lossbed.reliable(model)  # lossbed: only measured

    data = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        batch = windows(train, torch.randint(0, len(train) - SEQ - 1, (BATCH,), generator=data))
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    with torch.no_grad():
        batch = windows(heldout, torch.arange(0, len(heldout) - SEQ - 1, SEQ)[:64])
        heldout_loss = float(model.module(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss)
    lossbed.report(heldout_ppl=math.exp(heldout_loss),
                   tokens=args.steps * BATCH * SEQ * world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
