#!/usr/bin/env python3
"""User-space instructions per round trip, PortKit against the raw C baselines, by callgrind.

Runs `pkbench rt KIND N` and `pkbench rt KIND 2N` under valgrind (following child processes) and
subtracts: start-up, set-up and warm-up cancel, what remains is N round trips, both sides
(both threads, or both processes) counted. Instruction counts do not depend on the machine's
load, so this is the figure to compare between runs.

    callgrind.py PKBENCH OUTDIR [--short] [--n N] [--kinds K1,K2,...]

Kinds (pkbench rt KIND): portkit-threads, c-threads, cf-threads (CFRunLoop with the guide's
custom input source), portkit-processes, c-processes (the default), and for profiles
cf-threads-nodeadline, portkit-threads-idle1000, portkit-request-threads,
portkit-request-processes, portkit-stream64-threads, portkit-stream64-processes,
portkit-spawn, and with the ZeroMQ trait portkit-zmq-stream64 and zmq-stream64 (ipc://
streams; libzmq's I/O threads counted too).

Writes OUTDIR/callgrind.json and, for PortKit's kinds and CFRunLoop's,
OUTDIR/callgrind-profile-KIND.txt: the per-function difference between the two runs divided by
N (exclusive and inclusive), that is where the round trip spends its instructions.

Also counts the locked instructions per round trip (a `lock` prefix, or `xchg` with memory:
atomic read-modify-writes, each a full barrier costing about 4.7 ns on these machines against
a fraction of a nanosecond for most instructions): callgrind's per-instruction counts
(`--dump-instr=yes`) matched against `objdump -d` of every object the run executed. Reference
counting, locks and libc's cancellation points are where they come from.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

KINDS = ["portkit-threads", "c-threads", "cf-threads", "portkit-processes", "c-processes"]
LINE = re.compile(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$")


def run(binary, kind, n, workdir):
    tag = f"{kind}-{n}"
    out = os.path.join(workdir, tag + ".%p")
    env = dict(os.environ, PKBENCH=binary, SWIFT_BACKTRACE="enable=no")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--trace-children=yes", "--dump-instr=yes", f"--callgrind-out-file={out}",
         binary, "rt", kind, str(n)],
        capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {n}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    files = [os.path.join(workdir, f) for f in os.listdir(workdir) if f.startswith(tag + ".")]
    total = 0
    for path in files:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("totals:") or line.startswith("summary:"):
                    total += int(line.split()[1])
                    break
    return total, files


def functions(files, inclusive):
    """Per-function Ir over `files` (merged by name), from callgrind_annotate."""
    costs = {}
    for path in files:
        args = ["callgrind_annotate", "--threshold=100", f"--inclusive={'yes' if inclusive else 'no'}", path]
        text = subprocess.run(args, capture_output=True, text=True).stdout
        body = text.split("file:function", 1)[-1]
        for line in body.splitlines():
            m = LINE.match(line)
            if not m or "PROGRAM TOTALS" in line:
                continue
            name = m.group(2)
            name = re.sub(r"^\S*?:", "", name, count=1) if name.startswith(("???:", "./", "/")) else name
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def instruction_counts(files):
    """Executions per (object, address) over `files` (callgrind --dump-instr=yes), not counting
    the cost lines of calls (inclusive costs), and the function each address is in."""
    counts, function_of = {}, {}
    for path in files:
        objects, functions_ = {}, {}
        obj = fn = None
        address = 0
        after_call = False
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith(("ob=", "cob=", "fn=", "cfn=")):
                    m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                    table = objects if m.group(2) == "ob" else functions_
                    if m.group(4):
                        table[m.group(3)] = m.group(4)
                    if not m.group(1):
                        if m.group(2) == "ob":
                            obj = table[m.group(3)]
                        else:
                            fn = table[m.group(3)]
                    continue
                if line.startswith("calls="):
                    after_call = True
                    continue
                head = line[:1]
                if not head or not (head.isdigit() or head in "+-*"):
                    continue
                parts = line.split()
                token = parts[0]
                if token.startswith("0x"):
                    address = int(token, 16)
                elif token[0] in "+-":
                    step = int(token[1:], 16) if token[1:].startswith("0x") else int(token[1:])
                    address += step if token[0] == "+" else -step
                elif token != "*":
                    address = int(token)
                if after_call:
                    after_call = False
                    continue
                if len(parts) >= 3:
                    key = (obj, address)
                    counts[key] = counts.get(key, 0) + int(parts[2])
                    function_of[key] = fn
    return counts, function_of


_LOCKED = {}


def locked_addresses(path):
    """The addresses of `path`'s locked instructions (objdump -d)."""
    if path not in _LOCKED:
        found = set()
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True).stdout
        for line in text.splitlines():
            m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)", line)
            if m and (m.group(2).startswith("lock ") or (m.group(2).startswith("xchg") and "(" in m.group(2))):
                found.add(int(m.group(1), 16))
        _LOCKED[path] = found
    return _LOCKED[path]


def locked(small_files, large_files, n):
    """Locked instructions per round trip, and by function (object, name)."""
    a, _ = instruction_counts(small_files)
    b, function_of = instruction_counts(large_files)
    total, by_function = 0.0, {}
    for (obj, address), count in b.items():
        if not obj or not obj.startswith("/") or address not in locked_addresses(obj):
            continue
        per = (count - a.get((obj, address), 0)) / n
        if per > 0:
            total += per
            key = (os.path.basename(obj), function_of.get((obj, address)) or "?")
            by_function[key] = by_function.get(key, 0) + per
    return total, by_function


def code_lines(small_files, large_files, n):
    """Distinct 64-byte lines of code that every round trip (or message) runs: instructions
    the 2N run executed at least 0.9 N times more than the N run, each process counted on its own
    (two processes fetch their code separately; a run's files, sorted by process id, pair up
    parent with parent and child with child). Returns the total and the lines by object.
    After a context switch to another process on the same CPU the round trip fetches these
    lines again, about 1 to 2.5 ns each here (see docs/performance.md). Also returns the lines by
    function (a line two functions share counts for both there)."""
    total, by_object, by_function = 0, {}, {}
    pid = lambda path: int(path.rsplit(".", 1)[1])
    for small_path, large_path in zip(sorted(small_files, key=pid), sorted(large_files, key=pid)):
        before, _ = instruction_counts([small_path])
        counts, function_of = instruction_counts([large_path])
        lines, function_lines = {}, {}
        for (obj, address), count in counts.items():
            # Nearly every round trip: exactly N would drop a path that one round trip of the
            # run happened to skip (a pass that found two messages, say).
            if count - before.get((obj, address), 0) >= 0.9 * n:
                lines.setdefault(os.path.basename(obj or "?"), set()).add(address >> 6)
                key = (os.path.basename(obj or "?"), function_of.get((obj, address)) or "?")
                function_lines.setdefault(key, set()).add(address >> 6)
        for obj, found in lines.items():
            total += len(found)
            by_object[obj] = by_object.get(obj, 0) + len(found)
        for key, found in function_lines.items():
            by_function[key] = by_function.get(key, 0) + len(found)
    return total, by_object, by_function


def demangle(names):
    try:
        out = subprocess.run(["swift", "demangle", "--simplified", "--compact"], input="\n".join(names),
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
        if len(out) == len(names):
            return out
    except Exception:
        pass
    return names


# Where the runtime's own instructions go, by the exclusive cost of the functions named so.
CATEGORIES = [
    ("hashing (Dictionary/Set lookups: Hasher, String.hash, find)", ("Hasher", "hash(into", "RawDictionaryStorage", "_HashTable", "NativeDictionary", "NativeSet")),
    ("reference counting (retain/release, deinit, dealloc)", ("swift_retain", "swift_release", "RefCounts", "swift_dealloc", "deallocClassInstance", "swift_arrayDestroy", "__deallocating_deinit", "swift_unknownObjectRe", "swift_bridgeObjectRe")),
    ("allocation (malloc/free, array buffers, generic metadata)", ("malloc", "free", "_int_", "swift_slowAlloc", "swift_allocObject", "ContiguousArrayBuffer", "_allocateBuffer", "ContiguousArrayStorage", "Metadata", "MetadataCache", "GenericCacheEntry", "swift_getGeneric", "tcache", "cfree")),
    ("exclusivity checks (swift_beginAccess/endAccess)", ("swift_beginAccess", "swift_endAccess", "AccessSet")),
    ("thread-local storage", ("__tls_get_addr", "SwiftTLSContext", "pthread_getspecific")),
    ("system-call wrappers (libc)", ("=epoll_wait", "=recvmsg", "=sendmsg", "=__libc_recvmsg", "=__libc_sendmsg", "=write", "=read", "=__libc_write", "=__libc_read", "=syscall", "=eventfd_write", "=send", "=recv", "=clock_gettime", "=__clock_gettime", "=epoll_ctl")),
]


def categorize(exclusive):
    totals = {title: 0.0 for title, _ in CATEGORIES}
    other = 0.0
    for name, value in exclusive.items():
        for title, needles in CATEGORIES:
            bare = name.split(" [")[0]
            if any(bare == needle[1:] if needle.startswith("=") else needle in name for needle in needles):
                totals[title] += value
                break
        else:
            other += value
    return totals, other


def profile(small, large, n, path, kind, locked_by_function, lines_by_function):
    lines = [f"# {kind}: instructions per round trip by function ((2N run - N run) / N, N = {n})", ""]
    top = sorted(((v, k) for k, v in lines_by_function.items()), reverse=True)
    names = demangle([name for _, (_, name) in top[:40]])
    lines.append(f"## 64-byte lines of code every round trip runs ({sum(v for v, _ in top)} by function; "
                 "a line two functions share counts for both), by function")
    for (v, (obj, _)), name in zip(top, names):
        lines.append(f"{v:10d}  {name[:160]} [{obj}]")
    lines.append("")
    top = sorted(((v, k) for k, v in locked_by_function.items() if v >= 0.05), reverse=True)
    names = demangle([name for _, (_, name) in top])
    lines.append(f"## locked instructions ({sum(locked_by_function.values()):.1f}), by the function they are in")
    for (v, (obj, _)), name in zip(top, names):
        lines.append(f"{v:10.1f}  {name[:160]} [{obj}]")
    lines.append("")
    a, b = functions(small, False), functions(large, False)
    exclusive = {k: (b.get(k, 0) - a.get(k, 0)) / n for k in set(a) | set(b)}
    totals, other = categorize(exclusive)
    lines.append("## by category (exclusive instructions of the functions so named)")
    for title, value in sorted(totals.items(), key=lambda item: -item[1]):
        lines.append(f"{value:10.0f}  {title}")
    own = "CoreFoundation's and libdispatch's code" if kind.startswith("cf-") else "PortKit's own code"
    lines.append(f"{other:10.0f}  everything else ({own}, Swift stdlib algorithms, ...)")
    lines.append(f"{sum(totals.values()) + other:10.0f}  total")
    lines.append("")
    for inclusive in (False, True):
        a, b = functions(small, inclusive), functions(large, inclusive)
        diff = {k: (b.get(k, 0) - a.get(k, 0)) / n for k in set(a) | set(b)}
        top = sorted(((v, k) for k, v in diff.items() if v > 0.5), reverse=True)[:70]
        names = demangle([k for _, k in top])
        lines.append("## " + ("inclusive (the function and everything it calls)" if inclusive else "exclusive (the function's own instructions)"))
        for (v, _), name in zip(top, names):
            lines.append(f"{v:10.1f}  {name[:200]}")
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main():
    binary, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    short = "--short" in sys.argv
    n = 300 if short else 2000
    if "--n" in sys.argv:
        n = int(sys.argv[sys.argv.index("--n") + 1])
    kinds = KINDS
    if "--kinds" in sys.argv:
        kinds = sys.argv[sys.argv.index("--kinds") + 1].split(",")
    if not shutil.which("valgrind"):
        print("callgrind.py: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        json.dump({"error": "valgrind not installed"}, open(os.path.join(outdir, "callgrind.json"), "w"))
        return
    workdir = tempfile.mkdtemp(prefix="pkbench-callgrind-")
    # valgrind 3.19 cannot read the DWARF 5 that swiftc writes: strip it (symbols stay).
    stripped = os.path.join(workdir, "pkbench")
    shutil.copy(binary, stripped)
    subprocess.run(["objcopy", "--strip-debug", stripped], check=True)
    results = {}
    for kind in kinds:
        try:
            small, small_files = run(stripped, kind, n, workdir)
            large, large_files = run(stripped, kind, 2 * n, workdir)
            locked_total, locked_by_function = locked(small_files, large_files, n)
            lines_total, lines_by_object, lines_by_function = code_lines(small_files, large_files, n)
            results[kind] = {"n": n, "ir_n": small, "ir_2n": large, "per_round_trip": (large - small) / n,
                             "locked_per_round_trip": locked_total, "code_lines_per_round_trip": lines_total,
                             "code_lines_by_object": lines_by_object}
            print(f"  {kind:18s} {(large - small) / n:10.0f} instructions per round trip, {locked_total:.1f} locked, "
                  f"{lines_total} code lines", file=sys.stderr)
            if kind.startswith("portkit") or kind.startswith("cf-"):
                profile(small_files, large_files, n, os.path.join(outdir, f"callgrind-profile-{kind}.txt"), kind,
                        locked_by_function, lines_by_function)
        except Exception as error:  # record and go on: one failing kind must not hide the others
            results[kind] = {"error": str(error)[:500]}
            print(f"  {kind}: {error}", file=sys.stderr)
    json.dump(results, open(os.path.join(outdir, "callgrind.json"), "w"), indent=1)
    if "--keep" in sys.argv:  # the raw callgrind.out files, for callgrind_annotate --tree=both
        print(f"callgrind.py: raw outputs kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
