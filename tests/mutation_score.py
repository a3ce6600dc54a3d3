"""`make mutate`'s last word: the mutation score of the modules that decide a result
(pyproject's [tool.mutmut]) and every surviving mutant, from mutmut's own records.

    score = (killed + timeouts) / (killed + timeouts + survived)

Mutants that no selected test reaches (mutmut's "no tests") count as survivors here: a rule
no test runs is a rule no test holds. Exit 1 below the issue's 90% (#71)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

TARGET = 0.90


def statuses() -> dict[str, str]:
    """mutant name -> status, as `mutmut results --all true` prints them."""
    done = subprocess.run([str(Path(sys.executable).parent / "mutmut"), "results", "--all",
                           "true"], capture_output=True, text=True, timeout=300)
    found = {}
    for line in done.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name:
            found[name] = status
    return found


def main() -> int:
    found = statuses()
    if not found or set(found.values()) == {"not checked"}:
        print("no mutant was checked: the selected tests must pass on the unmutated code "
              "first (mutmut's output above says which failed), or `make mutate` has not run")
        return 2
    by_status = Counter(found.values())
    killed = by_status["killed"] + by_status["timeout"]
    survived = by_status["survived"] + by_status["no tests"]
    score = killed / (killed + survived) if killed + survived else 0.0
    per_file: dict[str, Counter] = {}
    for name, status in found.items():
        module = name.split(".x", 1)[0].split("ǁ", 1)[0]
        per_file.setdefault(module, Counter())[status] += 1
    print(json.dumps(dict(by_status), sort_keys=True))
    for module, counts in sorted(per_file.items()):
        k = counts["killed"] + counts["timeout"]
        s = counts["survived"] + counts["no tests"]
        print(f"  {module:<45} {k:>4} killed {s:>4} survived  "
              f"{k / (k + s) if k + s else 0:.0%}")
    for name, status in sorted(found.items()):
        if status in ("survived", "no tests"):
            print(f"  {status}: {name}")
    print(f"mutation score {score:.1%} ({killed} killed or timed out, {survived} survived; "
          f"target {TARGET:.0%})")
    return 0 if score >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
