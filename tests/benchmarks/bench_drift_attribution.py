"""Where unbiased_drift's perplexity loss comes from: its training replayed in one process,
with the loss of each stage switched on or off.

    .venv/bin/python -m tests.benchmarks.bench_drift_attribution [--steps 300] [--seeds 2]

Four simulated ranks, each with its own copy of the parameters, train as
harness.ddp.sharded does: every rank's gradient (at its own parameters, on its own batch
drawn as harness.data.sampler draws it) is reduced to the shard owners packet by packet
(received-mean of what arrived), each owner steps its shard (SGD, momentum 0.9, warm-up and
cosine decay), and the owners broadcast their shards packet by packet; a rank that misses a
packet keeps its stale values there. Packets are the transport's (350 floats at MTU 1500),
each link drops each packet independently with probability p. The owners' model is scored
as the bench scores it (held-out token perplexity).

    none         no loss: the reliable model
    reduce       loss on the reduce stage only (the gradient estimate is noisier)
    broadcast    loss on the broadcast stage only (replicas compute at stale parameters)
    both         the variant as it runs

Printed: per seed and case the perplexity and Δppl against `none` of the same seed, and
the mean Δ per case. Measured here (2026-12-01, 2 seeds, 300 steps, SGD 0.1, 10%, 11 min):
reduce +1.56% (+2.66, +0.46), broadcast +15.53% (+14.25, +16.82), both +19.31% (+27.11,
+11.52); the bench's unbiased_drift at 10% was +17.4% over 8 runs of the same seeds.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from harness.collectives.layout import Layout
from harness.data.corpus import load_documents, prepare
from harness.data.sampler import Batches
from harness.eval import models
from harness.eval.perplexity import evaluate
from harness.model import presets
from harness.train import schedule
from harness.transport.semantics import Semantics

CASES = {"none": (False, False), "reduce": (True, False), "broadcast": (False, True),
         "both": (True, True)}


def train(tok, corpus, seed: int, steps: int, lr: float, p: float, reduce_loss: bool,
          broadcast_loss: bool, world: int = 4) -> float:
    model = presets.build("tiny", tok.vocab_size, seed)
    start = models.flat(model)
    layout = Layout(start.numel(), world, Semantics.parse("udp").slot_floats(1500))
    bounds = [(o, *layout.packet_bounds(o, k)) for o in range(world)
              for k in range(layout.packets(o))]
    owner_of = torch.tensor([o for o, _, _ in bounds])          # per packet
    packet_of = torch.cat([torch.full((b - a,), i) for i, (_, a, b) in enumerate(bounds)])
    own_link = F.one_hot(owner_of, world).T.bool()               # [rank, packet]
    replicas = torch.stack([start.clone() for _ in range(world)])
    owners = start.clone()  # each shard as its owner holds it
    momentum = torch.zeros_like(start)
    batches = [Batches(corpus.train, r, world, 8, 64, seed) for r in range(world)]
    drops = torch.Generator().manual_seed(1000 + seed)  # the loss realisation

    def arrivals(lossy: bool) -> torch.Tensor:
        """[rank, element]: whether the rank's packet over that link arrived (a rank's own
        shard always does)."""
        if not lossy:
            return torch.ones(world, start.numel(), dtype=torch.bool)
        kept = (torch.rand(world, len(bounds), generator=drops) >= p) | own_link
        return kept[:, packet_of]

    for step in range(steps):
        rate = schedule.lr_at(step, steps, lr, "cosine")
        grads = []
        for r in range(world):
            models.load_flat(model, replicas[r])
            inputs, targets = batches[r].next()
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            model.zero_grad(set_to_none=True)
            loss.backward()
            grads.append(torch.cat([q.grad.reshape(-1) for q in model.parameters()]))
        arrived = arrivals(reduce_loss)  # the reduce stage: received-mean per element
        mean = (torch.stack(grads) * arrived).sum(dim=0) / arrived.sum(dim=0)
        momentum.mul_(0.9).add_(mean)
        owners.sub_(rate * momentum)
        received = arrivals(broadcast_loss)  # the broadcast: stale where a packet is lost
        replicas = torch.where(received, owners, replicas)
    models.load_flat(model, owners)
    return evaluate(model, corpus.heldout, tok.token_bytes).ppl


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--loss", type=float, default=0.1)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    documents, source = load_documents(None, None)
    tok, corpus = prepare(documents, source, "bpe", 64)
    deltas = {case: [] for case in CASES if case != "none"}
    for seed in range(args.seeds):
        base = train(tok, corpus, seed, args.steps, args.lr, args.loss, False, False)
        print(f"seed {seed} none: ppl {base:.1f}", flush=True)
        for case, (red, bc) in CASES.items():
            if case == "none":
                continue
            ppl = train(tok, corpus, seed, args.steps, args.lr, args.loss, red, bc)
            deltas[case].append((ppl / base - 1) * 100)
            print(f"seed {seed} {case}: ppl {ppl:.1f}, Δppl {deltas[case][-1]:+.2f}%",
                  flush=True)
    for case, ds in deltas.items():
        print(f"{case:>9}: mean Δppl {statistics.fmean(ds):+.2f}% over {len(ds)} seeds "
              f"({', '.join(f'{d:+.2f}' for d in ds)})")


if __name__ == "__main__":
    main()
