"""Per-run phase breakdown of an EP trace (ONNXRUNTIME_EP_MLX_TRACE): for the steady runs
(the last N partition runs, default all but the first 3), the median of each phase and of
what the partition span holds beyond them (the compiled replay, the rows resolved), and the
gap between consecutive partition runs (ORT's own work and the caller's), in milliseconds.
Below them, the named spans inside a run (category "step": the split decode step's prologue,
the compiled closure's application, the rows read back, copy-out's moves to the host and its
copies), each part of a phase or of "replay+other".

With --first N it prints instead where the first N partition runs' time went (the one-time
work of a session's first runs: every phase summed, and the nodes built, by op).

usage: python3 gpu/trace_summary.py TRACE.json [--skip N] [--runs A:B] [--first N]
(--runs: only the partition runs A to B-1 in time order, python slice bounds)"""
import json
import statistics
import sys


def main():
    path = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 3
    d = json.load(open(path))
    events = d["traceEvents"] if isinstance(d, dict) else d
    runs = sorted((e for e in events if e.get("cat") == "partition"), key=lambda e: e["ts"])
    if "--runs" in sys.argv:
        a, b = (int(x) if x else None for x in sys.argv[sys.argv.index("--runs") + 1].split(":"))
        runs, skip = runs[a:b], 0
    phases = [e for e in events if e.get("cat") == "phase"]
    if "--first" in sys.argv:
        first(path, runs[: int(sys.argv[sys.argv.index("--first") + 1])], events)
        return
    steps = [e for e in events if e.get("cat") == "step"]
    rows, parts = [], []
    for r in runs[skip:]:
        lo, hi = r["ts"], r["ts"] + r["dur"]
        inside = {}
        for p in phases:
            if lo <= p["ts"] <= hi:
                inside[p["name"]] = inside.get(p["name"], 0.0) + p["dur"]
        inside["replay+other"] = r["dur"] - sum(inside.values())
        inside["partition"] = r["dur"]
        rows.append(inside)
        part = {}
        for p in steps:
            if lo <= p["ts"] <= hi:
                part[p["name"]] = part.get(p["name"], 0.0) + p["dur"]
        parts.append(part)
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(runs[skip:], runs[skip + 1 :])]
    names = sorted({k for r in rows for k in r})
    print(f"{path}: {len(rows)} steady runs (of {len(runs)})")
    for n in names:
        v = [r.get(n, 0.0) / 1000 for r in rows]
        print(f"  {n:14s} median {statistics.median(v):8.3f} ms  min {min(v):8.3f}  max {max(v):8.3f}")
    for n in sorted({k for p in parts for k in p}):
        v = [p.get(n, 0.0) / 1000 for p in parts]
        print(f"    {n:12s} median {statistics.median(v):8.3f} ms  min {min(v):8.3f}  max {max(v):8.3f}")
    if gaps:
        g = [x / 1000 for x in gaps]
        print(f"  {'between runs':14s} median {statistics.median(g):8.3f} ms  min {min(g):8.3f}  max {max(g):8.3f}")


def first(path, runs, events):
    """Totals of every span inside the given runs, by category and name (ms)."""
    print(f"{path}: the first {len(runs)} partition runs, {sum(r['dur'] for r in runs) / 1000:.1f} ms")
    totals = {}
    for e in events:
        if e.get("cat") == "partition" or "dur" not in e:
            continue
        if any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in runs):
            node = e.get("cat") == "node"
            key = (e.get("cat", ""), (e.get("args") or {}).get("op", "?") if node else e["name"])
            n, t = totals.get(key, (0, 0.0))
            totals[key] = (n + 1, t + e["dur"])
    for (cat, name), (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"  {cat:9s} {name:28s} {n:5d} spans {t / 1000:9.1f} ms")


if __name__ == "__main__":
    main()
