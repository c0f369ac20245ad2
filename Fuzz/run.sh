#!/usr/bin/env bash
# Builds PortKit's fuzzers and fuzzes each for SECONDS (default 60) over a scratch copy of its
# seed corpus (Fuzz/Corpus/<target>), so the repository's corpus never changes by itself.
#
#   Fuzz/run.sh [SECONDS] [TARGET...]      (from anywhere)
#
# Targets: wire (greeting and frames), checkin (a worker's check-in, PORTKIT_WORKER), names (the
# name server's names and paths), zmq (the ZeroMQ mapping and name service). With no target,
# every one; zmq only when pkg-config finds libzmq (it is skipped, with a note, otherwise).
# Exits non-zero when a fuzzer finds a crash, printing the crash input's path; add that file to
# the target's corpus once the bug is fixed, so `swift test` replays it from then on.
set -euo pipefail

seconds="${1:-60}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    targets=(wire checkin names)
    if pkg-config --exists libzmq 2>/dev/null; then
        targets+=(zmq)
    else
        echo "fuzz: libzmq not found by pkg-config: skipping the zmq target"
    fi
fi

failed=()
summary=()
for target in "${targets[@]}"; do
    case "$target" in
        wire|checkin|names|zmq) ;;
        *) echo "fuzz: unknown target $target (wire, checkin, names, zmq)" >&2; exit 2 ;;
    esac
    product="$target-fuzzer"
    seeds="$here/Corpus/$target"

    # `--sanitize=fuzzer` makes SwiftPM link the product without its `main`; the -Xswiftc value
    # adds ASan. One comma-separated value: separate sanitizer flags silently drop the fuzzer's
    # coverage.
    swift build -c release --sanitize=fuzzer -Xswiftc -sanitize=fuzzer,address --product "$product"
    fuzzer="$here/.build/release/$product"

    work="$(mktemp -d "${TMPDIR:-/tmp}/portkit-$target-fuzz.XXXXXX")"
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
        echo "$product: FAILED (exit $status); log: $work/fuzz.log" >&2
        for crash in "${crashes[@]}"; do
            [[ -e "$crash" ]] && echo "$product: crash input: $crash" >&2
        done
        failed+=("$target")
        continue
    fi
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -n 1)"
    line="$product: no crash in ${seconds} s (${runs:-?} inputs, $(ls "$work/corpus" | wc -l) corpus entries)"
    echo "$line"
    summary+=("$line")
    rm -rf "$work"
done

echo
for line in "${summary[@]}"; do echo "$line"; done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: crashes in: ${failed[*]}" >&2
    exit 1
fi
