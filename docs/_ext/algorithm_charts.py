"""Charts of what each rate-limit algorithm admits under the same traffic, drawn at build time.

The figures are not hand-made: every admission is decided by the pure-Python reference models
of ``tests/reference_models.py``, the models the test suite holds the Lua scripts to (every
Decision field, on random sequences, against real Redis: tests/test_engine_properties.py). The
policy parameters come from a real ``django_redislua.Policy`` built from the same options a user
writes, so a chart shows what the engine admits.

``{algorithm-chart} <algorithm>`` in a page inserts the chart and a sentence of figures
computed from the same run; ``{algorithm-chart} overview`` compares them all.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

RATE, BURST = "10/m", 10  # the policy every rate chart uses: 10 a minute, a burst of 10
PERIOD = 60.0
HORIZON = 180.0
OUT = "_generated/charts"

RATE_ALGORITHMS = [
    "fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra",
]
COLOURS = {
    "fixed_window": "#d62728", "sliding_log": "#2ca02c", "sliding_window": "#ff7f0e",
    "token_bucket": "#1f77b4", "leaky_bucket": "#9467bd", "gcra": "#8c564b",
    "concurrency": "#17becf",
}


def traffic() -> list[float]:
    """The same requests for every algorithm (seconds): one at 0 (a fixed window opens there),
    15 at once at 55 s, 15 more at 62 s (just across that window's edge), then one every 3 s
    from 70 s on."""
    times = [0.0] + [55.0] * 15 + [62.0] * 15
    t = 70.0
    while t < HORIZON:
        times.append(t)
        t += 3.0
    return times


@dataclass
class Run:
    algorithm: str
    times: list[float]
    admitted: list[bool]
    in_flight: list[tuple[float, int]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(self.admitted)

    def most_in_any_period(self) -> int:
        ok = [t for t, a in zip(self.times, self.admitted, strict=True) if a]
        return max((sum(1 for u in ok if t <= u < t + PERIOD) for t in ok), default=0)

    def sentence(self) -> str:
        sent = len(self.times)
        if self.algorithm == "concurrency":
            peak = max(n for _, n in self.in_flight)
            return (f"Of {sent} requests, each holding its slot for {HOLD:g} s, {self.count} "
                    f"were admitted; never more than {peak} in flight at once.")
        return (f"Of {sent} requests, {self.count} were admitted; at most "
                f"{self.most_in_any_period()} of them within any {PERIOD:g} s.")


RUNS: dict[str, Run] = {}  # filled by generate() when the builder starts

HOLD = 20.0  # how long each request of the concurrency chart runs
SLOTS = 3


def run_rate(algorithm: str) -> Run:
    from django_redislua import Policy
    from tests.reference_models import MODELS

    policy = Policy("chart", rate=RATE, algorithm=algorithm,
                    burst=BURST if algorithm in ("token_bucket", "leaky_bucket", "gcra") else None)
    model = MODELS[algorithm](policy.limit, policy.param, int(policy.extra or 1))
    times = traffic()
    admitted = []
    for t in times:
        pending = model.check("client", round(t * 1_000_000), 1)
        if pending.allowed:
            pending.commit()
        admitted.append(pending.allowed)
    return Run(algorithm, times, admitted)


def run_concurrency() -> Run:
    """Six requests at once, then one every 5 s; each runs HOLD seconds, then releases."""
    from django_redislua import Policy
    from tests.reference_models import MODELS, Concurrency

    policy = Policy("chart", algorithm="concurrency", limit=SLOTS, timeout="10m")
    model = MODELS["concurrency"](policy.limit, policy.param, int(policy.extra or 1))
    assert isinstance(model, Concurrency)
    times = [0.0] * 6 + [5.0 * i for i in range(1, 24)]
    admitted: list[bool] = []
    releases: list[tuple[float, str]] = []
    held: list[tuple[float, int]] = [(0.0, 0)]
    for i, t in enumerate(times):
        for end, lease in sorted(r for r in releases if r[0] <= t):
            model.release("client", lease)
            releases.remove((end, lease))
            held.append((end, held[-1][1] - 1))
        lease = f"lease-{i}"
        pending = model.check("client", round(t * 1_000_000), 1, lease)
        if pending.allowed:
            pending.commit()
            releases.append((t + HOLD, lease))
            held.append((t, held[-1][1] + 1))
        admitted.append(pending.allowed)
    for end, _lease in sorted(releases):
        held.append((end, held[-1][1] - 1))
    # Several events at one instant (a release and an admission): only the count after them.
    last = {t: n for t, n in held}
    return Run("concurrency", times, admitted, sorted(last.items()))


def draw(runs: dict[str, Run], directory: Path) -> None:
    import logging

    import matplotlib

    # On a machine where matplotlib never ran, importing pyplot builds its per-user font cache
    # and logs about it ("generated new fontManager", and a warning when that takes over 5 s).
    # Those notices are about matplotlib's cache, not these docs; a docs dependency
    # (accessible-pygments) routes every INFO record to stderr, which the -W build must keep
    # empty. Only the font manager's notices are held back.
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    sent = traffic()

    def cumulative(ax: Any, run: Run, **style: Any) -> None:
        xs, ys, n = [0.0], [0], 0
        for t, ok in zip(run.times, run.admitted, strict=True):
            n += ok
            xs.append(t)
            ys.append(n)
        xs.append(HORIZON)
        ys.append(n)
        ax.step(xs, ys, where="post", **style)

    def sent_line(ax: Any) -> None:
        xs = [0.0, *sent, HORIZON]
        ax.step(xs, [0, *range(1, len(sent) + 1), len(sent)], where="post", color="#999999",
                linestyle="--", label="requests sent")

    for name in RATE_ALGORITHMS:
        run = runs[name]
        fig, ax = plt.subplots(figsize=(7.5, 3.2), dpi=110)
        sent_line(ax)
        cumulative(ax, run, color=COLOURS[name], linewidth=2, label="admitted")
        denied = [t for t, ok in zip(run.times, run.admitted, strict=True) if not ok]
        ax.plot(denied, [0.5] * len(denied), "|", color="#d62728", markersize=10,
                label="denied (429)")
        ax.set_xlim(0, HORIZON)
        ax.set_xlabel("seconds")
        ax.set_ylabel("requests")
        ax.set_title(f"{name}: rate={RATE!r}" + (f", burst={BURST}" if "bucket" in name
                                                  or name == "gcra" else ""))
        ax.legend(loc="upper left", fontsize="small")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(directory / f"{name}.png")
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 3.8), dpi=110)
    sent_line(ax)
    for name in RATE_ALGORITHMS:
        cumulative(ax, runs[name], color=COLOURS[name], linewidth=1.6, label=name)
    ax.set_xlim(0, HORIZON)
    ax.set_xlabel("seconds")
    ax.set_ylabel("requests admitted")
    ax.set_title(f"The same traffic, rate={RATE!r} (burst={BURST} for the buckets and GCRA)")
    ax.legend(loc="upper left", fontsize="small", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(directory / "overview.png")
    plt.close(fig)

    run = runs["concurrency"]
    fig, ax = plt.subplots(figsize=(7.5, 3.2), dpi=110)
    xs = [t for t, _ in run.in_flight] + [HORIZON]
    ys = [n for _, n in run.in_flight] + [run.in_flight[-1][1]]
    ax.step(xs, ys, where="post", color=COLOURS["concurrency"], linewidth=2, label="in flight")
    ok = [t for t, a in zip(run.times, run.admitted, strict=True) if a]
    no = [t for t, a in zip(run.times, run.admitted, strict=True) if not a]
    ax.plot(ok, [SLOTS + 0.5] * len(ok), "|", color="#2ca02c", markersize=10, label="admitted")
    ax.plot(no, [SLOTS + 0.8] * len(no), "|", color="#d62728", markersize=10,
            label="denied (429)")
    ax.axhline(SLOTS, color="#999999", linestyle="--", label=f"limit={SLOTS}")
    ax.set_xlim(0, HORIZON)
    ax.set_ylim(0, SLOTS + 1.2)
    ax.set_xlabel("seconds")
    ax.set_ylabel("requests in flight")
    ax.set_title(f"concurrency: limit={SLOTS}, each request runs {HOLD:g} s")
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(directory / "concurrency.png")
    plt.close(fig)


def generate(app: Sphinx) -> None:
    runs = {name: run_rate(name) for name in RATE_ALGORITHMS}
    runs["concurrency"] = run_concurrency()
    directory = Path(app.srcdir) / OUT
    # Redraw only when the inputs changed (the models, this file), so incremental builds stay
    # incremental; the stamp holds their digest.
    sources = [Path(__file__), Path(app.srcdir).parent / "tests" / "reference_models.py"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    stamp = directory / ".stamp"
    if not (stamp.exists() and stamp.read_text() == digest):
        draw(runs, directory)
        stamp.write_text(digest)
    RUNS.clear()
    RUNS.update(runs)


class AlgorithmChart(SphinxDirective):
    required_arguments = 1
    option_spec = {"alt": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        runs = RUNS
        if name != "overview" and name not in runs:
            raise self.error(f"unknown algorithm {name!r}; known: {', '.join(runs)}")
        image = nodes.image(uri=f"/{OUT}/{name}.png",
                            alt=self.options.get("alt", f"What {name} admits"))
        figure = nodes.figure("", image)
        if name == "overview":
            text = "; ".join(f"{n}: {runs[n].count}" for n in RATE_ALGORITHMS)
            caption = f"Requests admitted out of {len(traffic())}: {text}."
        else:
            caption = runs[name].sentence()
        figure += nodes.caption("", caption)
        return [figure]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    app.add_directive("algorithm-chart", AlgorithmChart)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
