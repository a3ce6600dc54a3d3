"""bounded_drift and rps return real torch optimizers (#56, item 1): each wraps the user's own
optimizer instance, keeps its param_groups (learning rates, weight decays), works with LR
schedulers, GradScaler and zero_grad, and its state_dict round-trips: a resumed run goes on
bit for bit. Run on a lossless stand-in for the collectives (ranks as threads, the exact
mean), so what is tested is the optimizer's side alone; the lossy transport under these
wrappers is tested on namespace hosts (tests/netns/test_lossbed_run.py)."""

from __future__ import annotations

import io
import threading
from types import SimpleNamespace

import pytest
import torch

from harness.collectives.layout import Layout
from harness.ddp.amp import SkipsDisagree
from harness.ddp.rps import RPSOptimizer
from harness.ddp.sharded import SchemeRefusal, ShardedOptimizer

PER_PACKET = 16  # floats per packet: small, so shards cut through parameters and groups


class LosslessWorld:
    """What every rank of a job sees when nothing is lost: the exact mean, each shard's
    owner's parameters everywhere."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list = [None] * world

    def exchange(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = tensor.clone()
        self.barrier.wait()
        everyone = list(self.slots)
        self.barrier.wait()  # (nobody writes the next step's slot before all have read)
        return everyone


class ShardedMember:
    def __init__(self, world: LosslessWorld, rank: int):
        self.w, self.rank, self.world = world, rank, world.world
        self.transport = SimpleNamespace(per_packet=PER_PACKET)

    def sharded_update(self, grads, params, step_fn):
        layout = Layout(grads.numel(), self.world, PER_PACKET)
        start, end = layout.shard_bounds(self.rank)
        mean = torch.stack(self.w.exchange(self.rank, grads)).mean(0)
        step_fn(start, end, mean[start:end].clone())
        owners = self.w.exchange(self.rank, params)
        for r in range(self.world):
            s, e = layout.shard_bounds(r)
            params[s:e] = owners[r][s:e]

    def resync(self, params):
        """Every owner's shard of `params` to every rank (reliably)."""
        layout = Layout(params.numel(), self.world, PER_PACKET)
        owners = self.w.exchange(self.rank, params)
        for r in range(self.world):
            s, e = layout.shard_bounds(r)
            params[s:e] = owners[r][s:e]


class RPSMember:
    def __init__(self, world: LosslessWorld, rank: int):
        self.w, self.rank = world, rank

    def average(self, flat):
        flat.copy_(torch.stack(self.w.exchange(self.rank, flat)).mean(0))


def run_ranks(world: int, body) -> list:
    """body(rank) on `world` threads; their results, or the first error raised."""
    results, errors = [None] * world, []

    def one(rank):
        try:
            results[rank] = body(rank)
        except BaseException as err:  # noqa: BLE001 (re-raised below, on the test's thread)
            errors.append(err)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


_GLOBAL_SEED = threading.Lock()


def model() -> torch.nn.Module:
    """The same initial model on every rank (the ranks are threads: torch's global
    generator is theirs to share one at a time)."""
    with _GLOBAL_SEED:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.Tanh(),
                                   torch.nn.Linear(12, 3))


def groups(m: torch.nn.Module, optimizer=torch.optim.AdamW):
    """Weight decay on the matrices only, and another learning rate for the biases: the
    groups a real LLM script makes."""
    decay = [p for n, p in m.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in m.named_parameters() if n.endswith("bias")]
    return optimizer([{"params": decay, "weight_decay": 0.1},
                      {"params": no_decay, "weight_decay": 0.0, "lr": 0.02}], lr=0.01)


def batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(5, 8, generator=gen)
    return x, x[:, :3].sin()


def loss_of(m, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.mse_loss(m(x), y)


def reference(world: int, steps: int, optimizer=torch.optim.AdamW,
              clip: float | None = None, norms: list | None = None) -> torch.Tensor:
    """Reliable data-parallel training: the mean of the ranks' gradients, one optimizer;
    clip: clip_grad_norm_ on that mean, as a DDP script clips (norms: each step's norm)."""
    m = model()
    opt = groups(m, optimizer)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    for step in range(steps):
        grads = []
        for rank in range(world):
            m.zero_grad()
            loss_of(m, rank, step).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        for i, p in enumerate(m.parameters()):
            p.grad = torch.stack([g[i] for g in grads]).mean(0)
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            if norms is not None:
                norms.append(float(norm))
        opt.step()
        sched.step()
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def flat(m) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def train_bounded_drift(world: int, steps: int, *, stop_after: int | None = None,
                        scaler: bool = False, tell_scaler: bool = True,
                        overflow: tuple[int, int] | None = None, scheme: str = "drift",
                        clip: float | None = None, local_clip: float | None = None):
    """Each rank's (model, optimizer, scheduler) trained with bounded_drift's optimizer (or
    rps's). stop_after: save each rank's state there, build everything anew, load it and go
    on. scaler: under a GradScaler (given to the optimizer unless not tell_scaler);
    overflow=(rank, step): that rank's gradients are infinite at that step. clip: the
    wrapper's clip_grad_norm; local_clip: clip_grad_norm_ in the script, on this rank's own
    gradient (what a DDP script did under bounded_drift before #66)."""
    shared = LosslessWorld(world)

    def build(rank, amp):
        m = model()
        given = amp if tell_scaler else None
        agree = AgreeingMember(shared, rank).any
        if scheme == "rps":
            opt = RPSOptimizer(m, groups(m, torch.optim.SGD), RPSMember(shared, rank),
                               scaler=given, agree=agree)
        else:
            opt = ShardedOptimizer(m, groups(m), ShardedMember(shared, rank), scaler=given,
                                   agree=agree, clip_grad_norm=clip,
                                   sum_over=AgreeingMember(shared, rank).sum)
        return m, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)

    def body(rank):
        amp = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if scaler else None
        m, opt, sched = build(rank, amp)
        for step in range(steps):
            if step == stop_after:
                saved = io.BytesIO()
                torch.save({"model": m.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict()}, saved)
                saved.seek(0)
                state = torch.load(saved, weights_only=False)
                m, opt, sched = build(rank, amp)
                m.load_state_dict(state["model"])
                opt.load_state_dict(state["opt"])
                sched.load_state_dict(state["sched"])
            loss = loss_of(m, rank, step)
            if overflow == (rank, step):
                loss = loss * float("inf")
            opt.zero_grad(set_to_none=step % 2 == 0)
            if amp is None:
                loss.backward()
                if local_clip is not None:
                    torch.nn.utils.clip_grad_norm_(m.parameters(), local_clip)
                opt.step()
            else:
                amp.scale(loss).backward()
                amp.step(opt)
                amp.update()
            sched.step()
        return m, opt, amp

    return [(m, opt) if not scaler else (m, opt, amp)
            for m, opt, amp in run_ranks(world, body)]


class AgreeingMember:
    """The reliable agreement of a flag (GradScaler's skips) among the thread ranks."""

    def __init__(self, world: LosslessWorld, rank: int):
        self.w, self.rank = world, rank

    def any(self, flag: bool) -> bool:
        return bool(torch.stack(self.w.exchange(self.rank, torch.tensor(float(flag)))).max())

    def sum(self, value: float) -> float:
        return float(torch.stack(self.w.exchange(
            self.rank, torch.tensor(value, dtype=torch.float64))).sum())


def test_bounded_drift_is_a_torch_optimizer_with_the_users_groups():
    shared = LosslessWorld(1)
    m = model()
    user = groups(m)
    opt = ShardedOptimizer(m, user, ShardedMember(shared, 0))
    assert isinstance(opt, torch.optim.Optimizer)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.02]
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
    assert opt.param_groups[0]["params"][0] is m[0].weight


@pytest.mark.parametrize("world", [2, 3])
def test_bounded_drift_trains_the_reliable_model_with_groups_and_a_scheduler(world):
    """Lossless, with weight decay on the matrices alone, the biases at their own learning
    rate and a cosine schedule over both: every rank ends with the model reliable
    data-parallel training makes (to float rounding: the same arithmetic, per element)."""
    expected = reference(world, 8)
    for m, opt in train_bounded_drift(world, 8):
        assert torch.allclose(flat(m), expected, rtol=0, atol=1e-6)
        assert opt.param_groups[1]["lr"] < 0.02 * 0.1  # the schedule reached the groups


@pytest.mark.parametrize("world", [2, 3])
def test_clipping_under_bounded_drift_is_ddps_clipping_of_the_reduced_gradient(world):
    """Lossless, bounded_drift(clip_grad_norm=C) ends with the model reliable DDP makes with
    clip_grad_norm_(C) after backward (to float rounding); clip_grad_norm_ in the script
    under bounded_drift clips each rank's own gradient, and ends elsewhere (#66)."""
    norms: list[float] = []
    expected = reference(world, 8, clip=0.05, norms=norms)
    assert sum(n > 0.05 for n in norms) >= 4  # the clip acted on most steps
    assert not torch.allclose(expected, reference(world, 8), atol=1e-4)  # and mattered
    for m, opt in train_bounded_drift(world, 8, clip=0.05):
        assert torch.allclose(flat(m), expected, rtol=0, atol=1e-6)
        assert opt.last_grad_norm == pytest.approx(norms[-1], rel=1e-5)
    for m, _ in train_bounded_drift(world, 8, local_clip=0.05):
        assert not torch.allclose(flat(m), expected, atol=1e-4)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1"])
def test_a_clip_that_is_not_a_positive_norm_is_refused(bad):
    shared = LosslessWorld(1)
    m = model()
    with pytest.raises(ValueError, match="clip_grad_norm="):
        ShardedOptimizer(m, groups(m), ShardedMember(shared, 0), clip_grad_norm=bad)


def test_lost_groups_would_show():
    """The check above can fail: the same two ranks, data and schedule, with one group for
    all (the old flattening: weight decay 0.1 and lr 0.01 on the biases too) train another
    model, and with the groups kept, the reliable one (the control: nothing else differs).
    It used to train one rank on one rank's data against two, which differs whatever the
    groups (#71)."""
    expected = reference(2, 8)

    def trained(one_group: bool) -> list[torch.Tensor]:
        shared = LosslessWorld(2)

        def body(rank):
            m = model()
            user = (torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1)
                    if one_group else groups(m))
            opt = ShardedOptimizer(m, user, ShardedMember(shared, rank))
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)
            for step in range(8):
                opt.zero_grad()
                loss_of(m, rank, step).backward()
                opt.step()
                sched.step()
            return flat(m)

        return run_ranks(2, body)

    assert all(torch.allclose(f, expected, rtol=0, atol=1e-6) for f in trained(False))
    assert not any(torch.allclose(f, expected, atol=1e-4) for f in trained(True))


@pytest.mark.parametrize("world", [2, 3])
def test_bounded_drift_resumes_from_each_ranks_checkpoint_bit_for_bit(world):
    uninterrupted = train_bounded_drift(world, 8)
    resumed = train_bounded_drift(world, 8, stop_after=4)
    for (a, _), (b, opt) in zip(uninterrupted, resumed, strict=True):
        assert torch.equal(flat(a), flat(b))
        assert opt.steps == 8


def test_bounded_drift_steps_under_gradscaler():
    expected = reference(2, 6)
    for m, _, _ in train_bounded_drift(2, 6, scaler=True):
        assert torch.allclose(flat(m), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scheme", ["drift", "rps"])
def test_an_overflow_on_one_rank_is_skipped_by_every_rank(scheme):
    """Rank 1's gradients overflow at step 2: both ranks skip that step (without the
    agreement rank 0 would step into a collective rank 1 skipped: here a barrier that
    never fills), both scales back off alike, and both models stay one model."""
    ranks = train_bounded_drift(2, 5, scaler=True, overflow=(1, 2), scheme=scheme)
    (m0, _, amp0), (m1, _, amp1) = ranks
    assert amp0.get_scale() == amp1.get_scale() == 2.0 ** 7  # backed off once, on both
    assert torch.equal(flat(m0), flat(m1))
    assert all(torch.isfinite(flat(m)).all() for m in (m0, m1))


def test_a_gradscaler_lossbed_was_not_given_is_refused_with_the_call_to_write():
    with pytest.raises(SkipsDisagree, match=r"bounded_drift\(model, optimizer, scaler=scaler\)"):
        train_bounded_drift(1, 2, scaler=True, tell_scaler=False)


def test_the_lossy_hook_makes_every_ranks_last_bucket_not_finite_where_one_was():
    from harness.ddp.hooks import agree_on_skips

    state = SimpleNamespace(agree=lambda flag: True, not_finite=False)  # another rank's was
    first, last = torch.ones(4), torch.ones(3)
    agree_on_skips(state, first, last=False)
    agree_on_skips(state, last, last=True)
    assert torch.isfinite(first).all() and torch.isnan(last).all()
    state.agree = lambda flag: flag  # every rank finite: nothing changed, the flag reset
    kept = torch.ones(3)
    agree_on_skips(state, kept, last=True)
    assert torch.isfinite(kept).all() and state.not_finite is False


def test_what_bounded_drift_cannot_do_is_refused_with_the_reason():
    shared = LosslessWorld(1)
    member = ShardedMember(shared, 0)
    m = model()
    with pytest.raises(SchemeRefusal, match=r"not its class: bounded_drift\(model, AdamW\("):
        ShardedOptimizer(m, torch.optim.AdamW, member)
    with pytest.raises(SchemeRefusal, match="LBFGS steps with a closure"):
        ShardedOptimizer(m, torch.optim.LBFGS(m.parameters()), member)
    stepped = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    loss_of(m, 0, 0).backward()
    stepped.step()
    with pytest.raises(SchemeRefusal, match="has state already"):
        ShardedOptimizer(m, stepped, member)
    opt = ShardedOptimizer(m, groups(m), member)
    with pytest.raises(SchemeRefusal, match="takes no closure"):
        opt.step(lambda: 0.0)
    with pytest.raises(SchemeRefusal, match="before wrapping"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(SchemeRefusal, match="not saved by bounded_drift"):
        opt.load_state_dict(groups(model()).state_dict())


class LaidOut(ShardedMember):
    """A rank of `world` that is laid out and never exchanges anything."""

    def __init__(self, rank: int, world: int):
        self.w, self.rank, self.world = None, rank, world
        self.transport = SimpleNamespace(per_packet=PER_PACKET)


def test_another_ranks_shard_is_refused_naming_both_ranks():
    saved = {}
    for rank in (0, 1):
        m = model()
        saved[rank] = ShardedOptimizer(m, groups(m), LaidOut(rank, 2)).state_dict()
    m = model()
    mine = ShardedOptimizer(m, groups(m), LaidOut(0, 2))
    with pytest.raises(SchemeRefusal, match="rank 1's shard of 2 ranks; this is rank 0 of 2"):
        mine.load_state_dict(saved[1])
    mine.load_state_dict(saved[0])
    assert mine.param_groups[0]["params"][0] is m[0].weight


def train_rps(world: int, steps: int, stop_after: int | None = None,
              clip: float | None = None):
    shared = LosslessWorld(world)

    def build(rank):
        m = model()
        opt = RPSOptimizer(m, groups(m, torch.optim.SGD), RPSMember(shared, rank),
                           clip_grad_norm=clip, mean_over=lambda t, rank=rank: torch.stack(
                               shared.exchange(rank, t)).mean(0))
        return m, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)

    def body(rank):
        m, opt, sched = build(rank)
        for step in range(steps):
            if step == stop_after:
                state = {"model": m.state_dict(), "opt": opt.state_dict(),
                         "sched": sched.state_dict()}
                m, opt, sched = build(rank)
                m.load_state_dict(state["model"])
                opt.load_state_dict(state["opt"])
                sched.load_state_dict(state["sched"])
            opt.zero_grad()
            loss_of(m, rank, step).backward()
            opt.step()
            sched.step()
        return m, opt

    return run_ranks(world, body)


def test_rps_is_the_users_optimizer_then_the_average():
    shared = LosslessWorld(1)
    m = model()
    user = groups(m, torch.optim.SGD)
    opt = RPSOptimizer(m, user, RPSMember(shared, 0))
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is user.param_groups and opt.state is user.state
    # a linear optimizer (plain SGD): averaging models is averaging gradients
    expected = reference(3, 6, torch.optim.SGD)
    for trained, _ in train_rps(3, 6):
        assert torch.allclose(flat(trained), expected, rtol=0, atol=1e-6)


def test_clipping_under_rps_is_ddps_clipping_of_the_mean_gradient():
    """RPS has no reduced gradient; rps(..., clip_grad_norm=C) clips each rank's own by the
    ranks' mean gradient's norm (reduced reliably for it): lossless under SGD it ends with
    DDP's model under clip_grad_norm_(C) (#66: clipping means DDP's under every scheme)."""
    norms: list[float] = []
    expected = reference(3, 6, torch.optim.SGD, clip=0.05, norms=norms)
    assert sum(n > 0.05 for n in norms) >= 3  # the clip acted
    assert not torch.allclose(expected, reference(3, 6, torch.optim.SGD), atol=1e-4)
    for trained, opt in train_rps(3, 6, clip=0.05):
        assert torch.allclose(flat(trained), expected, rtol=0, atol=1e-6)
        assert opt.last_grad_norm == pytest.approx(norms[-1], rel=1e-5)


def test_rps_resumes_bit_for_bit_and_refuses_a_closure():
    uninterrupted = train_rps(2, 6)
    resumed = train_rps(2, 6, stop_after=3)
    for (a, _), (b, opt) in zip(uninterrupted, resumed, strict=True):
        assert torch.equal(flat(a), flat(b))
        assert opt.param_groups is opt.inner.param_groups  # (still shared after loading)
    with pytest.raises(SchemeRefusal, match="takes no closure"):
        opt.step(lambda: 0.0)


def test_the_rate_lossbeds_own_schedule_sets_is_the_rate_a_step_uses():
    """harness/train/schedule.set_lr writes the wrapper's groups (once it wrote the inner
    optimizer's, which bounded_drift now overwrites from the user's groups every step)."""
    from harness.train import schedule

    m = model()
    opt = ShardedOptimizer(m, groups(m), ShardedMember(LosslessWorld(1), 0))
    before = flat(m)
    schedule.set_lr(opt, 0.0)
    loss_of(m, 0, 0).backward()
    opt.step()
    assert torch.equal(flat(m), before)  # a rate of 0 (and decay scaled by it) moves nothing


def test_the_replicas_drift_is_measured_against_the_model_they_are_bounded_by():
    """What lossbed run reports as the replicas' drift (#66): 0 where nothing was lost; a
    replica whose copy of another rank's shard went stale is that far from the owners'."""
    world = 2
    trained = train_bounded_drift(world, 3)
    assert run_ranks(world, lambda rank: trained[rank][1].replica_drift()) == [0.0, 0.0]
    opt0, opt1 = trained[0][1], trained[1][1]
    start, end = opt1.shard  # rank 0 misses rank 1's last broadcast: its old values there
    stale = opt0.flat_params.clone()
    opt0.flat_params[start:end] += 0.5
    drifts = run_ranks(world, lambda rank: trained[rank][1].replica_drift())
    owners = stale
    expected = float((opt0.flat_params - owners).norm() / owners.norm())
    assert drifts[0] == pytest.approx(expected) and drifts[0] > 0.01
    assert drifts[1] == 0.0
    # rps: against the ranks' mean model; one replica moved is that far from the mean
    shared = LosslessWorld(world)
    models = [model() for _ in range(world)]
    rps = [RPSOptimizer(m, torch.optim.SGD(m.parameters(), lr=0.1), RPSMember(shared, r))
           for r, m in enumerate(models)]

    def rps_drift(rank):
        return rps[rank].replica_drift(lambda mine: torch.stack(
            shared.exchange(rank, mine)).mean(0))

    assert run_ranks(world, rps_drift) == [0.0, 0.0]
    with torch.no_grad():
        models[1][0].bias += 1.0
    both = [flat(m) for m in models]
    mean = (both[0] + both[1]) / 2
    assert run_ranks(world, rps_drift) == pytest.approx(
        [float((b - mean).norm() / mean.norm()) for b in both])

