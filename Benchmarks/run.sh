#!/usr/bin/env bash
# PortKit's benchmark suite (issue #6): PortKit and every baseline in one run, one table.
# Each comparison is measured twice: by ordo-one/benchmark (all PortKit and baseline rows, one
# after the other), then interleaved batch by batch (`pkbench compare`), which a change in the
# machine's load cannot bias.
#
#   Benchmarks/run.sh                   full run (about 10 minutes on 2 cores), table on stdout
#   Benchmarks/run.sh --short           a few samples per row (CI: proves the suite still runs)
#   Benchmarks/run.sh --callgrind       also user-space instructions per round trip (valgrind)
#   Benchmarks/run.sh --callgrind-only  only that
#   Benchmarks/run.sh --filter REGEX    only the rows whose name (workload|impl|placement)
#                                       matches REGEX as a whole, e.g. 'rt\.threads\|.*'
#   Benchmarks/run.sh --no-zeromq       skip the libzmq baselines even if libzmq is installed
#   Benchmarks/run.sh --out DIR         where the raw results go (default Benchmarks/results)
#
# The libzmq baselines need Debian's libzmq3-dev; without it they are skipped and say so.
# Every latency row is measured twice: both sides pinned to CPU 0 ("same"), and one side per
# CPU ("split"). Numbers taken while the machine is busy are noisy: check `uptime` first.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)

SHORT=0
CALLGRIND=0
BENCH=1
ZEROMQ=auto
FILTER=""
OUT="$HERE/results"
while [ $# -gt 0 ]; do
    case "$1" in
        --short) SHORT=1 ;;
        --callgrind) CALLGRIND=1 ;;
        --callgrind-only) CALLGRIND=1; BENCH=0 ;;
        --no-zeromq) ZEROMQ=no ;;
        --zeromq) ZEROMQ=yes ;;
        --filter) FILTER="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

TRAITS=()
if [ "$ZEROMQ" = auto ]; then
    if pkg-config --exists libzmq 2>/dev/null; then ZEROMQ=yes; else ZEROMQ=no; fi
fi
if [ "$ZEROMQ" = yes ]; then TRAITS=(--traits ZeroMQ); fi

mkdir -p "$OUT"
rm -f "$OUT"/*.influx.csv "$OUT"/extra.jsonl "$OUT"/interleaved.jsonl "$OUT"/activity.log "$OUT"/callgrind.json "$OUT"/meta.json "$OUT"/expected.txt "$OUT"/callgrind-profile-*.txt

echo "== build (release${TRAITS[*]:+, ${TRAITS[*]}})" >&2
# A failed build must stop the run: the binary of an earlier build would be measured instead.
if ! swift build -c release "${TRAITS[@]}" --product pkbench 2>&1 | { grep -Ev "prohibited flag|^\[[0-9]+/[0-9]+\]" >&2 || true; }; then
    echo "run.sh: the build failed; nothing was measured" >&2
    exit 1
fi
BIN=$(swift build -c release "${TRAITS[@]}" --show-bin-path)
export PKBENCH="$BIN/pkbench"
[ -x "$PKBENCH" ] || { echo "run.sh: $PKBENCH was not built" >&2; exit 1; }
export PKBENCH_SHORT=$SHORT
if [ -n "$FILTER" ]; then export PKBENCH_FILTER="$FILTER"; fi

# What the table reports about the run.
python3 - "$OUT/meta.json" "$SHORT" "$ZEROMQ" <<'EOF'
import json, os, platform, subprocess, sys
def sh(cmd):
    try: return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception: return "?"
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
json.dump({
    "cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
    "swift": sh("swift --version 2>&1 | head -1"), "load_before": open("/proc/loadavg").read().split()[:3],
    "commit": os.environ.get("PKBENCH_COMMIT") or sh("git -C .. rev-parse --short HEAD 2>/dev/null") or "unknown",
    "dirty": False if os.environ.get("PKBENCH_COMMIT") else bool(sh("git -C .. status --porcelain -- ../Sources ../Package.swift")),
    "short": sys.argv[2] == "1", "zeromq": sys.argv[3] == "yes",
}, open(sys.argv[1], "w"))
EOF

# While the suite runs, note every 5 s the load and whether other people's builds or tests run
# (the report says how often they did: their numbers are noisier).
(
    while true; do
        others=$(ps -eo comm= | grep -cE '^(swift-frontend|swift-build|swift-test|swift-driver|clang|ld|ld.lld|ld.gold|xctest|.*PackageTests)$' || true)
        echo "$(date +%s) $(cut -d' ' -f1 /proc/loadavg) $others"
        sleep 5
    done
) > "$OUT/activity.log" 2>/dev/null &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null || true' EXIT

if [ "$BENCH" = 1 ]; then
    "$PKBENCH" list > "$OUT/expected.txt"
    echo "== benchmarks (ordo-one/benchmark): $(wc -l < "$OUT/expected.txt") rows" >&2
    FILTER_ARGS=()
    if [ -n "$FILTER" ]; then FILTER_ARGS=(--filter "$FILTER"); fi
    swift package "${TRAITS[@]}" --allow-writing-to-directory "$OUT" benchmark \
        --format influx --path "$OUT" --no-progress "${FILTER_ARGS[@]}" 2>&1 \
        | grep -Ev "prohibited flag|^\[[0-9]+/[0-9]+\]|runtime interposer|skipping LD_PRELOAD" >&2 || true
    ls "$OUT"/*.influx.csv >/dev/null 2>&1 || { echo "run.sh: the benchmark run wrote no results" >&2; exit 1; }

    echo "== the same comparisons interleaved batch by batch (pkbench compare)" >&2
    "$PKBENCH" compare > "$OUT/interleaved.jsonl" || echo "run.sh: pkbench compare failed" >&2

    if [ -z "$FILTER" ]; then
        echo "== memory per idle port, Foundation SocketPort (child processes)" >&2
        timeout 120 "$PKBENCH" memory >> "$OUT/extra.jsonl" || echo '{"memory": "failed"}' >> "$OUT/extra.jsonl"
        for placement in same split; do
            for kind in rt stream; do
                set +e
                SWIFT_BACKTRACE=enable=no timeout 120 "$PKBENCH" foundation "$kind" "$placement" >> "$OUT/extra.jsonl" 2>/dev/null
                rc=$?
                set -e
                if [ $rc -ne 0 ]; then
                    echo "{\"workload\": \"$kind\", \"placement\": \"$placement\", \"crashed\": $rc}" >> "$OUT/extra.jsonl"
                fi
            done
        done
    fi
fi

if [ "$CALLGRIND" = 1 ]; then
    echo "== callgrind: user-space instructions per round trip" >&2
    python3 "$HERE/callgrind.py" "$PKBENCH" "$OUT" $([ "$SHORT" = 1 ] && echo --short)
fi

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 "$HERE/report.py" "$OUT"
