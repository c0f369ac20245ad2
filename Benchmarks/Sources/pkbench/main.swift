// pkbench: the benchmark suite's helper executable.
//
// Peer processes (spawned with posix_spawn by the workloads, never forked):
//   pkbench c-echo PATH CPU SIZE              raw Unix-socket echo (C)
//   pkbench c-sink PATH CPU SIZE              raw Unix-socket stream receiver (C)
//   pkbench zmq-echo ENDPOINT CPU SIZE        libzmq PAIR echo (ZeroMQ trait)
//   pkbench zmq-sink ENDPOINT ACK CPU SIZE    libzmq PULL receiver (ZeroMQ trait)
//   pkbench pkzmq-worker ROLE CPU MAIN OWN    a worker on PortKit's ZeroMQ transport (trait)
//   pkbench pk-worker ROLE CPU IDLE           a PKWorkerProcess (echo | sink)
//   pkbench pk-named DIR ROLE CPU IDLE        a worker found by name (for callgrind runs)
//   pkbench names DIR START COUNT INDEX CPU   registers COUNT names, then "ready-INDEX"
// Measurements that do not fit the benchmark harness:
//   pkbench rt KIND N [PLACEMENT]             N round trips after 200 warm-up ones, for
//                                             callgrind (KIND: portkit-threads, c-threads,
//                                             cf-threads (CFRunLoop, the guide's custom input
//                                             source), portkit-processes, c-processes; for
//                                             profiles also cf-threads-nodeadline (the main
//                                             side's runs without a deadline too),
//                                             c-processes-shaped (C with PortKit's recvmsg),
//                                             portkit-threads-idle1000, portkit-request-threads,
//                                             portkit-request-processes,
//                                             portkit-stream64-threads (N messages), portkit-spawn;
//                                             with the trait, portkit-zmq-stream64 and
//                                             zmq-stream64: ipc:// streams, N messages;
//                                             portkit-zmq-ipc, portkit-zmq-tcp, zmq-ipc,
//                                             zmq-tcp: round trips)
//   pkbench memory                            user-space bytes per idle port (JSON)
//   pkbench foundation rt|stream PLACEMENT    Foundation SocketPort + RunLoop (JSON); may crash
//   pkbench compare [REGEX]                   PortKit and its baselines interleaved batch by batch
//                                             (JSON lines; the table's "interleaved" column)
//   pkbench list                              the catalogue's row names (honours PKBENCH_FILTER)
// Quick runs without the harness (median of a few samples per row; for iterating on the core):
//   pkbench quick [REGEX] [--samples N]       every catalogue row whose name matches (whole)

import BenchKit
import CBench
import Glibc
import PortKit

func fail(_ message: String) -> Never {
    let bytes = Array("pkbench: \(message)\n".utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    exit(2)
}

func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

let arguments = Array(CommandLine.arguments.dropFirst())
func argument(_ i: Int) -> String {
    guard i < arguments.count else { fail("missing argument \(i + 1) for \(arguments.first ?? "?")") }
    return arguments[i]
}
func int(_ i: Int) -> Int {
    guard let value = Int(argument(i)) else { fail("not a number: \(argument(i))") }
    return value
}

if PKWorkerProcess.isLaunchedWorker {
    // pk-worker ROLE CPU IDLE
    guard arguments.count == 4, arguments[0] == "pk-worker", let role = WorkerRole(rawValue: arguments[1]) else {
        fail("usage: pk-worker echo|sink CPU IDLE")
    }
    do { try servePortKitWorker(role: role, cpu: Int32(int(2)), idlePorts: int(3)) } catch { fail("pk-worker: \(error)") }
    exit(0)
}

switch arguments.first {
case "c-echo":
    exit(cb_un_echo_serve(argument(1), Int32(int(2)), int(3)))
case "c-sink":
    exit(cb_un_sink_serve(argument(1), Int32(int(2)), int(3)))
#if ZeroMQ
case "zmq-echo":
    exit(serveZMQEcho(endpoint: argument(1), cpu: Int32(int(2)), size: int(3)))
case "zmq-sink":
    exit(serveZMQSink(endpoint: argument(1), ack: argument(2), cpu: Int32(int(3)), size: int(4)))
case "pkzmq-worker":
    guard let role = WorkerRole(rawValue: argument(1)) else { fail("usage: pkzmq-worker echo|sink CPU MAIN OWN") }
    do { try serveZMQWorker(role: role, cpu: Int32(int(2)), mainEndpoint: argument(3), ownEndpoint: argument(4)) } catch {
        fail("pkzmq-worker: \(error)")
    }
#endif
case "pk-named":
    guard let role = WorkerRole(rawValue: argument(2)) else { fail("usage: pk-named DIR echo|sink CPU IDLE") }
    do { try serveNamedWorker(directory: argument(1), role: role, cpu: Int32(int(3)), idlePorts: int(4)) } catch {
        fail("pk-named: \(error)")
    }
case "names":
    do { try serveNames(directory: argument(1), start: int(2), count: int(3), index: int(4), cpu: Int32(int(5))) } catch {
        fail("names: \(error)")
    }

case "rt":
    let n = int(2)
    // An optional PLACEMENT (same | split): pins both sides as the table's rows do, so that
    // `time` or `strace` of one run shows the placement's own user and system time.
    let placement = arguments.count > 3 ? (Placement(rawValue: argument(3)) ?? { fail("rt: placement same|split") }()) : .none
    let workload: Workload
    do {
        switch argument(1) {
        case "portkit-threads": workload = try PortKitPair(.thread, .roundTrip, placement)
        case "c-threads": workload = try CSocketpairRoundTrip(placement)
        case "cf-threads": workload = try CFRunLoopRoundTrip(placement)
        case "cf-threads-nodeadline": workload = try CFRunLoopRoundTrip(placement, mainDeadline: false)
        case "portkit-processes": workload = try PortKitPair(.namedProcess, .roundTrip, placement)
        case "c-processes": workload = try CUnixSocketRoundTrip(placement)
        case "c-processes-shaped":
            // The raw round trip with PortKit's shape of reads (CBench.c, PKBENCH_C_SHAPED):
            // what that shape alone costs, for docs/performance.md. The helper inherits it.
            setenv("PKBENCH_C_SHAPED", "1", 1)
            workload = try CUnixSocketRoundTrip(placement)
        case "portkit-threads-idle1000": workload = try PortKitPair(.thread, .roundTrip, placement, idlePorts: 1000)
        case "portkit-request-threads": workload = try PortKitPair(.thread, .request, placement)
        case "portkit-request-processes": workload = try PortKitPair(.namedProcess, .request, placement)
        case "portkit-stream64-threads": workload = try PortKitPair(.thread, .stream, placement)
        case "portkit-stream64-processes": workload = try PortKitPair(.namedProcess, .stream, placement)
        case "portkit-spawn": workload = try PortKitSpawn(placement)
        case "portkit-lookup-1":
            let owners = PortKitNameLookup.owners(for: 10_000)
            workload = try PortKitNameLookup(placement, names: owners, owners: owners)
        case "portkit-lookup-10000":
            workload = try PortKitNameLookup(placement, names: 10_000, owners: PortKitNameLookup.owners(for: 10_000))
        #if ZeroMQ
        case "portkit-zmq-stream64": workload = try PortKitZMQPair(.ipc, .stream, placement)
        case "zmq-stream64": workload = try ZMQStream(.ipc, placement, size: 64)
        case "portkit-zmq-ipc": workload = try PortKitZMQPair(.ipc, .roundTrip, placement)
        case "portkit-zmq-tcp": workload = try PortKitZMQPair(.tcp, .roundTrip, placement)
        case "zmq-ipc": workload = try ZMQRoundTrip(.ipc, placement)
        case "zmq-tcp": workload = try ZMQRoundTrip(.tcp, placement)
        #endif
        default: fail("rt: unknown kind \(argument(1))")
        }
        _ = try workload.run(200)
        let ns = try workload.run(n)
        workload.close()
        say("{\"kind\": \"\(argument(1))\", \"n\": \(n), \"ns\": \(ns)}")
    } catch { fail("rt: \(error)") }

case "memory":
    do {
        let memory = try measurePortMemory(count: 1000)
        say("{\"bare_bytes\": \(memory.bareBytes), \"local_bytes\": \(memory.localBytes), \"connected_bytes\": \(memory.connectedBytes), \"descriptors_per_connected\": \(memory.descriptorsPerConnected)}")
    } catch { fail("memory: \(error)") }

case "foundation":
    guard let placement = Placement(rawValue: argument(2)) else { fail("foundation: placement same|split|none") }
    let stream = argument(1) == "stream"
    do {
        let ns = try foundationSocketPort(placement, stream: stream, batch: stream ? 1000 : 200, samples: isShortMode ? 3 : 15)
        say("{\"workload\": \"\(argument(1))\", \"placement\": \"\(placement.rawValue)\", \"ns_per_op\": \(ns)}")
        exit(0)  // the server thread runs forever
    } catch { fail("foundation: \(error)") }

case "compare":
    // Interleaved: one batch of PortKit, one of the baseline, and again, so that a change in
    // the machine's load hits both alike. One JSON line per comparison.
    if arguments.count > 1 { setenv("PKBENCH_FILTER", arguments[1], 1) }
    let budget = UInt64(isShortMode ? 200_000_000 : 2_000_000_000)
    let maxPairs = isShortMode ? 3 : 40
    for comparison in comparisons() {
        let a = comparison.subject, b = comparison.baseline
        do {
            let wa = try a.make()
            defer { wa.close() }
            let wb = try b.make()
            defer { wb.close() }
            _ = try wa.run(a.batch)
            _ = try wb.run(b.batch)
            var ratios: [Double] = [], va: [Double] = [], vb: [Double] = []
            let start = nowNanoseconds()
            while ratios.count < maxPairs && (ratios.count < 3 || nowNanoseconds() - start < budget) {
                let x = Double(try wa.run(a.batch)) / Double(a.batch)
                let y = Double(try wb.run(b.batch)) / Double(b.batch)
                va.append(x); vb.append(y); ratios.append(x / y)
            }
            func median(_ v: [Double]) -> Double { let s = v.sorted(); return s[s.count / 2] }
            say("{\"subject\": \"\(a.name)\", \"baseline\": \"\(b.name)\", \"pairs\": \(ratios.count), \"subject_ns\": \(median(va)), \"baseline_ns\": \(median(vb)), \"ratio\": \(median(ratios))}")
        } catch {
            say("{\"subject\": \"\(a.name)\", \"baseline\": \"\(b.name)\", \"error\": \"\(error)\"}")
        }
    }

case "list":
    for spec in catalogue() { say(spec.name) }

case "quick":
    var samples = 9
    var pattern: String?
    var i = 1
    while i < arguments.count {
        if arguments[i] == "--samples" { samples = int(i + 1); i += 2 } else { pattern = arguments[i]; i += 1 }
    }
    if let pattern { setenv("PKBENCH_FILTER", pattern, 1) }
    for spec in catalogue() {
        do {
            let workload = try spec.make()
            _ = try workload.run(spec.batch)
            var values: [Double] = []
            for _ in 0..<samples { values.append(Double(try workload.run(spec.batch)) / Double(spec.batch)) }
            workload.close()
            values.sort()
            let median = values[values.count / 2]
            say("\(spec.name)\t\(Int(median.rounded())) ns/op\t(min \(Int(values[0].rounded())))")
        } catch {
            say("\(spec.name)\tFAILED: \(error)")
        }
    }

default:
    fail("unknown command \(arguments.first ?? "(none)"); see the comment at the top of pkbench/main.swift")
}
exit(0)
