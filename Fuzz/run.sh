#!/usr/bin/env bash
# Builds the wire fuzzer and fuzzes it for SECONDS (default 60) over a scratch copy of the seed
# corpus (Fuzz/Corpus/wire), so the repository's corpus never changes by itself.
# Exits non-zero when the fuzzer finds a crash, printing the crash input's path; add that file
# to the corpus once the bug is fixed, so `swift test` replays it from then on.
#
#   Fuzz/run.sh [SECONDS]      (from anywhere)
set -euo pipefail

seconds="${1:-60}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
seeds="$here/Corpus/wire"
cd "$here"

# `--sanitize=fuzzer` makes SwiftPM link the product without its `main`; the -Xswiftc value adds
# ASan. One comma-separated value: separate sanitizer flags silently drop the fuzzer's coverage.
swift build -c release --sanitize=fuzzer -Xswiftc -sanitize=fuzzer,address --product wire-fuzzer
fuzzer="$here/.build/release/wire-fuzzer"

work="$(mktemp -d "${TMPDIR:-/tmp}/portkit-wire-fuzz.XXXXXX")"
mkdir -p "$work/corpus" "$work/crashes"
cp "$seeds"/* "$work/corpus/"

status=0
# Swift's backtracer would swallow the crash, and libFuzzer would write no crash file.
SWIFT_BACKTRACE=enable=no "$fuzzer" \
    -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$work/crashes/" -print_final_stats=1 \
    "$work/corpus" >"$work/fuzz.log" 2>&1 || status=$?
tail -n 25 "$work/fuzz.log"

crashes=("$work"/crashes/*)
if [[ $status -ne 0 || -e "${crashes[0]}" ]]; then
    echo "wire-fuzzer: FAILED (exit $status); log: $work/fuzz.log" >&2
    for crash in "${crashes[@]}"; do
        [[ -e "$crash" ]] && echo "wire-fuzzer: crash input: $crash" >&2
    done
    exit 1
fi
echo "wire-fuzzer: no crash in ${seconds} s ($(ls "$work/corpus" | wc -l) corpus entries)"
rm -rf "$work"
