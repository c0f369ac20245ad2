// A process-wide background loop on its own thread, for ports consumed with Swift concurrency
// (AsyncSequence, async request/reply) or delivered on a DispatchQueue; and the loop that
// writes coalesced sends made outside any running loop.

import Logging
import Synchronization

extension PKRunLoop {
    /// A run loop on a thread of its own that runs for the life of the process, made on first
    /// use. PortKit schedules ports here when they are consumed as an `AsyncSequence` or on a
    /// `DispatchQueue`; code may also `perform` work on it.
    public static var background: PKRunLoop { backgroundLoop.loop }

    /// Runs `body` on this loop's thread and returns its result, waiting for it; runs it
    /// directly when called on the loop's own thread. Safe from any thread.
    func performAndWait<R: Sendable>(_ body: @escaping @Sendable () -> R) -> R {
        if isOwnedByCurrentThread { return body() }
        let done = Semaphore()
        let box = ResultBox<R>()
        perform(inModes: [.common]) {
            box.value = body()
            done.signal()
        }
        done.wait()
        return box.value!
    }
}

private final class ResultBox<R>: @unchecked Sendable {
    var value: R?
}

/// A counting semaphore on an eventfd in semaphore mode.
final class Semaphore: @unchecked Sendable {
    private let fd: Int32

    init() {
        fd = (try? EventFD.createSemaphore()) ?? -1
        precondition(fd >= 0, "PortKit cannot create a semaphore (eventfd)")
    }

    private init(fd: Int32) { self.fd = fd }

    /// A semaphore, or `.system` when its eventfd cannot be made.
    static func make() throws(PKError) -> Semaphore { Semaphore(fd: try EventFD.createSemaphore()) }

    deinit { Descriptor.close(fd) }

    func signal() { EventFD.signal(fd) }

    /// Waits for a signal, up to `deadline`. Returns false on timeout.
    @discardableResult
    func wait(until deadline: PKDeadline = .distantFuture) -> Bool {
        while true {
            if EventFD.tryConsume(fd) { return true }
            let timeout = deadline.pollTimeoutMilliseconds(now: monotonicNanoseconds())
            if timeout == 0 { return EventFD.tryConsume(fd) }
            _ = try? Descriptor.poll(fd, events: Int16(1), timeoutMilliseconds: timeout)
        }
    }
}

extension PKRunLoop {
    /// The loop that writes the pending bytes of sends made outside any running loop (see
    /// `SendConnection.write`), and sends the ZeroMQ transport's batches, on a thread of its
    /// own made on first use. Its thread is a
    /// throughput thread (`SCHED_BATCH`): asking it to write never preempts the sender, which
    /// goes on adding to the same batch until it sleeps or its time slice ends (or finds
    /// `SendConnection.pendingLimit` bytes pending and writes them itself). On a CPU of its own
    /// it writes at once. docs/decisions.md, "Coalesced writes outside a loop".
    ///
    /// `nil` when its thread could not be started (the process is out of threads, memory or
    /// descriptors); a send then writes its pending bytes itself, waiting for room.
    package static var flusher: PKRunLoop? {
        if flusherRefused.load(ordering: .relaxed) { return nil }
        return flusherLoop?.loop
    }

    /// Whether `flusher` is there, asked without retaining its loop (a retain of a loop takes
    /// the slow path of its side table: weak references point to loops).
    package static var hasFlusher: Bool {
        !flusherRefused.load(ordering: .relaxed) && flusherLoop != nil
    }

    /// Makes `flusher` `nil` from now on, as in a process that could not start its thread: for
    /// tests of that case, in a child process of their own (a full descriptor table or a lowered
    /// address-space limit does not stop a thread reliably: glibc reuses cached thread stacks,
    /// and a descriptor someone else closes is taken).
    static func refuseFlusher() { flusherRefused.store(true, ordering: .relaxed) }
}

private let flusherRefused = Atomic<Bool>(false)

private final class DedicatedLoop: Sendable {
    let loop: PKRunLoop

    /// Starts a loop on a thread named `name` that runs for the life of the process;
    /// `throughput`: a throughput thread (see `ThreadScheduling.preferThroughput()`), if the
    /// scheduler lets it (a thread made by a `SCHED_IDLE` thread may not leave that policy
    /// without privilege: it keeps it, and says so in the log).
    ///
    /// - Throws: `.system` when the thread or its semaphore cannot be made.
    init(name: String, throughput: Bool = false) throws(PKError) {
        let ready = try Semaphore.make()
        let slot = ResultBox<PKRunLoop>()
        let thread = try SystemThread(name: name) {
            if throughput && !ThreadScheduling.preferThroughput() {
                dedicatedLoopLogger.notice("\(name) keeps the scheduling policy of the thread that started it: SCHED_BATCH was refused")
            }
            let loop = PKRunLoop.current
            // A source that is never signalled keeps the default mode from being empty.
            loop.add(PKCustomSource(perform: {}), forMode: .common)
            // Its descriptors now, as part of the first use: it sleeps at once anyway.
            _ = try? loop.epollFD()
            slot.value = loop
            ready.signal()
            while true { loop.run(in: .default) }
        }
        thread.detach()
        ready.wait()
        loop = slot.value!
    }
}

private let dedicatedLoopLogger = Logger(label: "PortKit.PKRunLoop")

private let backgroundLoop: DedicatedLoop = {
    do throws(PKError) { return try DedicatedLoop(name: "PortKit.bg") } catch {
        fatalError("PortKit cannot start its background loop: \(error)")
    }
}()

private let flusherLoop: DedicatedLoop? = {
    do throws(PKError) { return try DedicatedLoop(name: "PortKit.flush", throughput: true) } catch {
        dedicatedLoopLogger.warning("no thread for PortKit.flush (\(error)): sends outside a loop write their pending bytes themselves")
        return nil
    }
}()
