#if ZeroMQ
// The sending side: one PUSH socket connected to one endpoint, shared by every send right to
// that endpoint in this process (so a reply port received in many messages costs one
// connection). Any thread may send: the socket lives under a lock, taken for each whole
// message, so a message is never interleaved with another thread's (the lock, not a socket per
// thread: a connection per endpoint and process keeps the order of all messages sent to it).
//
// Its monitor tells it when the peer goes: once connected (the ZMTP handshake succeeded), a
// disconnection, whether the peer closed, died or fell silent past the heartbeat timeout, kills
// the connection for good, as the death of a Mach port's receiver kills its send rights. A
// connection that never succeeded keeps trying (ZeroMQ connects in the background); its
// messages wait for it until their send deadline.

import PortKit
import Synchronization

final class ZMQConnection: @unchecked Sendable {
    let endpoint: ZMQEndpoint
    /// The PUSH socket; nil once the connection is dead. Held for a whole send, waits included.
    private let socket: ZMQMutex<ZMQSocket?>
    /// Wakes a send that waits for room when the connection dies.
    private let interrupt: InterruptSignal
    private let state = ZMQMutex<State>(State())
    /// Set, under `state`'s lock, when `deadReason` is: a live connection answers `deadReason`
    /// (every send asks) with one load instead of a lock.
    private let isDead = Atomic<Bool>(false)

    private struct State {
        var established = false
        var deadReason: String?
        var deathHandlers: [Int: @Sendable (String) -> Void] = [:]
        var establishedHandlers: [@Sendable (Bool) -> Void] = []
        var nextToken = 0
    }

    /// Connects to `endpoint` in the background (libzmq's `zmq_connect` returns at once).
    init(endpoint: ZMQEndpoint, limits: PKPortLimits = .default) throws(PKError) {
        self.endpoint = endpoint
        let push = try ZMQSocket.sending(limits: limits)
        let monitor = try ZMQMonitor(monitoring: push)
        try push.connect(endpoint.description)
        interrupt = try InterruptSignal()
        socket = ZMQMutex(push)
        monitor.start { [weak self] event in self?.monitorReported(event) }
    }

    /// Why the connection died, or nil while it lives. Safe from any thread.
    var deadReason: String? {
        guard isDead.load(ordering: .acquiring) else { return nil }
        return state.withLock { $0.deadReason }
    }

    /// Whether the ZMTP handshake with the peer has succeeded.
    var isEstablished: Bool { state.withLock { $0.established } }

    // MARK: - Sending

    /// Sends one message (its one frame), waiting for room (or for the connection) until
    /// `deadline`.
    ///
    /// - Throws: `.invalidPort` (the connection is or became dead), `.sendTimedOut`, `.transport`.
    func send(_ frame: consuming ZMQOutgoingFrame, before deadline: PKDeadline) throws(PKError) {
        try socket.withLock { socket throws(PKError) in
            while true {
                if let reason = deadReason { throw PKError(.invalidPort, "cannot send to \(endpoint): \(reason)") }
                // Used in place (`socket?.`), not bound to a constant: a binding would retain it.
                guard let sent = try socket?.send(&frame) else {
                    throw PKError(.invalidPort, "cannot send to \(endpoint): the connection is closed")
                }
                if sent { return }
                guard let socket else { continue }  // not nil: it has just been used, under the lock
                // The edge rule for sending: read ZMQ_EVENTS (which rearms ZMQ_FD) and try again
                // while it shows room; only then sleep on ZMQ_FD.
                if socket.events.canSend { continue }
                if deadline.hasPassed {
                    let why = isEstablished
                        ? "the receiver's queue stayed full until the send deadline"
                        : "no connection to \(endpoint) was made before the send deadline"
                    throw PKError(.sendTimedOut, "\(why); nothing was sent")
                }
                _ = Descriptors.waitReadable([socket.pollDescriptor, interrupt.descriptor], until: deadline)
            }
        }
    }

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
            if state.established { return true }
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
        socket.withLock { socket in
            try? socket?.setOption(ZMQOption.linger, 0)
            socket?.close()
            socket = nil
        }
        ZMQConnectionCache.shared.forget(self)
        for handler in waiting { handler(false) }
        for handler in handlers { handler(reason) }
    }

    private func monitorReported(_ event: Int32) {
        switch event {
        case ZMQMonitorEvent.handshakeSucceeded:
            let waiting = state.withLock { state -> [@Sendable (Bool) -> Void] in
                state.established = true
                defer { state.establishedHandlers = [] }
                return state.establishedHandlers
            }
            for handler in waiting { handler(true) }
        case ZMQMonitorEvent.disconnected:
            if isEstablished { die("the port at \(endpoint) is gone (its connection closed, or its heartbeat stopped)") }
        case let failed where failed & ZMQMonitorEvent.handshakeFailed != 0:
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
#endif
