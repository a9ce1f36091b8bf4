#!/usr/bin/env python3
"""The ratios issue 9 states its targets in, from the estimates criterion wrote for
`cargo bench -p tollgate-bench --bench memory`.

    python3 crates/tollgate-bench/ratios.py [CRITERION_DIR]

CRITERION_DIR defaults to $CRITERION_HOME, else $CARGO_TARGET_DIR/criterion, else
target/criterion. Each figure is criterion's point estimate (the slope of time over iterations,
else the mean) of its latest run; a pair is left out when either side has not been measured.
Only the standard library is used.
"""

import json
import os
import sys
from datetime import datetime
from pathlib import Path

# (group, tollgate's benchmark, the peer's benchmark, target, what the ratio means)
# Time ratios: tollgate's time per check over the peer's (lower is better), target a maximum.
TIME_PAIRS = [
    ("gcra_1rule/admit", "tollgate", "governor", 1.5),
    ("gcra_1rule/admit", "tollgate_no_blocklist", "governor", None),
    ("gcra_1rule/admit", "tollgate_identity_per_check", "governor", None),
    ("gcra_1rule/deny", "tollgate", "governor", 1.5),
    ("gcra_1rule/deny", "tollgate_no_blocklist", "governor", None),
    ("gcra_1rule/deny", "tollgate_identity_per_check", "governor", None),
    ("sliding_log_3rules/admit", "tollgate", "governor_1quota", 3.0),
    ("sliding_log_3rules/admit", "tollgate_short_log", "governor_1quota", None),
    ("sliding_log_3rules/deny", "tollgate", "governor_1quota", 3.0),
    ("limiters_2x3/admit", "tollgate", "governor_1quota", 5.0),
    ("limiters_2x3/admit", "tollgate_short_log", "governor_1quota", None),
    ("limiters_2x3/deny", "tollgate", "governor_1quota", 5.0),
    ("fixed_window_1rule/admit", "tollgate", "limitador", None),
    ("fixed_window_3rules/admit", "tollgate", "limitador", 0.5),
]

# Throughput ratios: tollgate's checks per second over governor's (higher is better).
THROUGHPUT = "gcra_1rule_throughput"
THROUGHPUT_GROUPS = [
    ("1_thread_distinct_keys", None),
    ("2_threads_distinct_keys", 0.7),
    ("1_thread_hot_key", None),
    # Target: no worse than the 1-thread hot-key ratio (checked below).
    ("2_threads_hot_key", "1_thread_hot_key"),
]

# Middleware: the time each layer adds over the bare route, tollgate's over tower_governor's.
MIDDLEWARE = "middleware/gcra_1rule"
MIDDLEWARE_PAIRS = [
    ("tollgate", "tower_governor", 1.5),
    ("tollgate_no_headers", "tower_governor", None),
    ("tollgate", "tower_governor_headers", None),
]


def criterion_dir():
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    if os.environ.get("CRITERION_HOME"):
        return Path(os.environ["CRITERION_HOME"])
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]) / "criterion"
    return Path("target/criterion")


def load(root):
    """{(group, function): (ns per iteration, elements per iteration or None, mtime)}"""
    found = {}
    for meta_path in root.glob("**/new/benchmark.json"):
        estimates_path = meta_path.with_name("estimates.json")
        try:
            meta = json.loads(meta_path.read_text())
            estimates = json.loads(estimates_path.read_text())
        except (OSError, ValueError):
            continue
        # The figure criterion prints: the slope when it has one, else the mean.
        estimate = estimates.get("slope") or estimates.get("mean")
        if not estimate:
            continue
        throughput = meta.get("throughput") or {}
        elements = throughput.get("Elements")
        key = (meta.get("group_id"), meta.get("function_id"))
        found[key] = (
            estimate["point_estimate"],
            elements,
            estimates_path.stat().st_mtime,
        )
    return found


def fmt_ns(ns):
    return f"{ns / 1000:.2f} µs" if ns >= 10_000 else f"{ns:.0f} ns"


def verdict(ratio, target, higher_is_better=False):
    if target is None:
        return "(for comparison)", ""
    if higher_is_better:
        return f">= {target}x", "pass" if ratio >= target else "**miss**"
    return f"<= {target}x", "pass" if ratio <= target else "**miss**"


def main():
    root = criterion_dir()
    data = load(root)
    if not data:
        sys.exit(f"no criterion estimates under {root}: run "
                 "`cargo bench -p tollgate-bench --bench memory` first")
    used = []
    rows = []

    def get(group, function):
        value = data.get((group, function))
        if value is not None:
            used.append(value[2])
        return value

    for group, ours, theirs, target in TIME_PAIRS:
        a, b = get(group, ours), get(group, theirs)
        if a is None or b is None:
            continue
        ratio = a[0] / b[0]
        target_text, result = verdict(ratio, target)
        rows.append((f"`{group}`", f"{ours} {fmt_ns(a[0])}",
                     f"{theirs} {fmt_ns(b[0])}", f"{ratio:.2f}x", target_text, result))

    ratios = {}
    for name, target in THROUGHPUT_GROUPS:
        group = f"{THROUGHPUT}/{name}"
        a, b = get(group, "tollgate"), get(group, "governor")
        if a is None or b is None:
            continue
        # Checks per second: elements per iteration over seconds per iteration.
        ours, theirs = ((v[1] or 1) / v[0] * 1e9 for v in (a, b))
        ratio = ratios[name] = ours / theirs
        if isinstance(target, str):
            base = ratios.get(target)
            target_text = f">= {target} ratio"
            result = "" if base is None else ("pass" if ratio >= base else "**miss**")
            if base is not None:
                target_text = f">= {base:.2f}x ({target})"
        else:
            target_text, result = verdict(ratio, target, higher_is_better=True)
        rows.append((f"`{group}` (checks/s)", f"tollgate {ours / 1e6:.1f} M/s",
                     f"governor {theirs / 1e6:.1f} M/s", f"{ratio:.2f}x", target_text, result))

    bare = get(MIDDLEWARE, "bare")
    if bare is not None:
        for ours, theirs, target in MIDDLEWARE_PAIRS:
            a, b = get(MIDDLEWARE, ours), get(MIDDLEWARE, theirs)
            if a is None or b is None:
                continue
            added_a, added_b = a[0] - bare[0], b[0] - bare[0]
            if added_b <= 0:
                rows.append((f"`{MIDDLEWARE}` (added over bare {fmt_ns(bare[0])})",
                             f"{ours} +{fmt_ns(added_a)}", f"{theirs} +{fmt_ns(added_b)}",
                             "n/a", "", "(peer adds nothing measurable)"))
                continue
            ratio = added_a / added_b
            target_text, result = verdict(ratio, target)
            rows.append((f"`{MIDDLEWARE}` (added over bare {fmt_ns(bare[0])})",
                         f"{ours} +{fmt_ns(added_a)}", f"{theirs} +{fmt_ns(added_b)}",
                         f"{ratio:.2f}x", target_text, result))

    if not rows:
        sys.exit(f"no pair of issue 9 has both sides measured under {root}")
    print("| group | tollgate | peer | ratio | target | |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    first, last = (datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") for t in
                   (min(used), max(used)))
    print(f"\nEstimates from {root}, written {first} to {last}.")


if __name__ == "__main__":
    main()
