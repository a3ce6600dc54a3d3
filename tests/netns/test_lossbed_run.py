"""`lossbed run -- torchrun ...` on a 3-host namespace cluster at 10% random loss, with the
examples a user would start from (examples/): the report's loss is the kernel's, the lossy
collective missed about that much, the script's own figure is in the report, nothing is
left on any host; a script that fails on one rank ends the job with its exit code, the
impairment cleared and the rank named."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from testbed.impair import engine
from tests.helpers import RANK_ONE_FAILS, REPO, assert_job_left_nothing, lossbed, unique_name

pytestmark = [pytest.mark.netns, pytest.mark.slow]
LOSS = 0.1
LOADED_AT = time.time()


@pytest.fixture(scope="module")
def cluster():
    c = netns_cluster.up(netns_cluster.ClusterSpec(hosts=3, name=unique_name()))
    yield c
    clusters.down(c.name)


def temporary_folders() -> set[str]:
    """What torchrun's agent (torchelastic_*, its log folders) and a job (lossbed-*.tmp, the
    ranks' TMPDIR) make in the machine's temporary folder."""
    return {p.name for pattern in ("torchelastic_*", "lossbed-*.tmp")
            for p in Path("/tmp").glob(pattern)}


@pytest.fixture(autouse=True)
def leaves_no_temporary_folder():
    """Every job of these tests, passed or failed or interrupted, leaves none behind."""
    before = temporary_folders()
    yield
    assert temporary_folders() - before == set()


def run(cluster, out, *command: str, options=(), timeout: float = 600):
    done = lossbed("run", "--cluster", cluster.name, "--profile", "random-loss",
                   "--loss", str(LOSS), "--out", str(out), *options, "--", "torchrun",
                   *command, timeout=timeout)
    summary = json.loads((out / "summary.json").read_text())
    return done, summary


def assert_nothing_left(cluster):
    assert_job_left_nothing(cluster)
    # (the gates of these tests' jobs: made after this module was loaded)
    assert not [p for p in Path("/tmp").glob("lossbed-*.gate")
                if p.stat().st_mtime >= LOADED_AT]


def assert_lossy_as_the_kernel_says(summary):
    assert summary["joined"] and summary["applied"]
    measured, (low, high) = summary["measured_loss"], summary["measured_loss_interval"]
    assert low <= measured <= high
    # 10% within the kernel's own 95% interval, give or take its width (a 1-in-20 miss of
    # the interval is not a bug; four half-widths away would be)
    assert abs(measured - LOSS) < 2 * (high - low) + 0.005, summary
    assert 0.05 < summary["missing_fraction"] < 0.16, summary
    # every counter of data that moved counts it (bytes_received stayed 0 before #66)
    moved = ("packets_sent", "bytes_sent", "packets_received", "bytes_received", "ends_sent",
             "ends_received")
    assert [k for k in moved if not summary["transport_counters"][k] > 0] == [], summary


def test_the_plain_pytorch_example_goes_lossy_under_lossbed_run(cluster, tmp_path):
    done, summary = run(cluster, tmp_path / "plain", str(REPO / "examples/plain_pytorch.py"),
                        "--variant", "unbiased", "--steps", "40")
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["exit_code"] == 0 and summary["ranks"] == 3
    assert_lossy_as_the_kernel_says(summary)
    assert summary["steps"] == 40 and summary["steps_per_s"] > 0
    assert summary["step_ms"]["p50"] > 0 and summary["collective_ms"]["p50"] > 0
    assert summary["drift"] is None  # the gradient hook keeps every replica equal
    # every field of a run that moved data is filled in, but those that say nothing went
    # wrong or was asked (#66: a declared field stuck at its default is caught here)
    assert sorted(k for k, v in summary.items() if v is None) == [
        "drift", "invalid", "stopped_by", "timeout_s"], summary
    # its tokens (32 samples a rank a step, reported as it goes) over the run's time
    assert summary["script"]["tokens"] == 40 * 32 * 3 and summary["tokens_per_s"] > 0
    assert math.isfinite(summary["script"]["final_loss"])
    assert sorted(p.name for p in (tmp_path / "plain" / "ranks").iterdir()) == [
        "rank0.json", "rank1.json", "rank2.json"]
    # what a bench writes for a run, a run writes too
    assert "measured loss" in (tmp_path / "plain" / "summary.md").read_text()
    assert "<h1>lossbed run</h1>" in (tmp_path / "plain" / "report.html").read_text()
    for rank_file in (tmp_path / "plain" / "ranks").iterdir():
        # what the script made before it joined (torch alone: over 100,000 objects) is out
        # of the collector's scans, as in lossbed's own ranks: a full collection of it
        # stops a rank for tens of milliseconds, and its peers' lossy steps count the
        # stop as loss
        assert json.loads(rank_file.read_text())["gc"]["frozen_objects"] > 100_000
    assert_nothing_left(cluster)


def test_loss_zero_is_a_lossless_run_of_the_profile(cluster, tmp_path):
    """--loss 0 is no loss (it used to apply random-loss's own 1%), and the run says so."""
    done = lossbed("run", "--cluster", cluster.name, "--profile", "random-loss", "--loss", "0",
                   "--out", str(tmp_path / "lossless"), "--", "torchrun",
                   str(REPO / "examples/plain_pytorch.py"), "--variant", "unbiased",
                   "--steps", "5", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "profile random-loss: loss: none (--loss 0)" in done.stderr
    summary = json.loads((tmp_path / "lossless" / "summary.json").read_text())
    assert summary["applied"] and summary["loss"] == 0
    assert summary["measured_loss"] == 0 and summary["missing_fraction"] == 0, summary
    assert summary["transport_counters"]["packets_sent"] > 0
    assert_nothing_left(cluster)


def test_a_job_that_hangs_ends_at_its_timeout_cleared_and_recorded(cluster, tmp_path):
    """A rank that hangs before any host failed used to keep the job running for ever
    (--grace-s starts only after a failure): --timeout-s ends it (#66)."""
    script = tmp_path / "hangs.py"
    script.write_text("import time\ntime.sleep(3600)\n")
    started = time.monotonic()
    done = lossbed("run", "--cluster", cluster.name, "--profile", "random-loss", "--loss",
                   str(LOSS), "--impair-from", "start", "--timeout-s", "6", "--out",
                   str(tmp_path / "hung"), "--", "torchrun", str(script), timeout=300)
    assert done.returncode == 124, done.stderr[-3000:]
    assert time.monotonic() - started < 120  # not the sleep's hour
    assert "timed out: the job ran past --timeout-s 6" in done.stderr
    summary = json.loads((tmp_path / "hung" / "summary.json").read_text())
    assert summary["timed_out"] is True and summary["timeout_s"] == 6
    assert summary["exit_code"] == 124
    assert_nothing_left(cluster)


def test_train_ends_at_its_timeout_cleared_and_recorded(cluster, tmp_path):
    """lossbed train's launch has a stated limit (--timeout-s, 2 hours by default): past it
    the ranks are stopped, the impairment cleared, and --json's record says timed out."""
    record = tmp_path / "runs.jsonl"
    done = lossbed("train", "--cluster", cluster.name, "--profile", "random-loss", "--loss",
                   str(LOSS), "--steps", "10000", "--timeout-s", "4", "--json", str(record),
                   timeout=300)
    assert done.returncode == 124, done.stderr[-3000:]
    assert "timed out: its ranks ran past --timeout-s 4" in done.stderr
    (line,) = record.read_text().splitlines()
    said = json.loads(line)
    assert said["timed_out"] is True and said["timeout_s"] == 4 and said["steps"] == 10000
    assert_nothing_left(cluster)


def test_the_hugging_face_example_trains_with_the_bounded_drift_broadcast(cluster, tmp_path):
    done, summary = run(cluster, tmp_path / "hf", str(REPO / "examples/hf_finetune.py"),
                        "--variant", "unbiased_drift", "--steps", "30")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_lossy_as_the_kernel_says(summary)
    ppl = summary["script"]["heldout_ppl"]
    assert 1 < ppl < 256, ppl  # better than guessing one of 256 bytes
    assert summary["tokens_per_s"] > 0
    # the broadcasts' replicas differ where packets were lost: how far, in the report
    assert 0 < summary["drift"] < 0.1, summary["drift"]
    assert "replicas' drift (largest)" in (tmp_path / "hf" / "summary.md").read_text()
    assert_nothing_left(cluster)


def test_a_script_that_fails_on_one_rank_ends_the_job_cleared_and_named(cluster, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(RANK_ONE_FAILS)
    # its peers wait in the collective for rank 1: once rank 1 said what ended it, they are
    # stopped (within SAID_GRACE_S), not after --grace-s (30 s; a refusal to start was seen
    # 51.6 s late before #66)
    done, summary = run(cluster, tmp_path / "fails", str(script), timeout=300)
    assert done.returncode != 0 and summary["exit_code"] == done.returncode
    assert summary["stopped_by"] == "rank 1's error"
    # the last word names the rank, its host and the error, and where every host's output
    # is (torchrun's own tracebacks are there, not on the terminal)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("[run] failed: rank 1 on "), last
    assert last.endswith(f"RuntimeError: rank one gives up; every host's output: "
                         f"{tmp_path / 'fails' / 'logs'}/"), last
    assert sorted(p.name for p in (tmp_path / "fails" / "logs").iterdir()) == [
        f"{h.name}.log" for h in cluster.hosts]
    assert "ChildFailedError" not in done.stderr
    (said,) = [f for f in summary["failed"] if f["rank"] == 1]
    assert said["error"] == "RuntimeError: rank one gives up"
    assert said["host"] in [h.name for h in cluster.hosts]  # where it ran
    assert "rank one gives up" in done.stderr  # the job's own output, passed through
    assert_nothing_left(cluster)


@pytest.mark.parametrize(("command", "says"), [
    (["python", "x.py"], "is not a torchrun command"),
    (["torchrun", "--nnodes", "2", "x.py"], "--nnodes"),
    (["torchrun", "--nproc-per-node=2", "x.py"], "--nproc-per-node"),
    (["torchrun"], "no training script"),
])
def test_bad_commands_are_refused_before_anything_starts(cluster, tmp_path, command, says):
    done = lossbed("run", "--cluster", cluster.name, "--out", str(tmp_path / "x"), "--",
                   *command, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (tmp_path / "x").exists()
    assert engine.read_record(cluster) is None


def test_print_writes_each_hosts_torchrun(cluster, tmp_path):
    done = lossbed("run", "--cluster", cluster.name, "--print", "--", "torchrun",
                   "examples/plain_pytorch.py", timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("cd ")]
    assert len(lines) == 3
    for i, (line, host) in enumerate(zip(lines, cluster.hosts, strict=True)):
        assert line.startswith(f"cd {REPO} && env ")  # (the folder lossbed run started in)
        assert f"LOSSBED_ADDRESS={host.address}" in line
        assert f"is_host={1 if i == 0 else 0}" in line
        assert ("torch.distributed.run" in line or "/torchrun " in line), line
        assert "LOSSBED_KEY=" in line
    assert engine.read_record(cluster) is None


def test_an_interrupt_stops_the_job_and_clears_the_impairment(cluster, tmp_path):
    """SIGTERM, which lossbed takes the way it takes Ctrl-C (testbed.cli: the same
    KeyboardInterrupt; a SIGINT may be ignored by a process started in the background):
    the job stops, and even workers that ignore SIGTERM (torchrun's way to stop them) are
    gone: torchrun is killed after its grace (--grace-s), and what it left is found by the
    job's id."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import with_repo_on_path

    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(
        "import runpy, signal, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"sys.argv = [{str(REPO / 'examples/plain_pytorch.py')!r}, '--steps', '100000']\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "--cluster", cluster.name, "--profile",
         "random-loss", "--loss", str(LOSS), "--out", str(tmp_path / "stopped"),
         "--grace-s", "3", "--", "torchrun", str(stubborn)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": with_repo_on_path()},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    for line in proc.stderr:  # until the profile is on and the job trains under it
        if "applied" in line or time.monotonic() > deadline:
            break
    assert engine.read_record(cluster) is not None, "the profile was never applied"
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, rest[-2000:]
    # torchrun got --grace-s to stop its workers (not the 20 s it gets by default), then was
    # killed, and its stubborn workers with it
    assert time.monotonic() - signalled < 15, rest[-2000:]
    assert "interrupted" in rest
    assert json.loads((tmp_path / "stopped" / "summary.json").read_text())["exit_code"] == 130
    assert_nothing_left(cluster)


def users_project(tmp_path) -> Path:
    """A user's project outside the checkout: the real training script (its module beside
    it, its checkpoints in a folder of its own) and their own torchrun on their PATH."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "llm_training.py").write_text((REPO / "examples/llm_training.py").read_text())
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "torchrun").symlink_to(REPO / ".venv" / "bin" / "torchrun")
    return project


@pytest.mark.parametrize("scheme", ["lossy_gradients", "bounded_drift", "rps"])
def test_a_real_training_script_in_the_users_folder_goes_lossy(cluster, tmp_path, scheme):
    """examples/llm_training.py (AdamW with weight-decay groups, a cosine schedule, bf16
    autocast, 2 micro-batches a step, each rank's checkpoint) at 10% loss, started from
    the user's folder with the torchrun on their PATH: it trains, its steps are optimizer
    steps, its checkpoints are where it put them."""
    project = users_project(tmp_path)
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    done = lossbed("run", "--cluster", cluster.name, "--profile", "random-loss", "--loss",
                   str(LOSS), "--out", str(tmp_path / "out"), "--", "torchrun",
                   "llm_training.py", "--scheme", scheme, "--steps", "12", "--checkpoint",
                   "ckpt", "--save-every", "6", cwd=project, env={**os.environ, "PATH": path},
                   timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["workdir"] == str(project)
    assert summary["torchrun"] == [str(tmp_path / "bin" / "torchrun")]
    assert summary["ranks"] == 3 and summary["steps"] == 12  # not 24 micro-batches
    assert_lossy_as_the_kernel_says(summary)
    losses = summary["script"]["losses"]
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.3, losses  # it learned
    assert summary["script"]["heldout_ppl"] < 256  # below a uniform guess over bytes
    assert sorted(p.name for p in (project / "ckpt").iterdir()) == [
        "rank0.pt", "rank1.pt", "rank2.pt"]
    assert_nothing_left(cluster)


def test_a_script_that_is_not_there_is_refused_before_anything_is_impaired(cluster,
                                                                          tmp_path):
    project = users_project(tmp_path)
    done = lossbed("run", "--cluster", cluster.name, "--impair-from", "start", "--out",
                   str(tmp_path / "out"), "--", "torchrun", "llm_trainig.py", cwd=project,
                   timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{project}/llm_trainig.py: no such file on {cluster.hosts[0].name}" in done.stderr
    assert "--workdir" in done.stderr and "Traceback" not in done.stderr
    assert engine.read_record(cluster) is None  # (--impair-from start: not applied either)
    # ... and found where --workdir says it is, from any folder
    done = lossbed("run", "--cluster", cluster.name, "--print", "--workdir", str(project),
                   "--", "torchrun", "llm_training.py", cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and f"cd {project} && env " in done.stdout, done.stderr


def test_a_python_without_lossbeds_packages_is_refused_before_anything_is_impaired(
        cluster, tmp_path):
    """-- /path/to/venv/bin/torchrun of a venv without lossbed's packages: every rank died
    on ModuleNotFoundError 24 s after the profile was applied (#66). Now refused first,
    naming that Python and the fix."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\n")
    torchrun.chmod(0o755)
    (tmp_path / "train.py").write_text("print('never run')\n")
    done = lossbed("run", "--cluster", cluster.name, "--impair-from", "start", "--out",
                   str(tmp_path / "out"), "--", str(torchrun), "train.py", cwd=tmp_path,
                   timeout=120)
    assert done.returncode == 2, done.stderr
    assert (f"{venv / 'bin' / 'python'}, which runs the ranks on {cluster.hosts[0].name}, "
            "cannot import what a rank imports: ModuleNotFoundError") in done.stderr
    assert f"make setup VENV={venv}" in done.stderr
    assert "never run" not in done.stdout
    assert_nothing_left(cluster)



def test_a_train_whose_traffic_missed_the_impairment_is_no_result_and_exits_5(cluster,
                                                                             tmp_path):
    """train, like run, exits 5 on a run that is no result (#71: only run was tested): the
    profile's match leaves the lossy collective's UDP out, so most bytes cross no
    impairment, and the record says why."""
    record = tmp_path / "runs.jsonl"
    done = lossbed("train", "--cluster", cluster.name, "--profile", "random-loss", "--loss",
                   str(LOSS), "--set", "match.exclude=[{protocol: udp}]", "--variant",
                   "unbiased", "--steps", "5", "--json", str(record), timeout=300)
    assert done.returncode == 5, done.stderr[-3000:]
    assert "is no result under random-loss" in done.stderr
    (line,) = record.read_text().splitlines()
    said = json.loads(line)
    assert said["invalid"].startswith("only ") and said["coverage"]["fraction"] < 0.9, said
    assert_nothing_left(cluster)
