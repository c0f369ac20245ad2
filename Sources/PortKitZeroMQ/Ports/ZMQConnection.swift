#if ZeroMQ
// The sending side: one PUSH socket connected to one endpoint, shared by every send right to
// that endpoint in this process (so a reply port received in many messages costs one
// connection). Any thread may send: the socket lives under a lock, taken for each try at a
// whole message, so a message is never interleaved with another thread's (the lock, not a
// socket per thread: a connection per endpoint and process keeps the order of all messages
// sent to it). A send that finds the receiver's queue full waits for room without the lock, so
// no send waits for another's deadline.
//
// Messages sent in a stream go out in batches (protocol.md 10.2): a small message sent less than
// `ZMQBatch.defaultWindow` after the last one that went alone opens a batch, and the small ones
// after it join it, one frame for many messages, which PortKit's flusher thread
// (`PKRunLoop.flusher`) sends when the sender lets it run; a full batch is sent by the sender
// itself. libzmq's cost is per frame, so a stream of small messages costs a fraction of it per
// message; a round trip's messages, far apart, go alone and at once. docs/decisions.md,
// "Batches over ZeroMQ".
//
// Its monitor tells it when the peer goes: once connected (the ZMTP handshake succeeded), a
// disconnection, whether the peer closed, died or (over tcp://) fell silent past the heartbeat
// timeout, kills the connection for good, as the death of a Mach port's receiver kills its send
// rights. A connection that never succeeded keeps trying (ZeroMQ connects in the background, and
// reconnects after a handshake that timed out or was cut); its messages wait for it until their
// send deadline. Only a handshake the peer refuses (not a ZeroMQ PULL socket) kills it.

import Logging
import PortKit
import Synchronization

private let connectionLogger = Logger(label: "PortKitZeroMQ.ZMQConnection")

final class ZMQConnection: @unchecked Sendable {
    let endpoint: ZMQEndpoint
    /// The PUSH socket (nil once the connection is dead or closed at exit) and the batch being
    /// filled. Held for one try at a send; never while waiting for room.
    private let sending: ZMQMutex<Sending>
    /// Wakes a send that waits for room when the connection dies (and stays signalled).
    private let interrupt: InterruptSignal
    /// Wakes the sends that wait for room when another thread's send went through, or the
    /// socket closed: the news of room (libzmq's commands, which make `ZMQ_FD` readable) may
    /// have been taken by that send, under the lock, before a waiter's `poll` saw it. A waiter
    /// drains it, under the lock, before it tries again.
    private let roomChanged: InterruptSignal
    private let state = ZMQMutex<State>(State())
    /// Set, under `state`'s lock, when `deadReason` is: a live connection answers `deadReason`
    /// (every send asks) with one load instead of a lock.
    private let isDead = Atomic<Bool>(false)
    /// Set when libzmq has let go of the socket (its monitor stopped): after a close, once the
    /// messages it held are written or its linger has passed.
    private let socketReleased = Atomic<Bool>(false)
    /// Counts the PUSH sockets the connection has had: a connection to a name that follows it
    /// to a new address takes a new socket, and its old socket's monitor events are ignored.
    private let socketGeneration = Atomic<UInt32>(0)
    /// `ZMQSocket.sending`'s limits, for a new socket.
    private let limits: PKPortLimits
    /// Whether the ZMTP handshake has succeeded: set under `state`'s lock (where
    /// `onEstablished` registers its handlers), read with one load (a send asks it before it
    /// opens a batch: a batch never waits for a connection, only for room).
    private let handshaken = Atomic<Bool>(false)

    /// What a send takes the lock for.
    private struct Sending: ~Copyable {
        var socket: ZMQSocket?
        var batch = ZMQBatch()
        /// When the send of the last message that went alone began, or the open batch opened
        /// (nanoseconds of uptime): a message less than `window` after it opens a batch.
        var windowStart: UInt64 = 0
        /// `ZMQBatch.defaultWindow`; the tests widen it.
        var window = ZMQBatch.defaultWindow
        /// Whether the flusher has been asked to send the batch (a `perform` or a timer of
        /// its is pending: it is, whenever the batch holds messages, unless `flusherPaused`).
        var flushQueued = false
        /// How many times in a row the flusher found the receiver's queue full.
        var retries = 0
        /// Tests: the flusher leaves this connection's batches alone until `resumeFlusher`, so
        /// that only full batches go out and the frames are known.
        var flusherPaused = false
        /// Sends waiting for room, without the lock (see `roomChanged`).
        var roomWaiters = 0
        /// The address a connection to a host name connected to (see `connectWhenKnown`).
        var connectedTo: String?
        /// Whether a frame has gone into libzmq's queue since the socket connected to
        /// `connectedTo` (a connection to a name follows it to a new address only if none has:
        /// it would be lost with the old socket).
        var sentSinceConnect = false

        /// How soon the flusher tries again after finding the receiver's queue full: 1 ms, twice
        /// as long each time up to 64 ms (a receiver that stays behind costs its sender's flusher
        /// a wake-up every 64 ms, not one a millisecond).
        mutating func nextRetry() -> Duration {
            defer { retries += 1 }
            return .milliseconds(1 << min(retries, 6))
        }
    }

    private struct State {
        var deadReason: String?
        var deathHandlers: [Int: @Sendable (String) -> Void] = [:]
        var establishedHandlers: [@Sendable (Bool) -> Void] = []
        var nextToken = 0
    }

    /// Connects to `endpoint` in the background (libzmq's `zmq_connect` returns at once).
    ///
    /// - Throws: `.badName` for an endpoint libzmq refuses to connect to (a `*` host or port, or
    ///   one it finds malformed), `.system`.
    init(endpoint: ZMQEndpoint, limits: PKPortLimits = .default) throws(PKError) {
        guard endpoint.isLibzmqConnectable else {
            throw PKError(.badName, "cannot connect to \(endpoint): a * host or port is for binding only")
        }
        self.endpoint = endpoint
        self.limits = limits
        interrupt = try InterruptSignal()
        roomChanged = try InterruptSignal()
        let (push, monitor) = try Self.monitoredSocket(toward: endpoint, limits: limits)
        // A host name is looked up by PortKit, off this thread (`HostResolver`), and libzmq
        // connects to its address once it is known: libzmq would look it up on its I/O thread,
        // which serves every ZeroMQ socket of the process, at every try.
        var name: (host: String, port: String)?
        if case .tcp(let host, let port) = endpoint, HostResolver.kind(of: host) != .address {
            // What zmq_connect would refuse (an endpoint that skipped PortKit's checks), and what
            // it would look up itself (a zone or interface suffix, a name in brackets).
            guard ZMQEndpoint.isHostLibzmqAccepts(host), HostResolver.kind(of: host) == .name else {
                monitor.cancel(monitoring: push)
                push.close()
                throw PKError(.badName, "cannot connect to \(endpoint): its host is neither an address nor a host name")
            }
            name = (host, port)
        }
        if name == nil {
            // From here the monitor runs: a failure stops it before its reader goes (see
            // `ZMQMonitor.init`), or closing `push` would hang libzmq's reaper thread.
            do throws(PKError) { try push.connect(endpoint.description) } catch {
                monitor.cancel(monitoring: push)
                push.close()
                throw error
            }
        }
        sending = ZMQMutex(Sending(socket: push))
        // The flusher's thread is made now, if it is not yet, not later under the lock.
        _ = PKRunLoop.hasFlusher
        start(monitor, generation: 0)
        if let name { connectWhenKnown(host: name.host, port: name.port) }
    }

    /// A PUSH socket toward `endpoint`, and its monitor (not started: see `ZMQMonitor.init`).
    private static func monitoredSocket(toward endpoint: ZMQEndpoint, limits: PKPortLimits) throws(PKError) -> (ZMQSocket, ZMQMonitor) {
        let push = try ZMQSocket.sending(limits: limits)
        try push.setHeartbeats(toward: endpoint, connecting: true)
        return (push, try ZMQMonitor(monitoring: push))
    }

    /// Hands `monitor`, of the connection's socket number `generation`, its handler.
    private func start(_ monitor: ZMQMonitor, generation: UInt32) {
        monitor.start { [weak self] event in
            guard let self, socketGeneration.load(ordering: .acquiring) == generation else { return }
            monitorReported(event)
        }
    }

    /// Connects to `host` (a name) at `port` once its address is known. While the name has
    /// none, it looks again every `HostResolver.keepFailed`, as long as the connection lives
    /// (as libzmq tries a refused connection again); sends wait for it until their deadlines.
    /// A connection whose handshake has not succeeded `HostResolver.keepFound` after it
    /// connected looks the name up again, and follows it to a new address (as libzmq, which
    /// looked the name up at every try, did) if nothing has gone to the old one.
    private func connectWhenKnown(host: String, port: String) {
        HostResolver.whenKnown(host) { [weak self] address in
            guard let self else { return }
            // The first connect where the answer is (a lookup thread, or this one inside
            // `init`): a send waiting for it must not wait for the background loop, which code
            // may keep busy. A follow on the background loop, where the monitor's reports run:
            // a report of the old socket's handshake cannot pass its generation check before
            // the swap and mark the new socket established after it. (Only a connect schedules
            // a follow, so the first connect is never a follow's rival.)
            if sending.withLock({ $0.connectedTo == nil }) {
                connect(host: host, port: port, address: address)
            } else {
                PKRunLoop.background.perform { [weak self] in self?.connect(host: host, port: port, address: address) }
            }
        }
    }

    /// `connectWhenKnown`'s work once the name's address (or its absence) is known.
    private func connect(host: String, port: String, address: String?) {
        guard deadReason == nil else { return }
        guard let address else {
            later(HostResolver.keepFailed) { $0.connectWhenKnown(host: host, port: port) }
            return
        }
        let refused = sending.withLock { sending -> PKError? in
            let target = "tcp://\(address):\(port)"
            guard var socket = sending.socket, target != sending.connectedTo else { return nil }
            if sending.connectedTo != nil {
                // The handshake may have succeeded since the timer looked, and the monitor
                // reports it late: keep the connection if a frame went in since it
                // connected (its pipe would drop it). If none did, nothing of ours is in
                // the old socket (the lock is held): it is closed, and a new one connects.
                // A new socket, not `zmq_disconnect`: libzmq's I/O thread may complete the
                // old handshake at any moment, and the socket would then take the pipe, and
                // the next frames, from the old address; the old socket's monitor events
                // (its handshake, its end) are ignored.
                guard !isEstablished, !sending.sentSinceConnect else { return nil }
                guard let (fresh, monitor) = try? Self.monitoredSocket(toward: endpoint, limits: limits) else {
                    return nil  // no socket now (descriptors?): the timer looks again
                }
                let generation = socketGeneration.add(1, ordering: .acquiringAndReleasing).newValue
                try? socket.setOption(ZMQOption.linger, 0)
                socket.close()
                socket = fresh
                sending.socket = fresh
                start(monitor, generation: generation)
            }
            do throws(PKError) { try socket.connect(target) } catch { return error }
            sending.connectedTo = target
            sending.sentSinceConnect = false
            // zmq_connect reads libzmq's commands: the news a waiting send's ZMQ_FD would
            // have woken it for.
            if sending.roomWaiters > 0 { roomChanged.signal() }
            return nil
        }
        if let refused {
            // Not here: this may run inside `init`, under the connection cache's lock, which
            // `die` takes.
            later(.zero) { $0.die("cannot connect to \($0.endpoint) at \(address): \(refused.message)") }
            return
        }
        later(HostResolver.keepFound) { connection in
            if !connection.isEstablished { connection.connectWhenKnown(host: host, port: port) }
        }
    }

    /// Runs `body` with this connection after `delay`, on the background loop, if it still
    /// lives then (the timer holds it weakly).
    private func later(_ delay: Duration, _ body: @escaping @Sendable (ZMQConnection) -> Void) {
        PKRunLoop.background.perform { [weak self] in
            guard self != nil else { return }
            PKRunLoop.current.scheduleTimer(after: delay, forMode: .common) { [weak self] _ in
                guard let self, deadReason == nil else { return }
                body(self)
            }
        }
    }

    /// Why the connection died, or nil while it lives. Safe from any thread.
    var deadReason: String? {
        guard isDead.load(ordering: .acquiring) else { return nil }
        return state.withLock { $0.deadReason }
    }

    /// Whether the ZMTP handshake with the peer has succeeded.
    var isEstablished: Bool { handshaken.load(ordering: .acquiring) }

    /// The address a connection to a host name has connected to (`tcp://ADDRESS:PORT`), if any.
    var connectedAddress: String? { sending.withLock { $0.connectedTo } }

    /// Tests: the endpoints (as written) whose connections ignore the monitor's report of a
    /// successful handshake, as if it came late.
    static let handshakeReportsHeldForTests = ZMQMutex<Set<String>>([])

    // MARK: - Sending

    /// Sends one message of `byteCount` bytes, which `write` writes (more than once, if a try
    /// that found no room is followed by one that puts it in a batch), sent whole or not at all,
    /// after every message sent before it on this connection. A message that joins a batch
    /// (protocol.md 10.2) is accepted at once: the batch goes when it is full (this send waits
    /// for room for it, until `deadline`) or with the flusher. Any other waits for room, or for
    /// the connection, until `deadline`. A wait for room does not hold the lock: other threads'
    /// sends go on meanwhile, each to its own deadline.
    ///
    /// - Throws: `.invalidPort` (the connection is or became dead, or closed at exit),
    ///   `.sendTimedOut`, `.transport`.
    func send(byteCount: Int, before deadline: PKDeadline, _ write: (UnsafeMutableRawBufferPointer) -> Void) throws(PKError) {
        guard byteCount <= ZMQBatch.messageLimit else {
            // Too large for a batch: its frame is made before the lock, and goes after the open
            // batch.
            var frame = try ZMQOutgoingFrame(byteCount: byteCount, write)
            _ = try whenThereIsRoom(before: deadline) { sending throws(PKError) -> Bool? in
                try checkOpen(sending)
                guard try sendBatch(&sending) else { return nil }
                let start = PKDeadline.now.uptimeNanoseconds
                guard try send(&frame, on: &sending) else { return nil }
                sending.windowStart = start
                return false
            }
            return
        }
        // A message that goes alone: made on its first try, kept for the next.
        var alone: ZMQOutgoingFrame?
        let flushNeeded = try whenThereIsRoom(before: deadline) { sending throws(PKError) -> Bool? in
            try checkOpen(sending)
            if sending.batch.count == 0 {
                // The clock is read only when no batch is open: while one is, a message joins it.
                let now = PKDeadline.now.uptimeNanoseconds
                let opensBatch = now &- sending.windowStart < sending.window
                    && handshaken.load(ordering: .acquiring) && PKRunLoop.hasFlusher
                guard opensBatch else {
                    if alone == nil { alone = try ZMQOutgoingFrame(byteCount: byteCount, write) }
                    guard try send(&alone!, on: &sending) else { return nil }
                    sending.windowStart = now
                    return false
                }
                sending.windowStart = now
            } else if sending.batch.count + byteCount > ZMQBatch.capacity {
                guard try sendBatch(&sending) else { return nil }
            }
            // Written outside the batch's own code, so that the caller's closure does not meet
            // the lock's value (it writes raw memory the batch lends for the call).
            nonisolated(unsafe) let area = sending.batch.reserve(byteCount: byteCount)
            write(area)
            guard !sending.flushQueued, !sending.flusherPaused else { return false }
            sending.flushQueued = true
            return true
        }
        if flushNeeded { queueFlush() }
    }

    /// What a try under the lock came to.
    private enum Try {
        /// Done; `flushNeeded`: the flusher must be asked to send the batch.
        case done(flushNeeded: Bool)
        /// The receiver's queue has no room: wait for `descriptor` (`ZMQ_FD`) to change.
        case waitForRoom(descriptor: Int32)
    }

    /// Runs `attempt` under the lock until it is done (non-nil: whether the flusher must be
    /// asked), waiting between tries, without the lock, until `deadline` for the room it found
    /// none of (`nil`: it tried to send, and `ZMQ_EVENTS`, read since, showed no room).
    /// Inlined, with `attempt`: every send comes here, and almost every one is done at once.
    @inline(__always)
    private func whenThereIsRoom(
        before deadline: PKDeadline, _ attempt: (inout Sending) throws(PKError) -> Bool?
    ) throws(PKError) -> Bool {
        var waited = false
        while true {
            let next = try sending.withLock { sending throws(PKError) -> Try in
                if waited {
                    sending.roomWaiters -= 1
                    roomChanged.drain()
                }
                // The news of room this waiter drained is passed on unless its try found none
                // (it may end without a send: by joining the batch, or by an error).
                let outcome: Bool?
                do throws(PKError) { outcome = try attempt(&sending) } catch {
                    if waited && sending.roomWaiters > 0 { roomChanged.signal() }
                    throw error
                }
                if let flushNeeded = outcome {
                    if waited && sending.roomWaiters > 0 { roomChanged.signal() }
                    return .done(flushNeeded: flushNeeded)
                }
                guard let socket = sending.socket else {
                    throw PKError(.invalidPort, "cannot send to \(endpoint): the connection is closed")
                }
                if deadline.hasPassed {
                    let why = isEstablished
                        ? "the receiver's queue stayed full until the send deadline"
                        : "no connection to \(endpoint) was made before the send deadline"
                    throw PKError(.sendTimedOut, "\(why); nothing was sent")
                }
                sending.roomWaiters += 1
                return .waitForRoom(descriptor: socket.pollDescriptor)
            }
            switch next {
            case .done(let flushNeeded):
                return flushNeeded
            case .waitForRoom(let descriptor):
                waited = true
                _ = Descriptors.waitReadable([descriptor, interrupt.descriptor, roomChanged.descriptor], until: deadline)
            }
        }
    }

    /// Throws if the connection is dead or was closed at the process's exit.
    private func checkOpen(_ sending: borrowing Sending) throws(PKError) {
        if let reason = deadReason { throw PKError(.invalidPort, "cannot send to \(endpoint): \(reason)") }
        if sending.socket == nil { throw PKError(.invalidPort, "cannot send to \(endpoint): the connection is closed") }
    }

    /// Sends the open batch as one frame if the receiver's queue has room for it now. Returns
    /// false if it has none: the batch stays, and still takes messages.
    private func sendBatch(_ sending: inout Sending) throws(PKError) -> Bool {
        guard sending.batch.count > 0 else { return true }
        var frame = try sending.batch.frame()
        guard try send(&frame, on: &sending) else { return false }
        sending.batch.clear()
        sending.retries = 0
        return true
    }

    /// Sends one frame if the receiver's queue has room for it now. Returns false if it has
    /// none, with `ZMQ_EVENTS` read (the edge rule: `ZMQ_FD` then wakes a waiter when that may
    /// change).
    private func send(_ frame: inout ZMQOutgoingFrame, on sending: inout Sending) throws(PKError) -> Bool {
        while true {
            if let reason = deadReason { throw PKError(.invalidPort, "cannot send to \(endpoint): \(reason)") }
            // Used in place (`sending.socket?.`), not bound to a constant: a binding would retain it.
            guard let sent = try sending.socket?.send(&frame) else {
                throw PKError(.invalidPort, "cannot send to \(endpoint): the connection is closed")
            }
            if sent {
                sending.sentSinceConnect = true
                if sending.roomWaiters > 0 { roomChanged.signal() }
                return true
            }
            guard let socket = sending.socket else { continue }  // not nil: it has just been used, under the lock
            // Read ZMQ_EVENTS (which rearms ZMQ_FD) and try again while it shows room.
            if socket.events.canSend { continue }
            return false
        }
    }

    /// Has the flusher send the batch once the sender lets it run (or at once, on a CPU of its
    /// own).
    private func queueFlush() {
        guard let flusher = PKRunLoop.flusher else { return }
        flusher.perform { [self] in flushQueuedBatch() }
    }

    /// On the flusher's thread: sends the batch if the socket has room now; if not, tries again
    /// later (`Sending.nextRetry`: the receiver is behind, and the batch waits for it as a full
    /// socket's messages do). It never waits for the lock, which a stream's sender takes again
    /// and again (the flusher serves every connection); it tries again after `lockRetry`,
    /// twice as long each time the lock is taken, up to 4 ms (a batch's last messages wait
    /// that long at most).
    /// A batch of a connection that died is dropped with it.
    private func flushQueuedBatch(lockRetry: Duration = .milliseconds(1)) {
        enum Outcome { case done, again(Duration), locked, lost(messages: Int, PKError) }
        let outcome = sending.withLockIfAvailable { sending -> Outcome in
            sending.flushQueued = false
            guard sending.batch.count > 0, !sending.flusherPaused, sending.socket != nil, deadReason == nil else { return .done }
            do throws(PKError) {
                if try sendBatch(&sending) { return .done }
                sending.flushQueued = true
                return .again(sending.nextRetry())
            } catch {
                let messages = sending.batch.messageCount
                sending.batch.clear()
                // The connection died meanwhile: its queued messages go with it, unreported.
                return error.code == .invalidPort ? .done : .lost(messages: messages, error)
            }
        } ?? .locked
        switch outcome {
        case .done:
            break
        case .again(let delay):
            PKRunLoop.current.scheduleTimer(after: delay, forMode: .common) { [self] _ in flushQueuedBatch() }
        case .locked:
            let next = min(lockRetry * 2, .milliseconds(4))
            PKRunLoop.current.scheduleTimer(after: lockRetry, forMode: .common) { [self] _ in flushQueuedBatch(lockRetry: next) }
        case .lost(let messages, let error):
            connectionLogger.error("a batch of \(messages) messages to \(endpoint) was lost: \(error)")
        }
    }

    /// Makes messages sent less than `nanoseconds` apart join a batch (tests: a window wide
    /// enough that a slow machine or a sanitizer still batches).
    func setBatchWindow(_ nanoseconds: UInt64) {
        sending.withLock { $0.window = nanoseconds }
    }

    /// Tests: how many sends wait for room.
    var sendsWaitingForRoom: Int { sending.withLock { $0.roomWaiters } }

    /// Tests: the flusher leaves this connection's batches alone until `resumeFlusher`; only a
    /// batch that a message would overfill goes out (sent by that message's sender).
    func pauseFlusher() {
        sending.withLock { $0.flusherPaused = true }
    }

    /// Tests: the flusher sends the open batch, and the ones after it, as usual.
    func resumeFlusher() {
        let flushNeeded = sending.withLock { sending -> Bool in
            sending.flusherPaused = false
            guard sending.batch.count > 0, !sending.flushQueued else { return false }
            sending.flushQueued = true
            return true
        }
        if flushNeeded { queueFlush() }
    }

    /// At the process's exit: sends the batch and closes the socket, which lingers until libzmq
    /// has written what it holds (`isReleased`); a send after this fails with `.invalidPort`.
    /// The lock and the room for the batch are waited for `ZMQBatch.exitPatience` at most,
    /// together; past it, a batch with no room is lost, and a connection whose lock stayed
    /// taken (a sender that keeps it busy) is left as it is: the exit must not wait for it.
    /// Returns whether there is anything to wait for.
    fileprivate func closeBeforeExit() -> Bool {
        enum Outcome { case nothing, closed, closedLosing(messages: Int, PKError), waitForRoom(descriptor: Int32) }
        let deadline = PKDeadline.after(ZMQBatch.exitPatience)
        var waited = false
        while true {
            let outcome = sending.withLockIfAvailable { sending -> Outcome in
                // Counted among the sends that wait for room while it waits (see `roomChanged`).
                if waited {
                    sending.roomWaiters -= 1
                    roomChanged.drain()
                    waited = false
                }
                guard deadReason == nil, let socket = sending.socket else { return .nothing }
                var outcome = Outcome.closed
                do throws(PKError) {
                    if try !sendBatch(&sending) {
                        guard deadline.hasPassed else {
                            sending.roomWaiters += 1
                            waited = true
                            return .waitForRoom(descriptor: socket.pollDescriptor)
                        }
                        outcome = .closedLosing(messages: sending.batch.messageCount,
                                                PKError(.sendTimedOut, "the receiver's queue stayed full"))
                    }
                } catch {
                    outcome = .closedLosing(messages: sending.batch.messageCount, error)
                }
                sending.batch.clear()
                sending.socket?.close()
                sending.socket = nil
                // A send waiting for room learns that the socket is gone (for good: `interrupt`
                // stays signalled).
                if sending.roomWaiters > 0 { interrupt.signal() }
                return outcome
            }
            switch outcome {
            case .nothing?: return false
            case .closed?: return true
            case .closedLosing(let messages, let error)?:
                connectionLogger.error("at exit, a batch of \(messages) messages to \(endpoint) was lost: \(error)")
                return true
            case .waitForRoom(let descriptor)?:
                _ = Descriptors.waitReadable([descriptor, interrupt.descriptor, roomChanged.descriptor], until: deadline)
            case nil:
                if deadline.hasPassed {
                    connectionLogger.warning("at exit, the connection to \(endpoint) was left as it is: another thread was sending on it")
                    return false
                }
                _ = Descriptors.waitReadable([], until: .after(.milliseconds(1)))  // a pause: poll(2) with nothing to watch
            }
        }
    }

    /// Whether libzmq has let go of the closed socket: it wrote the messages it held, or its
    /// linger passed.
    fileprivate var isReleased: Bool { socketReleased.load(ordering: .acquiring) }

    // MARK: - Death

    /// Runs `handler` (on the background loop's thread, or at once on this one if the
    /// connection is already dead) when the connection dies. Returns a token for
    /// `removeDeathHandler`, or nil if it was already dead.
    @discardableResult
    func onDeath(_ handler: @escaping @Sendable (String) -> Void) -> Int? {
        let (token, reason) = state.withLock { state -> (Int?, String?) in
            if let reason = state.deadReason { return (nil, reason) }
            state.nextToken += 1
            state.deathHandlers[state.nextToken] = handler
            return (state.nextToken, nil)
        }
        if let reason { handler(reason) }
        return token
    }

    /// Runs `handler` once: with true when the ZMTP handshake succeeds (at once if it has),
    /// with false if the connection dies first. It runs on the background loop's thread, or on
    /// this one.
    func onEstablished(_ handler: @escaping @Sendable (Bool) -> Void) {
        let now = state.withLock { state -> Bool? in
            if handshaken.load(ordering: .acquiring) { return true }
            if state.deadReason != nil { return false }
            state.establishedHandlers.append(handler)
            return nil
        }
        if let now { handler(now) }
    }

    func removeDeathHandler(_ token: Int?) {
        guard let token else { return }
        _ = state.withLock { $0.deathHandlers.removeValue(forKey: token) }
    }

    /// Kills the connection: wakes a waiting sender, closes the socket, runs the death handlers.
    func die(_ reason: String) {
        let (handlers, waiting) = state.withLock { state -> ([@Sendable (String) -> Void], [@Sendable (Bool) -> Void]) in
            guard state.deadReason == nil else { return ([], []) }
            state.deadReason = reason
            isDead.store(true, ordering: .releasing)
            defer {
                state.deathHandlers = [:]
                state.establishedHandlers = []
            }
            return (Array(state.deathHandlers.values), state.establishedHandlers)
        }
        interrupt.signal()
        sending.withLock { sending in
            try? sending.socket?.setOption(ZMQOption.linger, 0)
            sending.socket?.close()
            sending.socket = nil
            sending.batch.clear()
        }
        ZMQConnectionCache.shared.forget(self)
        for handler in waiting { handler(false) }
        for handler in handlers { handler(reason) }
    }

    private func monitorReported(_ event: Int32) {
        switch event {
        case ZMQMonitorEvent.handshakeSucceeded:
            if Self.handshakeReportsHeldForTests.withLock({ $0.contains(endpoint.description) }) { return }
            let waiting = state.withLock { state -> [@Sendable (Bool) -> Void] in
                handshaken.store(true, ordering: .releasing)
                defer { state.establishedHandlers = [] }
                return state.establishedHandlers
            }
            for handler in waiting { handler(true) }
        case ZMQMonitorEvent.monitorStopped:
            socketReleased.store(true, ordering: .releasing)
        case ZMQMonitorEvent.disconnected:
            if isEstablished { die("the port at \(endpoint) is gone (its connection closed, or its heartbeat stopped)") }
        case let refused where refused & ZMQMonitorEvent.handshakeRefused != 0:
            // Only a refusal (not a timeout, nor a connection lost during the handshake, which
            // libzmq retries by reconnecting): a connection that never succeeded keeps trying.
            die("the ZeroMQ handshake with \(endpoint) failed: it is not a PortKit ZeroMQ port")
        default:
            break
        }
    }
}

/// The process's connections, one per endpoint. A connection lives while a send right uses it
/// and, after that, among the 16 most recently used; a dead one is forgotten at once, so the
/// next right to that endpoint connects afresh.
final class ZMQConnectionCache: Sendable {
    static let shared = ZMQConnectionCache()
    static let recentCapacity = 16

    private struct Weak { weak var connection: ZMQConnection? }
    private struct State {
        var byEndpoint: [ZMQEndpoint: Weak] = [:]
        var recent: [ZMQConnection] = []
    }
    private let state = ZMQMutex<State>(State())

    private init() {
        ProcessExit.register { ZMQConnectionCache.shared.closeBeforeExit() }
    }

    /// At the process's exit, what its connections hold goes out: each sends its batch and
    /// closes its socket, and the exit waits (up to the sockets' linger and a little more) until
    /// libzmq has written every message it held. libzmq's context is never terminated, so
    /// without this the messages still queued in it when the process ends are lost. The wait
    /// needs the background loop, which reads the sockets' monitors: an exit from its thread
    /// does not wait.
    private func closeBeforeExit() {
        let live = state.withLock { state in state.byEndpoint.values.compactMap(\.connection) }
        let closing = live.filter { $0.closeBeforeExit() }
        guard !closing.isEmpty, !PKRunLoop.background.isOwnedByCurrentThread else { return }
        let deadline = PKDeadline.after(.milliseconds(Int64(ZMQSocket.closingLinger) + 500))
        while !closing.allSatisfy(\.isReleased) && !deadline.hasPassed {
            _ = Descriptors.waitReadable([], until: .after(.milliseconds(1)))  // a pause: poll(2) with nothing to watch
        }
    }

    /// The live connection to `endpoint`, made if there is none.
    func connection(to endpoint: ZMQEndpoint) throws(PKError) -> ZMQConnection {
        try state.withLock { state throws(PKError) -> ZMQConnection in
            let connection: ZMQConnection
            if let existing = state.byEndpoint[endpoint]?.connection, existing.deadReason == nil {
                connection = existing
            } else {
                connection = try ZMQConnection(endpoint: endpoint)
                state.byEndpoint[endpoint] = Weak(connection: connection)
            }
            state.recent.removeAll { $0 === connection }
            state.recent.append(connection)
            if state.recent.count > Self.recentCapacity { state.recent.removeFirst() }
            return connection
        }
    }

    func forget(_ connection: ZMQConnection) {
        state.withLock { state in
            if state.byEndpoint[connection.endpoint]?.connection === connection {
                state.byEndpoint[connection.endpoint] = nil
            }
            state.recent.removeAll { $0 === connection }
            state.byEndpoint = state.byEndpoint.filter { $0.value.connection != nil }
        }
    }
}

/// The batch a connection fills (protocol.md 10.2): messages one after another in memory of its
/// own, each but the last flagged FOLLOWED. Under the connection's sending lock.
struct ZMQBatch: ~Copyable {
    /// The largest batch, in bytes: one frame.
    static let capacity = ZMQWireFormat.largestBatch
    /// The largest message, encoded (header and components), that joins a batch; a larger one
    /// goes alone, after the open batch. One data component of up to 2,019 bytes.
    static let messageLimit = 2 * 1024
    /// A message this soon after the last one that went alone (or after the open batch
    /// opened) opens a batch (nanoseconds). A stream's sends come well under a microsecond
    /// apart, a round trip's far more than this.
    static let defaultWindow: UInt64 = 2_000
    /// How long the exit waits for a connection's lock and then room for its batch, together.
    static let exitPatience = Duration.milliseconds(200)

    private var area: UnsafeMutableRawBufferPointer?
    /// The bytes in the batch.
    private(set) var count = 0
    /// The messages in the batch.
    private(set) var messageCount = 0
    /// Where the last message's header starts.
    private var lastHeader = 0

    init() {}

    deinit { area?.deallocate() }

    /// Adds room for a message of `byteCount` bytes (at most `capacity - count`), for the
    /// caller to write at once: the message's own bytes, flagged FOLLOWED later if another
    /// joins.
    mutating func reserve(byteCount: Int) -> UnsafeMutableRawBufferPointer {
        let area = self.area ?? UnsafeMutableRawBufferPointer.allocate(byteCount: Self.capacity, alignment: 8)
        self.area = area
        if count > 0 { ZMQMessageEncoder.markFollowed(in: area, headerAt: lastHeader) }
        lastHeader = count
        count += byteCount
        messageCount += 1
        return UnsafeMutableRawBufferPointer(rebasing: area[lastHeader..<count])
    }

    /// Empties the batch (its memory stays, for the next).
    mutating func clear() {
        count = 0
        messageCount = 0
    }

    /// The batch's bytes in a frame to send.
    func frame() throws(PKError) -> ZMQOutgoingFrame {
        let bytes = UnsafeRawBufferPointer(rebasing: area![0..<count])
        return try ZMQOutgoingFrame(byteCount: count) { frame in frame.copyMemory(from: bytes) }
    }
}
#endif
