#!/usr/bin/env python3
"""Turns one run of the suite into one table: workload, placement, PortKit median, baseline
median, ratio, target, met?

    report.py RESULTS_DIR        (what run.sh wrote: *.influx.csv, extra.jsonl, callgrind.json)

Medians are of the custom metric psPerOp (picoseconds per operation, timed on the thread that
does the work); each sample is a batch of operations. Writes RESULTS_DIR/table.md as well.
"""
import csv
import glob
import json
import os
import sys

# (row title, PortKit workload, PortKit impl, baseline workload, baseline impl, kind, target)
# kind "latency": ratio = PortKit / baseline, met when <= target.
# kind "throughput": ratio = PortKit msg/s / baseline msg/s, met when >= target.
RULES = [
    ("Round trip 64 B, threads", "rt.threads", "portkit", "rt.threads", "socketpair", "latency", 1.10),
    ("Round trip 64 B, threads", "rt.threads", "portkit", "rt.threads", "zmq-inproc", "latency", 1.00),
    ("Round trip 64 B, threads", "rt.threads", "portkit", "rt.threads", "cfrunloop", "latency", None),
    ("Round trip 64 B, processes", "rt.processes", "portkit", "rt.processes", "unix-socket", "latency", 1.15),
    ("Round trip 64 B, processes", "rt.processes", "portkit", "rt.processes", "zmq-ipc", "latency", 0.50),
    ("Round trip 64 B, processes", "rt.processes", "portkit", "rt.processes", "zmq-tcp", "latency", None),
    ("Stream 64 B, threads", "stream64.threads", "portkit", "stream64.threads", "zmq-inproc", "throughput", 1.2),
    ("Stream 64 B, threads", "stream64.threads", "portkit", "stream64.threads", "socketpair", "throughput", None),
    ("Stream 64 B, processes", "stream64.processes", "portkit", "stream64.processes", "zmq-ipc-pushpull", "throughput", 1.0),
    ("Stream 64 B, processes", "stream64.processes", "portkit", "stream64.processes", "unix-socket", "throughput", None),
    ("Stream 1 KiB, threads", "stream1k.threads", "portkit", "stream1k.threads", "zmq-inproc", "throughput", 1.0),
    ("Stream 1 KiB, threads", "stream1k.threads", "portkit", "stream1k.threads", "socketpair", "throughput", None),
    ("Stream 1 KiB, processes", "stream1k.processes", "portkit", "stream1k.processes", "zmq-ipc-pushpull", "throughput", 1.0),
    ("Stream 1 KiB, processes", "stream1k.processes", "portkit", "stream1k.processes", "unix-socket", "throughput", None),
    ("Request/reply, threads", "request.threads", "portkit", "rt.threads", "portkit", "latency", 1.2),
    ("Request/reply, processes", "request.processes", "portkit", "rt.processes", "portkit", "latency", 1.2),
    ("Spawn to check-in", "spawn", "portkit", "spawn", "pthread+byte", "latency", 1.5),
    ("Round trip, 1,000 idle ports per loop (each with a socket sender)", "rt.threads.idle1000", "portkit", "rt.threads", "portkit", "latency", 1.10),
    ("Round trip, 1,000 timers waiting on each loop", "rt.threads.timers1000", "portkit", "rt.threads", "portkit", "latency", 1.10),
    ("Round trip, processes, 1,000 more senders on the port, one of them silent", "rt.processes.crowd", "portkit", "rt.processes", "portkit", "latency", 1.10),
    ("Lookup, 10,000 names registered", "lookup", "portkit-10000", "lookup", "portkit-1", "latency", 2.0),
    # PortKit's ZeroMQ transport against raw libzmq on the same endpoint type: latency at most
    # 1.15 x, throughput at least 0.85 x (issue #6).
    ("ZeroMQ transport: round trip 64 B, processes, ipc://", "rt.processes", "portkit-zmq-ipc", "rt.processes", "zmq-ipc", "latency", 1.15),
    ("ZeroMQ transport: round trip 64 B, processes, tcp://", "rt.processes", "portkit-zmq-tcp", "rt.processes", "zmq-tcp", "latency", 1.15),
    ("ZeroMQ transport: stream 64 B, processes, ipc://", "stream64.processes", "portkit-zmq-ipc", "stream64.processes", "zmq-ipc-pushpull", "throughput", 0.85),
    ("ZeroMQ transport: stream 1 KiB, processes, ipc://", "stream1k.processes", "portkit-zmq-ipc", "stream1k.processes", "zmq-ipc-pushpull", "throughput", 0.85),
]

BASELINE_LABEL = {
    "socketpair": "raw socketpair + epoll (C)",
    "unix-socket": "raw named Unix socket + epoll (C)",
    "zmq-inproc": "libzmq PAIR inproc://",
    "zmq-ipc": "libzmq PAIR ipc://",
    "zmq-tcp": "libzmq PAIR tcp:// loopback",
    "zmq-ipc-pushpull": "libzmq PUSH/PULL ipc://",
    "pthread+byte": "pthread_create + 1 socketpair byte (C)",
    "cfrunloop": "CFRunLoop + the guide's custom input source",
}


def load(outdir):
    """{(workload, impl, placement): {"p25","p50","p75" (ns), "n"}} from the influx export."""
    rows = {}
    for path in glob.glob(os.path.join(outdir, "*.influx.csv")):
        with open(path, newline="") as f:
            lines = [l for l in f if not l.startswith("#")]
        for rec in csv.DictReader(lines):
            if rec.get("metric") != "psPerOp":
                continue
            parts = rec["test"].strip('"').split("|")
            if len(parts) != 3:
                continue
            key = tuple(parts)
            entry = rows.setdefault(key, {})
            p = float(rec["percentile"])
            entry[{0.0: "p0", 25.0: "p25", 50.0: "p50", 75.0: "p75", 100.0: "p100"}.get(p, f"p{p}")] = float(rec["value"]) / 1000.0
            entry["n"] = int(rec["iterations"])
    return rows


def fmt_latency(ns):
    return f"{ns / 1000:.2f} µs"


def fmt_rate(ns):
    return f"{1000.0 / ns:.2f} M msg/s"


def spread(entry):
    if not entry or "p25" not in entry or "p75" not in entry or not entry["p50"]:
        return 0.0
    return (entry["p75"] - entry["p25"]) / entry["p50"] * 100


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "results"
    data = load(outdir)
    meta = {}
    if os.path.exists(os.path.join(outdir, "meta.json")):
        meta = json.load(open(os.path.join(outdir, "meta.json")))
    extra = []
    if os.path.exists(os.path.join(outdir, "extra.jsonl")):
        for line in open(os.path.join(outdir, "extra.jsonl")):
            line = line.strip()
            if line.startswith("{"):
                try:
                    extra.append(json.loads(line))
                except ValueError:
                    pass
    interleaved = {}
    if os.path.exists(os.path.join(outdir, "interleaved.jsonl")):
        for line in open(os.path.join(outdir, "interleaved.jsonl")):
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "ratio" in item:
                interleaved[(item["subject"], item["baseline"])] = item
    activity = []
    if os.path.exists(os.path.join(outdir, "activity.log")):
        for line in open(os.path.join(outdir, "activity.log")):
            parts = line.split()
            if len(parts) == 3:
                activity.append((float(parts[1]), int(parts[2])))
    callgrind = {}
    if os.path.exists(os.path.join(outdir, "callgrind.json")):
        callgrind = json.load(open(os.path.join(outdir, "callgrind.json")))

    placements = [p for p in ("same", "split") if any(k[2] == p for k in data)]
    expected = set()
    expected_path = os.path.join(outdir, "expected.txt")
    if os.path.exists(expected_path):
        expected = {tuple(line.strip().split("|")) for line in open(expected_path) if line.count("|") == 2}
    out = []
    out.append("| Workload | Placement | PortKit | Baseline | Baseline median | Ratio | Interleaved | Target | Met? | Spread |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    met = total = 0
    for title, pw, pi, bw, bi, kind, target in RULES:
        for placement in placements:
            pk = data.get((pw, pi, placement))
            base = data.get((bw, bi, placement))
            label = BASELINE_LABEL.get(bi, "PortKit " + {"rt.threads": "round trip, threads", "rt.processes": "round trip, processes",
                                                          "lookup": "lookup, 1 name in each of the same owners"}.get(bw, bw))
            if pk is None and (pw, pi, placement) not in expected:
                continue  # filtered out of this run
            fmt = fmt_latency if kind == "latency" else fmt_rate
            pk_s = fmt(pk["p50"]) if pk else "not run"
            base_s = fmt(base["p50"]) if base else ("not run (no libzmq)" if bi.startswith("zmq") else "not run")
            ratio_s, inter_s, target_s, ok_s = "", "", "", ""
            if target is not None:
                target_s = ("≤ " if kind == "latency" else "≥ ") + f"{target:.2f} x"
            judged = []
            if pk and base:
                ratio = pk["p50"] / base["p50"] if kind == "latency" else base["p50"] / pk["p50"]
                ratio_s = f"{ratio:.2f} x"
                judged.append(ratio)
            inter = interleaved.get((f"{pw}|{pi}|{placement}", f"{bw}|{bi}|{placement}"))
            if inter:
                r = inter["ratio"] if kind == "latency" else 1.0 / inter["ratio"]
                inter_s = f"{r:.2f} x"
                judged.append(r)
            if target is None:
                ok_s = "(no target)" if judged else ""
            elif judged:
                oks = [(r <= target) if kind == "latency" else (r >= target) for r in judged]
                ok = all(oks)
                ok_s = "yes" if ok else ("**NO**" if not any(oks) else "mixed")
                total += 1
                met += ok
            else:
                ok_s = "not measured"
            sp = max(spread(pk), spread(base))
            out.append(f"| {title} | {placement} | {pk_s} | {label} | {base_s} | {ratio_s} | {inter_s} | {target_s} | {ok_s} | {sp:.0f}% |")

    # Foundation SocketPort + RunLoop, measured in a child process (it crashes on streams).
    for item in extra:
        if item.get("workload") not in ("rt", "stream"):
            continue
        placement = item.get("placement", "?")
        if item["workload"] == "rt":
            pk = data.get(("rt.threads", "portkit", placement))
            title = "Round trip 64 B, threads"
        else:
            pk = data.get(("stream64.threads", "portkit", placement))
            title = "Stream 64 B, threads"
        label = "Foundation SocketPort + RunLoop"
        if "crashed" in item:
            code = item["crashed"]
            what = f"crashed (signal {code - 128})" if code > 128 else f"failed (exit {code})"
            out.append(f"| {title} | {placement} | {fmt_latency(pk['p50']) if pk and item['workload'] == 'rt' else (fmt_rate(pk['p50']) if pk else '')} | {label} | {what} | | | | (no target) | |")
        else:
            ns = item["ns_per_op"]
            if item["workload"] == "rt":
                ratio = f"{pk['p50'] / ns:.2f} x" if pk else ""
                out.append(f"| {title} | {placement} | {fmt_latency(pk['p50']) if pk else ''} | {label} | {fmt_latency(ns)} | {ratio} | | | (no target) | |")
            else:
                ratio = f"{ns / pk['p50']:.2f} x (msg/s)" if pk else ""
                out.append(f"| {title} | {placement} | {fmt_rate(pk['p50']) if pk else ''} | {label} (send side only) | {fmt_rate(ns)} | {ratio} | | | (no target) | |")

    # Instructions per round trip (callgrind).
    def shown(entry):
        locked = entry.get("locked_per_round_trip")
        lines = entry.get("code_lines_per_round_trip")
        extra = [f"{locked:.0f} locked"] if locked is not None else []
        extra += [f"{lines} code lines"] if lines is not None else []
        return f"{entry['per_round_trip']:.0f}" + (f" ({'; '.join(extra)})" if extra else "")

    for side in ("threads", "processes"):
        pk = callgrind.get(f"portkit-{side}", {})
        c = callgrind.get(f"c-{side}", {})
        if not pk and not c:
            continue
        if "per_round_trip" in pk and "per_round_trip" in c:
            ratio = pk["per_round_trip"] / c["per_round_trip"]
            ok = ratio <= 3.0
            total += 1
            met += ok
            out.append(f"| User-space instructions per round trip, {side} | callgrind | {shown(pk)} | raw C ({'socketpair' if side == 'threads' else 'named Unix socket'}) | {shown(c)} | {ratio:.1f} x | | ≤ 3.00 x | {'yes' if ok else '**NO**'} | exact |")
        else:
            err = pk.get("error") or c.get("error") or "missing"
            out.append(f"| User-space instructions per round trip, {side} | callgrind | failed: {err[:80]} | | | | | ≤ 3.00 x | not measured | |")
        cf = callgrind.get(f"cf-{side}", {})
        if "per_round_trip" in pk and "per_round_trip" in cf:
            out.append(f"| User-space instructions per round trip, {side} | callgrind | {shown(pk)} | CFRunLoop + the guide's custom input source | {shown(cf)} | {pk['per_round_trip'] / cf['per_round_trip']:.2f} x | | | (no target) | exact |")

    for item in extra:
        if "bare_bytes" in item:
            local = f"{item['local_bytes']:.0f} B with one in-process sender (mailbox); " if "local_bytes" in item else ""
            out.append(f"| User-space memory per idle port | — | {item['bare_bytes']:.0f} B scheduled, no sender; {local}{item['connected_bytes']:.0f} B with one connected sender (a socket, +{item['descriptors_per_connected']} descriptors) | | | | | | (no target) | |")
    if not any(k[1].startswith("portkit-zmq") for k in list(data) + list(expected)):
        out.append("| The same through PortKit's ZeroMQ transport vs raw libzmq | — | not run (needs libzmq: the ZeroMQ trait) | | | | | | not measured | |")

    summary = f"{met} of {total} measured targets met."
    # Rows the suite should have produced and did not: a workload that broke.
    failed = ["|".join(parts) for parts in sorted(expected) if parts not in data]
    for kind, value in callgrind.items():
        if isinstance(value, dict) and "error" in value:
            failed.append(f"callgrind {kind}: {value['error'][:200]}")
    if failed:
        summary += "\n\nFAILED (no result): " + ", ".join(failed)
    text = "\n".join(out) + "\n\n" + summary + "\n"
    notes = []
    if meta:
        notes.append(f"Machine: {meta.get('cpus')} CPUs, {meta.get('cpu_model')}, kernel {meta.get('kernel')}, {meta.get('swift')}; "
                     f"load before the run {' '.join(meta.get('load_before', []))}; PortKit at {meta.get('commit')}"
                     f"{' with uncommitted changes' if meta.get('dirty') else ''}"
                     f"{'; SHORT MODE (a few samples per row: not for comparison)' if meta.get('short') else ''}.")
    if activity:
        loads = sorted(a for a, _ in activity)
        busy = sum(1 for _, o in activity if o > 0)
        notes.append(f"During the run: load {loads[0]:.2f} to {loads[-1]:.2f} (median {loads[len(loads) // 2]:.2f}; the suite's own two busy threads count about 1 to 2); "
                     f"compilers or test runners of other users seen in {busy} of {len(activity)} samples taken every 5 s.")
    ns = sorted({v.get("n", 0) for v in data.values()})
    if ns:
        notes.append(f"Samples per row: {ns[0]} to {ns[-1]}; spread = interquartile range / median of the worse of the two rows. "
                     "Ratio: medians of the ordo-one rows, measured one after the other; Interleaved: median of per-pair ratios with "
                     "PortKit and the baseline alternating batch by batch (`pkbench compare`). Met?: yes when both meet the target, "
                     "mixed when they disagree. Stream ratios are PortKit's messages per second over the baseline's.")
    text += "\n".join(notes) + ("\n" if notes else "")
    print(text)
    with open(os.path.join(outdir, "table.md"), "w") as f:
        f.write(text)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
