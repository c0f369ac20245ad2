#if ZeroMQ
// The receiving side: a PULL socket bound to one or more endpoints and read on one run loop.
//
// libzmq's ZMQ_FD is not the socket's data: it is a signal that the socket's state may have
// changed, and processing the socket's commands (reading ZMQ_EVENTS, or a receive that finds
// nothing) consumes it. So it behaves as an edge: after every wake (and after anything else that
// may have processed the socket's commands, such as a send on the same socket) the reader must
// receive until a receive finds nothing, or a message that arrived meanwhile would wait for the
// next, unrelated edge. The inbox does exactly that, `budget`
// messages at a time; when messages remain after a budget it signals its own custom source, so
// the loop comes back on its next pass (other sources get their turn; the loop never sleeps
// on a readable socket, and never spins on an empty one).
//
// Closing is synchronous: libzmq closes listeners on its own I/O thread, after zmq_close has
// returned, so an endpoint would stay taken for a moment after its port was invalidated. The
// inbox unbinds each endpoint and waits (at most a second) for its monitor to report the
// listener closed before it closes the socket: once a port is invalid, its endpoint is free.
//
// Thread rules: binding may come from any thread; receiving, scheduling and closing are
// loop-only once scheduled. The socket sits under a lock so that a bind from another thread
// (the reply service binds endpoints lazily) never races a receive.

import PortKit
import Synchronization

private let inboxCounter = Atomic<UInt64>(0)

final class ZMQInbox: @unchecked Sendable {
    /// Messages handled per wake before the loop gets to run other sources.
    static let budget = 64

    let limits: ZMQWireLimits
    private let io: LockedIO
    /// ZMQ_FD: readable when the socket has commands to process.
    let descriptor: Int32
    /// The frame being read: a batch's messages are taken one at a time, across wake-ups.
    /// Received into under `io`'s lock (the socket's), read without it. Loop-only, as `drain`.
    @exclusivity(unchecked) private var heldFrame: ZMQHeldFrame
    /// Reads `heldFrame`'s messages, and skips the rest of a dropped multipart message.
    /// Loop-only, as `heldFrame`.
    @exclusivity(unchecked) private var decoder: ZMQDecoder<PKZMQComponent>

    private struct IO {
        var socket: ZMQSocket?
        /// Reads the socket's ZMQ_EVENT_CLOSED events, to close synchronously.
        var closedEvents: ZMQSocket?
        /// Frames received so far (the tests tell batches from single messages by it).
        var framesReceived = 0
        var claims: [SocketFileClaim] = []
        /// The endpoints bound, as libzmq resolved them.
        var bound: [String] = []
        /// The same, as they were asked for (`tcp://localhost:5555` resolves to 127.0.0.1).
        var requested: [String] = []
        /// Set while the inbox is scheduled: makes the loop drain on its next pass.
        var wake: (@Sendable () -> Void)?

        /// Drops the events waiting for `close`. A bind that fails (`EADDRINUSE`) has made a
        /// listener and closed it, and its ZMQ_EVENT_CLOSED is queued by the time `zmq_bind`
        /// returns: left there, it would end `close`'s wait for a listener that is still open.
        func discardClosedEvents() {
            while (try? closedEvents?.receiveFrame { _, _ in }) == true {}
        }

        /// Unbinds every endpoint and waits until its listener is closed, then closes the
        /// socket and releases the claims; idempotent.
        mutating func close() {
            if let socket, let closedEvents {
                var waiting = bound.filter { socket.unbind($0) }.count
                let deadline = PKDeadline.after(.seconds(1))
                while waiting > 0 && !deadline.hasPassed {
                    guard closedEvents.waitReadable(timeoutMilliseconds: 10) else { continue }
                    var event: Int32?
                    var more = true
                    while more {
                        let got = (try? closedEvents.receiveFrame { bytes, hasMore in
                            more = hasMore
                            if event == nil && bytes.count >= 2 {
                                event = Int32(bytes.loadUnaligned(fromByteOffset: 0, as: UInt16.self))
                            }
                        }) ?? false
                        if !got { break }
                    }
                    if event == ZMQMonitorEvent.closed { waiting -= 1 }
                }
            }
            // Stop the monitor before closing its reader: libzmq sends monitor events with a
            // blocking send, so an event for a reader that is gone would block its I/O thread.
            try? socket?.monitor(nil, events: 0)
            socket?.close()
            socket = nil
            closedEvents?.close()
            closedEvents = nil
            for claim in claims { claim.release() }
            claims = []
            ReleasedAddresses.note(bound + requested)
            bound = []
            requested = []
            wake = nil
        }
    }

    /// The socket and its claims, under one lock, and the storage `heldFrame` receives into.
    private final class LockedIO: Sendable {
        let mutex: ZMQMutex<IO>
        /// The storage of the inbox's `heldFrame` (which releases its frame when the inbox
        /// closes), freed with the inbox.
        let frameStorage: ZMQFrameStorage
        init(_ io: consuming sending IO, frameStorage: ZMQFrameStorage) {
            mutex = ZMQMutex(io)
            self.frameStorage = frameStorage
        }
        deinit { frameStorage.deallocate() }
    }

    // Loop-only state.
    private var fdSource: PKDescriptorSource?
    private var again: PKCustomSource?
    private weak var loop: PKRunLoop?
    /// Called on the loop once a wake-up with the messages that arrived: it must take them from
    /// `next` until `next` says nil (one that stopped early would leave input that makes the
    /// loop pass again and again). One call a wake-up, not a message: the receiver retains
    /// itself and loads its handler once for a whole batch.
    var onMessages: (_ next: () -> ZMQDecoded<PKZMQComponent>?) -> Void = ZMQInbox.dropAll
    /// The bytes of a message its receiver has delivered (`recycle(_:)`), for the next
    /// message's bytes: no allocation while they fit. Loop-only: taken while `drain` receives,
    /// given back by the receiver it calls.
    @exclusivity(unchecked) private var spare: [UInt8] = []
    /// Called on the loop with the reason of each dropped message.
    var onViolation: (String) -> Void = { _ in }
    /// Called on the loop if the loop drops the inbox's sources (its thread ended).
    var onCancel: () -> Void = {}

    init(limits: PKPortLimits) throws(PKError) {
        let socket = try ZMQSocket.receiving(limits: limits)
        let address = "inproc://portkit-zmq-closed-\(inboxCounter.add(1, ordering: .relaxed).newValue)"
        try socket.monitor(address, events: ZMQMonitorEvent.closed)
        let closedEvents = try ZMQSocket(.pair)
        try closedEvents.connect(address)
        self.limits = ZMQWireLimits(limits)
        descriptor = socket.pollDescriptor
        decoder = ZMQDecoder(limits: ZMQWireLimits(limits))
        let storage = ZMQFrameStorage.allocate()
        heldFrame = ZMQHeldFrame(storage)
        io = LockedIO(IO(socket: socket, closedEvents: closedEvents), frameStorage: storage)
    }

    /// Binds `endpoint` (an `ipc://` path under its lock first) and returns the endpoint
    /// libzmq resolved (`tcp://H:*` gets its port). Safe from any thread.
    ///
    /// A bind processes the socket's pending commands, as a receive does: it consumes the
    /// ZMQ_FD signal of a message that arrived meanwhile. A bind that makes a listener signals
    /// the socket again (libzmq hands the listener to the socket with a command), one that fails
    /// does not; so a bind on a scheduled inbox, failed or not, makes its loop drain, or that
    /// message would wait for the next, unrelated edge.
    ///
    /// - Throws: `.nameInUse` if a live owner holds the endpoint; `.badName`; `.unsafeDirectory`;
    ///   `.invalidPort` if the inbox is closed; `.system`.
    func bind(_ endpoint: ZMQEndpoint) throws(PKError) -> String {
        // An address without a file (tcp, the abstract namespace) that this process's listener
        // has just closed can still be taken for a moment: a child process that another thread
        // is spawning holds a copy of every descriptor until it executes (close-on-exec or
        // not), and the kernel frees the address with the last copy. So a refused bind of such
        // an address is tried again for a short while before `.nameInUse` (a port invalidated
        // and bound again would otherwise fail now and then in a process that spawns workers);
        // any other refused bind (a live rival's address) fails at once.
        guard endpoint.socketFile == nil, ReleasedAddresses.wasRecent(endpoint.description) else {
            return try bindOnce(endpoint)
        }
        let deadline = PKDeadline.after(Self.addressReleasePatience)
        var pause = Duration.microseconds(500)
        while true {
            do throws(PKError) { return try bindOnce(endpoint) } catch {
                guard error.code == .nameInUse, !deadline.hasPassed else { throw error }
            }
            _ = Descriptors.waitReadable([], until: .after(pause))  // a pause: poll(2) with nothing to watch
            pause = min(pause * 2, .milliseconds(20))
        }
    }

    /// How long a bind waits for an address without a file to be released (see `bind`).
    static let addressReleasePatience = Duration.milliseconds(250)

    /// The addresses without a file that this process's ports stopped listening on lately
    /// (resolved and as asked for), with when: a bind of one of them waits a moment for the
    /// kernel to free it (see `bind`). Safe from any thread.
    private enum ReleasedAddresses {
        /// How long after its release an address counts as recent.
        static let recency: UInt64 = 1_000_000_000
        private static let released = PKMutex<[String: UInt64]>([:])

        static func note(_ endpoints: [String]) {
            guard !endpoints.isEmpty else { return }
            let now = PKDeadline.now.uptimeNanoseconds
            released.withLock { table in
                table = table.filter { now &- $0.value < recency }
                for endpoint in endpoints where !endpoint.hasPrefix("ipc:///") { table[endpoint] = now }
            }
        }

        static func wasRecent(_ endpoint: String) -> Bool {
            let now = PKDeadline.now.uptimeNanoseconds
            return released.withLock { table in table[endpoint].map { now &- $0 < recency } ?? false }
        }
    }

    /// Binds the socket to `endpoint`. An `ipc://` path is claimed first (`SocketFileClaim`,
    /// under `<path>.lock`, the name server's lock for a name in its directory): libzmq's bind
    /// unlinks whatever socket file is at the path, so a second binder would silently take a
    /// live owner's endpoint.
    private func bindOnce(_ endpoint: ZMQEndpoint) throws(PKError) -> String {
        let claim = try endpoint.socketFile.map { path throws(PKError) in
            try SocketFileClaim(socketPath: path, lockPath: path + ".lock", subject: "the endpoint ipc://\(path)")
        }
        var wake: (@Sendable () -> Void)?
        defer { wake?() }
        return try io.mutex.withLock { io throws(PKError) -> String in
            guard let socket = io.socket else {
                claim?.release()
                throw PKError(.invalidPort, "cannot bind \(endpoint): the port was invalidated")
            }
            wake = io.wake
            do throws(PKError) {
                try socket.setHeartbeats(toward: endpoint)
                try socket.bind(endpoint.description)
            } catch {
                claim?.release()
                io.discardClosedEvents()
                throw error
            }
            if let claim {
                claim.recordSocket()
                io.claims.append(claim)
            }
            let resolved = socket.lastEndpoint
            io.bound.append(resolved.isEmpty ? endpoint.description : resolved)
            io.requested.append(endpoint.description)
            return io.bound.last!
        }
    }

    var isOpen: Bool { io.mutex.withLock { $0.socket != nil } }

    /// The frames received so far, whole batches or single messages. Safe from any thread.
    var framesReceived: Int { io.mutex.withLock { $0.framesReceived } }

    // MARK: - Scheduling (loop-only)

    /// Adds the inbox's sources to `mode` of the calling thread's loop, and drains what already
    /// arrived.
    func schedule(on loop: PKRunLoop, forMode mode: PKRunLoopMode) throws(PKError) {
        precondition(loop.isOwnedByCurrentThread, "PortKitZeroMQ: a ZeroMQ port is scheduled from its loop's own thread")
        precondition(self.loop == nil || self.loop === loop, "PortKitZeroMQ: a ZeroMQ port belongs to one run loop")
        guard isOpen else { throw PKError(.invalidPort, "cannot schedule an invalidated port") }
        if fdSource == nil {
            fdSource = PKDescriptorSource(
                descriptor: descriptor, events: .readable,
                handler: { [unowned self] _ in self.drain() },
                cancel: { [unowned self] in self.sourcesCancelled() })
            again = PKCustomSource(perform: { [unowned self] in self.drain() })
        }
        self.loop = loop
        try loop.add(fdSource!, forMode: mode)
        loop.add(again!, forMode: mode)
        let again = again!
        io.mutex.withLock { io in
            io.wake = { [weak again, weak loop] in
                guard let again, let loop else { return }
                again.signal(waking: loop)
            }
        }
        // Messages may have arrived (and consumed the edge) before the socket was watched.
        again.signal(waking: loop)
    }

    /// Removes the inbox's sources from `mode`. Loop-only.
    func unschedule(from mode: PKRunLoopMode) {
        guard let loop, let fdSource, let again else { return }
        loop.remove(fdSource, forMode: mode)
        loop.remove(again, forMode: mode)
    }

    /// Stops watching and closes the socket, releasing `ipc://` claims; idempotent. On the
    /// loop's thread (or before the inbox was scheduled, or after its loop is gone) it happens
    /// now; from another thread it is queued on the loop, because epoll must stop watching
    /// ZMQ_FD before the socket that owns it closes: for the loop's next pass in whatever mode
    /// (the inbox may be in none, or in modes the loop never runs again), or its thread's end.
    func close() {
        let source = fdSource
        fdSource = nil
        let again = self.again
        self.again = nil
        onMessages = ZMQInbox.dropAll
        onViolation = { _ in }
        onCancel = {}
        // Deferred, it keeps the inbox until it runs: the sources' handlers reach it unowned.
        let finish: @Sendable () -> Void = { [self] in
            source?.invalidate()
            again?.invalidate()
            heldFrame.release()
            io.mutex.withLock { $0.close() }
        }
        if let loop, source != nil, !loop.isOwnedByCurrentThread {
            loop.performHousekeeping(finish)
        } else {
            finish()
        }
    }

    private func sourcesCancelled() {
        // The loop's thread ended (or the source was invalidated by `close`).
        guard fdSource != nil else { return }
        fdSource = nil
        let cancel = onCancel
        cancel()
    }

    // MARK: - The edge rule

    /// Receives until a receive finds nothing, `budget` messages at most; if input remains,
    /// signals the inbox's own source so the next pass continues. Loop-only.
    func drain() {
        var left = Self.budget
        var inputMayRemain = true
        onMessages {
            while left > 0 {
                left -= 1
                switch receiveOne() {
                case .none:
                    inputMayRemain = false
                    return nil
                case .message(let message): return message
                case .violation(let reason): onViolation(reason)
                case .skipped: break
                }
            }
            return nil
        }
        assert(left == 0 || !inputMayRemain, "PortKitZeroMQ bug: an inbox's receiver stopped before next() said nil")
        if inputMayRemain, isOpen, let loop { again?.signal(waking: loop) }
    }

    /// Takes back the bytes of a message the receiver has delivered, to receive the next one
    /// into (up to `SpareBytes.limit`). Loop-only, while `onMessages` runs.
    func recycle(_ bytes: inout [UInt8]) {
        SpareBytes.keep(&bytes, in: &spare)
    }

    /// What an inbox without a receiver does with a wake-up's messages: drops them.
    static func dropAll(_ next: () -> ZMQDecoded<PKZMQComponent>?) {
        while next() != nil {}
    }

    private enum Received {
        case none, message(ZMQDecoded<PKZMQComponent>), violation(String), skipped
    }

    /// Takes the next message: the next of the batch being read, or the first of the next
    /// frame (a peer's multipart message is read to its end, libzmq delivers all its frames at
    /// once, and dropped); `.none` when the socket has none. A non-blocking receive that finds
    /// nothing has processed the socket's pending commands, so it consumes ZMQ_FD's signal as
    /// reading ZMQ_EVENTS would: no need to read ZMQ_EVENTS per message (a system call each).
    private func receiveOne() -> Received {
        // The next message of a batch: no lock, no socket.
        if heldFrame.isHeld { return readHeldFrame() }
        return io.mutex.withLock { io -> Received in
            // The socket is used in place (`io.socket?.`), not bound to a constant: a binding
            // would retain and release it for every frame.
            var outcome = Received.none
            while true {
                let got: Bool?
                do throws(PKError) { got = try io.socket?.receive(into: &heldFrame) } catch {
                    return .violation("receiving failed: \(error)")
                }
                guard got == true else { return outcome }
                io.framesReceived += 1
                let more = heldFrame.more
                guard let verdict = decoder.begin(frameWithMore: more) else { return readHeldFrame() }
                heldFrame.release()
                if case .violation(let reason) = verdict { outcome = .violation(reason) }
                if case .none = outcome { outcome = .skipped }
                if !more { return outcome }
            }
        }
    }

    /// The message at the held frame's offset; releases the frame after its last.
    private func readHeldFrame() -> Received {
        let bytes = heldFrame.bytes
        let output = decoder.next(in: bytes, at: &heldFrame.offset, reusing: &spare)
        if heldFrame.offset >= bytes.count { heldFrame.release() }
        switch output {
        case .message(let message): return .message(message)
        case .violation(let reason): return .violation(reason)
        case .needMore: return .skipped
        }
    }
}
#endif
