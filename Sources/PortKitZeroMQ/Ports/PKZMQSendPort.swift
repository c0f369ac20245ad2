#if ZeroMQ
// A ZeroMQ send right: the address of a port (an endpoint and a port id) plus this right's own
// validity; the connection under it is shared per endpoint and made on first use.

import PortKit
import Synchronization

/// A send right to a ZeroMQ port (the remote port of `PKSendPort`'s model, over ZeroMQ).
///
/// A cheap `Sendable` value: copy it, store it, use it from any thread. It names a port by
/// `endpoint` (where the port's owner bound its socket) and `portID` (0 for the receive port
/// bound there). Under it is this process's one connection to that endpoint, made on first
/// use and shared by every right to it, so messages sent to one endpoint from one process
/// arrive in the order they were sent, and never interleave.
///
/// A right becomes invalid when `invalidate()` is called on it (or a copy), or when its
/// connection dies: the port's owner closed it, its process died (noticed at once on a live
/// host), or, over `tcp://`, it fell silent past the heartbeat bound
/// (`PKZMQTransport.heartbeat`; a stopped process on this host, reached over `ipc://`, is
/// alive). Sending to an invalid right throws `.invalidPort`; it never raises a signal. A right
/// to an endpoint that nobody has bound yet stays valid: ZeroMQ keeps connecting, and a send
/// waits for the connection until its deadline.
///
/// Two rights are equal when they name the same endpoint and port id.
public struct PKZMQSendPort: Sendable, Hashable, CustomStringConvertible {
    /// Where the port is bound.
    public var endpoint: String { right.address.endpoint }
    /// The port's id at `endpoint`: 0 for the receive port bound there.
    public var portID: UInt64 { right.address.portID }

    let right: ZMQSendRight

    /// A send right to the port at `endpoint`; starts connecting at once.
    ///
    /// - Parameters:
    ///   - endpoint: `tcp://HOST:PORT` or `ipc://PATH` (see `PKZMQEndpoint`).
    ///   - portID: the port's id there; 0 for the receive port bound at `endpoint`.
    /// - Throws: `.badName` for an endpoint PortKit does not accept or cannot connect to (a
    ///   `*` host or port is for binding only); `.system` if libzmq fails.
    public init(connectingTo endpoint: String, portID: UInt64 = 0) throws(PKError) {
        let parsed = try ZMQEndpoint(parsing: endpoint)
        right = ZMQSendRight(address: ZMQPortAddress(endpoint: endpoint, portID: portID), endpoint: parsed)
        _ = try right.connect(refusedAs: .badName)
    }

    /// A right to an address that came off the wire (already checked); connects on first use.
    /// A right to an address that came off the wire or from a bound port (checked already);
    /// connects on first use. An endpoint that does not parse makes a right that is invalid
    /// from the start.
    init(address: ZMQPortAddress) {
        if let parsed = try? ZMQEndpoint(parsing: address.endpoint) {
            right = ZMQSendRight(address: address, endpoint: parsed)
        } else {
            right = ZMQSendRight(address: address, endpoint: .ipc(path: "/"))
            right.invalidate("the endpoint \(address.endpoint) is not one PortKit accepts")
        }
    }

    /// Sends `message`, waiting until `deadline` for room in the receiver's queue, or for the
    /// connection if it is not made yet (`-[NSPortMessage sendBeforeDate:]`). A small message
    /// sent right after another on the same connection joins a batch and is accepted at once
    /// (protocol.md 10.2).
    ///
    /// The message is queued whole or not at all. Its ports travel as their endpoints; a port
    /// bound to a wildcard address (`tcp://*:PORT`) is advertised under the local address the
    /// kernel uses toward this right's endpoint.
    ///
    /// - Throws: `.sendTimedOut`; `.invalidPort` (the right is or became invalid while waiting);
    ///   `.limitExceeded` (the message is over `PKPortLimits.default`); `.transport`.
    public func send(_ message: PKZMQMessage, before deadline: PKDeadline) throws(PKError) {
        // The connection's death is checked by its send, under its socket's lock.
        try right.withConnection { connection throws(PKError) in
            try send(message, reply: nil, on: connection, before: deadline)
        }
    }

    /// Sends `message`, waiting at most `timeout` for room.
    public func send(_ message: PKZMQMessage, timeout: Duration) throws(PKError) {
        try send(message, before: .after(timeout))
    }

    /// Sends a message made of `msgid`, `components` and a reply port.
    public func send(
        msgid: UInt32, components: [PKZMQComponent] = [], replyPort: PKZMQSendPort? = nil,
        before deadline: PKDeadline
    ) throws(PKError) {
        try send(PKZMQMessage(msgid: msgid, components: components, replyPort: replyPort), before: deadline)
    }

    /// Sends `message` to this right's port on `connection` (this right's), with `reply` as its
    /// reply port if given (a request's), else the message's own.
    ///
    /// - Throws: as `send(_:before:)`.
    func send(_ message: PKZMQMessage, reply: ZMQPortAddress?, on connection: ZMQConnection, before deadline: PKDeadline) throws(PKError) {
        var replyAddress = reply
        if replyAddress == nil { replyAddress = try message.replyPort?.address(toward: right.endpoint, before: deadline) }
        switch message.body {
        case .bytes(let bytes) where replyAddress == nil:
            // One data component and no reply port (the usual message): measured and written
            // without a pass over components.
            let byteCount = try ZMQMessageEncoder.measureData(byteCount: bytes.count, limits: Self.limits)
            let (msgid, destination) = (message.msgid, portID)
            let sent = bytes.withUnsafeBytes { data in
                Result { () throws(PKError) in
                    try connection.send(byteCount: byteCount, before: deadline) { frame in
                        ZMQMessageEncoder.writeData(msgid: msgid, destination: destination, data, into: frame)
                    }
                }
            }
            try sent.get()
        case .bytes(let bytes):
            // One data component: encoded as it is, with no array made.
            try send(msgid: message.msgid, components: CollectionOfOne(PKZMQComponent.data(bytes)), reply: replyAddress,
                     on: connection, before: deadline)
        case .components(let all) where all.contains(where: { $0.port != nil }):
            // Each port's address is found once, so that measuring and writing see the same one.
            let components = try all.map { component throws(PKError) -> ZMQWireComponent in
                switch component {
                case .data(let bytes): .data(bytes)
                case .port(let port): .port(try port.address(toward: right.endpoint, before: deadline))
                }
            }
            try send(msgid: message.msgid, components: components, reply: replyAddress, on: connection, before: deadline)
        case .components(let all):
            // Data only: encoded as they are, with no wire components made.
            try send(msgid: message.msgid, components: all, reply: replyAddress, on: connection, before: deadline)
        }
    }

    private func send<Components: Collection>(
        msgid: UInt32, components: Components, reply: ZMQPortAddress?,
        on connection: ZMQConnection, before deadline: PKDeadline
    ) throws(PKError) where Components.Element: ZMQEncodableComponent {
        let byteCount = try ZMQMessageEncoder.measure(components: components, reply: reply, limits: Self.limits)
        try connection.send(byteCount: byteCount, before: deadline) { frame in
            ZMQMessageEncoder.write(msgid: msgid, destination: portID, components: components, reply: reply, into: frame)
        }
    }

    /// What a sender checks a message against (a receiver's default limits).
    private static let limits = ZMQWireLimits(.default)

    /// This port's address as a peer at `destination` can reach it (see
    /// `ZMQEndpoint.advertised(toward:before:)`).
    func address(toward destination: ZMQEndpoint, before deadline: PKDeadline) throws(PKError) -> ZMQPortAddress {
        guard right.endpoint.isWildcard else { return right.address }
        return ZMQPortAddress(endpoint: try right.endpoint.advertised(toward: destination, before: deadline), portID: portID)
    }

    /// Whether the port can still be reached through this right: false once it was
    /// invalidated or its connection died. Safe from any thread.
    public var isValid: Bool { right.isValid }

    /// Gives up this right and every copy of it; sends through it throw `.invalidPort`. Other
    /// rights to the same port are not affected. Safe from any thread.
    public func invalidate() { right.invalidate("the send right was invalidated") }

    public var description: String {
        "PKZMQSendPort(\(endpoint)\(portID == 0 ? "" : "#\(portID)")\(isValid ? "" : ", invalid"))"
    }

    public static func == (lhs: PKZMQSendPort, rhs: PKZMQSendPort) -> Bool { lhs.right.address == rhs.right.address }
    public func hash(into hasher: inout Hasher) { hasher.combine(right.address) }
}

/// The state every copy of one send right shares: its own invalidation, and the connection it
/// resolved on first use (kept, so that the right dies with that connection even if the
/// endpoint is bound again later).
final class ZMQSendRight: Sendable {
    let address: ZMQPortAddress
    let endpoint: ZMQEndpoint
    private let state = ZMQMutex<State>(State())
    /// The connection once made (`state` keeps it for the right's whole life), and whether the
    /// right was invalidated, both stored under `state`'s lock: a send reads them with two loads
    /// instead of taking the lock.
    private let madeConnection = Atomic<Unmanaged<ZMQConnection>?>(nil)
    private let invalidated = Atomic<Bool>(false)

    private struct State {
        var connection: ZMQConnection?
        var invalidReason: String?
    }

    init(address: ZMQPortAddress, endpoint: ZMQEndpoint) {
        self.address = address
        self.endpoint = endpoint
    }

    /// The connection, made on first use.
    ///
    /// - Throws: `.invalidPort` if the right is invalid; errors making the connection.
    func connection() throws(PKError) -> ZMQConnection {
        let connection = try connectionEvenIfDead()
        if let reason = connection.deadReason {
            throw PKError(.invalidPort, "cannot use the send right to \(endpoint): \(reason)")
        }
        return connection
    }

    /// The connection, made on first use, even if it has died since (to watch for its death).
    ///
    /// - Throws: `.invalidPort` if the right was invalidated; errors making the connection.
    func connectionEvenIfDead() throws(PKError) -> ZMQConnection {
        try withConnection { $0 }
    }

    /// Runs `body` with the connection (made on first use, even if it has died since) without
    /// retaining it: the right holds it for its whole life once made (`state.connection` is
    /// never cleared), and `body` runs while the right lives. A send's hot path: the
    /// connection's reference counts live in a side table (the cache and the monitor hold it
    /// weakly), where a retain and a release cost about 130 instructions.
    ///
    /// - Throws: `.invalidPort` if the right was invalidated; errors making the connection;
    ///   what `body` throws.
    func withConnection<R>(_ body: (ZMQConnection) throws(PKError) -> R) throws(PKError) -> R {
        let made = invalidated.load(ordering: .acquiring) ? nil : madeConnection.load(ordering: .acquiring)
        let connection: Unmanaged<ZMQConnection>
        if let made { connection = made } else { connection = try lockedConnection() }
        let result = withExtendedLifetime(self) {
            connection._withUnsafeGuaranteedRef { connection in
                Result { () throws(PKError) -> R in try body(connection) }
            }
        }
        return try result.get()
    }

    /// Makes the connection now, for `PKZMQSendPort.init(connectingTo:)`.
    ///
    /// - Throws: `refusedAs` if libzmq refuses the endpoint; else as `connection()`.
    func connect(refusedAs code: PKError.Code) throws(PKError) -> ZMQConnection {
        let connection = try lockedConnection(refusedAs: code).takeUnretainedValue()
        if let reason = connection.deadReason {
            throw PKError(.invalidPort, "cannot use the send right to \(endpoint): \(reason)")
        }
        return connection
    }

    /// `withConnection`'s way when the right is new or invalid: under the lock. An endpoint
    /// libzmq refuses to connect to (one that passed PortKit's checks, which should not be)
    /// makes the right invalid for good, and throws `refusedAs`: `.invalidPort` for a send,
    /// as for any right that cannot reach its port.
    @inline(never)
    private func lockedConnection(refusedAs refusal: PKError.Code = .invalidPort) throws(PKError) -> Unmanaged<ZMQConnection> {
        try state.withLock { state throws(PKError) -> Unmanaged<ZMQConnection> in
            if let reason = state.invalidReason { throw PKError(.invalidPort, "cannot use the send right to \(endpoint): \(reason)") }
            if let connection = state.connection { return .passUnretained(connection) }
            let connection: ZMQConnection
            do throws(PKError) { connection = try ZMQConnectionCache.shared.connection(to: endpoint) } catch {
                guard error.code == .badName else { throw error }
                state.invalidReason = "libzmq refuses to connect to it (\(error.message))"
                invalidated.store(true, ordering: .releasing)
                throw PKError(refusal, "cannot use the send right to \(endpoint): \(state.invalidReason!)")
            }
            state.connection = connection
            madeConnection.store(.passUnretained(connection), ordering: .releasing)
            return .passUnretained(connection)
        }
    }

    var isValid: Bool {
        state.withLock { state in
            state.invalidReason == nil && state.connection?.deadReason == nil
        }
    }

    /// The connection, if one was made and still lives.
    var liveConnection: ZMQConnection? {
        state.withLock { state in state.connection?.deadReason == nil ? state.connection : nil }
    }

    /// Why the right is invalid, or nil.
    var invalidReason: String? {
        state.withLock { state in state.invalidReason ?? state.connection?.deadReason }
    }

    func invalidate(_ reason: String) {
        state.withLock { state in
            if state.invalidReason == nil { state.invalidReason = reason }
            invalidated.store(true, ordering: .releasing)
        }
    }
}
/// A message's own components, encoded as they are when the message holds no port (a message
/// with ports is encoded from `ZMQWireComponent`s, each port's address found once toward the
/// destination, since a wildcard-bound port is advertised per destination).
extension PKZMQComponent: ZMQEncodableComponent {
    var encodableData: [UInt8]? { data }
    var encodablePort: ZMQPortAddress? { port?.right.address }
}
#endif
