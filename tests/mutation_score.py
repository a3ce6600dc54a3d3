"""`make mutate`'s last word: the mutation score of the modules that decide a result
(pyproject's [tool.mutmut]) and every surviving mutant, from mutmut's own records, each with
its one-line argument from tests/mutation_equivalents.toml (why no test can tell it from the
code: an equivalent mutant) or marked UNARGUED.

    score = (killed + timeouts) / (killed + timeouts + survived)

Mutants that no selected test reaches (mutmut's "no tests") count as survivors here: a rule
no test runs is a rule no test holds. An equivalent mutant is still a survivor in the score.
Exit 1 below the issue's 90% (#71) or with a survivor that is not argued.

    python -m tests.mutation_score              the score and the survivors
    python -m tests.mutation_score --markdown   the survivors as docs/results.md lists them
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

TARGET = 0.90
EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.toml")


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


def arguments() -> dict[str, str]:
    """mutant name -> why it is equivalent (one line), from mutation_equivalents.toml."""
    return tomllib.loads(EQUIVALENTS.read_text())["equivalent"]


def module_of(name: str) -> str:
    return name.split(".x", 1)[0].split("ǁ", 1)[0]


def main(argv: list[str]) -> int:
    found = statuses()
    if not found or set(found.values()) == {"not checked"}:
        print("no mutant was checked: the selected tests must pass on the unmutated code "
              "first (mutmut's output above says which failed), or `make mutate` has not run")
        return 2
    argued = arguments()
    survivors = sorted(n for n, s in found.items() if s in ("survived", "no tests"))
    if "--markdown" in argv:
        print("| module | mutant | why it survives |\n|---|---|---|")
        for name in survivors:
            print(f"| {module_of(name)} | `{name.rsplit('.', 1)[-1]}` | "
                  f"{argued.get(name, 'UNARGUED')} |")
        return 0
    by_status = Counter(found.values())
    killed = by_status["killed"] + by_status["timeout"]
    survived = by_status["survived"] + by_status["no tests"]
    score = killed / (killed + survived) if killed + survived else 0.0
    per_file: dict[str, Counter] = {}
    for name, status in found.items():
        per_file.setdefault(module_of(name), Counter())[status] += 1
    print(json.dumps(dict(by_status), sort_keys=True))
    for module, counts in sorted(per_file.items()):
        k = counts["killed"] + counts["timeout"]
        s = counts["survived"] + counts["no tests"]
        print(f"  {module:<45} {k:>4} killed {s:>4} survived  "
              f"{k / (k + s) if k + s else 0:.0%}")
    unargued = [n for n in survivors if n not in argued]
    for name in survivors:
        print(f"  {found[name]}: {name}: {argued.get(name, 'UNARGUED')}")
    stale = sorted(set(argued) - set(survivors))
    if stale:
        print(f"  {len(stale)} argued mutant(s) no longer survive (killed, or renumbered): "
              "remove them from tests/mutation_equivalents.toml")
    print(f"mutation score {score:.1%} ({killed} killed or timed out, {survived} survived, "
          f"{len(survivors) - len(unargued)} of them argued equivalent, {len(unargued)} "
          f"unargued; target {TARGET:.0%})")
    return 0 if score >= TARGET and not unargued else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
