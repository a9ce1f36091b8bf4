#!/usr/bin/env bash
# Instructions per check (callgrind): tollgate's memory store and governor, each case alone.
# Counts do not depend on load, so they compare across runs on a shared machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install -y valgrind)" >&2; exit 1; }
cargo build --release -q -p tollgate-bench --example probe
n=20000
out=$(mktemp -d)
for case in "${@:-gcra_admit gcra_deny log_admit log_deny two_by_three_admit governor_admit governor_deny}"; do
    for c in $case; do
        total=$(valgrind --tool=callgrind --callgrind-out-file="$out/$c" \
            --toggle-collect='probe::checks*' --toggle-collect='probe::governor_checks*' \
            target/release/examples/probe "$c" "$n" 2>&1 | awk '/Collected/ {print $4}')
        printf '%-20s %6d instructions per check\n' "$c" $((total / n))
    done
done
rm -rf "$out"
