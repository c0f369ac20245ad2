// Every measured row: a workload, an implementation (PortKit or a baseline), a placement, and
// how many operations one sample performs. The benchmarks and `pkbench` both read this list, so
// names match between a run and the report.

import Glibc
import PortKit

public struct WorkloadSpec: Sendable {
    /// The workload, e.g. "rt.threads" (see `report.py` for what each compares with).
    public let workload: String
    /// "portkit" or the baseline's name.
    public let impl: String
    public let placement: Placement
    /// Operations per sample (round trips, messages, spawns, lookups).
    public let batch: Int
    public let make: @Sendable () throws -> Workload

    /// The benchmark's name: `workload|impl|placement` (no commas: the report reads CSV).
    public var name: String { "\(workload)|\(impl)|\(placement.rawValue)" }
}

/// Whether to run the short mode (CI): smaller batches, few samples.
public var isShortMode: Bool {
    if let value = getenv("PKBENCH_SHORT") { return String(cString: value) == "1" }
    return false
}

/// A regular expression (POSIX extended) a spec's name must match to run; `PKBENCH_FILTER`.
public var workloadFilter: String? {
    guard let value = getenv("PKBENCH_FILTER"), value.pointee != 0 else { return nil }
    return String(cString: value)
}

/// Whether `name` matches `pattern` as a whole (as the benchmark plugin's --filter does).
public func matches(_ name: String, _ pattern: String?) -> Bool {
    guard let pattern else { return true }
    var regex = regex_t()
    guard regcomp(&regex, "^(" + pattern + ")$", REG_EXTENDED | REG_NOSUB) == 0 else { return true }
    defer { regfree(&regex) }
    return regexec(&regex, name, 0, nil, 0) == 0
}

/// The whole suite, in run order (each PortKit row next to its baselines).
public func catalogue(short: Bool = isShortMode, filtered: Bool = true) -> [WorkloadSpec] {
    let rt = short ? 100 : 1000
    let stream = short ? 1000 : 10_000
    let spawn = short ? 10 : 100
    let lookup = short ? 10 : 50
    let manyNames = 10_000
    var specs: [WorkloadSpec] = []
    func add(_ workload: String, _ impl: String, _ placement: Placement, _ batch: Int, _ make: @escaping @Sendable () throws -> Workload) {
        specs.append(WorkloadSpec(workload: workload, impl: impl, placement: placement, batch: batch, make: make))
    }
    for p in Placement.measured {
        // Round trip of 64-byte messages, thread to thread.
        add("rt.threads", "portkit", p, rt) { try PortKitPair(.thread, .roundTrip, p) }
        add("rt.threads", "socketpair", p, rt) { try CSocketpairRoundTrip(p) }
        // The guide's custom input source on CFRunLoop (no target: the ratio is reported).
        add("rt.threads", "cfrunloop", p, rt) { try CFRunLoopRoundTrip(p) }
        #if ZeroMQ
        add("rt.threads", "zmq-inproc", p, rt) { try ZMQRoundTrip(.inproc, p) }
        #endif
        // The same with 1,000 idle ports on each loop.
        add("rt.threads.idle1000", "portkit", p, rt) { try PortKitPair(.thread, .roundTrip, p, idlePorts: 1000) }
        // The same with 1,000 timers waiting on each loop.
        add("rt.threads.timers1000", "portkit", p, rt) { try PortKitPair(.thread, .roundTrip, p, idleTimers: 1000) }
        // Request/reply (sendRequest), thread to thread.
        add("request.threads", "portkit", p, rt) { try PortKitPair(.thread, .request, p) }

        // Round trip, process to process.
        add("rt.processes", "portkit", p, rt) { try PortKitPair(.process, .roundTrip, p) }
        add("rt.processes", "unix-socket", p, rt) { try CUnixSocketRoundTrip(p) }
        // The same with 1,000 more senders connected to the main side's port, and one
        // connection that never greets.
        add("rt.processes.crowd", "portkit", p, rt) { try PortKitPair(.process, .roundTrip, p, crowd: 1000) }
        #if ZeroMQ
        add("rt.processes", "zmq-ipc", p, rt) { try ZMQRoundTrip(.ipc, p) }
        add("rt.processes", "zmq-tcp", p, rt) { try ZMQRoundTrip(.tcp, p) }
        #endif
        add("request.processes", "portkit", p, rt) { try PortKitPair(.process, .request, p) }
        #if ZeroMQ
        // PortKit's ZeroMQ transport against raw libzmq on the same endpoint type.
        add("rt.processes", "portkit-zmq-ipc", p, rt) { try PortKitZMQPair(.ipc, .roundTrip, p) }
        add("rt.processes", "portkit-zmq-tcp", p, rt) { try PortKitZMQPair(.tcp, .roundTrip, p) }
        #endif

        // One-way streams.
        for size in [64, 1024] {
            let tag = size == 64 ? "64" : "1k"
            add("stream\(tag).threads", "portkit", p, stream) { try PortKitPair(.thread, .stream, p, size: size) }
            add("stream\(tag).threads", "socketpair", p, stream) { try CSocketpairStream(p, size: size) }
            #if ZeroMQ
            add("stream\(tag).threads", "zmq-inproc", p, stream) { try ZMQStream(.inproc, p, size: size) }
            #endif
            add("stream\(tag).processes", "portkit", p, stream) { try PortKitPair(.process, .stream, p, size: size) }
            add("stream\(tag).processes", "unix-socket", p, stream) { try CUnixSocketStream(p, size: size) }
            #if ZeroMQ
            add("stream\(tag).processes", "zmq-ipc-pushpull", p, stream) { try ZMQStream(.ipc, p, size: size) }
            add("stream\(tag).processes", "portkit-zmq-ipc", p, stream) { try PortKitZMQPair(.ipc, .stream, p, size: size) }
            #endif
        }

        // Thread spawn until its check-in arrives.
        add("spawn", "portkit", p, spawn) { try PortKitSpawn(p) }
        add("spawn", "pthread+byte", p, spawn) { try CThreadSpawn(p) }

        // Name lookup: 10,000 names registered against one in each of the same owner
        // processes (see PortKitNameLookup).
        let owners = PortKitNameLookup.owners(for: manyNames)
        add("lookup", "portkit-10000", p, lookup) { try PortKitNameLookup(p, names: manyNames, owners: owners) }
        add("lookup", "portkit-1", p, lookup) { try PortKitNameLookup(p, names: owners, owners: owners) }
    }
    let filter = filtered ? workloadFilter : nil
    return specs.filter { matches($0.name, filter) }
}

/// A comparison the report makes: PortKit's row against a baseline row, same placement.
public struct Comparison: Sendable {
    public let subject: WorkloadSpec
    public let baseline: WorkloadSpec
}

/// Every comparison whose two rows are in the catalogue and one of which matches
/// `PKBENCH_FILTER` (see report.py's RULES for the targets).
public func comparisons(_ specs: [WorkloadSpec] = catalogue(filtered: false)) -> [Comparison] {
    let filter = workloadFilter
    var byName: [String: WorkloadSpec] = [:]
    for spec in specs { byName[spec.name] = spec }
    var result: [Comparison] = []
    for spec in specs where spec.impl == "portkit" || spec.impl == "portkit-10000" || spec.impl.hasPrefix("portkit-zmq") {
        let p = spec.placement.rawValue
        if spec.impl.hasPrefix("portkit-zmq") {
            // Against raw libzmq on the same endpoint type only.
            let raw = spec.workload == "rt.processes" ? (spec.impl == "portkit-zmq-ipc" ? "zmq-ipc" : "zmq-tcp") : "zmq-ipc-pushpull"
            let name = "\(spec.workload)|\(raw)|\(p)"
            if let baseline = byName[name], matches(spec.name, filter) || matches(name, filter) {
                result.append(Comparison(subject: spec, baseline: baseline))
            }
            continue
        }
        var baselines: [String] = specs.filter { $0.workload == spec.workload && $0.placement == spec.placement && !$0.impl.hasPrefix("portkit") }.map(\.name)
        switch spec.workload {
        case "request.threads", "rt.threads.idle1000", "rt.threads.timers1000": baselines.append("rt.threads|portkit|\(p)")
        case "request.processes", "rt.processes.crowd": baselines.append("rt.processes|portkit|\(p)")
        case "lookup": baselines.append("lookup|portkit-1|\(p)")
        default: break
        }
        for name in baselines {
            if let baseline = byName[name], matches(spec.name, filter) || matches(name, filter) {
                result.append(Comparison(subject: spec, baseline: baseline))
            }
        }
    }
    return result
}
