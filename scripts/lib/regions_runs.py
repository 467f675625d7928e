"""The other tenant's loadgen reports of `scripts/bench-regions`: its 2 s runs
during the move (or the control's window), and their rate and latency, shared
by the move's table and the control's one line."""
import glob
import json
import re


def during_files(work):
    """The during window's reports, in the order they ran."""
    return sorted(glob.glob(f"{work}/other-during-*.json"),
                  key=lambda n: int(re.findall(r"(\d+)\.json$", n)[0]))


def runs(names):
    """New orders/s over the reports, their seconds, the median run's p50, the
    slowest run's p99 (so that the slowest run's tail shows), and each run's
    rate."""
    reports = [json.load(open(n)) for n in names]
    new = [r["outcomes"].get("new", {}) for r in reports]
    count = sum(o.get("count", 0) for o in new)
    secs = sum(r["elapsed_s"] for r in reports)
    p99 = max((o.get("p99_us", 0) for o in new), default=0)
    p50 = sorted(o.get("p50_us", 0) for o in new)[len(new) // 2] if new else 0
    rates = [o.get("count", 0) / r["elapsed_s"] for o, r in zip(new, reports)]
    return count / secs if secs else 0.0, secs, p50, p99, rates
