#if ZeroMQ
// Helpers for the ZeroMQ tests: loops on fresh threads, deadlines, private directories.

import Foundation
import PortKit
import Synchronization

/// Failure raised by a helper when a deadline passes.
struct TestTimeout: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out waiting for \(what)" }
}

/// A value guarded by a mutex, shareable between threads and closures.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    var value: Value {
        get { mutex.withLock { $0 } }
        set { mutex.withLock { $0 = newValue } }
    }
    @discardableResult
    func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
}

/// Sleeps the calling thread.
func sleepFor(_ duration: Duration) {
    let (seconds, attoseconds) = duration.components
    var spec = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
    nanosleep(&spec, nil)
}

/// Polls `condition` every millisecond until it holds or `timeout` passes.
func waitUntil(_ what: String, timeout: Duration = .seconds(10), _ condition: () -> Bool) throws {
    let deadline = PKDeadline.after(timeout)
    while !condition() {
        if deadline.hasPassed { throw TestTimeout(what: what) }
        sleepFor(.milliseconds(1))
    }
}

/// Runs `loop` in `mode` until `condition` holds, failing after `timeout`.
func run(_ loop: PKRunLoop, in mode: PKRunLoopMode = .default, until what: String, timeout: Duration = .seconds(10), _ condition: () -> Bool) throws {
    let deadline = PKDeadline.after(timeout)
    while !condition() {
        if deadline.hasPassed { throw TestTimeout(what: what) }
        loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
    }
}

/// Runs `body` on a new thread with its own run loop and waits for it, up to `timeout`.
@discardableResult
func onLoopThread<R: Sendable>(
    timeout: Duration = .seconds(60), _ body: @escaping @Sendable (PKRunLoop) throws -> R
) throws -> R {
    let result = Locked<Result<R, any Error>?>(nil)
    let thread = Thread {
        result.value = Result { try body(PKRunLoop.current) }
    }
    thread.start()
    try waitUntil("the loop thread to finish", timeout: timeout) { result.value != nil }
    return try result.value!.get()
}

/// A private directory (mode 0700) removed at deinit, for ipc:// endpoints and name directories.
final class TemporaryDirectory: @unchecked Sendable {
    let path: String

    init() {
        var template = Array("/tmp/pkzmq-test-XXXXXX".utf8CString)
        path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    func endpoint(_ name: String) -> String { "ipc://\(path)/\(name)" }
}

/// What each open descriptor is, for a failure message.
func describeDescriptors() -> String {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return entries.sorted { Int($0) ?? 0 < Int($1) ?? 0 }.map { entry in
        "\(entry)=\((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(entry)")) ?? "?")"
    }.joined(separator: " ")
}

/// Counts the open descriptors of this process (`/proc/self/fd`).
func openDescriptorCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}
#endif

#if ZeroMQ
import Testing

/// Expects `body` to throw a `PKError` with `code`.
func expectPKError(
    _ code: PKError.Code, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void
) {
    do {
        try body()
        Issue.record("expected PKError.\(code); nothing was thrown", sourceLocation: sourceLocation)
    } catch let error as PKError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected PKError.\(code); got \(error)", sourceLocation: sourceLocation)
    }
}
#endif
