// The in-process path: a message sent through a local send right (`makeSendRight()`) is handed
// over in memory, as libzmq's inproc mailbox does, with no socket, no encoding and no system call
// unless the port's loop may be asleep (then one eventfd write wakes it). Ports in such a
// message still become connections of the receiver's own, as across processes. Across
// processes, and for rights received in messages, the socket stays the way (protocol.md).

extension PKReceivePort {
    /// What `enqueueLocal` found under the lock.
    enum MailboxOutcome {
        case queued(wake: LoopDoorbell?)
        case full(room: Int32, ownThread: Bool)
    }

    /// Queues `message` in the mailbox, waiting while it is full until `deadline`.
    /// A sender's right of `epoch` (see `revokeSenders()`) must still be current.
    func enqueueLocal(_ message: consuming PKPortMessage, epoch: UInt64? = nil, before deadline: PKDeadline) throws(PKError) {
        let (bytes, ports) = message.census
        try checkLimits(message, dataBytes: bytes, ports: ports)
        if ports != 0 { try checkAcceptsRights(epoch: epoch) }
        // Moved into the mailbox, not copied: a copy would retain its components and reply port
        // here and release them again on the way out.
        var pending: PKPortMessage? = ports == 0 ? message : try Self.ownRights(for: message, before: deadline)
        try enqueueOwned(&pending, bytes: bytes, epoch: epoch, before: deadline, waiting: true)
    }

    /// `enqueueLocal` for a sender that must not wait on its thread (an async request): queues
    /// `message` if the mailbox has room now and returns nil; if it is full, returns the message
    /// as it would be queued (checked, its ports the receiver's own rights already), for
    /// `enqueueOwned` on a thread that may wait. (Making the rights again for a second try
    /// would drop the first ones: a sender leaving a port, a right to answer spent.)
    func enqueueLocalUnlessFull(_ message: consuming PKPortMessage, epoch: UInt64?, before deadline: PKDeadline) throws(PKError) -> (message: PKPortMessage, bytes: Int)? {
        let (bytes, ports) = message.census
        try checkLimits(message, dataBytes: bytes, ports: ports)
        if ports != 0 { try checkAcceptsRights(epoch: epoch) }
        var pending: PKPortMessage? = ports == 0 ? message : try Self.ownRights(for: message, before: deadline)
        try enqueueOwned(&pending, bytes: bytes, epoch: epoch, before: deadline, waiting: false)
        guard let unsent = pending.take() else { return nil }
        return (unsent, bytes)
    }

    /// Queues `pending` (checked, its rights made; `bytes` its data bytes), taking it out of
    /// `pending`. While the mailbox is full it waits until `deadline`, or if not `waiting`
    /// returns with the message still in `pending`.
    @inline(__always)
    func enqueueOwned(_ pending: inout PKPortMessage?, bytes: Int, epoch: UInt64?, before deadline: PKDeadline, waiting: Bool) throws(PKError) {
        while true {
            let outcome = try shared.withLock { state throws(PKError) -> MailboxOutcome in
                guard Self.accepts(state, epoch: epoch) else { throw Self.refusal(state) }
                if hasRoom(state, for: bytes) {
                    state.mailbox.append(pending.take()!)
                    state.mailboxBytes += bytes
                    // Only the first message of a batch needs to wake the loop: it takes them all.
                    // Its doorbell is taken, not the loop (read under the lock, the loop is only
                    // borrowed; see `LoopDoorbell`).
                    return .queued(wake: state.mailbox.count == 1 ? state.loop?.doorbell : nil)
                }
                if state.roomSignal < 0 { state.roomSignal = try EventFD.create() }
                EventFD.drain(state.roomSignal)  // sleep until the loop next makes room
                state.waitingSenders += 1
                return .full(room: state.roomSignal, ownThread: state.loop?.isOwnedByCurrentThread ?? false)
            }
            switch consume outcome {
            case .queued(let doorbell):
                // The loop the port is bound to is the adopter's (see `schedule(on:mode:)`; a
                // signal before the adopter is added there waits in the doorbell's queue for it).
                if let doorbell { adopter.signal(ringing: doorbell) }
                return
            case .full(let room, let ownThread):
                defer { shared.withLock { $0.waitingSenders -= 1 } }
                guard waiting else { return }
                if ownThread {
                    throw PKError(.sendTimedOut, "the receive port's queue is full and it runs on this very thread, so waiting cannot help")
                }
                let timeout = deadline.pollTimeoutMilliseconds(now: monotonicNanoseconds())
                if timeout == 0 || (try? Descriptor.poll(room, events: Descriptor.readable, timeoutMilliseconds: timeout)) == 0 {
                    // Room may have appeared just as the wait ended (by count or by bytes), or
                    // the port may have been invalidated: the next look says so.
                    if shared.withLock({ !$0.isValid || hasRoom($0, for: bytes) }) { continue }
                    throw PKError(.sendTimedOut, "the receive port's queue stayed full until the send deadline; nothing was sent")
                }
            }
        }
    }

    /// Refuses a message with ports for an invalid port (or through a revoked right) before
    /// its rights are made: a right to answer a request, passed on, answers no more, even if the
    /// message is not sent after all (`ReplyRight.makeTransferDescriptor`). (Checked again
    /// under the lock as the message is queued.)
    private func checkAcceptsRights(epoch: UInt64?) throws(PKError) {
        if let refusal = shared.withLock({ Self.accepts($0, epoch: epoch) ? nil : Self.refusal($0) }) { throw refusal }
    }

    /// Whether the port takes a message through a right of `epoch` (nil: the port's own
    /// right). Under the lock.
    @inline(__always)
    private static func accepts(_ state: Shared, epoch: UInt64?) -> Bool {
        state.isValid && (epoch == nil || epoch == state.senderEpoch)
    }

    /// Why `accepts` said no. Under the lock; out of line (a refusal is rare).
    @inline(never)
    private static func refusal(_ state: Shared) -> PKError {
        PKError(.invalidPort, state.isValid ? "cannot send: the send right was invalidated" : "cannot send: the receive port was invalidated")
    }

    /// Whether the mailbox takes a message of `bytes` data bytes now (one message always fits
    /// in an empty mailbox).
    private func hasRoom(_ state: Shared, for bytes: Int) -> Bool {
        state.mailbox.count < limits.maxQueuedMessages
            && (state.mailboxBytes + bytes <= limits.maxQueuedBytes || state.mailbox.isEmpty)
    }

    /// The receiver of an in-process message gets rights of its own, as across processes: a
    /// port of this process becomes a `LocalRight` (no socket), any other a new connection;
    /// either counts as a sender and can be invalidated on its own, as a Mach send right.
    private static func ownRights(for message: consuming PKPortMessage, before deadline: PKDeadline) throws(PKError) -> PKPortMessage {
        func own(_ right: PKSendPort) throws(PKError) -> PKSendPort {
            switch right.storage {
            case .local(let port):
                return PKSendPort(localRight: LocalRight(port: port))
            case .localRight(let existing):
                guard existing.isValid else { throw PKError(.invalidPort, "cannot send a port: the send right was invalidated") }
                // Of the same epoch: a right revoked meanwhile yields an invalid one.
                return PKSendPort(localRight: LocalRight(port: existing.port, epoch: existing.epoch))
            case .connection, .reply:
                return PKSendPort(connection: SendConnection(takingOwnershipOf: try right.makeTransferDescriptor(before: deadline)))
            }
        }
        if let reply = message.replyPort { message.replyPort = try own(reply) }
        guard case .components(let all) = message.body, all.contains(where: { $0.port != nil }) else { return message }
        var components: [PKPortComponent] = []
        components.reserveCapacity(all.count)
        for component in all {
            switch component {
            case .data: components.append(component)
            case .port(let right): components.append(.port(try own(right)))
            }
        }
        message.components = components
        return message
    }

    /// The limits a message through a socket would be held to, by this port's own limits.
    private func checkLimits(_ message: borrowing PKPortMessage, dataBytes: Int, ports: Int) throws(PKError) {
        if ports > wireLimits.maxDescriptors {
            throw PKError(.limitExceeded, "a message carries at most \(wireLimits.maxDescriptors) ports, reply port included; this one has \(ports)")
        }
        if dataBytes > wireLimits.maxMessageBytes {
            throw PKError(.limitExceeded, "a message carries at most \(wireLimits.maxMessageBytes) data bytes; this one has \(dataBytes)")
        }
        if message.componentCount > wireLimits.maxComponents {
            throw PKError(.limitExceeded, "a message has at most \(wireLimits.maxComponents) components; this one has \(message.componentCount)")
        }
    }

    /// Takes every message waiting in the mailbox (loop-only), and lets waiting senders retry.
    func takeMailbox() -> [PKPortMessage] {
        shared.withLock { state in
            guard !state.mailbox.isEmpty else { return [] }
            let messages = state.mailbox
            state.mailbox = []
            state.mailboxBytes = 0
            if state.waitingSenders > 0 { EventFD.signal(state.roomSignal) }
            return messages
        }
    }
}

/// A message that its receiver could not take at once (`PKSendPort.sendUnlessQueueFull`),
/// prepared to be sent by a thread that may wait for room.
enum PreparedSend: Sendable {
    case local(PreparedLocalSend)
    case connection(PreparedConnectionSend)

    /// Sends the message, waiting for room until `deadline`.
    func send(before deadline: PKDeadline) throws(PKError) {
        switch self {
        case .local(let prepared): try prepared.queue(before: deadline)
        case .connection(let prepared): try prepared.send(before: deadline)
        }
    }
}

/// A message through a connection (or an answer through a reply right) that the socket had no
/// room for: its frame, checked, and its descriptors, made once, so that a send that waits for
/// room and tries again makes no right twice (a second reply right, say, whose first copy,
/// closed unsent, would tell the reply port its sender left). Owns the descriptors.
final class PreparedConnectionSend: Sendable {
    private let connection: SendConnection
    private let replyRight: ReplyRight?
    private let frame: WireFrame
    private let descriptors: [Int32]

    init(connection: SendConnection, reply replyRight: ReplyRight?, frame: WireFrame, descriptors: [Int32]) {
        self.connection = connection
        self.replyRight = replyRight
        self.frame = frame
        self.descriptors = descriptors
    }

    deinit { for fd in descriptors { Descriptor.close(fd) } }

    /// Writes the frame, waiting for room until `deadline`; a timeout sends nothing, and the
    /// message may be sent again.
    func send(before deadline: PKDeadline) throws(PKError) {
        if let replyRight {
            try replyRight.send(frame, descriptors: descriptors, before: deadline)
        } else {
            try connection.write(frame, descriptors: descriptors, before: deadline)
        }
    }
}

/// A message for a port of this process that found its queue full
/// (`PKSendPort.sendUnlessQueueFull`): checked against the limits, its ports the receiver's own
/// rights already, waiting to be queued.
struct PreparedLocalSend: Sendable {
    /// The right it is sent through, held until it is queued (a right of its own counts as one
    /// of the port's senders).
    let right: PKSendPort
    let port: PKReceivePort
    /// The sending right's epoch, for a right of its own (`LocalRight`).
    let epoch: UInt64?
    let message: PKPortMessage
    /// Its data bytes.
    let bytes: Int

    /// Queues the message, waiting for room until `deadline`.
    func queue(before deadline: PKDeadline) throws(PKError) {
        var pending: PKPortMessage? = message
        try port.enqueueOwned(&pending, bytes: bytes, epoch: epoch, before: deadline, waiting: true)
    }
}

extension PKPortMessage {
    /// The bytes of all data components.
    var dataByteCount: Int { census.dataBytes }

    /// The bytes of all data components, and the ports the message carries (its reply port
    /// included), counted in one pass that copies no component.
    var census: (dataBytes: Int, ports: Int) {
        let reply = replyPort == nil ? 0 : 1
        switch body {
        case .bytes(let data):
            return (data.count, reply)
        case .components(let components):
            var bytes = 0
            var ports = reply
            components.withUnsafeBufferPointer { all in
                for index in all.indices {
                    switch all[index] {
                    case .data(let data): bytes += data.count
                    case .port: ports += 1
                    }
                }
            }
            return (bytes, ports)
        }
    }
}
