// What every workload shares: thread placement, pinned driver threads, the helper executable.

import CBench
import Dispatch
import Glibc

/// Where the two sides of a workload run. Placement changes every latency by up to 2 x on
/// two-vCPU machines, so PortKit and its baseline are always measured with the same one.
public enum Placement: String, CaseIterable, Sendable {
    /// Both sides pinned to CPU 0.
    case same
    /// One side on CPU 0, the other on CPU 1.
    case split
    /// Not pinned (callgrind runs only: instruction counts do not depend on placement).
    case none

    /// The CPUs of the first (client, sender, creator) and second (server, receiver, new
    /// thread or child) side; -1 for "anywhere".
    public var cpus: (first: Int32, second: Int32) {
        switch self {
        case .same: (0, 0)
        case .split: (0, Self.cpuCount > 1 ? 1 : 0)
        case .none: (-1, -1)
        }
    }

    /// The placements that make sense on this machine.
    public static var measured: [Placement] { cpuCount > 1 ? [.same, .split] : [.same] }

    public static let cpuCount = Int(cb_cpu_count())
}

/// A workload: `run(n)` performs `n` operations and returns the nanoseconds they took, timed on
/// the thread that performs them (so the driving overhead is not counted).
public protocol Workload: AnyObject {
    func run(_ n: Int) throws -> UInt64
    func close()
}

public struct BenchError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Runs on a fresh thread; `Unmanaged` carries the closure through pthread_create.
private final class ThreadBody {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

/// Starts a joinable thread running `body`.
public func startThread(_ body: @escaping @Sendable () -> Void) throws -> pthread_t {
    let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(&thread, nil, { argument in
        let body = Unmanaged<ThreadBody>.fromOpaque(argument!).takeRetainedValue()
        body.body()
        return nil
    }, context)
    guard rc == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(context).release()
        throw BenchError("pthread_create failed: \(rc)")
    }
    return thread
}

/// What a driver thread runs: `work(n)` for each posted batch, `tearDown` once at the end, both
/// on the driver's own thread.
public struct DriverBody {
    public var work: (Int) throws -> UInt64
    public var tearDown: () -> Void
    public init(work: @escaping (Int) throws -> UInt64, tearDown: @escaping () -> Void = {}) {
        self.work = work
        self.tearDown = tearDown
    }
}

/// A thread pinned to one CPU that sets itself up once and then runs posted batches.
public final class PinnedDriver: Workload, @unchecked Sendable {
    private let gate: OpaquePointer
    private var body: DriverBody?
    private var elapsed: Int64 = 0
    private var failure: String?
    private var thread = pthread_t()
    private var closed = false

    /// Starts the thread, pins it to `cpu`, runs `setUp` there and waits for it.
    public init(cpu: Int32, setUp: @escaping @Sendable () throws -> DriverBody) throws {
        gate = cb_gate_new()
        let ready = DispatchSemaphore(value: 0)
        thread = try startThread { [unowned self] in
            cb_pin_self(cpu)
            do { self.body = try setUp() } catch { self.failure = "\(error)" }
            ready.signal()
            guard let body = self.body else { return }
            while true {
                let n = cb_gate_take(self.gate)
                if n < 0 { break }
                do {
                    self.elapsed = Int64(try body.work(n))
                } catch {
                    self.elapsed = -1
                    self.failure = "\(error)"
                }
                cb_gate_done(self.gate)
            }
            body.tearDown()
            self.body = nil
        }
        ready.wait()
        if let failure {
            pthread_join(thread, nil)
            closed = true
            cb_gate_free(gate)
            throw BenchError("set-up failed: \(failure)")
        }
    }

    public func run(_ n: Int) throws -> UInt64 {
        cb_gate_post(gate, n)
        cb_gate_wait_done(gate)
        guard elapsed >= 0 else { throw BenchError(failure ?? "the workload failed") }
        return UInt64(elapsed)
    }

    public func close() {
        guard !closed else { return }
        closed = true
        cb_gate_post(gate, -1)
        pthread_join(thread, nil)
        cb_gate_free(gate)
    }

    deinit { close() }
}

/// Nanoseconds on CLOCK_MONOTONIC.
@inline(__always) public func nowNanoseconds() -> UInt64 { cb_now_ns() }

/// The `pkbench` helper executable: `$PKBENCH`, else next to the running executable.
public var helperExecutable: String {
    if let path = getenv("PKBENCH"), path.pointee != 0 { return String(cString: path) }
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    let exe = n > 0 ? String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : CommandLine.arguments[0]
    let directory = exe.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
    return directory + "/pkbench"
}

/// A fresh private directory under /tmp (names, sockets).
public func makeScratchDirectory(_ prefix: String) throws -> String {
    var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
    guard let result = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
        throw BenchError("mkdtemp failed: errno \(errno)")
    }
    return String(cString: result)
}

/// Removes a directory made by `makeScratchDirectory` and what is directly in it.
public func removeScratchDirectory(_ path: String) {
    guard path.hasPrefix("/tmp/"), let dir = opendir(path) else { return }
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
        if name == "." || name == ".." { continue }
        unlink(path + "/" + name)
    }
    closedir(dir)
    rmdir(path)
}
