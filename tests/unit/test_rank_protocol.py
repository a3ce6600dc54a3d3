"""The rank protocol (harness/rank_protocol.py): what a rank is told, written by every
launcher and read by every rank through one record; what it reports, as marked lines and
typed records; and no other module of harness/ reading LOSSBED_* or torchrun's variables."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import launch, rank_protocol, torchrun
from harness.rank_protocol import ControllerEnv, RankEnv, ScriptRankMetrics, TrainRankMetrics
from testbed.errors import UsageError

HARNESS = Path(__file__).resolve().parents[2] / "harness"


def test_what_a_launcher_writes_is_what_a_rank_reads():
    told = RankEnv(rank=2, world=4, local_rank=1, master_addr="10.0.0.1", master_port=29400,
                   key="ab" * 32, transport="roce-uc:4096", address="10.0.0.3", mtu=9000,
                   segmentation=True, metrics_dir="/m", gate="/g", host="h3", job="j1",
                   work_local=False, drop_mask="7:0.1", backend="nccl", rdma_device="rxe0")
    assert RankEnv.from_env(told.to_env()) == told


def test_an_empty_environment_reads_as_the_one_set_of_defaults():
    told = RankEnv.from_env({})
    assert told == RankEnv()
    assert (told.transport, told.mtu, told.backend, told.local_rank) == ("udp", 1500, "gloo", 0)
    assert told.key is None and told.work_local and not told.segmentation
    # a rank cannot start without its place: the missing variables are named
    with pytest.raises(SystemExit, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        told.required()


@pytest.mark.parametrize("name", ["LOSSBED_MTU", "RANK", "MASTER_PORT", "LOCAL_RANK"])
def test_a_number_that_is_not_one_is_refused_naming_its_variable(name):
    with pytest.raises(UsageError, match=name):
        RankEnv.from_env({name: "fifteen hundred"})


def test_the_controllers_choices_are_checked_and_forwarded_as_given():
    chosen = ControllerEnv.from_env({"LOSSBED_DROP_MASK": "7:0.1", "LOSSBED_BACKEND": "nccl",
                                     "LOSSBED_CHECKPOINTS": "/c"})
    assert chosen.check().forwarded() == {"LOSSBED_DROP_MASK": "7:0.1",
                                          "LOSSBED_BACKEND": "nccl"}
    assert chosen.checkpoints == "/c"
    with pytest.raises(UsageError, match="LOSSBED_BACKEND"):
        ControllerEnv.from_env({"LOSSBED_BACKEND": "mpi"}).check()
    with pytest.raises(UsageError, match="LOSSBED_DROP_MASK"):
        ControllerEnv.from_env({"LOSSBED_DROP_MASK": "often"}).check()


def test_marks_are_read_back_and_anything_else_is_output():
    line = rank_protocol.mark(rank_protocol.METRICS_MARK, {"rank": 1, "world": 2})
    assert rank_protocol.read_mark(line) == (rank_protocol.METRICS_MARK,
                                             {"rank": 1, "world": 2})
    for other in ('{"loss": 1.2}', '{"lossbed_joined": 1, "x": 2}', "{not json",
                  "step 3 loss 4.1", '{"lossbed_other": 1}', "[1, 2]"):
        assert rank_protocol.read_mark(other) is None, other


@pytest.mark.parametrize("record", [ScriptRankMetrics, TrainRankMetrics])
def test_the_metrics_records_survive_their_json_and_refuse_another_shape(record):
    made = record(rank=1, world=2) if record is ScriptRankMetrics else record(rank=1)
    again = record.from_dict({**made.to_dict(), "added_by_a_later_version": 1})
    assert again == made
    with pytest.raises(TypeError):
        record.from_dict([1, 2])
    with pytest.raises(TypeError):
        record.from_dict({})  # no rank


def test_a_torchrun_job_that_prints_a_broken_metrics_mark_keeps_it_as_output():
    import io

    from harness.job_output import Job

    job, out = Job(Path("/nonexistent")), io.StringIO()
    job.take(rank_protocol.mark(rank_protocol.METRICS_MARK, {"world": 2}), out)  # no rank
    job.take(rank_protocol.mark(rank_protocol.METRICS_MARK, {"rank": 0, "world": 2}), out)
    job.take(rank_protocol.mark(rank_protocol.JOINED_MARK, {"world": 2}), out)
    assert [m.rank for m in job.metrics] == [0] and job.joined.is_set()
    assert "lossbed_rank_metrics" in out.getvalue()


def test_a_failed_job_says_in_one_line_which_rank_on_which_host_and_why(tmp_path):
    """The torchrun tracebacks (110-174 lines) go to each host's log file; the last line
    names the rank, its host and the error's last line, and where the logs are (#66)."""
    import io

    from harness.job_output import Job

    job = Job(tmp_path / "logs")
    traceback = ["Traceback (most recent call last):", '  File "train.py", line 3',
                 "RuntimeError: rank one gives up", "[W1207 socket.cpp:207] [c10d] noise",
                 "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                 "train.py FAILED"]
    job.pump(io.StringIO("".join(line + "\n" for line in traceback)), io.StringIO(), "h2")
    assert (tmp_path / "logs" / "h2.log").read_text().splitlines() == traceback
    assert job.failure_line(0, ["h1", "h2"]) is None
    # a script without harness.api: the last line that reads as an error (not torchrun's
    # own ChildFailedError), on its host
    assert job.failure_line(1, ["h1", "h2"]) == (
        "failed (exit 1): on h2: RuntimeError: rank one gives up; every host's output: "
        f"{tmp_path / 'logs'}/")
    # a rank that said what ended it (harness.api's error mark) is named first
    job.take(rank_protocol.mark(rank_protocol.ERROR_MARK, {
        "rank": 1, "host": "h2", "error": "RuntimeError: rank one gives up"}), io.StringIO())
    assert job.failure_line(1, ["h1", "h2"]) == (
        "failed: rank 1 on h2: RuntimeError: rank one gives up; every host's output: "
        f"{tmp_path / 'logs'}/")


def _cluster():
    return SimpleNamespace(
        name="c1", mtu=1400, shares_this_machine=True,
        hosts=[SimpleNamespace(name=f"h{i + 1}", address=f"10.0.0.{i + 1}", ifname="eth0",
                               gpus=0, project=Path("/p")) for i in range(3)],
        rank_python=lambda host: "python3")


def test_both_launchers_tell_a_rank_through_the_protocol(monkeypatch):
    monkeypatch.setenv("LOSSBED_DROP_MASK", "7:0.1")
    monkeypatch.delenv("LOSSBED_BACKEND", raising=False)
    told = RankEnv.from_env(launch.rank_env(_cluster(), 1))
    assert (told.rank, told.world, told.master_addr, told.address, told.mtu) == (
        1, 3, "10.0.0.1", "10.0.0.2", 1400)
    assert told.drop_mask == "7:0.1" and told.backend == "gloo"
    from testbed.profiles.model import Profile

    profile = Profile.model_validate({"name": "p", "direction": "ingress", "impairment": {
        "loss": {"model": "bernoulli", "loss_pct": 10}}})
    made = torchrun.commands(_cluster(), torchrun.RunSpec(command=["torchrun", "job.py"]),
                             torchrun.Checked([], ["job.py"], profile), "job1", "cd" * 32,
                             "/tmp/gate", None)
    told = RankEnv.from_env(made[2].env)
    assert (told.job, told.host, told.address, told.key, told.gate) == (
        "job1", "h3", "10.0.0.3", "cd" * 32, "/tmp/gate")
    assert told.segmentation and told.rank is None  # torchrun gives the places
    assert told.drop_mask == "7:0.1" and told.metrics_dir is None


AGENT_REPORT = [
    "Traceback (most recent call last):",
    '  File "/v/bin/torchrun", line 8, in <module>',
    "    sys.exit(main())",
    '  File "/v/lib/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "  exitcode  : 1 (pid: 12)",
    "============================================================"]
SCRIPTS_OWN = [
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in <module>',
    '  File "/v/lib/torch/distributed/distributed_c10d.py", line 2, in all_reduce',
    "RuntimeError: rank one gives up"]


def test_torchruns_own_failure_report_goes_to_the_log_alone_and_the_scripts_is_shown(
        tmp_path):
    import io

    from harness.job_output import Job

    shown = io.StringIO()
    cpp = ["Exception raised from recvBytes at /torch/csrc/distributed/c10d/Utils.hpp:667 "
           "(most recent call first):", "frame #0: c10::Error::Error(...) + 0x98 (0x7f in "
           "libc10.so)", "frame #1: <unknown function> + 0x5f (0x7f in libtorch_cpu.so)"]
    lines = ["step 1", *SCRIPTS_OWN, "[W1207 c10d] a warning", *cpp, *AGENT_REPORT, "after"]
    Job(tmp_path).pump(io.StringIO("".join(x + "\n" for x in lines)), shown, "h1")
    assert shown.getvalue().splitlines() == [
        "step 1", *SCRIPTS_OWN, "[W1207 c10d] a warning", "after"]
    assert (tmp_path / "h1.log").read_text().splitlines() == lines



def test_the_jobs_finish_runs_before_the_script_destroys_the_default_group(monkeypatch):
    """Every example ends with dist.destroy_process_group(): the finish (metrics, and the
    replicas' drift, which needs the group) runs first, once; another group's destroy does
    not finish the job."""
    import torch.distributed as dist

    from harness import rank_hooks

    calls = []
    monkeypatch.setattr(dist, "destroy_process_group",
                        lambda group=None: calls.append(("destroy", group)))
    rank_hooks._finish_before_destroy(lambda: calls.append(("finish", None)))
    rank_hooks._finish_before_destroy(lambda: calls.append(("twice", None)))  # not again
    dist.destroy_process_group("subgroup")
    dist.destroy_process_group()
    assert calls == [("destroy", "subgroup"), ("finish", None), ("destroy", None)]
