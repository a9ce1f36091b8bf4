#!/usr/bin/env bash
# Wall-clock time per check of two builds of tollgate and of governor, interleaved round by
# round on the same machine in the same minutes: `side_by_side.sh BASE [ROUNDS] [CASES...]`
# builds the `probe` example at commit BASE (in a worktree under target/) and at the working
# tree, runs each case of each build and governor's matching case in turn, and prints the
# medians. On a shared machine whose speed drifts between runs, this is the fair way to say
# whether a change made the check faster: both builds meet the same drift.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
base=${1:?usage: side_by_side.sh BASE [ROUNDS] [CASES...]}
rounds=${2:-5}
shift $(($# < 2 ? $# : 2))
cases=${*:-gcra_admit gcra_deny log_admit two_by_three_admit}
n=5000000
tree=target/side-by-side/$base
if [ ! -d "$tree" ]; then
    git worktree add -q --detach "$tree" "$base"
fi
(cd "$tree" && CARGO_TARGET_DIR="$PWD/../target-$base" cargo build --release -q -p tollgate-bench --example probe)
cargo build --release -q -p tollgate-bench --example probe
base_bin=target/side-by-side/target-$base/release/examples/probe
head_bin=target/release/examples/probe
per_check() { # binary case -> ns per check
    local start end
    start=$(date +%s%N)
    "$1" "$2" "$n"
    end=$(date +%s%N)
    echo $(((end - start) / n))
}
for c in $cases; do
    governor=governor_admit
    [[ $c == *deny ]] && governor=governor_deny
    for _ in $(seq "$rounds"); do
        echo "$c base $(per_check "$base_bin" "$c")"
        echo "$c head $(per_check "$head_bin" "$c")"
        echo "$c governor $(per_check "$head_bin" "$governor")"
    done
done | python3 -c '
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    case, build, ns = line.split()
    runs[case, build].append(int(ns))
print(f"| case | base | this tree | governor | base / governor | this tree / governor | this tree / base |")
print("|---|---|---|---|---|---|---|")
for case in dict.fromkeys(c for c, _ in runs):
    b, h, g = (statistics.median(runs[case, k]) for k in ("base", "head", "governor"))
    print(f"| {case} | {b:.0f} ns | {h:.0f} ns | {g:.0f} ns | {b/g:.2f}x | {h/g:.2f}x | {h/b:.2f} |")
'
