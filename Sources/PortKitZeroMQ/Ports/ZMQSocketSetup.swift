#if ZeroMQ
// The options PortKit's ZeroMQ sockets get (protocol.md, "ZeroMQ mapping": limits, and
// heartbeats at each bind and connect), set in one place.

import PortKit
import Synchronization

extension ZMQSocket {
    /// A PULL socket for a receive port: `ZMQ_MAXMSGSIZE` from the largest frame the limits
    /// allow, or a batch's if larger (libzmq drops the connection of a peer that sends a bigger
    /// one), `ZMQ_RCVHWM` from `maxQueuedMessages` (frames: a batch counts one). Heartbeats
    /// are set at each bind (`setHeartbeats(toward:)`).
    static func receiving(limits: PKPortLimits) throws(PKError) -> ZMQSocket {
        let socket = try ZMQSocket(.pull)
        try socket.setOption(ZMQOption.maxMessageSize, int64: Int64(ZMQWireLimits(limits).largestAcceptedFrame))
        try socket.setOption(ZMQOption.receiveHighWaterMark, Int32(clamping: limits.maxQueuedMessages))
        return socket
    }

    /// How long a connection that closes while alive (its last send right is gone) keeps
    /// delivering the messages already queued: a send that succeeded is never dropped just
    /// because its right was released. A dead connection closes with linger 0.
    static let closingLinger: Int32 = 2000

    /// `ZMQ_HANDSHAKE_IVL` (milliseconds) of every bind and connection but a connection toward
    /// `ipc://` (see `setHeartbeats(toward:connecting:)`): libzmq's default, 30 s. The tests
    /// shorten it.
    static let handshakeMilliseconds = Atomic<Int32>(30_000)

    /// A PUSH socket for the connection behind send rights: `ZMQ_SNDHWM` from
    /// `maxQueuedMessages`, `ZMQ_IMMEDIATE` (a message waits for a live connection instead of
    /// queueing toward a peer that is not there), `ZMQ_LINGER` `closingLinger`. Heartbeats are
    /// set before it connects (`setHeartbeats(toward:)`).
    static func sending(limits: PKPortLimits) throws(PKError) -> ZMQSocket {
        let socket = try ZMQSocket(.push)
        try socket.setOption(ZMQOption.linger, closingLinger)
        try socket.setOption(ZMQOption.sendHighWaterMark, Int32(clamping: limits.maxQueuedMessages))
        try socket.setOption(ZMQOption.immediate, 1)
        try socket.setOption(ZMQOption.reconnectInterval, 100)
        try socket.setOption(ZMQOption.reconnectIntervalMax, 1000)
        return socket
    }

    /// Sets the heartbeats of the next bind or connect to `endpoint` (libzmq copies a socket's
    /// options into each listener and connection as it makes them): `PKZMQTransport.heartbeat`
    /// toward `tcp://`, none toward `ipc://` (protocol.md 10.5). An `ipc://` peer is on this
    /// host: its kernel reports its death at once, and a stopped local process is alive, as
    /// with PortKit's Unix-socket ports. A pending heartbeat timer would also make libzmq's I/O
    /// thread sleep with a timeout, a kernel timer armed and cancelled at every wake-up.
    ///
    /// The handshake's time limit (`ZMQ_HANDSHAKE_IVL`) likewise, for a connection (`connecting`):
    /// `handshakeMilliseconds` toward `tcp://`, none toward `ipc://`, where a peer stopped before
    /// it greets is alive too (with libzmq's 30 s, its connection was dropped and made again
    /// every 30 s). A bound socket keeps the limit: a local client that connects and never
    /// greets does not keep its session for good.
    ///
    /// Only the sending side (the connection) times a silent peer out: `ZMQ_HEARTBEAT_TIMEOUT`
    /// on a connection, 0 on a bind, and no `ZMQ_HEARTBEAT_TTL` asked of a bind by a
    /// connection's PINGs. A receiver whose queue is full has libzmq stop reading its
    /// connections, PINGs and PONGs with the messages, so a receiver that timed its senders out
    /// would drop a live one that is merely ahead of it, and its senders would see it die. Its
    /// own PINGs still go out while it reads nothing: they tell its senders it lives, and a
    /// stopped or lost receiver sends none.
    func setHeartbeats(toward endpoint: ZMQEndpoint, connecting: Bool = false) throws(PKError) {
        let heartbeat: PKZMQHeartbeat? = if case .tcp = endpoint { PKZMQTransport.heartbeat } else { nil }
        let handshake: Int32 = if case .ipc = endpoint, connecting { 0 } else { Self.handshakeMilliseconds.load(ordering: .relaxed) }
        try setOption(ZMQOption.handshakeInterval, handshake)
        try setOption(ZMQOption.heartbeatInterval, heartbeat?.intervalMilliseconds ?? 0)
        try setOption(ZMQOption.heartbeatTimeout, connecting ? heartbeat?.timeoutMilliseconds ?? 0 : 0)
        try setOption(ZMQOption.heartbeatTTL, connecting ? 0 : heartbeat?.ttlMilliseconds ?? 0)
    }
}
#endif
