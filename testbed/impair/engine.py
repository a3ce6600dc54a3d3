"""Apply, clear and show a profile on every host of a cluster, all or nothing.

    profile -> choose a backend the hosts' kernels have and that can express the profile
            -> plan (pure) -> record the intent -> apply host by host
            -> on any failure (or Ctrl-C) clear every host, so none stays impaired

What is applied is recorded in the cluster's state folder (impairment.json): the profile as
validated, the backend, and what each backend needs to find its objects again. Clearing
removes lossbed's objects of *every* backend from every host, so it also finishes the job
after a crash.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import LossbedError, UsageError
from testbed.impair import features, plan
from testbed.impair.registry import BACKENDS, PREFERENCE
from testbed.profiles.model import Profile

log = logging.getLogger(__name__)

RECORD = "impairment.json"
PARALLEL_HOSTS = 8


@dataclass
class Choice:
    backend: str
    reason: str
    probes: dict[str, str | None]


def probe(host) -> dict[str, str | None]:
    """Backend name -> None when the host's kernel has it, else why not."""
    return host.agent_call("probe", {})


def probe_all(hosts) -> dict[str, str | None]:
    """Backend name -> None when *every* host's kernel has it, else why not, host by host.
    One backend runs on every host of a plan, so a cluster of mixed kernels gets the best
    backend all of them have, and the reason says which host lacked the better ones."""
    hosts = list(hosts)
    with ThreadPoolExecutor(max_workers=min(PARALLEL_HOSTS, len(hosts))) as pool:
        per_host = list(pool.map(probe, hosts))
    combined = {}
    for name in dict.fromkeys(n for p in per_host for n in p):
        missing = [(h.name, p.get(name, "not probed")) for h, p in
                   zip(hosts, per_host, strict=True) if p.get(name, "not probed")]
        if not missing:
            combined[name] = None
        elif len(missing) == len(hosts) and len({why for _, why in missing}) == 1:
            combined[name] = missing[0][1]  # the same everywhere: say it once
        else:
            combined[name] = "; ".join(f"{host}: {why}" for host, why in missing) + (
                f" (the other {len(hosts) - len(missing)} hosts have it)"
                if len(missing) < len(hosts) else "")
    return combined


def choose(profile: Profile, hosts, probes: dict[str, str | None],
           forced: str | None = None) -> Choice:
    """The first available backend that can express every path of the profile."""
    needs = set()
    for src in hosts:
        for dst in hosts:
            if src.name != dst.name:
                at = dst.name if profile.direction != "egress" else src.name
                needs |= features.needed(profile.impairment_for(src.name, dst.name, at))
    if forced is not None:
        if forced not in BACKENDS:
            raise UsageError("--backend", f"unknown backend {forced!r}",
                             f"Use one of: {', '.join(PREFERENCE)}")
        if probes.get(forced):
            raise LossbedError(f"backend {forced} is not available here: {probes[forced]}")
        missing = needs - BACKENDS[forced].SUPPORTS
        if missing:
            raise LossbedError(
                f"profile {profile.name} needs {features.describe(missing)}, which the "
                f"{forced} backend cannot do. Leave --backend out to let lossbed choose")
        return Choice(forced, "chosen with --backend", probes)
    unavailable = []
    for name in PREFERENCE:
        if probes.get(name):
            unavailable.append(f"{name}: {probes[name]}")
            continue
        missing = needs - BACKENDS[name].SUPPORTS
        if not missing:
            why = "the most capable backend this kernel has" if not unavailable else (
                "; ".join(unavailable) + f"; so {name}")
            return Choice(name, why, probes)
        unavailable.append(f"{name} cannot do {features.describe(missing)}")
    can = [n for n in PREFERENCE if not (needs - BACKENDS[n].SUPPORTS)]
    raise LossbedError(
        f"profile {profile.name} needs {features.describe(needs)}; no backend on these hosts "
        f"can apply all of it ({'; '.join(unavailable)}). "
        + (f"Backends that could: {', '.join(can)} — " if can else "")
        + "use hosts whose kernel has sch_netem (lossbed up --kind vm), or a profile "
          "without what is missing. lossbed never approximates a profile.")


def planned_hosts(cluster) -> list[plan.PlannedHost]:
    return [plan.PlannedHost(h.name, h.address, h.ifname, cluster.mtu) for h in cluster.hosts]


def make_plan(cluster, profile: Profile, *, backend: str | None = None,
              only: list[str] | None = None) -> tuple[plan.Plan, Choice]:
    """Probe the hosts' kernel, choose the backend, build the plan. Touches nothing."""
    plan.build(profile, planned_hosts(cluster), "?", only)  # names checked before probing
    cluster.connect()  # every host reachable (one at a time, clear errors), or stop here
    probes = probe_all(cluster.hosts)  # every host: one backend must run on all of them
    choice = choose(profile, cluster.hosts, probes, backend)
    return plan.build(profile, planned_hosts(cluster), choice.backend, only), choice


def apply(cluster, the_plan: plan.Plan, choice: Choice | None = None) -> dict:
    """Apply on every host of the plan, or on none."""
    if read_record(cluster) is not None:
        log.info("cluster %s: clearing the profile applied before", cluster.name)
        clear(cluster)
    cluster.connect()  # every host reachable, or nothing is applied anywhere
    extra = ({"lease_s": cluster.lease_s, "force": cluster.force_interface}
             if cluster.lease_s is not None else {})
    record = {"status": "applying", "backend": the_plan.backend,
              "profile": the_plan.profile.model_dump(mode="json"),
              "only": [hp.host for hp in the_plan.hosts], "handles": {},
              "reason": choice.reason if choice else "", "applied_at": time.time()}
    _write(cluster, record)
    started = time.monotonic()

    def apply_host(hp):
        return hp.host, cluster.host(hp.host).agent_call(
            "apply", {"backend": the_plan.backend, "plan": hp.to_dict(), **extra,
                      # (what a host that judges the request holds the plan to: a Slurm
                      # node's agent, testbed/slurm/policy.py; the others ignore it)
                      "profile": the_plan.profile.model_dump(mode="json")})

    try:
        # Hosts in parallel (each waits on its own netlink session, VM or SSH channel); the
        # first failure stops the rest and the except clause below clears them all.
        with ThreadPoolExecutor(max_workers=PARALLEL_HOSTS) as pool:
            for host, handles in pool.map(apply_host, the_plan.hosts):
                record["handles"][host] = handles
        record["status"] = "applied"
        _write(cluster, record)
    except BaseException:
        log.error("applying profile %s failed: clearing every host", the_plan.profile.name)
        clear(cluster)
        raise
    log.info("profile %s applied with %s on %d hosts in %.2f s", the_plan.profile.name,
             the_plan.backend, len(the_plan.hosts), time.monotonic() - started)
    return record


def _clear_host(host) -> tuple[list[str], list[str]]:
    try:
        return [f"{host.name}:{name}" for name in host.agent_call("clear", {})], []
    except Exception as err:
        return [], [str(err)]


def clear(cluster) -> list[str]:
    """Remove lossbed's impairment objects of every backend from every host (hosts in
    parallel: each waits on its own netlink socket and nft process)."""
    cleared, errors = [], []
    with ThreadPoolExecutor(max_workers=PARALLEL_HOSTS) as pool:
        for host_cleared, host_errors in pool.map(_clear_host, cluster.hosts):
            cleared += host_cleared
            errors += host_errors
    if errors:
        raise LossbedError("could not clear everything: " + "; ".join(errors))
    (cluster.state_dir / RECORD).unlink(missing_ok=True)
    return cleared


def read_record(cluster) -> dict | None:
    try:
        return json.loads((cluster.state_dir / RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def applied_plan(cluster) -> tuple[plan.Plan, dict]:
    """The plan of what is applied now, rebuilt from the record (plans are deterministic)."""
    record = read_record(cluster)
    if record is None or record.get("status") != "applied":
        raise LossbedError(f"no profile is applied on cluster {cluster.name}: "
                           f"apply one with: lossbed apply PROFILE --cluster {cluster.name}")
    profile = Profile.model_validate(record["profile"])
    return plan.build(profile, planned_hosts(cluster), record["backend"], record["only"]), record


def _write(cluster, record: dict) -> None:
    path = cluster.state_dir / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def netem_on_this_kernel() -> str | None:
    """None if this machine's kernel may have sch_netem (loaded, built in, or a module file
    of it), else why not: read from /proc and /lib/modules, nothing created."""
    release = os.uname().release
    if Path("/sys/module/sch_netem").exists():
        return None
    modules = Path("/lib/modules") / release
    builtin = modules / "modules.builtin"
    if builtin.is_file() and "sch_netem" in builtin.read_text(errors="replace"):
        return None
    if any(modules.glob("kernel/net/sched/sch_netem.ko*")):
        return None
    return f"this machine's kernel ({release}) has no sch_netem"


def refuse_for_this_kernel(profile: Profile, hosts: int) -> None:
    """For namespace hosts about to be built on this machine: refuse a profile only netem
    can apply when this kernel has no netem, before anything is built (the full probe,
    which creates a qdisc, runs once the hosts exist)."""
    from types import SimpleNamespace

    why = netem_on_this_kernel()
    if why is None:
        return
    names = [SimpleNamespace(name=f"h{i + 1}") for i in range(max(2, hosts))]
    try:
        choose(profile, names, {"netem": why})
    except LossbedError as err:
        raise UsageError("--profile", str(err), "Run it on VM hosts (lossbed up --kind vm, "
                         "then --cluster NAME), or give a profile of loss alone "
                         "(random-loss, burst-loss)") from None
