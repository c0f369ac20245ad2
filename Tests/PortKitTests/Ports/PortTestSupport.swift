// Helpers for the port tests: running a loop until a condition holds, threads that serve a
// port, send rights with connections of their own, and raw sockets that play a (possibly
// malformed) peer.

import Glibc
import Synchronization
@testable import PortKit

// MARK: - Patience

/// Whether the process runs under ThreadSanitizer (its runtime is linked in), which slows
/// everything by an order of magnitude or more.
let runsUnderThreadSanitizer: Bool = dlsym(nil, "__tsan_init") != nil

/// A deadline that only catches a hang, stretched under a sanitizer. Never use it for a
/// duration a test checks (a timeout under test, or "nothing happens for 20 ms").
func patience(_ duration: Duration) -> Duration {
    if runsUnderThreadSanitizer { return duration * 20 }
    if runsUnderAddressSanitizer { return duration * 10 }
    return duration
}

/// Whether the tests run under AddressSanitizer (several times slower, and the whole suite
/// shares two CPUs with its sanitizer's work).
let runsUnderAddressSanitizer: Bool = dlsym(nil, "__asan_init") != nil

/// `waitUntil` with a hang-catching deadline stretched by `patience`.
func waitPatiently(_ what: String, timeout: Duration = .seconds(10), _ condition: () -> Bool) throws {
    try waitUntil(what, timeout: patience(timeout), condition)
}

extension TestThread {
    /// `join` with a hang-catching deadline stretched by `patience`.
    func joinPatiently(timeout: Duration = .seconds(20)) throws { try join(timeout: patience(timeout)) }
}

extension TestLatch {
    /// `wait` with a hang-catching deadline stretched by `patience`.
    func waitPatiently(timeout: Duration = .seconds(10), _ what: String = "latch") throws -> Value {
        try wait(timeout: patience(timeout), what)
    }
}

/// `onLoopThread` with a hang-catching deadline stretched by `patience`.
@discardableResult
func onPortLoopThread<R: Sendable>(
    timeout: Duration = .seconds(30), _ body: @escaping @Sendable (PKRunLoop) throws -> R
) throws -> R {
    try onLoopThread(timeout: patience(timeout), body)
}

// MARK: - Running loops with deadlines

/// Runs `loop` in `mode`, one handled source at a time, until `condition` holds; throws when
/// `timeout` passes first.
func runLoop(
    _ loop: PKRunLoop, in mode: PKRunLoopMode = .default, timeout: Duration = .seconds(20),
    _ what: String = "condition", until condition: () -> Bool
) throws {
    let deadline = PKDeadline.after(patience(timeout))
    while !condition() {
        if deadline.hasPassed { throw TestTimeout(what: what) }
        loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
    }
}

/// Runs `loop` in `mode` for `duration` (to show that something does *not* happen).
func runLoop(_ loop: PKRunLoop, in mode: PKRunLoopMode = .default, for duration: Duration) {
    let deadline = PKDeadline.after(duration)
    while !deadline.hasPassed { loop.run(in: mode, until: deadline) }
}

/// The kernel thread id of the calling thread.
var currentThreadID: Int32 { ThreadIdentity.current }

// MARK: - Send rights

/// A send right to `port` with a connection of its own, as a right received in a message is
/// (a right from `makeSendRight()` shares the port's one local connection).
func independentRight(to port: PKReceivePort) throws -> PKSendPort {
    PKSendPort(connection: SendConnection(takingOwnershipOf: try port.makeTransferDescriptor()))
}

/// Makes `count` send rights to `port` by the public road: a message carrying them as port
/// components, received on a carrier port scheduled on `loop` (the calling thread's).
func rightsByMessage(to port: PKReceivePort, count: Int, on loop: PKRunLoop) throws -> [PKSendPort] {
    var received: [PKSendPort]?
    let carrier = PKReceivePort { message in received = message.ports }
    defer { carrier.invalidate() }
    try loop.add(carrier, forMode: .default)
    let components = (0..<count).map { _ in PKPortComponent.port(port.makeSendRight()) }
    try carrier.makeSendRight().send(PKPortMessage(msgid: 1, components: components), timeout: .seconds(5))
    try runLoop(loop, "rights carried in a message") { received != nil }
    return received!
}

/// A payload of `count` bytes.
func bytes(_ count: Int, seed: UInt8 = 0) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &+ Int(seed)) }
}

// MARK: - A thread that serves a port

/// A thread with its own run loop and one port, which it runs until the port is invalidated
/// (or a deadline passes). `configure` runs on that thread before the loop starts; it sets the
/// port's handler and may keep state of its own.
final class PortServer: @unchecked Sendable {
    let right: PKSendPort
    let port: PKReceivePort
    let loop: PKRunLoop
    private let thread: TestThread

    init(
        name: String = "port-server", lifetime: Duration = .seconds(120),
        _ configure: @escaping (PKReceivePort, PKRunLoop) -> Void
    ) throws {
        let ready = TestLatch<UncheckedBox<(PKReceivePort, PKRunLoop)>>()
        let setUp = UncheckedBox(configure)
        thread = TestThread(name: name) {
            let loop = PKRunLoop.current
            let port = PKReceivePort()
            setUp.value(port, loop)
            guard (try? loop.add(port, forMode: .default)) != nil else { return }
            ready.set(UncheckedBox((port, loop)))
            let deadline = PKDeadline.after(patience(lifetime))
            while port.isValid && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            port.invalidate()
        }
        let (port, loop) = try ready.waitPatiently(timeout: .seconds(10), "server \(name) ready").value
        self.port = port
        self.loop = loop
        self.right = port.makeSendRight()
    }

    /// Invalidates the server's port (from this thread) and waits for the thread to end.
    func stop() throws {
        port.invalidate()
        try thread.joinPatiently(timeout: .seconds(20))
    }

    /// Waits for the server's thread to end on its own.
    func joinPatiently() throws { try thread.joinPatiently(timeout: .seconds(20)) }
}

// MARK: - Raw peers

/// A system call that failed in a test's own set-up.
struct RawSocketError: Error, CustomStringConvertible {
    let call: String
    let code: Int32
    var description: String { "\(call) failed: errno \(code)" }
}

/// The writing end of a raw connection to a receive port: the test writes whatever bytes it
/// likes (a valid greeting, frames, garbage) as a peer that may break the protocol.
final class RawPeer: @unchecked Sendable {
    let fd: Int32
    private var closed = false

    /// Makes a socketpair and hands one end to `port` as a new sender connection.
    init(to port: PKReceivePort) throws {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw RawSocketError(call: "socketpair", code: errno)
        }
        port.adoptFromAnyThread(fds[0])
        fd = fds[1]
    }

    deinit { close() }

    /// The bytes of a valid greeting.
    static var greeting: [UInt8] {
        var buffer: [UInt8] = []
        WireEncoder.appendGreeting(.current(pid: UInt32(bitPattern: getpid()), uid: geteuid()), to: &buffer)
        return buffer
    }

    /// The bytes of a valid frame.
    static func frame(msgid: UInt32, data: [UInt8] = []) -> [UInt8] {
        var buffer: [UInt8] = []
        WireEncoder.append(WireFrame(msgid: msgid, components: data.isEmpty ? [] : [.data(data)]), to: &buffer)
        return buffer
    }

    /// A frame header with the given fields, little-endian.
    static func header(length: UInt32, msgid: UInt32, components: UInt16, flags: UInt16, descriptors: UInt16) -> [UInt8] {
        var buffer: [UInt8] = []
        func put<T: FixedWidthInteger>(_ value: T) { withUnsafeBytes(of: value.littleEndian) { buffer.append(contentsOf: $0) } }
        put(length); put(msgid); put(components); put(flags); put(descriptors); put(UInt16(0))
        return buffer
    }

    /// Writes all of `bytes` in one `send` with MSG_NOSIGNAL; returns the errno on failure.
    @discardableResult
    func write(_ bytes: [UInt8]) -> Int32? {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw in
                Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n < 0 {
                if errno == EINTR { continue }
                return errno
            }
            offset += n
        }
        return nil
    }

    /// Closes the writing direction: the port sees the end of the stream.
    func shutdownWrite() { _ = Glibc.shutdown(fd, Int32(SHUT_WR)) }

    func close() {
        guard !closed else { return }
        closed = true
        _ = Glibc.close(fd)
    }

    /// Whether the port closed its end: a read sees EOF (or the connection was reset).
    var peerClosed: Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, 0) > 0 else { return false }
        if pfd.revents & Int16(POLLHUP | POLLERR) != 0 { return true }
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    }

    /// Waits until the port has closed its end; then a write fails with EPIPE, not SIGPIPE.
    func waitUntilClosedByPort(timeout: Duration = .seconds(10)) throws {
        try waitPatiently("the port to close the raw connection", timeout: timeout) { self.peerClosed }
    }
}
