#!/usr/bin/env bash
# Wall-clock time a rate-limit layer adds to a request through an axum route, tollgate's and
# tower_governor's, interleaved round by round in the same minutes:
# `layer_side_by_side.sh [ROUNDS] [BASE]` builds the `probe_layer` example at the working tree
# (and at commit BASE, in a worktree under target/, when given), runs every case in turn each
# round, and prints the medians of what each layer adds over the bare route. Criterion's
# groups run one after another, minutes apart; on a shared machine whose speed drifts, this
# is the fair way to set the two layers side by side.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
rounds=${1:-7}
base=${2:-}
n=400000
cargo build --release -q -p tollgate-bench --example probe_layer
builds=("head target/release/examples/probe_layer")
if [ -n "$base" ]; then
    tree=target/side-by-side/$base
    [ -d "$tree" ] || git worktree add -q --detach "$tree" "$base"
    (cd "$tree" && CARGO_TARGET_DIR="$PWD/../target-$base" \
        cargo build --release -q -p tollgate-bench --example probe_layer)
    builds+=("base target/side-by-side/target-$base/release/examples/probe_layer")
fi
# Every run on the same core (the last), when taskset is there: the scheduler moving a run
# between cores is noise of its own.
pin=()
if command -v taskset >/dev/null; then
    pin=(taskset -c "$(($(nproc) - 1))")
fi
per_request() { # binary case -> ns per request
    local start end
    start=$(date +%s%N)
    "${pin[@]}" "$1" "$2" "$n"
    end=$(date +%s%N)
    echo $(((end - start) / n))
}
for _ in $(seq "$rounds"); do
    for build in "${builds[@]}"; do
        read -r name bin <<<"$build"
        for c in bare tollgate tollgate_no_headers; do
            echo "$name $c $(per_request "$bin" "$c")"
        done
    done
    for c in tower_governor tower_governor_headers; do
        echo "peer $c $(per_request target/release/examples/probe_layer "$c")"
    done
done | python3 -c '
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    build, case, ns = line.split()
    runs[build, case].append(int(ns))
med = {k: statistics.median(v) for k, v in runs.items()}
bare = med["head", "bare"]
added = lambda build, case: med[build, case] - med[build if build != "peer" else "head", "bare"]
g, gh = added("peer", "tower_governor"), added("peer", "tower_governor_headers")
print(f"bare route: {bare:.0f} ns; tower_governor adds {g:.0f} ns, with use_headers {gh:.0f} ns")
print("| build | tollgate adds | over tower_governor with headers | without headers | over tower_governor |")
print("|---|---|---|---|---|")
for build in dict.fromkeys(b for b, _ in runs if b != "peer"):
    t, tn = added(build, "tollgate"), added(build, "tollgate_no_headers")
    print(f"| {build} | {t:.0f} ns | {t/gh:.2f}x | {tn:.0f} ns | {tn/g:.2f}x |")
'
