// PortKit's workloads, written as the Threading Programming Guide's users write them: the main
// side owns a receive port on its run loop; the worker (a PKWorkerThread or a PKWorkerProcess,
// checked in the guide's way) owns one on its own loop; each holds a send right to the other.

import CBench
import Glibc
import PortKit

/// The message ids of the benchmark protocol.
public enum BenchMessage {
    /// A ping (echoed) or a stream message (counted).
    public static let data: UInt32 = 1
    /// The last message of a stream batch: the receiver acknowledges it.
    public static let last: UInt32 = 2
    /// An idle port's one message.
    public static let idle: UInt32 = 3
    /// "Here is my port" (its reply port), to a worker found by name; answered with `hello`.
    public static let hello: UInt32 = 4
}

/// What the worker side does with each message.
public enum WorkerRole: String, Sendable {
    /// Answers each message: on its reply port if it has one (request/reply), else on the main port.
    case echo
    /// Counts messages; acknowledges each `BenchMessage.last` on the main port.
    case sink
}

/// The worker's handler for `role`, answering on `mainPort`.
public func workerHandler(_ role: WorkerRole, mainPort: PKSendPort) -> (PKPortMessage) -> Void {
    let deadline = PKDeadline.distantFuture
    switch role {
    case .echo:
        return { message in
            if let reply = message.replyPort {
                try? reply.send(PKPortMessage(msgid: message.msgid, components: message.components), before: deadline)
            } else {
                try? mainPort.send(message, before: deadline)
            }
        }
    case .sink:
        let ack = PKPortMessage(msgid: BenchMessage.last)
        return { message in
            if message.msgid == BenchMessage.last { try? mainPort.send(ack, before: deadline) }
        }
    }
}

/// Idle ports and the send rights that keep their senders connected.
public struct IdlePorts {
    public var ports: [PKReceivePort] = []
    /// One right per port, each over a connection (a socket) of its own; keep them alive.
    public var rights: [PKSendPort] = []

    public func invalidate() {
        for right in rights { right.invalidate() }
        for port in ports { port.invalidate() }
    }
}

/// Schedules `count` ports on `loop`, each with one connected sender: a socket connection of
/// its own, as a sender in another process has (not the in-process mailbox that
/// `makeSendRight()` uses, nor the socket-free right an in-process message carries). The ports
/// travel, as rights, in messages sent over a socket (to a collector port found through the name
/// server), so each arrives as a connection; one message then goes through each, so every
/// connection is adopted, greeted and watched by the loop's epoll. Loop-only. The ports stay
/// scheduled until invalidated; keep the returned rights alive.
public func makeIdlePorts(_ count: Int, on loop: PKRunLoop) throws -> IdlePorts {
    var idle = IdlePorts()
    guard count > 0 else { return idle }
    var delivered = 0
    var rights: [PKSendPort] = []
    let directory = try makeScratchDirectory("pkbench-idle")
    defer { removeScratchDirectory(directory) }
    let names = PKNameServer(directory: directory)
    let collector = PKReceivePort { message in rights.append(contentsOf: message.ports) }
    try loop.add(collector, forMode: .default)
    defer { collector.invalidate() }
    try names.register(collector, name: "collector")
    let toCollector = try names.lookUp("collector")
    defer { toCollector.invalidate() }
    let deadline = PKDeadline.after(.seconds(60))
    func runUntil(_ done: () -> Bool, _ what: String) throws {
        while !done() {
            if loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) == .timedOut {
                throw BenchError("idle ports: \(what)")
            }
        }
    }
    idle.ports.reserveCapacity(count)
    for sent in 1...count {
        let port = PKReceivePort { _ in delivered += 1 }
        try loop.add(port, forMode: .default)
        try toCollector.send(PKPortMessage(msgid: BenchMessage.idle, components: [.port(port.makeSendRight())]), before: .after(.seconds(10)))
        idle.ports.append(port)
        // The collector runs on this thread: let it read before the socket fills.
        try runUntil({ rights.count + 32 >= sent }, "\(rights.count) of \(sent) rights arrived")
    }
    try runUntil({ rights.count >= count }, "\(rights.count) of \(count) rights arrived")
    for right in rights { try right.send(PKPortMessage(msgid: BenchMessage.idle), before: .after(.seconds(10))) }
    try runUntil({ delivered >= count }, "\(delivered) of \(count) messages delivered")
    for port in idle.ports { port.handler = { _ in } }
    idle.rights = rights
    return idle
}

/// Schedules `count` timers an hour away on `loop`'s default mode, each at its own time: a
/// loop that many timers wait on (a server's per-client timeouts, say). Invalidate them when done.
public func makeIdleTimers(_ count: Int, on loop: PKRunLoop) -> [PKTimer] {
    (0..<count).map { index in
        loop.scheduleTimer(after: .seconds(3600) + .milliseconds(index)) { _ in }
    }
}

/// Senders connected to a port by name, and one connection that never greets: a server's
/// crowd of clients with one hostile peer among them. The port waits an hour for a greeting,
/// so the silent one stays for the whole measurement.
public final class Crowd {
    private let directory: String
    private var rights: [PKSendPort] = []
    private var silent: Int32 = -1

    /// Limits for a port that gets a crowd: a greeting waited for an hour.
    public static var limits: PKPortLimits {
        var limits = PKPortLimits.default
        limits.greetingTimeout = .seconds(3600)
        return limits
    }

    /// Connects `count` senders and one silent connection to `port`, which runs on `loop`
    /// (this thread's), and runs the loop until it has accepted them.
    public init(of count: Int, at port: PKReceivePort, on loop: PKRunLoop) throws {
        directory = try makeScratchDirectory("pkbench-crowd")
        do {
            let names = PKNameServer(directory: directory)
            try names.register(port, name: "crowd")
            rights.reserveCapacity(count)
            let deadline = PKDeadline.after(.seconds(60))
            while rights.count < count {
                if let right = try lookUpUnlessBusy(names, "crowd") {
                    rights.append(right)
                } else {
                    // The backlog is full: let the loop accept.
                    if deadline.hasPassed { throw BenchError("crowd: \(rights.count) of \(count) senders connected") }
                    loop.run(in: .default, until: .after(.milliseconds(5)))
                }
            }
            silent = cb_connect_unix("\(directory)/crowd.sock")
            guard silent >= 0 else { throw BenchError("crowd: the silent connection failed") }
            // Accept what is still in the backlog (the greetings come with it).
            loop.run(in: .default, until: .after(.milliseconds(200)))
        } catch {
            close()
            throw error
        }
    }

    public func close() {
        if silent >= 0 { Glibc.close(silent) }
        silent = -1
        for right in rights { right.invalidate() }
        rights = []
        removeScratchDirectory(directory)
    }
}

/// The worker side, in this process (a PKWorkerThread) or another (a PKWorkerProcess).
public enum WorkerKind: Sendable {
    /// A `PKWorkerThread`.
    case thread
    /// A `PKWorkerProcess` (spawned, checked in by passing a port).
    case process
    /// A process started with plain posix_spawn that registers a name; the main side looks it
    /// up and sends its own port in a first message. The same wire path as `.process`, without
    /// `pidfd_open` (which valgrind 3.19 does not support), so callgrind can run it.
    case namedProcess
}

/// What the main side does in each batch.
public enum PortKitPattern: Sendable {
    /// Send, then run the loop until the answer arrives (`runMode:beforeDate:`), `n` times.
    case roundTrip
    /// `sendRequest` (a fresh reply port each time, `CFMessagePortSendRequest`), `n` times.
    case request
    /// Send `n` messages of `size` bytes one way, then wait for the acknowledgement of the last.
    case stream
}

/// PortKit between two threads or two processes: main side on a pinned driver thread, worker
/// checked in on the other side, pinned per `placement`.
public final class PortKitPair: Workload {
    private let driver: PinnedDriver

    /// - Parameters:
    ///   - idlePorts: idle ports (each with a connected sender) added to both loops.
    ///   - crowd: senders connected to the main side's port besides the worker, one more
    ///     connection that never greets (`Crowd`).
    ///   - idleTimers: timers an hour away added to both loops (threads only).
    public init(_ kind: WorkerKind, _ pattern: PortKitPattern, _ placement: Placement, size: Int = 64, idlePorts: Int = 0, crowd: Int = 0, idleTimers: Int = 0) throws {
        precondition(idleTimers == 0 || kind == .thread, "idle timers are for the thread pair")
        let workerCPU = placement.cpus.second
        let role: WorkerRole = pattern == .stream ? .sink : .echo
        driver = try PinnedDriver(cpu: placement.cpus.first) {
            let loop = PKRunLoop.current
            var answers = 0
            let mine = PKReceivePort(limits: crowd > 0 ? Crowd.limits : .default) { _ in answers += 1 }
            try loop.add(mine, forMode: .default)
            let idleHere = try makeIdlePorts(idlePorts, on: loop)
            let crowdHere = crowd > 0 ? try Crowd(of: crowd, at: mine, on: loop) : nil
            let timersHere = makeIdleTimers(idleTimers, on: loop)

            let workerPort: PKSendPort
            var stopWorker: () -> Void
            switch kind {
            case .thread:
                let worker = try PKWorkerThread(name: "pkbench-worker", mainPort: mine.makeSendRight(), checkInTimeout: .seconds(30)) { context in
                    if workerCPU >= 0 { cb_pin_self(workerCPU) }
                    guard let main = context.mainPort else { throw BenchError("no main port") }
                    let idle = try makeIdlePorts(idlePorts, on: context.loop)
                    _ = makeIdleTimers(idleTimers, on: context.loop)  // the loop keeps them; they end with it
                    let handler = workerHandler(role, mainPort: main)
                    context.port.handler = { message in withExtendedLifetime(idle.rights) { handler(message) } }
                }
                workerPort = worker.port
                stopWorker = { try? worker.stop(timeout: .seconds(10)) }
            case .process:
                let worker = try PKWorkerProcess(
                    executable: helperExecutable, arguments: ["pk-worker", role.rawValue, "\(workerCPU)", "\(idlePorts)"],
                    name: "pkbench-worker", mainPort: mine.makeSendRight(), checkInTimeout: .seconds(120))
                workerPort = worker.port
                stopWorker = { _ = worker.stop(timeout: .seconds(10)) }
            case .namedProcess:
                let directory = try makeScratchDirectory("pkbench-worker")
                var argv: [UnsafeMutablePointer<CChar>?] = [helperExecutable, "pk-named", directory, role.rawValue, "\(workerCPU)", "\(idlePorts)"]
                    .map { (text: String) in strdup(text) }
                argv.append(nil)
                let pid = cb_spawn_process(helperExecutable, argv)
                for pointer in argv { free(pointer) }
                guard pid > 0 else { throw BenchError("could not spawn pkbench pk-named") }
                do {
                    workerPort = try PKNameServer(directory: directory).lookUp("pkbench-worker", timeout: .seconds(120))
                    try workerPort.send(PKPortMessage(msgid: BenchMessage.hello, replyPort: mine.makeSendRight()), before: .after(.seconds(60)))
                    let deadline = PKDeadline.after(.seconds(120))
                    while answers < 1 {
                        if loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) == .timedOut { throw BenchError("no hello from pk-named") }
                    }
                    answers = 0
                } catch {
                    kill(pid, SIGKILL)
                    _ = cb_reap(pid, 5000)
                    removeScratchDirectory(directory)
                    throw error
                }
                stopWorker = {
                    kill(pid, SIGTERM)
                    _ = cb_reap(pid, 30_000)
                    removeScratchDirectory(directory)
                }
            }

            let payload = [UInt8](repeating: 0x5A, count: size)
            let message = PKPortMessage(msgid: BenchMessage.data, data: payload)
            let last = PKPortMessage(msgid: BenchMessage.last, data: payload)

            func awaitAnswers(_ target: Int, _ deadline: PKDeadline) throws {
                while answers < target {
                    let result = loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
                    if result == .timedOut || result == .finished { throw BenchError("no answer from the worker (\(result))") }
                }
            }

            let work: (Int) throws -> UInt64
            switch pattern {
            case .roundTrip:
                work = { n in
                    let deadline = PKDeadline.after(.seconds(60))
                    let start = nowNanoseconds()
                    for _ in 0..<n {
                        let target = answers + 1
                        try workerPort.send(message, before: deadline)
                        try awaitAnswers(target, deadline)
                    }
                    return nowNanoseconds() - start
                }
            case .request:
                work = { n in
                    let start = nowNanoseconds()
                    for _ in 0..<n {
                        guard try workerPort.sendRequest(message, sendTimeout: .seconds(60), receiveTimeout: .seconds(60)) != nil else {
                            throw BenchError("no reply")
                        }
                    }
                    return nowNanoseconds() - start
                }
            case .stream:
                work = { n in
                    let deadline = PKDeadline.after(.seconds(120))
                    let target = answers + 1
                    let start = nowNanoseconds()
                    for _ in 0..<(n - 1) { try workerPort.send(message, before: deadline) }
                    try workerPort.send(last, before: deadline)
                    try awaitAnswers(target, deadline)
                    return nowNanoseconds() - start
                }
            }
            return DriverBody(work: work, tearDown: {
                stopWorker()
                stopWorker = {}
                mine.invalidate()
                idleHere.invalidate()
                crowdHere?.close()
                for timer in timersHere { timer.invalidate() }
            })
        }
    }

    public func run(_ n: Int) throws -> UInt64 { try driver.run(n) }
    public func close() { driver.close() }
}

/// A worker thread launched until its check-in arrives (`PKWorkerThread.init`), then stopped
/// and joined outside the clock.
public final class PortKitSpawn: Workload {
    private let driver: PinnedDriver
    public init(_ placement: Placement) throws {
        let childCPU = placement == .split ? placement.cpus.second : -1  // same: inherits CPU 0
        driver = try PinnedDriver(cpu: placement.cpus.first) {
            _ = PKRunLoop.current  // the launcher's loop exists before the clock starts
            return DriverBody(work: { n in
                var total: UInt64 = 0
                for _ in 0..<n {
                    let start = nowNanoseconds()
                    let worker = try PKWorkerThread(name: "pkbench-spawn", checkInTimeout: .seconds(30)) { _ in
                        if childCPU >= 0 { cb_pin_self(childCPU) }
                    }
                    total += nowNanoseconds() - start
                    try worker.stop(timeout: .seconds(10))
                }
                return total
            })
        }
    }
    public func run(_ n: Int) throws -> UInt64 { try driver.run(n) }
    public func close() { driver.close() }
}

/// Serves a worker process's side: `pkbench pk-worker ROLE CPU IDLE`.
public func servePortKitWorker(role: WorkerRole, cpu: Int32, idlePorts: Int) throws {
    if cpu >= 0 { cb_pin_self(cpu) }
    try PKWorkerProcess.serve { context in
        guard let main = context.mainPort else { throw BenchError("no main port") }
        let idle = try makeIdlePorts(idlePorts, on: context.loop)
        let handler = workerHandler(role, mainPort: main)
        context.port.handler = { message in withExtendedLifetime(idle.rights) { handler(message) } }
    }
}

/// Serves `pkbench pk-named DIR ROLE CPU IDLE`: registers "pkbench-worker" in DIR; the first
/// message (`hello`) brings the main side's port; then serves as a worker does.
public func serveNamedWorker(directory: String, role: WorkerRole, cpu: Int32, idlePorts: Int) throws -> Never {
    if cpu >= 0 { cb_pin_self(cpu) }
    let loop = PKRunLoop.current
    let port = PKReceivePort()
    try loop.add(port, forMode: .default)
    let idle = try makeIdlePorts(idlePorts, on: loop)
    port.handler = { message in
        guard message.msgid == BenchMessage.hello, let main = message.replyPort else { return }
        try? main.send(PKPortMessage(msgid: BenchMessage.hello), before: .after(.seconds(60)))
        port.handler = workerHandler(role, mainPort: main)
    }
    try PKNameServer(directory: directory).register(port, name: "pkbench-worker")
    while true {
        withExtendedLifetime(idle) { _ = loop.run(in: .default, until: .distantFuture, returnAfterSourceHandled: true) }
    }
}
