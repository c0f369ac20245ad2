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
/// - Warning: Loop-only once scheduled, but for `endpoint`, `invalidate()` and `isValid`.
public final class PKZMQNameServer: @unchecked Sendable {
    /// Where the server is bound.
    public var endpoint: String { port.endpoint }
    /// Whether the server still serves. Safe from any thread.
    public var isValid: Bool { port.isValid }
    /// How long a registration may take to reach the registered port.
    public let registrationTimeout: Duration

    private let port: PKZMQReceivePort
    private var names: [String: Registration] = [:]
    private let logger = Logger(label: "PortKitZeroMQ.PKZMQNameServer")

    /// One name; touched only on the server's loop thread (it crosses threads only inside
    /// blocks performed there).
    private final class Registration: @unchecked Sendable {
        let port: PKZMQSendPort
        var watch: PKZMQInvalidationWatch?
        var confirmed = false
        var timer: PKTimer?
        var replyPort: PKZMQSendPort?
        init(port: PKZMQSendPort) { self.port = port }
    }

    /// A name server bound to `endpoint` (`tcp://HOST:PORT` for other hosts).
    ///
    /// - Throws: as `PKZMQReceivePort.init(bindingTo:limits:handler:)`.
    public init(bindingTo endpoint: String, registrationTimeout: Duration = .seconds(5)) throws(PKError) {
        self.registrationTimeout = registrationTimeout
        port = try PKZMQReceivePort(bindingTo: endpoint)
        port.handler = { [unowned self] message in self.handle(message) }
        port.onInvalidation = { [weak self] in
            guard let self else { return }
            for registration in names.values { end(registration) }
            names = [:]
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
    }

    // MARK: - Requests

    private func handle(_ message: PKZMQMessage) {
        guard let request = ZMQNameProtocol.request(message) else {
            answer(message, .badRequest)
            return
        }
        switch request {
        case .lookUp(let name):
            if let registration = names[name], registration.confirmed, registration.port.isValid {
                answer(message, .ok, port: registration.port)
            } else {
                answer(message, .nameNotFound)
            }
        case .unregister(let name, let port):
            guard let registration = names[name], registration.port == port else {
                answer(message, .nameNotFound)
                return
            }
            end(registration)
            names[name] = nil
            answer(message, .ok)
        case .register(let name, let port):
            register(name, port, message)
        }
    }

    private func register(_ name: String, _ port: PKZMQSendPort, _ message: PKZMQMessage) {
        do throws(PKError) { try PKZMQEndpoint.validate(name: name) } catch {
            answer(message, .badName)
            return
        }
        if let existing = names[name] {
            // A live owner keeps its name; a dead one's registration is on its way out.
            guard !existing.port.isValid else { return answer(message, .nameInUse) }
            end(existing)
            names[name] = nil
        }
        guard let loop = self.port.runLoop else { return }
        let registration = Registration(port: port)
        registration.replyPort = message.replyPort
        names[name] = registration
        do throws(PKError) {
            registration.watch = try port.watchInvalidation(on: loop, forMode: .common) { [unowned self] in
                self.dropped(name, registration, why: "its connection died")
            }
        } catch {
            names[name] = nil
            return answer(message, .unreachable)
        }
        let msgid = message.msgid
        registration.timer = loop.scheduleTimer(after: registrationTimeout, forMode: .common) { [unowned self] _ in
            guard !registration.confirmed else { return }
            self.dropped(name, registration, why: "it could not be reached within \(self.registrationTimeout)")
            try? registration.replyPort?.send(ZMQNameProtocol.reply(to: msgid, .unreachable), timeout: .seconds(1))
        }
        port.right.liveConnection?.onEstablished { established in
            guard established else { return }
            loop.perform(inModes: [.common]) { [self] in self.confirm(name, registration, msgid) }
        }
    }

    private func confirm(_ name: String, _ registration: Registration, _ msgid: UInt32) {
        guard names[name] === registration, !registration.confirmed else { return }
        registration.confirmed = true
        registration.timer?.invalidate()
        logger.debug("registered \"\(name)\" at \(registration.port.endpoint)")
        try? registration.replyPort?.send(ZMQNameProtocol.reply(to: msgid, .ok), timeout: .seconds(5))
        registration.replyPort = nil
    }

    private func dropped(_ name: String, _ registration: Registration, why: String) {
        guard names[name] === registration else { return }
        logger.debug("dropped \"\(name)\" at \(registration.port.endpoint): \(why)")
        end(registration)
        names[name] = nil
    }

    private func end(_ registration: Registration) {
        registration.watch?.cancel()
        registration.watch = nil
        registration.timer?.invalidate()
        registration.timer = nil
    }

    private func answer(_ message: PKZMQMessage, _ status: ZMQNameProtocol.Status, port: PKZMQSendPort? = nil) {
        try? message.replyPort?.send(ZMQNameProtocol.reply(to: message.msgid, status, port: port), timeout: .seconds(5))
    }
}

extension PKRunLoop {
    /// Adds a ZeroMQ name server to `mode`: it serves while the loop runs that mode. Loop-only.
    public func add(_ server: PKZMQNameServer, forMode mode: PKRunLoopMode) throws(PKError) {
        try server.schedule(on: self, forMode: mode)
    }
}
#endif
