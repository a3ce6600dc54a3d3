"""The controller's side of the run boundaries: a run's profile is applied when its model is
built and wrapped, not before. DDP's construction broadcasts rank 0's parameters over gloo
(TCP); when the profile came before it, a run at 30% loss held ranks in that broadcast for
over 60 s (TCP's backoff) and the first step's alignment named them lost (CI, twice)."""

from __future__ import annotations

import pytest

from harness.rank_protocol import STOP, Boundary, RunResult, mark, marks, run_results
from harness.train import run


def test_the_profile_is_applied_when_the_run_is_ready_and_cleared_when_it_has_trained(
        monkeypatch):
    events = []
    monkeypatch.setattr(run.engine, "apply", lambda cluster, *plan: events.append(
        ("apply", plan[0])))
    monkeypatch.setattr(run.engine, "clear", lambda cluster: events.append(("clear",)))
    monkeypatch.setattr(run.verify, "read", lambda cluster: {"read": len(events)})
    monkeypatch.setattr(run.verify, "report", lambda cluster, end, start: (start, end))
    monkeypatch.setattr(run.verify, "measure_coverage", lambda cluster, end, start, *how: None)

    class Plan:
        profile = "lossy"

    runs = [run.Run(None, "random-loss", loss=0.3)]
    boundaries = run._Boundaries(object(), runs, {runs[0].network: (Plan(),)})
    assert boundaries.answer(Boundary(0).line()) == "go 0"
    assert events == []  # setup (DDP's broadcast) runs on a clean network
    assert boundaries.answer(Boundary(0, "ready").line()) == "go 0 ready"
    assert events[0][0] == "apply"
    assert boundaries.answer(Boundary(0, "trained").line()) == "go 0 trained"
    assert events[-1] == ("clear",) and boundaries.windows[0] is not None
    assert boundaries.answer(Boundary(1).line()) == "go 1"  # after the last
    assert len(events) == 2
    assert boundaries.error is None


def test_a_runs_wall_time_is_the_gap_between_its_start_boundary_and_the_next(monkeypatch):
    """The bench prices a seed from its runs' wall times (setup and evaluation included)."""
    monkeypatch.setattr(run.engine, "apply", lambda cluster, *plan: None)
    monkeypatch.setattr(run.engine, "clear", lambda cluster: None)
    monkeypatch.setattr(run.verify, "read", lambda cluster: {})
    monkeypatch.setattr(run.verify, "report", lambda cluster, end, start: None)
    monkeypatch.setattr(run.verify, "measure_coverage", lambda cluster, end, start, *how: None)
    clock = iter([100.0, 130.5, 172.0])
    monkeypatch.setattr(run.time, "monotonic", lambda: next(clock))

    class Plan:
        profile = "clean"

    runs = [run.Run(None), run.Run(None)]
    boundaries = run._Boundaries(object(), runs, {("clean", ()): (Plan(),)})
    for index in range(2):
        for phase in ("start", "ready", "trained"):
            boundaries.answer(Boundary(index, phase).line())
    assert boundaries.run_s(0) == 30.5
    assert boundaries.run_s(1) is None  # its end has not come yet
    boundaries.answer(Boundary(2).line())
    assert boundaries.run_s(1) == 41.5


def test_the_boundary_its_answer_and_the_runs_result_are_declared_messages():
    """#68 item 3: what rank 0 of the worker says at a boundary and after a run, and the
    controller's answers, are declared in harness/rank_protocol.py beside their readers."""
    said = Boundary(3, "ready")
    assert Boundary.read(said.line()) == said and said.go() == "go 3 ready"
    assert Boundary.read(Boundary(4).line()).go() == "go 4"
    assert Boundary.read("[run 1/2] step 3/10 loss 4.2") is None
    assert Boundary.read('{"boundary": 0}') is None  # (the old undeclared form)

    with pytest.raises(ValueError, match="phase is one of start, ready, trained"):
        Boundary(0, "done")
    assert STOP == "stop"
    first, second = (RunResult(**{**RESULT, "index": 0, "ppl": 9.5}),
                     RunResult(**{**RESULT, "index": 1, "ppl": 9.1}))
    lines = ["progress", mark("lossbed_run_result", first.to_dict()),
             Boundary(1).line(), mark("lossbed_run_result", second.to_dict()),
             mark("rank_metrics", {"rank": 0})]
    assert run_results(marks(lines)) == [first, second]
    # a result without a field the record needs is refused, by name, not read as a gap
    short = {k: v for k, v in first.to_dict().items() if k != "model_sha"}
    with pytest.raises(TypeError, match="model_sha"):
        run_results(marks([mark("lossbed_run_result", short)]))


# One run's result as rank 0 says it (every field of RunResult)
RESULT = dict(index=0, headline="rank0", ppl=9.5, ppl_rank0=9.5, ppl_ranks=[9.5, 9.6],
              ppl_rank_mean=9.55, ppl_rank_worst=9.6, ppl_average_model=9.4, ppl_owners=None,
              ce_per_token=2.25, bits_per_byte=1.1, bytes_per_token=2.9, eval_tokens=4096,
              drift=0.01, parameters=460_000, corpus="stdlib-docs", corpus_sha="ab",
              split_sha="cd", heldout_windows=64, heldout_dropped=0, tokenizer="bpe-512",
              vocab_size=512, epochs=1, model_sha="ef")


def test_progress_is_a_declared_message_shown_as_text_or_read_by_its_fields():
    """#68 item 3: rank 0's progress travels as rank_protocol.Progress, and the bench reads
    its run number from the field (it parsed "[run 3/6 ..." back from the text before)."""
    from harness.rank_protocol import Progress

    said = Progress(run=2, runs=6, variant="rps", seed=3, step=40, steps=150, loss=4.25,
                    tokens_per_s=812.4, eta_s=95.2)
    assert Progress.read(said.line()) == said
    assert said.text() == ("[run 3/6 rps seed 3] step 40/150 loss 4.250 812 tok/s, about 95 s "
                           "left in this run")
    assert Progress.read(Boundary(1).line()) is None and Progress.read("warning: x") is None
    shown, read = [], []
    to_echo = run._progress_to(shown.append, None)
    to_echo(said.line())
    to_echo("a library's warning")
    assert shown == [said.text(), "a library's warning"]
    to_bench = run._progress_to(shown.append, read.append)
    to_bench(said.line())
    assert read == [said] and len(shown) == 2
