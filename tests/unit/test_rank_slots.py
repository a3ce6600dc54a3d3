"""LOCAL_RANK numbers the ranks of one machine (a rank's GPU is LOCAL_RANK % GPUs): namespace
hosts share this machine, so two of them get GPUs 0 and 1, as NCCL needs; remote hosts
number their own ranks from 0."""

from __future__ import annotations

from types import SimpleNamespace

from harness import launch


def _cluster(kind: str, gpus: list[int]):
    hosts = [SimpleNamespace(name=f"h{i + 1}", address=f"10.0.0.{i + 1}", ifname="eth0",
                             gpus=g, project="/p") for i, g in enumerate(gpus)]
    return SimpleNamespace(name="c1", kind=kind, hosts=hosts, mtu=1500,
                           shares_this_machine=kind == "netns")


def test_namespace_hosts_share_the_machine_and_number_its_ranks():
    cluster = _cluster("netns", [0, 0, 0])
    assert [launch.rank_env(cluster, r)["LOCAL_RANK"] for r in range(3)] == ["0", "1", "2"]


def test_remote_hosts_number_their_own_ranks():
    cluster = _cluster("remote", [2, 2])
    assert [launch.rank_env(cluster, r)["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
    assert [launch.rank_env(cluster, r)["MASTER_ADDR"] for r in range(4)] == ["10.0.0.1"] * 4


def test_a_local_rank_keeps_the_controllers_python_path_after_the_project(monkeypatch):
    """Local ranks inherit the controller's environment: an entry on its PYTHONPATH (the
    tests' fork audit, a user's own folder) stays on theirs, after the project."""
    import subprocess

    seen = {}

    class Host:
        name, address, ifname, gpus, project = "h1", "10.0.0.1", "eth0", 0, "/p"

        def popen(self, argv, env, **kwargs):
            seen["PYTHONPATH"] = env["PYTHONPATH"]
            return subprocess.Popen(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.PIPE, text=True)

    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    cluster = SimpleNamespace(name="c1", kind="netns", hosts=[Host()], mtu=1500,
                              shares_this_machine=True,
                              rank_python=lambda host: "python3")
    launch.run(cluster, "harness.nothing", [], authenticate=False)
    assert seen["PYTHONPATH"] == "/p:/somewhere/else"
