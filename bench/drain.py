"""Bench 4: time for the engine to drain N queued INFO signals (N = 1,000 ... 10,000).

For each N: a fresh session, N INFO signals dropped into inputs/ while no engine runs,
then one in-process Engine.checkpoint() (it takes everything waiting), timed. Linear
handling gives the same per-signal cost at every N.

A drain that would not fit the time budget is not run to the end: the bench stops it at
the budget (raising out of the engine from a wrapper around signals.mark_handled, which
also timestamps every handled signal) and estimates the full drain from the timeline of
the largest run by a least-squares fit T(k) = a*k + b*k^2. Estimated figures say "est.".
"""
from __future__ import annotations

import io
import shutil
import tempfile
import time

from _common import Row, now, ratio, say


class OverBudget(Exception):
    pass


def drain_once(base: str, n: int, budget: float) -> dict:
    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.engine.mailbox import Mode
    from ralph.session_store import _signals, signals

    workspace = tempfile.mkdtemp(prefix="ralph-bench-drain-", dir=base)
    stamps: list[float] = []
    cpu_stamps: list[float] = []
    original = _signals.mark_handled
    try:
        session = session_store.create(workspace, f"bench: drain {n}", now=now())
        start = time.perf_counter()
        for i in range(n):
            signals.drop(session.dir, "INFO", f"queued signal {i}", now=now())
        drop = (time.perf_counter() - start) / n
        engine = Engine(session, Config(), agent_for=lambda role: None, out=io.StringIO())
        deadline = float("inf")

        def timed_mark_handled(*args, **kwargs):
            original(*args, **kwargs)
            t = time.perf_counter()
            stamps.append(t)
            cpu_stamps.append(time.process_time())
            if t > deadline:
                raise OverBudget

        _signals.mark_handled = timed_mark_handled
        start, cpu_start = time.perf_counter(), time.process_time()
        deadline = start + budget
        try:
            engine.mailbox.poll(Mode.CHECKPOINT)
            complete = True
        except OverBudget:
            complete = False
        total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        _signals.mark_handled = original
        if complete:
            left = signals.waiting(session.dir)
            if left or len(stamps) != n:
                raise RuntimeError(f"drain bench: {len(stamps)} handled, {len(left)} left, "
                                   f"of {n}")
    finally:
        _signals.mark_handled = original
        shutil.rmtree(workspace, ignore_errors=True)
    return {"n": n, "complete": complete, "total": total, "cpu": cpu, "handled": len(stamps),
            "timeline": [t - start for t in stamps],
            "cpu_timeline": [t - cpu_start for t in cpu_stamps], "drop": drop}


def fit(timeline: list[float]) -> tuple[float, float]:
    """Least squares T(k) = a*k + b*k^2 over (k, time the k-th signal was handled)."""
    step = max(1, len(timeline) // 500)
    pts = [(k + 1, t) for k, t in enumerate(timeline)][::step]
    s11 = sum(k * k for k, _ in pts)
    s12 = sum(k ** 3 for k, _ in pts)
    s22 = sum(k ** 4 for k, _ in pts)
    y1 = sum(k * t for k, t in pts)
    y2 = sum(k * k * t for k, t in pts)
    det = s11 * s22 - s12 * s12
    if not pts or det <= 0:
        return (timeline[-1] / len(timeline) if timeline else 0.0), 0.0
    a = (y1 * s22 - y2 * s12) / det
    b = (s11 * y2 - s12 * y1) / det
    if b < 0:  # no growth: a linear fit
        return y1 / s11, 0.0
    if a < 0:  # growth dominates: a pure quadratic fit
        return 0.0, y2 / s22
    return a, b


def run(base: str, sizes=(1000, 2000, 5000, 10000), budget: float = 100.0,
        total_budget: float = 160.0) -> list[Row]:
    results: dict[int, dict] = {}
    spent = 0.0
    model = None  # wall-clock (a, b) from the largest run so far: decides what fits the budget
    cpu_model = None  # the same fit of CPU time: the estimates in the table
    for n in sizes:
        allowed = min(budget, total_budget - spent)
        predicted = model[0] * n + model[1] * n * n if model else None
        if allowed <= 0 or (predicted is not None and predicted > allowed):
            say(f"drain: N={n} skipped: estimated {predicted:.0f} s > the {allowed:.0f} s left")
            results[n] = {"n": n, "skipped": True, "estimate": predicted}
            continue
        say(f"drain: N={n} queued INFO signals (budget {allowed:.0f} s)")
        r = drain_once(base, n, allowed)
        spent += r["total"]
        results[n] = r
        if r["timeline"]:
            model, cpu_model = fit(r["timeline"]), fit(r["cpu_timeline"])
        if not r["complete"]:
            r["estimate"] = model[0] * n + model[1] * n * n

    def per_signal(n: int) -> tuple[float, float, bool]:
        """(wall, CPU) seconds per signal for the whole drain of n, and whether estimated."""
        r = results[n]
        if r.get("complete"):
            return r["total"] / n, r["cpu"] / n, False
        cpu = (cpu_model[0] * n + cpu_model[1] * n * n) / n if cpu_model else float("nan")
        return (r.get("estimate") or float("nan")) / n, cpu, True

    def cell(wall: float, cpu: float, est: bool) -> str:
        return f"{wall * 1000:.3f} ms (CPU {cpu * 1000:.3f} ms)" + (" est." if est else "")

    first = sizes[0]
    base_wall, base_cpu, base_est = per_signal(first)
    rows = []
    for n in sizes:
        wall, cpu, est = per_signal(n)
        r = results[n]
        if r.get("skipped"):
            note = (f"not run: the fit predicts {r['estimate']:.0f} s for the whole drain, "
                    f"over the budget")
        elif not r["complete"]:
            note = (f"stopped at the budget: {r['handled']} of {n} handled in "
                    f"{r['total']:.1f} s; whole drain est. {r['estimate']:.0f} s")
        else:
            note = f"{r['total']:.2f} s in all; dropping took {r['drop'] * 1000:.3f} ms/signal"
        rows.append(Row("4 drain queued signals", f"N={n:,}: time per signal",
                        cell(wall, cpu, est), cell(base_wall, base_cpu, base_est) + f", N={first:,}",
                        f"{ratio(wall, base_wall)} (CPU {ratio(cpu, base_cpu)})"
                        + (" est." if est or base_est else ""), note=note))
    if cpu_model is not None:
        a, b = cpu_model
        last = sizes[-1]
        rows[-1].note += (f"; linear = 1.0; fit of the CPU timeline: the k-th signal costs "
                          f"{a * 1000:.3f} ms + {2 * b * 1e6:.3f} us*k, i.e. "
                          f"{(a + 2 * b * first) * 1000:.1f} ms at k={first:,}, "
                          f"{(a + 2 * b * last) * 1000:.1f} ms at k={last:,}"
                          + (" (quadratic drain)" if b * last > a else ""))
    return rows
