#if ZeroMQ
// The name service's server: a ZeroMQ receive port that maps names to ports (endpoints) for
// processes on any host. A registration lives as long as the server's connection to the
// registered port: when that port's owner dies (noticed at once) or, over tcp://, falls silent
// (within the heartbeat bound), the name goes.

import Logging
import PortKit

/// A name server reachable over ZeroMQ (the cross-host counterpart of `PKNameServer`).
///
/// Schedule it on a run loop with `PKRunLoop.add(_:forMode:)`, like a port; it answers
/// `PKZMQNameService` requests while the loop runs. To register, the service connects to the
/// port being registered and answers only once the ZMTP handshake succeeded (or says the port
/// is unreachable after `registrationTimeout`); from then on the connection watches the port's
/// owner (with heartbeats over `tcp://`), and the name is dropped when that connection dies.
/// A second registrant of a live name gets `.nameInUse`. Names follow the name server's rule:
/// 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not starting with a dot. Its requests and
/// replies are in protocol.md, section 10.10.
///
/// Everything it does runs in the modes it was added to: requests, the confirmation of a
/// registration, its timeout, and the watch on each registered port. Like a port added to a
/// run loop (`-[NSRunLoop addPort:forMode:]`), a scheduled server is kept alive by its loop
/// until it is invalidated (or its loop's thread ends); dropping your reference does not stop
/// it. Its loop never waits for a client: a reply whose connection to the client is not made
/// yet waits for it off the loop, up to `replyPatience`, and is then dropped (the client's
/// request times out).
///
/// - Warning: Loop-only once scheduled, but for `endpoint`, `invalidate()` and `isValid`.
public final class PKZMQNameServer: @unchecked Sendable {
    /// Where the server is bound.
    public var endpoint: String { port.endpoint }
    /// Whether the server still serves. Safe from any thread.
    public var isValid: Bool { port.isValid }
    /// How long a registration may take to reach the registered port.
    public let registrationTimeout: Duration
    /// How long a reply may wait for its connection to the client before it is dropped.
    public static let replyPatience = Duration.seconds(5)
    /// The most replies that wait for their connections at once; beyond it the oldest goes.
    static let maxWaitingReplies = 256
    /// The most registrations that wait for their confirmation at once (each holds a connection
    /// being made, several descriptors and libzmq sockets); beyond it a REGISTER is answered
    /// 4, unreachable, at once.
    static let maxPendingRegistrations = 64

    private let port: PKZMQReceivePort
    private let logger = Logger(label: "PortKitZeroMQ.PKZMQNameServer")

    // Loop-only state.
    private var names: [String: Registration] = [:]
    /// The registrations not confirmed yet (`maxPendingRegistrations`).
    private var pendingRegistrations = 0
    /// The modes the server was added to, where all its work runs.
    private var modes: [PKRunLoopMode] = []
    /// Replies waiting for their connections (`reply(_:to:)`), oldest first.
    private var waitingReplies: [WaitingReply] = []
    /// Drops the waiting replies whose patience ran out.
    private var replyExpiry: PKTimer?

    /// The server for a block that crosses to another thread and back to its loop, where it
    /// is read: it must not keep the server alive, nor release it on another thread.
    private final class WeakServer: @unchecked Sendable {
        weak var value: PKZMQNameServer?
        init(_ value: PKZMQNameServer) { self.value = value }
    }

    /// A registration, reached from the background loop's thread only to be handed back to
    /// the server's loop.
    private final class WeakRegistration: @unchecked Sendable {
        weak var value: Registration?
        init(_ value: Registration) { self.value = value }
    }

    /// A reply whose connection to the client was not made yet.
    private struct WaitingReply {
        let message: PKZMQMessage
        let port: PKZMQSendPort
        let connection: ZMQConnection
        let deadline: PKDeadline
    }

    /// One name; touched only on the server's loop thread (it crosses threads only inside
    /// blocks performed there).
    private final class Registration: @unchecked Sendable {
        let port: PKZMQSendPort
        /// The registrant's key: an UNREGISTER, or the REGISTER sent again, must carry it.
        let key: [UInt8]
        var watch: PKZMQInvalidationWatch?
        var confirmed = false
        /// Counted in `pendingRegistrations` until confirmed or ended.
        var countedAsPending = false
        var timer: PKTimer?
        var replyPort: PKZMQSendPort?
        init(port: PKZMQSendPort, key: [UInt8]) {
            self.port = port
            self.key = key
        }
    }

    /// A name server bound to `endpoint` (`tcp://HOST:PORT` for other hosts).
    ///
    /// - Throws: as `PKZMQReceivePort.init(bindingTo:limits:handler:)`.
    public init(bindingTo endpoint: String, registrationTimeout: Duration = .seconds(5)) throws(PKError) {
        self.registrationTimeout = registrationTimeout
        port = try PKZMQReceivePort(bindingTo: endpoint)
        port.onInvalidation = { [weak self] in
            guard let self else { return }
            // The port lets go of the server (see `schedule`): the loop no longer keeps it.
            port.handler = { _ in }
            for registration in names.values { end(registration) }
            names = [:]
            waitingReplies = []
            replyExpiry?.invalidate()
            replyExpiry = nil
        }
    }

    /// The names registered now, sorted. Loop-only.
    public var registeredNames: [String] { names.filter { $0.value.confirmed }.keys.sorted() }

    /// Stops serving: the port closes and every registration is forgotten. Safe from any thread.
    public func invalidate() {
        port.invalidate()
    }

    func schedule(on loop: PKRunLoop, forMode mode: PKRunLoopMode) throws(PKError) {
        try loop.add(port, forMode: mode)
        if !modes.contains(mode) { modes.append(mode) }
        // The loop keeps the scheduled port, and the port's handler keeps the server, until the
        // port's invalidation lets go of it.
        port.handler = { [self] message in handle(message) }
    }

    /// Adds a one-shot timer to every mode of the server.
    private func scheduleTimer(on loop: PKRunLoop, at fireDate: PKDeadline, _ handler: @escaping (PKTimer) -> Void) -> PKTimer {
        let timer = PKTimer(fireDate: fireDate, handler: handler)
        for mode in modes { loop.add(timer, forMode: mode) }
        return timer
    }

    // MARK: - Requests

    private func handle(_ message: PKZMQMessage) {
        guard let request = ZMQNameProtocol.request(message) else {
            answer(message, .badRequest)
            return
        }
        // An ill-formed name is answered as one (status 3) whatever the request, not as a name
        // nobody registered.
        switch request {
        case .lookUp(let name) where !Self.isWellFormed(name), .unregister(let name, _, _) where !Self.isWellFormed(name):
            answer(message, .badName)
        case .lookUp(let name):
            if let registration = names[name], registration.confirmed, registration.port.isValid {
                answer(message, .ok, port: registration.port)
            } else {
                answer(message, .nameNotFound)
            }
        case .unregister(let name, let port, let key):
            // The port alone proves nothing (a LOOKUP gives it to anyone): the key the
            // registrant was given does.
            guard let registration = names[name], registration.confirmed, registration.port == port, registration.key == key else {
                answer(message, .nameNotFound)
                return
            }
            end(registration)
            names[name] = nil
            answer(message, .ok)
        case .register(let name, let port, let key):
            register(name, port, key, message)
        }
    }

    private static func isWellFormed(_ name: String) -> Bool {
        (try? PKZMQEndpoint.validate(name: name)) != nil
    }

    private func register(_ name: String, _ port: PKZMQSendPort, _ key: [UInt8], _ message: PKZMQMessage) {
        guard Self.isWellFormed(name) else { return answer(message, .badName) }
        if let existing = names[name], existing.port == port, existing.key == key, existing.port.isValid {
            // The registrant asking again (its answer was lost, or came after it gave up): the
            // same registration, answered now if confirmed, else when it is.
            if existing.confirmed { return answer(message, .ok) }
            existing.replyPort = message.replyPort
            return
        }
        if let existing = names[name] {
            // A live owner keeps its name; a dead one's registration is on its way out.
            guard !existing.port.isValid else { return answer(message, .nameInUse) }
            end(existing)
            names[name] = nil
        }
        guard let loop = self.port.runLoop else { return }
        guard pendingRegistrations < Self.maxPendingRegistrations else {
            logger.debug("refused to register \"\(name)\": \(pendingRegistrations) registrations wait for their ports")
            return answer(message, .unreachable)
        }
        let registration = Registration(port: port, key: key)
        registration.countedAsPending = true
        pendingRegistrations += 1
        registration.replyPort = message.replyPort
        names[name] = registration
        let msgid = message.msgid
        do throws(PKError) {
            registration.watch = try port.watchInvalidation(on: loop, forModes: modes) { [weak self] in
                guard let self else { return }
                // Before its confirmation (the port refused the handshake, or its connection
                // died first), the registrant is told at once (status 4), not left to time out.
                let unconfirmed = names[name] === registration && !registration.confirmed
                dropped(name, registration, why: "its connection died")
                if unconfirmed { reply(ZMQNameProtocol.reply(to: msgid, .unreachable), to: registration.replyPort) }
            }
        } catch {
            names[name] = nil
            uncountPending(registration)
            return answer(message, .unreachable)
        }
        registration.timer = scheduleTimer(on: loop, at: .after(registrationTimeout)) { [weak self] _ in
            guard let self, !registration.confirmed else { return }
            dropped(name, registration, why: "it could not be reached within \(registrationTimeout)")
            reply(ZMQNameProtocol.reply(to: msgid, .unreachable), to: registration.replyPort)
        }
        // The registration is reached weakly: the connection keeps this handler until it is
        // made or dies, and one toward an endpoint nobody binds is neither; held strongly, the
        // registration kept the connection (and so the handler) for the process's life.
        let modes = self.modes
        let server = WeakServer(self)
        let pending = WeakRegistration(registration)
        port.right.liveConnection?.onEstablished { established in
            guard established else { return }
            loop.perform(inModes: modes) {
                guard let registration = pending.value else { return }
                server.value?.confirm(name, registration, msgid)
            }
        }
    }

    private func confirm(_ name: String, _ registration: Registration, _ msgid: UInt32) {
        guard names[name] === registration, !registration.confirmed else { return }
        registration.confirmed = true
        uncountPending(registration)
        registration.timer?.invalidate()
        logger.debug("registered \"\(name)\" at \(registration.port.endpoint)")
        reply(ZMQNameProtocol.reply(to: msgid, .ok), to: registration.replyPort)
        registration.replyPort = nil
    }

    private func dropped(_ name: String, _ registration: Registration, why: String) {
        guard names[name] === registration else { return }
        logger.debug("dropped \"\(name)\" at \(registration.port.endpoint): \(why)")
        end(registration)
        names[name] = nil
    }

    private func uncountPending(_ registration: Registration) {
        guard registration.countedAsPending else { return }
        registration.countedAsPending = false
        pendingRegistrations -= 1
    }

    private func end(_ registration: Registration) {
        uncountPending(registration)
        registration.watch?.cancel()
        registration.watch = nil
        registration.timer?.invalidate()
        registration.timer = nil
    }

    private func answer(_ message: PKZMQMessage, _ status: ZMQNameProtocol.Status, port: PKZMQSendPort? = nil) {
        reply(ZMQNameProtocol.reply(to: message.msgid, status, port: port), to: message.replyPort)
    }

    // MARK: - Replies

    /// Sends `message` to `replyPort` without waiting: at once if its connection is made and
    /// has room; if not, the reply waits for the connection off the loop (up to
    /// `replyPatience`), and is tried once more when it is made (`sendWaitingReplies`); a reply
    /// that cannot go then is dropped, and the client's request times out. The loop never
    /// waits for a client (protocol.md 10.10).
    private func reply(_ message: PKZMQMessage, to replyPort: PKZMQSendPort?) {
        guard let replyPort else { return }
        do throws(PKError) {
            try replyPort.send(message, before: .now)
            return
        } catch where error.code == .sendTimedOut {
            // The connection is not made yet, or the client's queue is full.
        } catch {
            return logger.debug("dropped a reply to \(replyPort.endpoint): \(error)")
        }
        // It waits even if the connection is made by now (it may have been made since the send
        // was tried): `onEstablished` then runs at once, and the reply is tried once more.
        guard let connection = replyPort.right.liveConnection, let loop = port.runLoop else {
            return logger.debug("dropped a reply to \(replyPort.endpoint): its connection died")
        }
        if waitingReplies.count >= Self.maxWaitingReplies {
            logger.debug("dropped a reply to \(waitingReplies[0].port.endpoint): too many replies wait for their connections")
            waitingReplies.removeFirst()
        }
        let alreadyWatched = waitingReplies.contains { $0.connection === connection }
        waitingReplies.append(WaitingReply(message: message, port: replyPort, connection: connection, deadline: .after(Self.replyPatience)))
        if !alreadyWatched {
            // On the background loop's thread (or at once, if it was made meanwhile).
            let (modes, server) = (self.modes, WeakServer(self))
            connection.onEstablished { _ in
                loop.perform(inModes: modes) { server.value?.sendWaitingReplies() }
            }
        }
        if replyExpiry == nil {
            replyExpiry = scheduleTimer(on: loop, at: waitingReplies[0].deadline) { [weak self] _ in
                self?.replyExpiry = nil
                self?.sendWaitingReplies()
            }
        }
    }

    /// Sends the waiting replies whose connection was made (or drops them if it died), drops
    /// those whose patience ran out, and keeps the others, with a timer for the oldest.
    private func sendWaitingReplies() {
        var kept: [WaitingReply] = []
        for waiting in waitingReplies {
            let connection = waiting.connection
            if connection.isEstablished || connection.deadReason != nil {
                do throws(PKError) { try waiting.port.send(waiting.message, before: .now) } catch {
                    logger.debug("dropped a reply to \(waiting.port.endpoint): \(error)")
                }
            } else if waiting.deadline.hasPassed {
                logger.debug("dropped a reply to \(waiting.port.endpoint): no connection within \(Self.replyPatience)")
            } else {
                kept.append(waiting)
            }
        }
        waitingReplies = kept
        guard replyExpiry == nil, let first = kept.first, let loop = port.runLoop else { return }
        replyExpiry = scheduleTimer(on: loop, at: first.deadline) { [weak self] _ in
            self?.replyExpiry = nil
            self?.sendWaitingReplies()
        }
    }
}

extension PKRunLoop {
    /// Adds a ZeroMQ name server to `mode`: it serves while the loop runs that mode. Loop-only.
    public func add(_ server: PKZMQNameServer, forMode mode: PKRunLoopMode) throws(PKError) {
        try server.schedule(on: self, forMode: mode)
    }
}
#endif
