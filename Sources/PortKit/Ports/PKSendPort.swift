// A send right: a Sendable handle on a connection to a receive port, usable from any thread.

import Synchronization

/// A send right to a port (`NSPort` as a remote port, a remote `CFMessagePort`).
///
/// A cheap, `Sendable` value: copy it, store it, use it from any thread. Under it is one
/// connected socket to the port's owner (one end of a `socketpair` within a process, a
/// connection to a named socket across processes). Messages sent through one send right arrive
/// in order and never interleave with another sender's, even when threads share it.
///
/// A send right becomes invalid when its receive port is invalidated, the port's owner (thread
/// or process) goes away, the connection breaks, or `invalidate()` is called. Sending to an
/// invalid port throws `PKError` with `.invalidPort`; it never raises SIGPIPE.
///
/// Two send rights are equal when they share one connection (copies of one value).
public struct PKSendPort: Sendable, Hashable, CustomStringConvertible {
    /// A connection of its own, or (for a right made in the port's own process) the port, whose
    /// shared local connection is made on first use.
    enum Storage: Sendable {
        case connection(SendConnection)
        case local(PKReceivePort)
        /// A right of its own to a port of this process, received in an in-process message.
        case localRight(LocalRight)
    }
    let storage: Storage

    init(connection: SendConnection) { self.storage = .connection(connection) }
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
        }
    }

    /// Sends `message`, waiting while the receiver's queue is full until `deadline`
    /// (`-[NSPortMessage sendBeforeDate:]`, `-[NSPort sendBeforeDate:msgid:components:from:reserved:]`).
    ///
    /// A message is queued whole or not at all: if the deadline passes before any of it is
    /// queued, nothing is sent. If it passes with part of a message queued, the connection is
    /// closed (the receiver discards the partial message) and this send right becomes invalid.
    /// Through a right made in this process by `makeSendRight()`, the message is handed over in
    /// memory (its ports still become connections of the receiver's own); a sender on the port's own loop
    /// thread never waits for itself: when the queue is full there, the send fails at once.
    ///
    /// - Parameters:
    ///   - message: the message; its ports travel as send rights to the same ports.
    ///   - deadline: how long a full queue may hold the sender; `.now` never waits.
    /// - Throws: `PKError` with `.sendTimedOut`, `.invalidPort` (the port is or became invalid),
    ///   `.limitExceeded` (the message is over the limits), or `.transport`.
    public func send(_ message: PKPortMessage, before deadline: PKDeadline) throws(PKError) {
        let connection: SendConnection
        switch storage {
        case .local(let port):
            // Within the process, the message is handed over in memory.
            try port.enqueueLocal(message, before: deadline)
            return
        case .localRight(let right):
            // The port's validity and the right's epoch are checked under the mailbox's lock.
            guard !right.wasInvalidated else { throw PKError(.invalidPort, "cannot send: the send right was invalidated") }
            try right.port.enqueueLocal(message, epoch: right.epoch, before: deadline)
            return
        case .connection(let over):
            connection = over
        }
        var components: [WireComponent] = []
        components.reserveCapacity(message.components.count)
        for component in message.components {
            switch component {
            case .data(let bytes): components.append(.data(bytes))
            case .port: components.append(.port)
            }
        }
        let frame = WireFrame(msgid: message.msgid, hasReplyPort: message.replyPort != nil, components: components)
        // The sender checks the limits before making anything (the receiver checks them again).
        do throws(WireError) { try WireEncoder.check(frame, limits: PKPortLimits.default.wire) } catch {
            throw PKError(.limitExceeded, "the message is over PortKit's limits: \(error.message)")
        }
        var transfers: [Int32] = []
        defer { for fd in transfers { Descriptor.close(fd) } }
        if let reply = message.replyPort {
            transfers.append(try reply.makeTransferDescriptor(before: deadline))
        }
        for case .port(let port) in message.components {
            transfers.append(try port.makeTransferDescriptor(before: deadline))
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(WireEncoder.encodedSize(of: frame))
        WireEncoder.append(frame, to: &bytes)
        try connection.write(bytes, descriptors: transfers, before: deadline)
    }

    /// The descriptor under this right, for watching its hang-up.
    var watchableConnection: SendConnection? {
        if case .connection(let connection) = storage { return connection }
        return nil
    }

    /// Sends `message`, waiting at most `timeout` for room in the receiver's queue.
    public func send(_ message: PKPortMessage, timeout: Duration) throws(PKError) {
        try send(message, before: .after(timeout))
    }

    /// Sends a message made of `msgid`, `components` and a reply port
    /// (`-[NSPort sendBeforeDate:msgid:components:from:reserved:]`).
    public func send(
        msgid: UInt32, components: [PKPortComponent] = [], replyPort: PKSendPort? = nil,
        before deadline: PKDeadline
    ) throws(PKError) {
        try send(PKPortMessage(msgid: msgid, components: components, replyPort: replyPort), before: deadline)
    }

    /// Whether the port can still receive: false once the receive port is gone or this right
    /// was invalidated (`-[NSPort isValid]`). Safe from any thread.
    public var isValid: Bool {
        switch storage {
        case .connection(let connection): connection.isValid
        case .local(let port): port.isValid
        case .localRight(let right): right.isValid
        }
    }

    /// Gives up this send right and every copy of it (`-[NSPort invalidate]` on a remote port).
    /// The receive port sees this sender leave. Safe from any thread.
    ///
    /// A right that `PKReceivePort.makeSendRight()` made in the port's own thread or process
    /// lives as long as the port: invalidating it does nothing; invalidate the port instead.
    public func invalidate() {
        switch storage {
        case .connection(let connection): connection.invalidate(reason: "the send right was invalidated")
        case .localRight(let right): right.invalidate()
        case .local: break
        }
    }

    public var description: String {
        switch storage {
        case .connection(let connection): "PKSendPort(fd \(connection.fd)\(isValid ? "" : ", invalid"))"
        case .local(let port): "PKSendPort(local \(port))"
        case .localRight(let right): "PKSendPort(in-process \(right.port)\(right.isValid ? "" : ", invalid"))"
        }
    }

    private var identity: ObjectIdentifier {
        switch storage {
        case .connection(let connection): ObjectIdentifier(connection)
        case .local(let port): ObjectIdentifier(port)
        case .localRight(let right): ObjectIdentifier(right)
        }
    }

    public static func == (lhs: PKSendPort, rhs: PKSendPort) -> Bool { lhs.identity == rhs.identity }
    public func hash(into hasher: inout Hasher) { hasher.combine(identity) }
}

/// The writing end of one connection to a receive port. Owns its descriptor; every write
/// happens under `lock`, so one message is never interleaved with another.
final class SendConnection: @unchecked Sendable {
    let fd: Int32
    private let lock = PKMutex<State>(State())

    struct State {
        var invalidReason: String?
    }

    /// Takes ownership of `fd`, a connected stream socket whose greeting was already written.
    init(takingOwnershipOf fd: Int32) {
        self.fd = fd
    }

    deinit { Descriptor.close(fd) }

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

    func invalidate(reason: String) {
        lock.withLock { state in
            guard state.invalidReason == nil else { return }
            state.invalidReason = reason
            Socket.shutdown(fd)
        }
    }

    /// Writes one whole frame with its descriptors attached to its first byte.
    func write(_ bytes: [UInt8], descriptors: [Int32], before deadline: PKDeadline) throws(PKError) {
        try lock.withLock { state throws(PKError) in
            if let reason = state.invalidReason {
                throw PKError(.invalidPort, "cannot send: \(reason)")
            }
            var offset = 0
            var attach = descriptors
            while offset < bytes.count {
                let result: IOResult<Int>
                do throws(PKError) {
                    result = try Socket.send(fd, bytes, from: offset, descriptors: attach)
                } catch {
                    if Socket.isPeerGone(error.errno) {
                        markInvalid(&state, "the receive port is gone")
                        throw PKError(.invalidPort, "cannot send: the receive port is gone")
                    }
                    markInvalid(&state, "the connection failed: \(error)")
                    throw PKError(.transport, "sending failed; the connection was closed", call: error.call, errno: error.errno)
                }
                switch result {
                case .done(let n):
                    offset += n
                    attach = []
                case .wouldBlock:
                    try waitForRoom(&state, startedMessage: offset > 0, deadline: deadline)
                }
            }
        }
    }

    /// Waits until the socket takes more bytes, or fails the send.
    private func waitForRoom(_ state: inout State, startedMessage: Bool, deadline: PKDeadline) throws(PKError) {
        let outcome: Socket.WaitResult
        do { outcome = try Socket.waitWritable(fd, until: deadline) } catch {
            markInvalid(&state, "waiting to send failed: \(error)")
            throw PKError(.transport, "waiting to send failed", call: error.call, errno: error.errno)
        }
        switch outcome {
        case .writable: return
        case .hangUp:
            markInvalid(&state, "the receive port is gone")
            throw PKError(.invalidPort, "cannot send: the receive port is gone")
        case .timedOut:
            if startedMessage {
                markInvalid(&state, "a send timed out in the middle of a message")
                throw PKError(.sendTimedOut, "the send deadline passed in the middle of a message; the connection was closed and the receiver discards the partial message")
            }
            throw PKError(.sendTimedOut, "the receive port's queue stayed full until the send deadline; nothing was sent")
        }
    }

    private func markInvalid(_ state: inout State, _ reason: String) {
        guard state.invalidReason == nil else { return }
        state.invalidReason = reason
        Socket.shutdown(fd)
    }

    /// A fresh connection to this connection's receive port, as a descriptor to attach to a
    /// message: the receiver gets a send right of its own to the same port. The caller owns
    /// (and closes, after sending) the returned descriptor.
    func makeTransferDescriptor(before deadline: PKDeadline) throws(PKError) -> Int32 {
        let (readEnd, writeEnd) = try Socket.pair()
        do throws(PKError) {
            try ConnectionSetup.writeGreeting(writeEnd)
            // Ask the port's owner to adopt the read end, in order on this connection.
            defer { Descriptor.close(readEnd) }
            var bytes: [UInt8] = []
            WireEncoder.append(WireFrame.attachSender(), to: &bytes)
            try write(bytes, descriptors: [readEnd], before: deadline)
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
