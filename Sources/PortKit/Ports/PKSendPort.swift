// A send right: a Sendable handle on a receive port (a connection to it, or the port itself
// within its process), usable from any thread.

import Logging
import Synchronization

/// A send right to a port (`NSPort` as a remote port, a remote `CFMessagePort`).
///
/// A cheap, `Sendable` value: copy it, store it, use it from any thread. Under it is one of:
///
/// - a connected socket of its own to the port's owner: a connection to a named socket (a
///   right looked up by name), or one end of a `socketpair` (a right received through a socket,
///   a right to another process's port received in an in-process message, a worker process's
///   inherited rights; protocol.md section 6);
/// - the port itself, for a right made by `PKReceivePort.makeSendRight()`: no socket; a message
///   is handed over in memory, into the port's mailbox;
/// - a right of its own to a port of this process, received in an in-process message: no
///   socket either; the mailbox too;
/// - the right to answer one request, on the reply channel of the connection the request came
///   in on (protocol.md section 6.1).
///
/// Messages sent through one send right arrive in order and never interleave with another
/// sender's, even when threads share it.
///
/// A send right becomes invalid when its receive port is invalidated, the port's owner (thread
/// or process) goes away, the connection breaks, or `invalidate()` is called on it. A right made
/// by `makeSendRight()` is the exception: it lives as long as the port, and `invalidate()` on it
/// does nothing. A right to answer a request is also void once it has answered, once it was
/// passed on in a message (even one that then failed to send), once the requester gave the
/// request up (as its loop learns it), or once the next request arrives on that connection
/// (protocol.md section 6.1). Sending to an invalid port throws `PKError` with `.invalidPort`;
/// it never raises SIGPIPE.
///
/// Two send rights are equal when they are copies of one value, or when both were made by
/// `makeSendRight()` on one port (they are that port). Two rights to one port got otherwise
/// (two look-ups, two received messages) are not equal.
public struct PKSendPort: Sendable, Hashable, CustomStringConvertible {
    /// What is under the right (see the type's documentation): a connection of its own, the
    /// port itself (a right made by `makeSendRight()`, sending into its mailbox), an in-process
    /// right of its own, or the right to answer one request.
    enum Storage: Sendable {
        case connection(SendConnection)
        case local(PKReceivePort)
        /// A right of its own to a port of this process, received in an in-process message.
        case localRight(LocalRight)
        /// The right to answer one request, on the reply channel of the connection it came in on.
        case reply(ReplyRight)
    }
    let storage: Storage

    init(connection: SendConnection) { self.storage = .connection(connection) }
    init(reply right: ReplyRight) { self.storage = .reply(right) }
    init(local port: PKReceivePort) { self.storage = .local(port) }
    init(localRight right: LocalRight) { self.storage = .localRight(right) }

    /// A descriptor to attach to a message so that its receiver gets a send right of its own.
    func makeTransferDescriptor(before deadline: PKDeadline) throws(PKError) -> Int32 {
        switch storage {
        case .connection(let connection): return try connection.makeTransferDescriptor(before: deadline)
        case .local(let port): return try port.makeTransferDescriptor()
        case .localRight(let right):
            guard !right.wasInvalidated else { throw PKError(.invalidPort, "cannot send a port: the send right was invalidated") }
            return try right.port.makeTransferDescriptor(epoch: right.epoch)
        case .reply(let right): return try right.makeTransferDescriptor(before: deadline)
        }
    }

    /// Sends `message`, waiting while the receiver's queue is full until `deadline`
    /// (`-[NSPortMessage sendBeforeDate:]`, `-[NSPort sendBeforeDate:msgid:components:from:reserved:]`).
    ///
    /// A message is accepted whole or not at all: if the deadline passes before any of it is
    /// in the socket, nothing is sent; once part of it is, the rest waits in the connection's
    /// pending bytes and goes out as the receiver reads (docs/decisions.md, "Send deadline").
    /// Through a right made in this process by `makeSendRight()`, the message is handed over in
    /// memory (its ports still become rights of the receiver's own: an in-process right for a
    /// port of this process, a new connection for any other); a sender on the port's own loop
    /// thread never waits for itself: when the queue is full there, the send fails at once.
    ///
    /// - Parameters:
    ///   - message: the message; its ports travel as send rights to the same ports.
    ///   - deadline: how long a full queue may hold the sender; `.now` never waits.
    /// - Throws: `PKError` with `.sendTimedOut`, `.invalidPort` (the port is or became invalid),
    ///   `.limitExceeded` (the message is over the limits, or the kernel refused its ports for
    ///   now: too many of this user's descriptors in flight), `.system` (the same for want of
    ///   memory, the right still valid), or `.transport`.
    public func send(_ message: consuming PKPortMessage, before deadline: PKDeadline) throws(PKError) {
        try send(consume message, replyBackToken: 0, before: deadline)
    }

    /// Sends `message`; with a non-zero `replyBackToken` (through a connection only), as request
    /// `replyBackToken` whose reply port is the connection's reply channel (REPLY_BACK).
    ///
    /// The message is consumed: in memory it moves into the receiver's mailbox, with no copy
    /// (a copy would retain its components and reply port, and release them again).
    func send(_ message: consuming PKPortMessage, replyBackToken: UInt16, before deadline: PKDeadline) throws(PKError) {
        try Self.send(message, through: storage, replyBackToken: replyBackToken, before: deadline)
    }

    /// `send(_:replyBackToken:before:)` with the right's storage borrowed: switching over the
    /// `storage` property itself copied the right it found (a retain and a release of it per
    /// message, about 25 ns of a 100 ns in-memory send here), a borrowed parameter does not.
    private static func send(
        _ message: consuming PKPortMessage, through storage: borrowing Storage, replyBackToken: UInt16,
        before deadline: PKDeadline
    ) throws(PKError) {
        // Each case only calls on: a case that bound a right for code after the switch would
        // copy it.
        switch storage {
        case .local(let port):
            // Within the process, the message is handed over in memory.
            try port.enqueueLocal(consume message, before: deadline)
        case .localRight(let right):
            try right.send(consume message, before: deadline)
        case .connection(let connection):
            try Self.write(message, to: connection, reply: nil, replyBackToken: replyBackToken, before: deadline)
        case .reply(let right):
            try Self.write(message, to: right.writer, reply: right, replyBackToken: replyBackToken, before: deadline)
        }
    }

    /// Encodes `message` and writes it on `connection`, or on the reply channel of `reply`.
    private static func write(
        _ message: borrowing PKPortMessage, to connection: SendConnection, reply replyRight: ReplyRight?,
        replyBackToken: UInt16, before deadline: PKDeadline
    ) throws(PKError) {
        // The usual message (its bytes alone, no reply port), a request that asks for its answer
        // on the connection (REPLY_BACK), or that answer, is encoded from its bytes where they
        // are: no frame to make. The tokens are never 0 (the reader's `nextToken()`, and a
        // request's, which the decoder checked), so the frame breaks no rule but the length's.
        assert(replyRight == nil || replyBackToken == 0, "PKSendPort: an answer makes no request of its own")
        if case .bytes(let bytes) = message.body, message.replyPort == nil {
            do throws(WireError) { try WireEncoder.check(dataByteCount: bytes.count, limits: PKPortLimits.default.wire) } catch {
                throw overLimits(error)
            }
            try bytes.withUnsafeBufferPointer { (payload) throws(PKError) in
                let payload = UnsafeRawBufferPointer(payload)
                if let replyRight {
                    try replyRight.send(WirePlainFrame(msgid: message.msgid, payload: payload, repliesBack: false,
                                                       replyToken: replyRight.ticket.token),
                                        descriptors: [], before: deadline)
                } else if replyBackToken != 0 {
                    try connection.write(WirePlainFrame(msgid: message.msgid, payload: payload, repliesBack: true,
                                                        replyToken: replyBackToken),
                                         descriptors: [], before: deadline)
                } else {
                    try connection.write(WirePlainFrame(msgid: message.msgid, payload: payload), descriptors: [], before: deadline)
                }
            }
            return
        }
        var transfers: [Int32] = []
        defer { for fd in transfers { Descriptor.close(fd) } }
        let frame = try checkedFrame(for: message, to: connection, reply: replyRight, replyBackToken: replyBackToken, making: &transfers, before: deadline)
        if let replyRight {
            try replyRight.send(frame, descriptors: transfers, before: deadline)
        } else {
            try connection.write(frame, descriptors: transfers, before: deadline)
        }
    }

    /// The frame of `message` for `connection` (or of the answer through `replyRight`), checked
    /// against the limits before anything is made (the receiver checks them again); then its
    /// descriptors, made and appended to `transfers` (the caller closes them).
    private static func checkedFrame(
        for message: borrowing PKPortMessage, to connection: SendConnection, reply replyRight: ReplyRight?,
        replyBackToken: UInt16, making transfers: inout [Int32], before deadline: PKDeadline
    ) throws(PKError) -> WireFrame {
        // One data component is held inline: the frame makes no array.
        let components: WireComponents
        switch message.body {
        case .bytes(let bytes): components = WireComponents(.data(bytes))
        case .components(let all): components = wireComponents(all)
        }
        let frame = WireFrame(msgid: message.msgid, hasReplyPort: message.replyPort != nil,
                              repliesBack: replyBackToken != 0,
                              replyToken: replyRight?.ticket.token ?? replyBackToken, components: components)
        do throws(WireError) {
            try WireEncoder.check(frame, limits: PKPortLimits.default.wire, direction: replyRight == nil ? .toPort : .toRequester)
        } catch {
            throw overLimits(error)
        }
        // The usual message carries no port, nor a reply port: no descriptor to make. One that
        // does is refused before its rights are made if it cannot go (a right to answer a
        // request, passed on, answers no more: `ReplyRight.makeTransferDescriptor`).
        if frame.descriptorCount > 0 {
            if !(replyRight.map { $0.isValid } ?? connection.isValid) {
                throw PKError(.invalidPort, replyRight == nil ? "cannot send: the receive port is gone, or the send right was invalidated"
                                                              : "cannot send: this reply right was already used or passed on, or its request has ended")
            }
            try makeTransferDescriptors(for: message, into: &transfers, before: deadline)
        }
        return frame
    }

    /// Writes `message` on `connection` (or answers through `replyRight`) if the socket takes it
    /// now, and returns nil; or else returns it prepared (its frame checked, its descriptors made
    /// once), for a thread that may wait to write (`PreparedConnectionSend.send(before:)`).
    /// Making the descriptors may wait for room, until `deadline`, to write a port's
    /// ATTACH_SENDER.
    private static func writeUnlessFull(
        _ message: borrowing PKPortMessage, to connection: SendConnection, reply replyRight: ReplyRight?,
        before deadline: PKDeadline
    ) throws(PKError) -> PreparedConnectionSend? {
        var transfers: [Int32] = []
        let frame: WireFrame
        do throws(PKError) {
            frame = try checkedFrame(for: message, to: connection, reply: replyRight, replyBackToken: 0, making: &transfers, before: deadline)
        } catch {
            for fd in transfers { Descriptor.close(fd) }
            throw error
        }
        let prepared = PreparedConnectionSend(connection: connection, reply: replyRight, frame: frame, descriptors: transfers)
        do throws(PKError) {
            try prepared.send(before: .distantPast)
            return nil
        } catch where error.code == .sendTimedOut {
            return prepared  // nothing was sent: the socket had no room
        }
    }

    // A message's rare steps, out of line: inlined, their code would sit among the send's,
    // which every message runs, and spread it over more lines of the instruction cache.

    /// The frame's components for a message held as components, not as its bytes.
    @inline(never)
    private static func wireComponents(_ all: [PKPortComponent]) -> WireComponents {
        func wire(_ component: PKPortComponent) -> WireComponent {
            switch component {
            case .data(let bytes): .data(bytes)
            case .port: .port
            }
        }
        return all.count == 1 ? WireComponents(wire(all[0])) : WireComponents(all.map(wire))
    }

    @inline(never)
    private static func overLimits(_ error: WireError) -> PKError {
        PKError(.limitExceeded, "the message is over PortKit's limits: \(error.message)")
    }

    /// Appends to `transfers` a descriptor for the reply port and for each port `message`
    /// carries, in the frame's order (the caller closes them).
    @inline(never)
    private static func makeTransferDescriptors(
        for message: borrowing PKPortMessage, into transfers: inout [Int32], before deadline: PKDeadline
    ) throws(PKError) {
        if let reply = message.replyPort {
            transfers.append(try reply.makeTransferDescriptor(before: deadline))
        }
        guard case .components(let all) = message.body else { return }  // its bytes only
        for case .port(let port) in all {
            transfers.append(try port.makeTransferDescriptor(before: deadline))
        }
    }

    /// The descriptor under this right, for watching its hang-up.
    var watchableConnection: SendConnection? {
        switch storage {
        case .connection(let connection): connection
        case .reply(let right): right.writer
        case .local, .localRight: nil
        }
    }

    /// Sends `message`, waiting at most `timeout` for room in the receiver's queue.
    public func send(_ message: consuming PKPortMessage, timeout: Duration) throws(PKError) {
        try send(consume message, before: .after(timeout))
    }

    /// Sends a message made of `msgid`, `components` and a reply port
    /// (`-[NSPort sendBeforeDate:msgid:components:from:reserved:]`).
    public func send(
        msgid: UInt32, components: [PKPortComponent] = [], replyPort: PKSendPort? = nil,
        before deadline: PKDeadline
    ) throws(PKError) {
        try send(PKPortMessage(msgid: msgid, components: components, replyPort: replyPort), before: deadline)
    }

    /// For a sender that must not wait on its thread (an async request): sends `message` if
    /// the receiver takes it now (a port of this process with room in its queue, a socket with
    /// room) and returns nil, or else returns it prepared (checked, its rights made once) to be
    /// sent by a thread that may wait (`PreparedSend.send(before:)`). Making its rights may
    /// still wait on this thread, until `deadline`: a port in it that is a connection writes
    /// its ATTACH_SENDER there.
    func sendUnlessQueueFull(_ message: consuming PKPortMessage, before deadline: PKDeadline) throws(PKError) -> PreparedSend? {
        switch storage {
        case .local(let port):
            return try port.enqueueLocalUnlessFull(message, epoch: nil, before: deadline)
                .map { .local(PreparedLocalSend(right: self, port: port, epoch: nil, message: $0.message, bytes: $0.bytes)) }
        case .localRight(let right):
            guard !right.wasInvalidated else { throw PKError(.invalidPort, "cannot send: the send right was invalidated") }
            return try right.port.enqueueLocalUnlessFull(message, epoch: right.epoch, before: deadline)
                .map { .local(PreparedLocalSend(right: self, port: right.port, epoch: right.epoch, message: $0.message, bytes: $0.bytes)) }
        case .connection(let connection):
            return try Self.writeUnlessFull(message, to: connection, reply: nil, before: deadline).map(PreparedSend.connection)
        case .reply(let right):
            return try Self.writeUnlessFull(message, to: right.writer, reply: right, before: deadline).map(PreparedSend.connection)
        }
    }

    /// Whether the port can still receive: false once the receive port is gone or this right
    /// was invalidated (`-[NSPort isValid]`). Safe from any thread.
    public var isValid: Bool {
        switch storage {
        case .connection(let connection): connection.isValid
        case .local(let port): port.isValid
        case .localRight(let right): right.isValid
        case .reply(let right): right.isValid
        }
    }

    /// Whether this is a right to answer one request that came in over a connection
    /// (REPLY_BACK): it answers once, and reaches no port after that.
    var isReplyRight: Bool {
        if case .reply = storage { true } else { false }
    }

    /// Gives up this send right and every copy of it (`-[NSPort invalidate]` on a remote port).
    /// It returns at once, and no send is accepted from then on. Messages sent before still
    /// arrive, first, then the receive port sees this sender leave (what its receiver has not
    /// read 5 s after the invalidation is dropped). Safe from any thread.
    ///
    /// A right that `PKReceivePort.makeSendRight()` made in the port's own thread or process
    /// lives as long as the port: invalidating it does nothing; invalidate the port instead.
    public func invalidate() {
        switch storage {
        case .connection(let connection): connection.invalidate(reason: "the send right was invalidated")
        case .localRight(let right): right.invalidate()
        case .reply(let right): right.invalidate()
        case .local: break
        }
    }

    public var description: String {
        switch storage {
        case .connection(let connection): "PKSendPort(fd \(connection.fd)\(isValid ? "" : ", invalid"))"
        case .local(let port): "PKSendPort(local \(port))"
        case .localRight(let right): "PKSendPort(in-process \(right.port)\(right.isValid ? "" : ", invalid"))"
        case .reply(let right): "PKSendPort(reply to request \(right.ticket.token) on fd \(right.writer.fd)\(right.isValid ? "" : ", invalid"))"
        }
    }

    private var identity: ObjectIdentifier {
        switch storage {
        case .connection(let connection): ObjectIdentifier(connection)
        case .local(let port): ObjectIdentifier(port)
        case .localRight(let right): ObjectIdentifier(right)
        case .reply(let right): ObjectIdentifier(right)
        }
    }

    public static func == (lhs: PKSendPort, rhs: PKSendPort) -> Bool { lhs.identity == rhs.identity }
    public func hash(into hasher: inout Hasher) { hasher.combine(identity) }
}

/// The writing end of one connection to a receive port. Owns its descriptor; every write
/// happens under `lock`, so one message is never interleaved with another.
final class SendConnection: @unchecked Sendable {
    let fd: Int32
    /// Tells this connection from any other, even one made later at the same address.
    let serial = SendConnection.serials.wrappingAdd(1, ordering: .relaxed).newValue
    private static let serials = Atomic<UInt64>(0)
    private let lock = PKMutex<State>(State())

    struct State {
        var invalidReason: String?
        /// Frames accepted but not yet written (coalesced writes, see `write`).
        var pending: [UInt8] = []
        /// Set when the connection was invalidated with bytes pending: they still go out (the
        /// loop or flusher that has them keeps writing), until this deadline at most; the
        /// socket is shut down once they are written. `invalidReason` is already set, so no send
        /// joins them.
        var lingerUntil: PKDeadline?
        /// Where a frame written directly is encoded: kept from one send to the next while small
        /// (`scratchLimit`), so a send allocates nothing for its bytes. Raw memory, freed with
        /// the connection: an array here cost a send about 250 instructions and two locked ones
        /// (emptied, grown with zeros, moved in and out of the state).
        var scratch = UnsafeMutableRawBufferPointer(start: nil, count: 0)
        /// When bytes were last written to the socket (monotonic nanoseconds; 0: never, or by
        /// a running loop, which dates its writes by `writerWaits` instead): unread bytes in it
        /// are ours, and worth asking about only if that was recent (see `wroteRecently`).
        var lastWriteAt: UInt64 = 0
        /// The loop of the thread that made the last direct write, if it has one, and its
        /// `waits` and pass then.
        var writerLoop: ObjectIdentifier?
        var writerWaits: UInt64 = 0
        var writerPass: UInt64 = 0
        /// Someone (a loop) will write the pending bytes.
        var flushScheduled = false
        /// The reply channel's reader while no request holds it (made on first use).
        var replyChannel: ReplyChannelReader?
        var replyChannelClaimed = false
        /// The port's owner broke the protocol on the reply channel: requests make reply
        /// connections of their own from now on.
        var replyChannelBroken = false
        /// A request has used the reply channel: other descriptors (a request's watch) may
        /// share this socket, so the end of the connection is a `shutdown`, not only a `close`.
        var replyChannelUsed = false
    }

    /// Pending bytes past which a send writes them itself, waiting for room.
    static let pendingLimit = 64 << 10
    /// How recent the last write must be for a send to ask whether it is still unread.
    static let recentWriteNanoseconds: UInt64 = 2_000
    /// The largest encoding area a connection keeps between sends.
    static let scratchLimit = 4 << 10

    /// Takes ownership of `fd`, a connected stream socket whose greeting was already written.
    init(takingOwnershipOf fd: Int32) {
        self.fd = fd
    }

    deinit {
        // A requester's loop may still watch a duplicate of the descriptor: the port must see
        // this sender leave all the same.
        let replyChannelUsed = lock.withLock { state in
            state.scratch.deallocate()
            return state.replyChannelUsed
        }
        if replyChannelUsed { Socket.shutdown(fd) }
        Descriptor.close(fd)
    }

    /// Takes the reply channel for one request, or `nil` when another request holds it, it
    /// broke, or the connection is invalid (the request then makes a reply connection).
    func claimReplyChannel() -> ReplyChannelReader? {
        lock.withLock { state in
            guard !state.replyChannelClaimed, !state.replyChannelBroken, state.invalidReason == nil else { return nil }
            state.replyChannelClaimed = true
            state.replyChannelUsed = true
            if let reader = state.replyChannel { return reader }
            let reader = ReplyChannelReader()
            state.replyChannel = reader
            return reader
        }
    }

    /// Gives the reply channel back after a request; `broken`: never to be used again.
    func releaseReplyChannel(broken: Bool) {
        lock.withLock { state in
            state.replyChannelClaimed = false
            if broken {
                state.replyChannelBroken = true
                state.replyChannel = nil
            }
        }
    }

    /// Ends the connection without waiting: what is pending goes out if the socket takes it
    /// now (an answer written earlier in the same pass), the rest is dropped.
    func abandon(reason: String) {
        lock.withLock { state in
            if !state.pending.isEmpty && state.invalidReason == nil {
                _ = try? flushLocked(&state, until: .distantPast, failOnTimeout: false)
            }
            markInvalid(&state, reason)
        }
    }

    var isValid: Bool {
        lock.withLock { state in
            if state.invalidReason != nil { return false }
            if Socket.peerHasHungUp(fd) {
                state.invalidReason = "the receive port is gone"
                return false
            }
            return true
        }
    }

    /// Ends the connection, without waiting (unless the process has no flusher, which only a
    /// process out of threads lacks: then it writes them itself, waiting up to
    /// `finalFlushPatience`): no send is accepted from now on, and what was sent before still
    /// goes out, first. Pending bytes the socket does not take now linger: the loop or the
    /// flusher that has them writes them when the receiver reads, and then shuts the socket
    /// down; whatever is still unwritten `finalFlushPatience` after the invalidation is dropped
    /// (and logged; the receiver may see the last frame cut short, which it drops), so a
    /// receiver that never reads holds no descriptor of ours for long. A Mach port's queued
    /// messages outlive the send right that sent them in the same way.
    func invalidate(reason: String) {
        // nil: nothing lingers; otherwise whether this call took the flush duty.
        let lingers = lock.withLock { state -> Bool? in
            guard state.invalidReason == nil else { return nil }
            if !state.pending.isEmpty {
                _ = try? flushLocked(&state, until: .distantPast, failOnTimeout: false)
                guard state.invalidReason == nil else { return nil }  // the receiver is gone
            }
            state.invalidReason = reason
            guard !state.pending.isEmpty else {
                Socket.shutdown(fd)
                endFlushDuty(&state)
                return nil
            }
            state.lingerUntil = .after(Self.finalFlushPatience)
            // (Listed for the exit's flush, if no one has the duty to write them: a loop's
            // watch for room may have failed, `flushDutyReturned`.)
            return takeFlushDuty(&state)
        }
        guard let ownsDuty = lingers else { return }
        guard let flusher = PKRunLoop.flusher else {
            // No thread could be started to write them: written here, waiting for room.
            flushPending()
            return
        }
        // The flusher writes them, even if a loop has them too: that loop may be inside a
        // handler that does not return before the linger ends (a long wait of its own), and
        // they would be dropped though the receiver read. Both writing is harmless: the lock
        // orders them, and an invalidated connection takes no new bytes.
        flusher.perform { flusher.flushPendingWrites(of: self, ownsDuty: ownsDuty) }
        flusher.perform {
            // Weak: a linger that ends sooner (all written) lets go of the connection at once.
            PKRunLoop.current.scheduleTimer(after: Self.finalFlushPatience, forMode: .common) { [weak self] _ in self?.endLinger() }
        }
    }

    /// The end of an invalidated connection's linger: bytes still pending are dropped.
    private func endLinger() {
        let dropped = lock.withLock { state -> Int in
            guard state.lingerUntil != nil else { return 0 }
            let count = state.pending.count
            markInvalid(&state, state.invalidReason ?? "invalidated")
            return count
        }
        if dropped > 0 {
            Self.logger.warning("an invalidated send right's last \(dropped) bytes were dropped: its receive port read nothing for \(Self.finalFlushPatience)")
        }
    }

    private static let logger = Logger(label: "PortKit.SendConnection")

    /// Tests: whether the connection was invalidated with bytes still pending, which wait.
    var isLingering: Bool { lock.withLock { $0.lingerUntil != nil } }

    /// Writes one encoded frame (and the descriptors it carries).
    ///
    /// Coalesced writes (protocol.md is unaffected: the bytes on the wire are the same):
    /// - A frame goes out at once while the connection keeps up: a request, a reply, a round
    ///   trip pay no delay.
    /// - When the socket is full (the receiver is behind), the rest of the frame and the frames
    ///   after it wait in the connection's pending bytes, up to `pendingLimit`, and go out
    ///   together, one `send` for many frames, when the socket has room again: the sender's
    ///   own loop writes them (before it next waits), or, for a thread not running a loop,
    ///   PortKit's flusher loop does (`PKRunLoop.flusher`). A send finding `pendingLimit` bytes
    ///   pending writes them itself, waiting for room until its deadline, then fails with
    ///   `.sendTimedOut` having sent nothing: the receiver's back-pressure holds the sender as
    ///   before.
    /// - Inside a loop's pass, a second frame to the same connection joins the pending bytes
    ///   at once: a handler that streams frames makes one system call per batch.
    /// Pending bytes go out before anything else on the connection (a frame with descriptors
    /// waits for them), so frames keep their order.
    ///
    /// The frame is encoded under the connection's lock, straight into the pending bytes or into
    /// the connection's encoding area, so a send copies its payload once.
    func write(_ frame: some WireEncodable, descriptors: [Int32], before deadline: PKDeadline) throws(PKError) {
        let size = frame.encodedSize
        let here = PKRunLoop.onCurrentThread
        let loop = here?.isRunning == true ? here : nil
        // The lock is held only for steps that do not wait: a sender waiting for room never
        // holds up the loop that flushes this connection's pending bytes.
        while true {
            let step = try lock.withLock { state throws(PKError) -> WriteStep in
                if let reason = state.invalidReason {
                    throw PKError(.invalidPort, "cannot send: \(reason)")
                }
                // Inside a pass that already wrote directly to this connection.
                let corked = loop != nil && state.writerLoop == loop!.id && state.writerPass == loop!.pass
                if descriptors.isEmpty && (!state.pending.isEmpty || corked) {
                    if !state.pending.isEmpty && state.pending.count + size > Self.pendingLimit {
                        try flushLocked(&state, until: .distantPast, failOnTimeout: false)
                        guard state.pending.count + size <= Self.pendingLimit else { return .needRoom }
                    }
                    return appendPending(frame, &state)
                }
                if !state.pending.isEmpty {
                    try flushLocked(&state, until: .distantPast, failOnTimeout: false)
                    guard state.pending.isEmpty else { return .needRoom }
                }
                // The receiver has not read what we wrote last: it is busy (or already woken
                // for it) and will not read this sooner, so it waits with the frames that
                // follow and goes out with them in one write, waking the receiver once. Asked
                // (an ioctl) only when that write was recent (`wroteRecently`): a stream's sends
                // come microseconds apart, while a round trip's next send comes after the
                // answer, when the receiver has read everything (a system call per message
                // saved there).
                if descriptors.isEmpty && Self.wroteRecently(state, here) && Socket.unsentBytes(fd) > 0 {
                    return appendPending(frame, &state)
                }
                state.writerLoop = here?.id
                state.writerWaits = here?.waits ?? 0
                state.writerPass = here?.pass ?? 0
                let (area, isTemporary) = Self.encodingArea(size, &state)
                defer { if isTemporary { area.deallocate() } }
                frame.encode(size: size, into: area)
                let bytes = UnsafeRawBufferPointer(rebasing: area[..<size])
                // A running loop dates its write by its waits alone (see `wroteRecently`).
                let written = try writeLocked(&state, bytes, descriptors: descriptors, clock: loop == nil)
                if written == 0 && !descriptors.isEmpty { return .needRoom }  // nothing went out
                guard written < size else { return .sent(flush: false) }
                // The socket is full: the rest waits with the frames that follow.
                state.pending.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[written...]))
                return .sent(flush: takeFlushDuty(&state))
            }
            switch step {
            case .sent(let flush):
                guard flush else { return }
                if let loop {
                    loop.notePendingWrite(self)
                } else if let flusher = PKRunLoop.flusher {
                    flusher.perform { flusher.flushPendingWrites(of: self) }
                } else {
                    // No thread could be started to write them: this thread writes them now,
                    // waiting for room as a thread that ends does.
                    flushPending()
                }
                return
            case .needRoom:
                try waitForRoom(until: deadline)
            }
        }
    }

    /// Whether the connection's last write may still be unread, and so worth asking about,
    /// for a send on the thread whose loop is `here` (if it has one). Not if this thread's loop
    /// made it and has waited since (for events, or outside any run): a loop that waited is
    /// not streaming on this connection, and its reader had that time; a round trip's next
    /// send comes after such a wait, and so reads no clock. Yes if a running loop made it and
    /// has not waited since: its passes since ran back to back (and it writes what it leaves
    /// pending before it waits). Otherwise, if it was written within `recentWriteNanoseconds`
    /// of `now` (the clock, read only then; a test gives its own reading, which no preemption
    /// between two readings can age).
    static func wroteRecently(_ state: State, _ here: PKRunLoop.ThreadLoop?, now: () -> UInt64 = monotonicNanoseconds) -> Bool {
        if let here, state.writerLoop == here.id {
            if state.writerWaits != here.waits { return false }
            // Equal waits while running: the write was made in this run (entering one counts).
            if here.isRunning { return true }
        }
        return state.lastWriteAt != 0 && now() &- state.lastWriteAt < recentWriteNanoseconds
    }

    private enum WriteStep {
        /// The frame was accepted; `flush`: the caller must arrange the pending bytes' flush.
        case sent(flush: Bool)
        /// Nothing was sent: wait for room, then try again.
        case needRoom
    }

    /// Room for `size` bytes to encode a frame in: the connection's scratch area, grown if need
    /// be, or for a frame over `scratchLimit` an area of its own (`isTemporary`) that the caller
    /// deallocates.
    private static func encodingArea(_ size: Int, _ state: inout State) -> (area: UnsafeMutableRawBufferPointer, isTemporary: Bool) {
        if size <= state.scratch.count { return (state.scratch, false) }
        if size > scratchLimit { return (.allocate(byteCount: size, alignment: 8), true) }
        let grown = Swift.min(Swift.max(size, 2 * state.scratch.count, 256), scratchLimit)
        state.scratch.deallocate()
        state.scratch = .allocate(byteCount: grown, alignment: 8)
        return (state.scratch, false)
    }

    /// Encodes `frame` at the end of the pending bytes, which someone must then write (see
    /// `takeFlushDuty`). Out of line: a round trip's frames go out at once and never come here,
    /// and this code would sit among theirs.
    @inline(never)
    private func appendPending(_ frame: some WireEncodable, _ state: inout State) -> WriteStep {
        WireEncoder.appendEncoded(frame, to: &state.pending)
        return .sent(flush: takeFlushDuty(&state))
    }

    /// Waits, without the lock, until the socket may take bytes or `deadline` passes.
    private func waitForRoom(until deadline: PKDeadline) throws(PKError) {
        let outcome: Socket.WaitResult
        do { outcome = try Socket.waitWritable(fd, until: deadline) } catch {
            throw PKError(.transport, "waiting to send failed", call: error.call, errno: error.errno)
        }
        switch outcome {
        case .writable, .hangUp: return  // the next step writes, or learns the peer is gone
        case .timedOut:
            throw PKError(.sendTimedOut, "the receive port's queue stayed full until the send deadline; nothing was sent")
        }
    }

    /// Whether the caller must arrange a flush (no one has been asked to yet). Until the duty
    /// ends, the connection is listed for a flush at exit: listing and unlisting happen under
    /// the lock with the duty's changes, so a flush that ends on one thread never unlists bytes
    /// another thread has just made pending (a process that sent and then exited could lose
    /// its last frames that way).
    private func takeFlushDuty(_ state: inout State) -> Bool {
        guard !state.flushScheduled else { return false }
        state.flushScheduled = true
        PendingWritesAtExit.add(self)
        return true
    }

    /// Ends the flush duty (the next pending bytes arrange a new one). Under the lock.
    private func endFlushDuty(_ state: inout State) {
        state.flushScheduled = false
        PendingWritesAtExit.remove(self)
    }

    /// What a flush that does not wait achieved.
    enum FlushOutcome { case done, blocked, failed }

    /// Writes as much of the pending bytes as the socket takes now. Safe from any thread.
    /// When it returns `.done` or `.failed`, the flush duty ends (the next pending bytes
    /// schedule a new one); `.blocked` leaves it with the caller, who watches for room.
    func flushPendingWithoutWaiting() -> FlushOutcome {
        let outcome = lock.withLock { state in
            var outcome = FlushOutcome.failed
            if Self.mayWrite(state) {
                do throws(PKError) {
                    outcome = try flushLocked(&state, until: .distantPast, failOnTimeout: false) ? .done : .blocked
                } catch {}
            }
            if outcome == .done { endLingerWritten(&state) }
            if outcome != .blocked { endFlushDuty(&state) }
            return outcome
        }
        return outcome
    }

    /// The loop that was to flush gave up watching (see `PKRunLoop.watchForRoom`): the next
    /// send arranges a flush again.
    func flushDutyReturned() {
        lock.withLock { endFlushDuty(&$0) }
    }

    /// The longest pending bytes wait for room once the process or the thread that has them
    /// ends, or once their connection is invalidated.
    static let finalFlushPatience = Duration.seconds(5)

    /// Whether pending bytes may still be written: the connection is valid, or it was
    /// invalidated with bytes pending and they linger.
    private static func mayWrite(_ state: State) -> Bool {
        state.invalidReason == nil || state.lingerUntil != nil
    }

    /// Every pending byte of an invalidated connection is written: its socket is shut down (the
    /// receive port sees the sender leave after its last frame).
    private func endLingerWritten(_ state: inout State) {
        guard state.lingerUntil != nil else { return }
        state.lingerUntil = nil
        Socket.shutdown(fd)
    }

    /// Writes every pending byte, waiting for room for `finalFlushPatience` at most (an
    /// invalidated connection's bytes until the end of their linger), and not past `limit`
    /// (the exit's one deadline for all its connections); a flush that cannot finish by then
    /// closes the connection. For a process that ends with bytes pending, and a thread or an
    /// invalidation with no flusher to hand them to. Safe from any thread.
    ///
    /// It waits for room without the lock, as a send does: held, the lock stopped every other
    /// thread's send on the connection (whatever its deadline), `isValid`, and the flusher,
    /// which serves every connection of the process, for up to `finalFlushPatience`.
    func flushPending(until limit: PKDeadline? = nil) {
        var deadline: PKDeadline?
        while true {
            let waitUntil: PKDeadline? = lock.withLock { state in
                // This ends any loop's duty to flush: the next pending bytes arrange a new one.
                if deadline == nil { endFlushDuty(&state) }
                guard !state.pending.isEmpty, Self.mayWrite(state) else {
                    endLingerWritten(&state)
                    return nil
                }
                let own = state.lingerUntil ?? .after(Self.finalFlushPatience)
                let until = deadline ?? limit.map { min($0, own) } ?? own
                do throws(PKError) {
                    if try flushLocked(&state, until: .distantPast, failOnTimeout: false) {
                        endLingerWritten(&state)
                        return nil
                    }
                } catch {
                    return nil  // the connection broke (it is marked invalid)
                }
                guard !until.hasPassed else {
                    markInvalid(&state, "frames sent earlier could not be written within \(Self.finalFlushPatience)")
                    return nil
                }
                return until
            }
            guard let waitUntil else { return }
            deadline = waitUntil
            // A hang-up or an error is learnt by the next write.
            _ = try? Socket.waitWritable(fd, until: waitUntil)
        }
    }

    /// Writes pending bytes, waiting for room until `deadline`. Returns whether all went out;
    /// what did not stays pending (the connection stays usable). With `failOnTimeout`, running
    /// out of time throws `.sendTimedOut` instead of returning `false`.
    @discardableResult
    private func flushLocked(_ state: inout State, until deadline: PKDeadline, failOnTimeout: Bool = true) throws(PKError) -> Bool {
        var written = 0
        defer {
            if written >= state.pending.count {
                state.pending.removeAll(keepingCapacity: state.pending.capacity <= 4 * Self.pendingLimit)
            } else if written > 0 {
                state.pending.removeFirst(written)
            }
        }
        let pending = state.pending
        while true {
            written = try writeLocked(&state, pending, from: written)
            if written == pending.count { return true }
            // The socket is full: wait for room, if there is time.
            var outcome = Socket.WaitResult.timedOut
            if !deadline.hasPassed {
                do { outcome = try Socket.waitWritable(fd, until: deadline) } catch {
                    markInvalid(&state, "waiting to send failed: \(error)")
                    throw PKError(.transport, "waiting to send failed", call: error.call, errno: error.errno)
                }
            }
            switch outcome {
            case .writable: continue
            case .hangUp:
                markInvalid(&state, "the receive port is gone")
                throw PKError(.invalidPort, "cannot send: the receive port is gone")
            case .timedOut:
                if failOnTimeout {
                    throw PKError(.sendTimedOut, "the receive port's queue stayed full until the send deadline; nothing was sent")
                }
                return false
            }
        }
    }

    /// Writes what the socket takes of `bytes` from `start` now; returns the offset reached.
    /// Descriptors travel with the first byte written.
    private func writeLocked(_ state: inout State, _ bytes: [UInt8], from start: Int = 0, descriptors: [Int32] = []) throws(PKError) -> Int {
        let result: Result<Int, PKError> = bytes.withUnsafeBytes { raw in
            Result { () throws(PKError) in try writeLocked(&state, raw, from: start, descriptors: descriptors) }
        }
        return try result.get()
    }

    /// `writeLocked(_:_:from:descriptors:)` for bytes in memory the caller holds. `clock`: a
    /// write dates itself in `lastWriteAt` (a direct write by a running loop is dated by the
    /// loop's waits instead, and leaves it 0).
    private func writeLocked(_ state: inout State, _ bytes: UnsafeRawBufferPointer, from start: Int = 0, descriptors: [Int32] = [],
                             clock: Bool = true) throws(PKError) -> Int {
        var offset = start
        var attach = descriptors
        while offset < bytes.count {
            let result: IOResult<Int>
            do throws(PKError) {
                result = try Socket.send(fd, UnsafeRawBufferPointer(rebasing: bytes[offset...]), descriptors: attach)
            } catch {
                throw writeFailed(&state, error, withDescriptors: !attach.isEmpty)
            }
            switch result {
            case .done(let n):
                offset += n
                attach = []
                state.lastWriteAt = clock ? monotonicNanoseconds() : 0
            case .wouldBlock:
                return offset
            }
        }
        return offset
    }

    /// What a failed write throws, and what it does to the connection. Out of line: every
    /// send's write inlines `writeLocked`, and this would sit among its code.
    @inline(never)
    private func writeFailed(_ state: inout State, _ error: PKError, withDescriptors: Bool) -> PKError {
        if Socket.isPeerGone(error.errno) {
            markInvalid(&state, "the receive port is gone")
            return PKError(.invalidPort, "cannot send: the receive port is gone")
        }
        // A write with descriptors is a frame's first (pending bytes are written before one):
        // refused whole, it leaves the stream at a frame boundary. The kernel's refusals for the
        // moment fail this send only, not the connection: ETOOMANYREFS (this user's
        // descriptors in flight, in every process, passed RLIMIT_NOFILE: receivers that do not
        // read), ENOBUFS, ENOMEM.
        if withDescriptors, Socket.isRefusedForNow(error.errno) {
            return PKError(Socket.isTooManyInFlight(error.errno) ? .limitExceeded : .system,
                           "the kernel refused the message's descriptors for now; nothing was sent", call: error.call, errno: error.errno)
        }
        markInvalid(&state, "the connection failed: \(error)")
        return PKError(.transport, "sending failed; the connection was closed", call: error.call, errno: error.errno)
    }

    private func markInvalid(_ state: inout State, _ reason: String) {
        guard Self.mayWrite(state) else { return }
        if state.invalidReason == nil { state.invalidReason = reason }
        state.lingerUntil = nil
        state.pending = []
        Socket.shutdown(fd)
    }

    /// A fresh connection to this connection's receive port, as a descriptor to attach to a
    /// message: the receiver gets a send right of its own to the same port. The caller owns
    /// (and closes, after sending) the returned descriptor.
    func makeTransferDescriptor(before deadline: PKDeadline) throws(PKError) -> Int32 {
        let (readEnd, writeEnd) = try Socket.pair()
        defer { Descriptor.close(readEnd) }
        do throws(PKError) {
            try ConnectionSetup.writeGreeting(writeEnd)
            // Ask the port's owner to adopt the read end, in order on this connection.
            try write(WireFrame.attachSender(), descriptors: [readEnd], before: deadline)
            return writeEnd
        } catch {
            Descriptor.close(writeEnd)
            throw error
        }
    }
}

/// How a connection starts: the sender's greeting.
enum ConnectionSetup {
    static let greeting: [UInt8] = {
        var bytes: [UInt8] = []
        WireEncoder.appendGreeting(.current(pid: UInt32(bitPattern: ThreadIdentity.processID), uid: Socket.effectiveUserID), to: &bytes)
        return bytes
    }()

    /// Writes the greeting on a fresh socket (it always fits in an empty socket buffer).
    static func writeGreeting(_ fd: Int32) throws(PKError) {
        let result = try Socket.send(fd, greeting, from: 0, descriptors: [])
        guard case .done(let n) = result, n == greeting.count else {
            throw PKError(.transport, "could not write the greeting on a new connection")
        }
    }
}

/// Writes every connection's pending bytes (coalesced writes) when the process calls `exit`
/// (or returns from `main`), so that a program that sends and then ends loses nothing it sent:
/// the connections whose pending bytes some loop was to write are listed here meanwhile.
enum PendingWritesAtExit {
    private static let installed = Atomic<Bool>(false)
    private static let connections = PKMutex<[ObjectIdentifier: SendConnection]>([:])

    static func add(_ connection: SendConnection) {
        connections.withLock { $0[ObjectIdentifier(connection)] = connection }
        if !installed.exchange(true, ordering: .acquiringAndReleasing) {
            ProcessExit.register { PendingWritesAtExit.flushAll() }
        }
    }

    static func remove(_ connection: SendConnection) {
        _ = connections.withLock { $0.removeValue(forKey: ObjectIdentifier(connection)) }
    }

    private static func flushAll() {
        let pending = connections.withLock { table in
            defer { table = [:] }
            return Array(table.values)
        }
        // One deadline for all: the exit waits `finalFlushPatience` at most, however many
        // receivers are behind.
        let limit = PKDeadline.after(SendConnection.finalFlushPatience)
        for connection in pending { connection.flushPending(until: limit) }
    }
}
