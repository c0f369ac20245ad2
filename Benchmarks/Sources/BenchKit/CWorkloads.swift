// The raw C baselines (CBench) as workloads.

import CBench
import Glibc

/// Round trips over a socketpair between two threads, both in epoll_wait.
public final class CSocketpairRoundTrip: Workload {
    private var handle: OpaquePointer?
    public init(_ placement: Placement, size: Int = 64) throws {
        guard let h = cb_sp_rt_new(placement.cpus.first, placement.cpus.second, size) else { throw BenchError("cb_sp_rt_new failed") }
        handle = h
    }
    public func run(_ n: Int) throws -> UInt64 {
        let ns = cb_rt_run(handle, n)
        guard ns >= 0 else { throw BenchError("socketpair round trip failed") }
        return UInt64(ns)
    }
    public func close() { cb_rt_free(handle); handle = nil }
}

/// Round trips over a named Unix socket between this process and a helper process.
public final class CUnixSocketRoundTrip: Workload {
    private var handle: OpaquePointer?
    public init(_ placement: Placement, size: Int = 64) throws {
        let path = "/tmp/pkbench-un-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        guard let h = cb_un_rt_new(helperExecutable, path, placement.cpus.first, placement.cpus.second, size) else {
            throw BenchError("cb_un_rt_new failed (helper \(helperExecutable))")
        }
        handle = h
    }
    public func run(_ n: Int) throws -> UInt64 {
        let ns = cb_rt_run(handle, n)
        guard ns >= 0 else { throw BenchError("Unix-socket round trip failed") }
        return UInt64(ns)
    }
    public func close() { cb_rt_free(handle); handle = nil }
}

/// A one-way stream over a socketpair between two threads, one write per message.
public final class CSocketpairStream: Workload {
    private var handle: OpaquePointer?
    public init(_ placement: Placement, size: Int) throws {
        guard let h = cb_sp_stream_new(placement.cpus.first, placement.cpus.second, size) else { throw BenchError("cb_sp_stream_new failed") }
        handle = h
    }
    public func run(_ n: Int) throws -> UInt64 {
        let ns = cb_stream_run(handle, n)
        guard ns >= 0 else { throw BenchError("socketpair stream failed") }
        return UInt64(ns)
    }
    public func close() { cb_stream_free(handle); handle = nil }
}

/// A one-way stream over a named Unix socket to a helper process, one write per message.
public final class CUnixSocketStream: Workload {
    private var handle: OpaquePointer?
    public init(_ placement: Placement, size: Int) throws {
        let path = "/tmp/pkbench-un-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        guard let h = cb_un_stream_new(helperExecutable, path, placement.cpus.first, placement.cpus.second, size) else {
            throw BenchError("cb_un_stream_new failed (helper \(helperExecutable))")
        }
        handle = h
    }
    public func run(_ n: Int) throws -> UInt64 {
        let ns = cb_stream_run(handle, n)
        guard ns >= 0 else { throw BenchError("Unix-socket stream failed") }
        return UInt64(ns)
    }
    public func close() { cb_stream_free(handle); handle = nil }
}

/// A bare thread create until its first byte arrives over a socketpair (the socketpair is made
/// before the clock starts, the join happens after it stops).
public final class CThreadSpawn: Workload {
    private let driver: PinnedDriver
    public init(_ placement: Placement) throws {
        let childCPU = placement == .split ? placement.cpus.second : -1  // same: inherits CPU 0
        driver = try PinnedDriver(cpu: placement.cpus.first) {
            DriverBody(work: { n in
                var total: UInt64 = 0
                for _ in 0..<n {
                    guard let spawn = cb_spawn_prepare() else { throw BenchError("socketpair failed") }
                    let start = nowNanoseconds()
                    let rc = cb_spawn_go(spawn, childCPU)
                    total += nowNanoseconds() - start
                    cb_spawn_finish(spawn)
                    guard rc == 0 else { throw BenchError("thread create failed") }
                }
                return total
            })
        }
    }
    public func run(_ n: Int) throws -> UInt64 { try driver.run(n) }
    public func close() { driver.close() }
}
