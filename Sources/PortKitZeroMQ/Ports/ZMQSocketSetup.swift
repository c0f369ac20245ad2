#if ZeroMQ
// The options every PortKit ZeroMQ socket gets (protocol.md, "ZeroMQ mapping": limits and
// heartbeats), set in one place.

import PortKit

extension ZMQSocket {
    /// A PULL socket for a receive port: `ZMQ_MAXMSGSIZE` from the largest frame the limits
    /// allow, or a batch's if larger (libzmq drops the connection of a peer that sends a bigger
    /// one), `ZMQ_RCVHWM` from `maxQueuedMessages` (frames: a batch counts one), heartbeats.
    static func receiving(limits: PKPortLimits) throws(PKError) -> ZMQSocket {
        let socket = try ZMQSocket(.pull)
        try socket.setOption(ZMQOption.maxMessageSize, int64: Int64(ZMQWireLimits(limits).largestAcceptedFrame))
        try socket.setOption(ZMQOption.receiveHighWaterMark, Int32(clamping: limits.maxQueuedMessages))
        try socket.applyHeartbeat(PKZMQTransport.heartbeat)
        return socket
    }

    /// How long a connection that closes while alive (its last send right is gone) keeps
    /// delivering the messages already queued: a send that succeeded is never dropped just
    /// because its right was released. A dead connection closes with linger 0.
    static let closingLinger: Int32 = 2000

    /// A PUSH socket for the connection behind send rights: `ZMQ_SNDHWM` from
    /// `maxQueuedMessages`, `ZMQ_IMMEDIATE` (a message waits for a live connection instead of
    /// queueing toward a peer that is not there), `ZMQ_LINGER` `closingLinger`, heartbeats.
    static func sending(limits: PKPortLimits) throws(PKError) -> ZMQSocket {
        let socket = try ZMQSocket(.push)
        try socket.setOption(ZMQOption.linger, closingLinger)
        try socket.setOption(ZMQOption.sendHighWaterMark, Int32(clamping: limits.maxQueuedMessages))
        try socket.setOption(ZMQOption.immediate, 1)
        try socket.setOption(ZMQOption.reconnectInterval, 100)
        try socket.setOption(ZMQOption.reconnectIntervalMax, 1000)
        try socket.applyHeartbeat(PKZMQTransport.heartbeat)
        return socket
    }

    private func applyHeartbeat(_ heartbeat: PKZMQHeartbeat) throws(PKError) {
        try setOption(ZMQOption.heartbeatInterval, heartbeat.intervalMilliseconds)
        try setOption(ZMQOption.heartbeatTimeout, heartbeat.timeoutMilliseconds)
        try setOption(ZMQOption.heartbeatTTL, heartbeat.ttlMilliseconds)
    }
}
#endif
