// Helpers shared by the tests: threads with deadlines, descriptor counting.

import Foundation
@testable import PortKit

/// Failure raised by a helper when a deadline passes.
struct TestTimeout: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out waiting for \(what)" }
}

/// Counts the open descriptors of this process (`/proc/self/fd`).
func openDescriptorCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

/// Makes `loop`'s own epoll descriptor and eventfd now (a loop makes them when it first sleeps),
/// and the timerfd for its runs' deadlines (made when a run with a deadline first sleeps), so
/// that a test that counts the process's descriptors does not take them for something its work
/// left behind.
func warmUpLoopDescriptors(_ loop: PKRunLoop) {
    _ = try? loop.epollFD()
    _ = loop.deadlineTimer()
}

/// A thread that runs `body` and can be joined with a deadline.
final class TestThread: @unchecked Sendable {
    private let done = Locked(false)
    private let thread: Thread

    init(name: String = "test-thread", _ body: @escaping @Sendable () -> Void) {
        let done = self.done
        thread = Thread {
            body()
            done.value = true
        }
        thread.name = name
        thread.start()
    }

    /// Waits for the thread's body to return, up to `timeout`.
    func join(timeout: Duration = .seconds(10)) throws {
        try waitUntil("thread to finish", timeout: timeout) { self.done.value }
    }
}

/// Polls `condition` every millisecond until it holds or `timeout` passes.
func waitUntil(_ what: String, timeout: Duration = .seconds(10), _ condition: () -> Bool) throws {
    let deadline = PKDeadline.after(timeout)
    while !condition() {
        if deadline.hasPassed { throw TestTimeout(what: what) }
        sleepFor(.milliseconds(1))
    }
}

/// A value one thread sets and another waits for, with a deadline. Guarded by `PKMutex`, like
/// `Locked`: a waiter that polls while the setter holds a plain `Mutex` takes it over inside the
/// uninstrumented runtime, so ThreadSanitizer sees no hand-over and reports a race on whatever
/// the value leads to (a port the setter's thread made, say).
final class TestLatch<Value: Sendable>: Sendable {
    private let state = PKMutex<Value?>(nil)
    init() {}
    func set(_ value: Value) { state.withLock { $0 = value } }
    var value: Value? { state.withLock { $0 } }
    func wait(timeout: Duration = .seconds(10), _ what: String = "latch") throws -> Value {
        try waitUntil(what, timeout: timeout) { self.value != nil }
        return value!
    }
}

/// A value guarded by a mutex, shareable between threads and closures. The mutex is
/// `PKMutex`, whose hand-offs ThreadSanitizer sees (a contended plain `Mutex`'s it does not,
/// and reports a race on the value).
final class Locked<Value: Sendable>: Sendable {
    private let mutex: PKMutex<Value>
    init(_ value: Value) { mutex = PKMutex(value) }
    var value: Value {
        get { mutex.withLock { $0 } }
        set { mutex.withLock { $0 = newValue } }
    }
    @discardableResult
    func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
}

/// Sleeps the calling thread.
func sleepFor(_ duration: Duration) {
    let ns = duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000
    var spec = timespec(tv_sec: Int(ns / 1_000_000_000), tv_nsec: Int(ns % 1_000_000_000))
    nanosleep(&spec, nil)
}

/// Runs `body` on a new thread with its own run loop and waits for it, up to `timeout`.
/// Loop tests use this so each gets a fresh loop; a long test uses `awaitLoopThread`.
@discardableResult
func onLoopThread<R: Sendable>(
    timeout: Duration = .seconds(30), _ body: @escaping @Sendable (PKRunLoop) throws -> R
) throws -> R {
    let result = Locked<Result<R, any Error>?>(nil)
    let thread = TestThread(name: "loop-thread") {
        let outcome = Result { try body(PKRunLoop.current) }
        result.value = outcome
    }
    try thread.join(timeout: timeout)
    return try result.value!.get()
}
