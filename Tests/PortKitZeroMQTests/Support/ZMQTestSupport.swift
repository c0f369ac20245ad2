#if ZeroMQ
// Helpers for the ZeroMQ tests: loops on fresh threads, deadlines, private directories.

import Foundation
import PortKit

/// Failure raised by a helper when a deadline passes.
struct TestTimeout: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out waiting for \(what)" }
}

/// A value guarded by a mutex, shareable between threads and closures.
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

/// Whether the tests run under a sanitizer (its runtime is linked in), which slows everything
/// by an order of magnitude.
let runsUnderSanitizer: Bool = dlsym(nil, "__tsan_init") != nil || dlsym(nil, "__asan_init") != nil

/// A deadline that only catches a hang, stretched under a sanitizer (as PortKitTests'
/// `patience`). Never use it for a duration a test checks.
func patience(_ duration: Duration) -> Duration {
    runsUnderSanitizer ? duration * 20 : duration
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

#if ZeroMQ
/// Tests that change process-wide settings (the heartbeat) run their body in a child process
/// (an exit test), so the setting cannot leak into tests running alongside. The body prints
/// what it measured, then "ok" or "failed: <why>", and exits 0; `IsolatedRun.check` reads that.
enum IsolatedRun {
    /// Fails the body with `message` unless `condition` holds.
    struct Failure: Error, CustomStringConvertible { let description: String }
    static func require(_ condition: Bool, _ message: @autoclosure () -> String) throws {
        if !condition { throw Failure(description: message()) }
    }

    /// Runs `body` in the child and ends the child.
    static func report(_ body: () throws -> Void) -> Never {
        do {
            try body()
            print("ok")
        } catch {
            print("failed: \(error)")
        }
        fflush(nil)
        exit(0)
    }

    /// Checks the child's output: it ended with "ok". Prints what it measured.
    static func check(_ result: ExitTest.Result?, sourceLocation: SourceLocation = #_sourceLocation) {
        guard let result else { return }  // the exit expectation already failed
        let lines = String(decoding: result.standardOutputContent, as: UTF8.self).split(separator: "\n").map(String.init)
        for line in lines.dropLast() { print(line) }
        #expect(lines.last == "ok", "\(lines.joined(separator: "\n"))", sourceLocation: sourceLocation)
    }
}
#endif
