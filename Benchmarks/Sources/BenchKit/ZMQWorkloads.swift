// The raw libzmq baselines (CZMQBench) as workloads; built only with this package's `ZeroMQ` trait.

#if ZeroMQ
import CZMQBench
import Glibc

/// Where a libzmq baseline's two sides talk.
public enum ZMQEndpoint: String, Sendable {
    case inproc, ipc, tcp

    /// A fresh endpoint of this type to bind (inproc endpoints are named by CZMQBench itself).
    func bindAddress(_ tag: String) -> String {
        switch self {
        case .inproc: "inproc://pkbench-\(tag)"
        case .ipc: "ipc:///tmp/pkbench-zmq-\(getpid())-\(tag)-\(UInt32.random(in: 0...UInt32.max))"
        case .tcp: "tcp://127.0.0.1:*"
        }
    }
}

/// PAIR round trips: inproc between two threads, ipc or tcp between this process and a helper.
public final class ZMQRoundTrip: Workload {
    private var handle: OpaquePointer?
    public init(_ endpoint: ZMQEndpoint, _ placement: Placement, size: Int = 64) throws {
        let (a, b) = placement.cpus
        switch endpoint {
        case .inproc: handle = cz_inproc_rt_new(a, b, size)
        case .ipc, .tcp: handle = cz_proc_rt_new(helperExecutable, endpoint.bindAddress("rt"), a, b, size)
        }
        guard handle != nil else { throw BenchError("libzmq \(endpoint) round trip: set-up failed") }
    }
    public func run(_ n: Int) throws -> UInt64 {
        let ns = cz_rt_run(handle, n)
        guard ns >= 0 else { throw BenchError("libzmq round trip failed") }
        return UInt64(ns)
    }
    public func close() { cz_rt_free(handle); handle = nil }
}

/// One-way streams: PAIR over inproc between two threads, PUSH/PULL over ipc to a helper.
public final class ZMQStream: Workload {
    private var handle: OpaquePointer?
    public init(_ endpoint: ZMQEndpoint, _ placement: Placement, size: Int) throws {
        let (a, b) = placement.cpus
        switch endpoint {
        case .inproc: handle = cz_inproc_stream_new(a, b, size)
        case .ipc, .tcp: handle = cz_proc_stream_new(helperExecutable, endpoint.bindAddress("data"), endpoint.bindAddress("ack"), a, b, size)
        }
        guard handle != nil else { throw BenchError("libzmq \(endpoint) stream: set-up failed") }
    }
    public func run(_ n: Int) throws -> UInt64 {
        let ns = cz_stream_run(handle, n)
        guard ns >= 0 else { throw BenchError("libzmq stream failed") }
        return UInt64(ns)
    }
    public func close() { cz_stream_free(handle); handle = nil }
}

public func serveZMQEcho(endpoint: String, cpu: Int32, size: Int) -> Int32 { cz_echo_serve(endpoint, cpu, size) }
public func serveZMQSink(endpoint: String, ack: String, cpu: Int32, size: Int) -> Int32 { cz_sink_serve(endpoint, ack, cpu, size) }
public let zeroMQBaselinesBuilt = true
#else
public let zeroMQBaselinesBuilt = false
#endif
