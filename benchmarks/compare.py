"""Compare this checkout with an earlier commit: both benchmarks, runs alternated, one command.

    .venv/bin/python benchmarks/compare.py REF [--pairs 3] [--full] [--only ratelimit|locks]
        [--no-reference]

REF (a commit, tag or branch) is checked out in a temporary git worktree. Each pair runs
``bench_ratelimit.py`` and ``bench_locks.py`` three ways, in a shuffled order (seeded): the code
at REF, this checkout, and this checkout on the reference transport (``--reference``: redis-py's
public API, the lean channel off), each tree with its own benchmark scripts and package
(``PYTHONPATH``), all on this Python and its redis-py. Every run starts its own loopback server.
Each figure is a ratio to a peer in the same run (a bare redis-py ``INCR``; redis-py's ``Lock``),
so the drift of a shared machine between runs cancels out, and is reported as the median over
the pairs with the spread (min-max). Absolute medians are printed beside them.

By default ``bench_ratelimit.py`` runs ``--quick`` (about 40 s a run) and ``bench_locks.py`` with
fewer trials; ``--full`` runs both at their defaults (about 5 minutes a run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261124
LOCK_ROW = re.compile(r"^(?P<peer>\S.*?)\s+(?P<handoff>[\d.]+)\s+[\d.]+x\s+(?P<cycle>\d+)\s+"
                      r"[\d.]+x$")
CONTENDED_ROW = re.compile(r"^(?P<peer>\S.*?)\s+(?P<per_second>\d+)\s+[\d.]+x\s+\d+\s+\d+\s+"
                           r"(?P<p50>[\d.]+)\s+(?P<p99>[\d.]+)\s+[\d.]+\s+(?P<overlaps>\d+)$")
OURS = "django-redislua Lock"


def run(tree: Path, script: str, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("REDISLUA_BENCH_REFERENCE", None)
    done = subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{script} in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def ratelimit_figures(tree: Path, extra: list[str], full: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "figures.json"
        run(tree, "bench_ratelimit.py",
            [*([] if full else ["--quick"]), "--no-chart", "--json", str(path), *extra])
        figures = json.loads(path.read_text())
    found: dict[str, float] = {}
    for section in ("allowed", "denied"):
        for row in figures[section]["rows"]:
            if row["who"] == "ours":
                found[f"{section} {row['algorithm']}, x INCR"] = row["x_incr"]
                found[f"{section} {row['algorithm']}, us"] = row["median_us"]
            elif row["label"] == "redis-py INCR":
                found[f"{section} redis-py INCR, us"] = row["median_us"]
    return found


def lock_figures(tree: Path, extra: list[str], full: bool) -> dict[str, float]:
    quick = [] if full else ["--handoffs", "30", "--cycles", "1000", "--rounds", "5"]
    out = run(tree, "bench_locks.py", [*quick, *extra])
    handoff, cycle, contended = {}, {}, {}
    for line in out.splitlines():
        if match := LOCK_ROW.match(line):
            handoff[match["peer"]] = float(match["handoff"])
            cycle[match["peer"]] = float(match["cycle"])
        elif match := CONTENDED_ROW.match(line):
            contended[match["peer"]] = (float(match["per_second"]), int(match["overlaps"]))
    if contended[OURS][1]:
        raise SystemExit(f"{tree}: overlapping holders in the contention rounds:\n{out}")
    return {
        "lock hand-off, ms": handoff[OURS],
        "lock hand-off, x python-redis-lock": handoff[OURS] / handoff["python-redis-lock"],
        "lock acquire+release, us": cycle[OURS],
        "lock acquire+release, x redis-py Lock": cycle[OURS] / cycle["redis-py Lock"],
        "lock contended acquisitions/s": contended[OURS][0],
        "lock contended, x redis-py Lock": contended[OURS][0] / contended["redis-py Lock"][0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("ref", help="the earlier commit to compare with")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each contender")
    parser.add_argument("--full", action="store_true", help="both benchmarks at their defaults")
    parser.add_argument("--only", choices=("ratelimit", "locks"), help="one benchmark only")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip this checkout on the reference transport")
    options = parser.parse_args()
    measures = {"ratelimit": (ratelimit_figures,), "locks": (lock_figures,)}.get(
        options.only or "", (ratelimit_figures, lock_figures))
    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory() as scratch:
        before = Path(scratch) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(before),
                        options.ref], check=True)
        try:
            contenders = {f"at {options.ref}": (before, []), "this checkout": (ROOT, []),
                          "this, reference transport": (ROOT, ["--reference"])}
            if options.no_reference:
                del contenders["this, reference transport"]
            figures: dict[str, dict[str, list[float]]] = {
                name: defaultdict(list) for name in contenders}
            for pair in range(options.pairs):
                order = list(contenders)
                rng.shuffle(order)
                for name in order:
                    tree, extra = contenders[name]
                    print(f"pair {pair + 1}/{options.pairs}: {name}", file=sys.stderr, flush=True)
                    for measure in measures:
                        for figure, value in measure(tree, extra, options.full).items():
                            figures[name][figure].append(value)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)
    names = list(contenders)
    print(f"# {options.pairs} runs of each, medians (min-max); {sys.executable}")
    print(f"{'figure':<40} " + " ".join(f"{name[:26]:>26}" for name in names)
          + f" {'this / before':>14}")
    for figure in figures[names[1]]:
        cells = []
        for name in names:
            values = figures[name].get(figure, [])
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
                         if values else "-")
        before_values, after_values = figures[names[0]].get(figure), figures[names[1]][figure]
        ratio = (f"{statistics.median(after_values) / statistics.median(before_values):.3f}"
                 if before_values else "-")
        print(f"{figure:<40} " + " ".join(f"{cell:>26}" for cell in cells) + f" {ratio:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
