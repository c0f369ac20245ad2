// Helpers for the run-loop tests: pipes to make descriptor sources ready, sources that keep a
// mode alive, observers that log activities, a lock for tests that count descriptors, and a
// host's event loop for a loop hosted through its descriptor.

import Glibc
import Testing
@testable import PortKit

/// A failed system call in a test's own set-up.
struct TestSystemCallFailed: Error, CustomStringConvertible {
    let call: String
    let errno: Int32
    var description: String { "\(call) failed: errno \(errno)" }
}

/// A pipe whose read end a descriptor source watches. Both ends are non-blocking and
/// close-on-exec; the test closes them.
struct TestPipe: Sendable {
    let readEnd: Int32
    let writeEnd: Int32

    init() throws {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw TestSystemCallFailed(call: "pipe", errno: errno) }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        readEnd = fds[0]
        writeEnd = fds[1]
    }

    /// Makes the read end readable.
    func makeReadable() {
        var byte: UInt8 = 1
        _ = write(writeEnd, &byte, 1)
    }

    /// Reads everything that is buffered; returns how many bytes.
    @discardableResult
    func drain() -> Int {
        var buffer = [UInt8](repeating: 0, count: 256)
        var total = 0
        while true {
            let n = buffer.withUnsafeMutableBytes { read(readEnd, $0.baseAddress, $0.count) }
            if n <= 0 { return total }
            total += n
        }
    }

    func closeBoth() {
        close(readEnd)
        close(writeEnd)
    }
}

/// A custom source that is never signalled: it keeps `mode` from being empty, so a run in it
/// sleeps until its deadline instead of returning `.finished`.
@discardableResult
func keepAlive(_ loop: PKRunLoop, _ mode: PKRunLoopMode) -> PKCustomSource {
    let source = PKCustomSource(perform: {})
    loop.add(source, forMode: mode)
    return source
}

extension Locked where Value == [String] {
    /// Appends one entry to a log.
    func append(_ entry: String) { withLock { $0.append(entry) } }
}

/// Adds an observer of `activities` to `mode` that appends each activity's name to `log`.
@discardableResult
func logActivities(
    of loop: PKRunLoop, in mode: PKRunLoopMode, into log: Locked<[String]>,
    _ activities: PKRunLoopActivity = .all
) -> PKRunLoopObserver {
    let observer = PKRunLoopObserver(activities: activities) { _, activity in log.append(activity.description) }
    loop.add(observer, forMode: mode)
    return observer
}

/// Adds an observer to `mode` that sets `flag` each time the loop is about to sleep, so another
/// thread can act while the loop sleeps.
@discardableResult
func flagWhenAsleep(_ loop: PKRunLoop, _ mode: PKRunLoopMode, _ flag: Locked<Bool>) -> PKRunLoopObserver {
    let observer = PKRunLoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, activity in
        flag.value = activity == .beforeWaiting
    }
    loop.add(observer, forMode: mode)
    return observer
}

/// Serializes the in-process tests that open many descriptors at once (tests that count the
/// process's descriptors run in a child process instead). `PKMutex`: its hand-overs are visible
/// to ThreadSanitizer (see `TestLatch`).
let descriptorHeavyTests = PKMutex<Void>(())

/// Waits, up to `timeout`, until the process has at most `limit` open descriptors; returns the
/// last count seen (a count above `limit` means they never settled).
func settledDescriptorCount(atMost limit: Int, timeout: Duration = .seconds(20)) -> Int {
    let deadline = PKDeadline.after(timeout)
    var count = openDescriptorCount()
    while count > limit && !deadline.hasPassed {
        sleepFor(.milliseconds(5))
        count = openDescriptorCount()
    }
    return count
}

/// Nanoseconds between two deadlines, for comparing fire dates exactly.
func nanoseconds(from start: PKDeadline, to end: PKDeadline) -> Int64 {
    Int64(bitPattern: end.uptimeNanoseconds &- start.uptimeNanoseconds)
}

/// The run-loop suites, nested here so that `swift test --filter RunLoop` selects every one.
@Suite enum RunLoopTests {}

/// A host's event loop: waits in poll(2) for `loop.descriptor` (never longer than 5 s) and
/// runs one pass each time it is readable, until `done`.
func runAsHost(_ loop: PKRunLoop, _ mode: PKRunLoopMode, _ what: String, until done: () -> Bool) throws {
    let deadline = PKDeadline.after(patience(.seconds(10)))
    while !done() {
        if deadline.hasPassed { throw TestTimeout(what: what) }
        guard try pollReadable(loop.descriptor, timeoutMilliseconds: 5_000) else {
            throw TestTimeout(what: "\(what): the loop's descriptor to become readable")
        }
        loop.runOnePass(in: mode)
    }
}

/// Whether `fd` is readable within `timeoutMilliseconds`, by `poll(2)`.
func pollReadable(_ fd: Int32, timeoutMilliseconds: Int32) throws -> Bool {
    var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    while true {
        let n = poll(&entry, 1, timeoutMilliseconds)
        if n >= 0 { return n == 1 && entry.revents & Int16(POLLIN) != 0 }
        if errno != EINTR { throw TestSystemCallFailed(call: "poll", errno: errno) }
    }
}

/// Runs `body` on a loop thread; if it is still running after a while (`patience(10 s)`), a
/// watchdog stops the loop, so that a run that would sleep for ever returns `.stopped`.
func withWatchdog<R: Sendable>(_ body: @escaping @Sendable (PKRunLoop) throws -> R) throws -> R {
    try withWatchdog { loop, _ in try body(loop) }
}

/// As `withWatchdog(_:)`; `barked` turns true before the watchdog stops the loop, so that
/// something the stopped pass does can tell it came late.
func withWatchdog<R: Sendable>(_ body: @escaping @Sendable (PKRunLoop, _ barked: Locked<Bool>) throws -> R) throws -> R {
    let loopBox = Locked<PKRunLoop?>(nil)
    let finished = Locked(false)
    let barked = Locked(false)
    let watchdog = TestThread(name: "loop-watchdog") {
        let limit = PKDeadline.after(patience(.seconds(10)))
        while !finished.value && !limit.hasPassed { sleepFor(.milliseconds(5)) }
        if !finished.value {
            barked.value = true
            loopBox.value?.stop()
        }
    }
    defer { finished.value = true }
    let result = try onLoopThread(timeout: patience(.seconds(30))) { loop in
        loopBox.value = loop
        defer { finished.value = true }
        return try body(loop, barked)
    }
    try watchdog.join(timeout: patience(.seconds(30)))
    return result
}
