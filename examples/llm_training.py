"""A real causal-LM training script, as a team would write one, made lossy with one line per
scheme (the lines marked "lossbed:"): AdamW with weight-decay groups, a warm-up and cosine
schedule, bf16 autocast, gradient accumulation, and a checkpoint each rank saves and resumes
from.

    lossbed run --profile random-loss --loss 0.1 -- \
        torchrun llm_training.py --scheme bounded_drift --checkpoint ckpt

--scheme reliable is the script as it was. With --checkpoint DIR each rank saves its own
state there every --save-every steps (and at --stop-at, where it stops), and a run that
finds one there resumes from it. The model is a small decoder-only transformer (no download),
trained on the text that ships with Python (pydoc_data.topics) as bytes; rank 0 prints each
step's loss and reports its held-out perplexity.
"""

import argparse
import math
import os
from pydoc_data.topics import topics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import harness.api as lossbed

SEQ, VOCAB = 64, 256


class TinyLM(torch.nn.Module):
    """Token and position embeddings, pre-norm causal transformer blocks, a tied head."""

    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, width)
        self.positions = torch.nn.Embedding(SEQ, width)
        block = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        for table in (self.tokens, self.positions):  # small: the head is the tokens' table
            torch.nn.init.normal_(table.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.norm(x) @ self.tokens.weight.T


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on the matrices, none on biases, norms and embeddings."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() == 2 and "tokens" not in name and "positions" not in name
         else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return factor


def batch(text: torch.Tensor, seed: int, rank: int, step: int, micro: int, size: int):
    """The step's micro-batch: drawn from (seed, rank, step, micro), so a resumed run sees
    what an uninterrupted one would."""
    gen = torch.Generator().manual_seed(hash((seed, rank, step, micro)) % 2**62)
    starts = torch.randint(0, len(text) - SEQ - 1, (size,), generator=gen)
    rows = torch.stack([text[s:s + SEQ + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def lm_loss(model, ids, targets) -> torch.Tensor:
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        logits = model(ids)
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheme", default="bounded_drift",
                        choices=["reliable", "lossy_gradients", "bounded_drift", "rps"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches a step")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint", help="folder of each rank's checkpoint")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--stop-at", type=int, help="save and stop after this many steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    text = torch.tensor(list("\n".join(topics.values()).encode()[:400_000]), dtype=torch.long)
    train, heldout = text[:-20_000], text[-20_000:]
    torch.manual_seed(args.seed)  # the same model on every rank
    model = DDP(TinyLM())  # (no buffers: nothing for DDP to broadcast before a forward)
    optimizer = torch.optim.AdamW(parameter_groups(model.module, 0.1), lr=args.lr,
                                  betas=(0.9, 0.95))
    if args.scheme == "reliable":
        lossbed.reliable(model)  # lossbed: only measured
    elif args.scheme == "lossy_gradients":
        lossbed.lossy_gradients(model, "unbiased")  # lossbed: the lossy gradient reduce
    elif args.scheme == "bounded_drift":
        optimizer = lossbed.bounded_drift(model, optimizer)  # lossbed: the lossy broadcast
    else:
        optimizer = lossbed.rps(model, optimizer)  # lossbed: RPS's lossy averaging
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(4, args.steps))

    first = 0
    saved = os.path.join(args.checkpoint, f"rank{rank}.pt") if args.checkpoint else None
    if saved and os.path.exists(saved):  # resume: each rank its own
        state = torch.load(saved, weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        first = state["step"]
        if rank == 0:
            print(f"resumed at step {first}", flush=True)

    last = args.stop_at if args.stop_at is not None else args.steps
    losses = []
    for step in range(first, last):
        total = 0.0
        for micro in range(args.accumulate):
            ids, targets = batch(train, args.seed, rank, step, micro, args.micro_batch)
            if micro < args.accumulate - 1:
                with model.no_sync():  # the gradients add up locally
                    loss = lm_loss(model, ids, targets) / args.accumulate
                    loss.backward()
            else:
                loss = lm_loss(model, ids, targets) / args.accumulate
                loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        losses.append(total)
        if rank == 0:
            print(f"step {step} loss {total:.6f} lr {schedule.get_last_lr()[0]:.3g}",
                  flush=True)
        if saved and ((step + 1) % args.save_every == 0 or step + 1 == last):
            os.makedirs(args.checkpoint, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(), "step": step + 1}, saved)

    model.eval()
    with torch.no_grad():
        ids, targets = batch(heldout, args.seed, 0, 0, 0, 16)
        ppl = math.exp(lm_loss(model.module, ids, targets).item())
    lossbed.report(final_loss=losses[-1] if losses else None, heldout_ppl=ppl,
                   first_step=first, losses=losses)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
