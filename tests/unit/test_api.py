"""harness.api, the public face for a user's own training script: its bad set-ups refused
with what to change (no process group, a world of one, no job key, a model not wrapped in
DDP), without any network (the process group is stood in for)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import harness.api as lossbed
from harness.rank_protocol import KEY as KEY_ENV


@pytest.fixture
def fake_group(monkeypatch):
    """dist as a job of `world` ranks would answer (no process group is made)."""

    def make(world: int):
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda: 0)
        monkeypatch.setattr(dist, "get_world_size", lambda: world)

    return make


def test_without_a_process_group_the_fix_is_named(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(lossbed.LossbedSetupError, match="init_process_group"):
        lossbed.Job()


def test_a_world_of_one_is_refused(fake_group):
    fake_group(1)
    with pytest.raises(lossbed.LossbedSetupError, match="2 or more ranks"):
        lossbed.Job()


def test_without_the_job_key_the_datagrams_would_go_unsealed_and_it_says_so(
        fake_group, monkeypatch):
    fake_group(2)
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(lossbed.LossbedSetupError) as err:
        lossbed.Job()
    assert "LOSSBED_KEY" in str(err.value) and "sealed=False" in str(err.value)


def test_verbs_semantics_are_refused_by_name(fake_group, monkeypatch):
    fake_group(2)
    monkeypatch.setenv(KEY_ENV, "ab" * 32)
    with pytest.raises(lossbed.LossbedSetupError, match="verbs-uc"):
        lossbed.Job(lossbed.Options(transport="verbs-uc"))


@pytest.mark.parametrize("call", ["reliable", "lossy_gradients", "bounded_drift", "rps"])
def test_a_model_not_wrapped_in_ddp_is_refused(call):
    job = object.__new__(lossbed.Job)  # (its transport is not reached)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    args = {"reliable": (model,), "lossy_gradients": (model,),
            "bounded_drift": (model, optimizer), "rps": (model, optimizer)}[call]
    with pytest.raises(TypeError, match="DistributedDataParallel.*model = DDP"):
        getattr(job, call)(*args)


def test_report_refuses_what_cannot_be_written():
    job = object.__new__(lossbed.Job)
    job._script = {}
    job.report(ppl=12.5, steps=3)
    assert job._script == {"ppl": 12.5, "steps": 3}
    with pytest.raises(TypeError):
        job.report(model=torch.nn.Linear(1, 1))


def test_the_gradients_stay_local_where_lossbed_reduces_them_itself(monkeypatch):
    """bounded_drift and rps turn DDP's own reduction off (as no_sync does, for good): a
    backward leaves each rank's gradients as they are. (A one-rank gloo group in a file.)"""
    import tempfile

    from torch.nn.parallel import DistributedDataParallel as DDP

    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
        try:
            model = DDP(torch.nn.Linear(3, 1))
            lossbed._keep_gradients_local(model)
            model(torch.ones(2, 3)).sum().backward()
            assert torch.equal(model.module.weight.grad, torch.full((1, 3), 2.0))
            assert model.require_backward_grad_sync is False
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("call", ["bounded_drift", "rps"])
def test_an_optimizer_class_is_refused_with_the_call_to_write(call):
    """The old shape, bounded_drift(model, torch.optim.AdamW, lr=...): refused, naming the
    instance to pass, before the model's DDP is changed."""
    from harness.ddp.sharded import SchemeRefusal

    job = object.__new__(lossbed.Job)
    with pytest.raises(SchemeRefusal, match=rf"{call}\(model, SGD\(model.parameters\(\)"):
        getattr(job, call)(torch.nn.Linear(2, 2), torch.optim.SGD)
