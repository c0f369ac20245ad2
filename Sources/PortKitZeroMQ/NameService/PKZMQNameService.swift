#if ZeroMQ
// The name service's client: register, look up and unregister names at a PKZMQNameServer,
// from any process on any host that reaches it.

import PortKit

/// A client of a `PKZMQNameServer` (`NSPortNameServer` across hosts).
///
/// Every call is a request to the server (`PKZMQSendPort.sendRequest`), so it runs the calling
/// thread's run loop in a private mode while it waits. Safe from any thread.
public struct PKZMQNameService: Sendable {
    /// Where the server is.
    public let endpoint: String
    private let server: PKZMQSendPort
    /// The keys this client (and its copies) registered names with: an UNREGISTER must carry
    /// the name's, and a REGISTER sent again with it is the same registration (protocol.md
    /// 10.10).
    private let keys = Keys()

    private final class Keys: Sendable {
        let byName = ZMQMutex<[String: (port: PKZMQSendPort, key: [UInt8])]>([:])
    }

    /// A client of the server at `endpoint`.
    ///
    /// - Throws: `.badName` for an endpoint PortKit does not accept.
    public init(endpoint: String) throws(PKError) {
        self.endpoint = endpoint
        server = try PKZMQSendPort(connectingTo: endpoint)
    }

    /// Registers `port` under `name`. Returns once the server has connected to the port: from
    /// then on, the name lasts until `unregister`, the port's invalidation, or its owner's death
    /// or, over `tcp://`, silence (its PINGs and its answers to the server's stop).
    ///
    /// - Throws: `.nameInUse` (a live owner holds the name), `.badName`, `.transport` (the server
    ///   could not reach the port), `.sendTimedOut`/`.receiveTimedOut` (no server answered),
    ///   `.interrupted` (the calling thread's loop was stopped while it waited).
    ///
    /// Registering `port` under `name` again (after a timeout, say, whose answer never came) is
    /// the same registration: answered ok if it is in place.
    public func register(_ port: PKZMQSendPort, name: String, timeout: Duration = .seconds(10)) throws(PKError) {
        try PKZMQEndpoint.validate(name: name)
        // Kept before the request goes: whatever becomes of the answer, the registration (if
        // the server made it) is this client's to remove, or to ask for again.
        let key = keys.byName.withLock { keys -> [UInt8] in
            if let kept = keys[name], kept.port == port { return kept.key }
            let key = ZMQNameProtocol.newKey()
            keys[name] = (port, key)
            return key
        }
        let request = PKZMQMessage(msgid: ZMQNameProtocol.register, components: [.data(Array(name.utf8)), .port(port), .data(key)])
        do throws(PKError) {
            let reply = try server.sendRequest(request, sendTimeout: timeout, receiveTimeout: timeout)
            _ = try ZMQNameProtocol.check(reply, name: name, service: endpoint)
        } catch {
            // Refused: not this client's. (A timeout may have left the registration in place.)
            if error.code != .receiveTimedOut && error.code != .interrupted {
                keys.byName.withLock { keys in if keys[name]?.key == key { keys[name] = nil } }
            }
            throw error
        }
    }

    /// Registers a receive port under `name` (its `makeSendRight()`).
    public func register(_ port: PKZMQReceivePort, name: String, timeout: Duration = .seconds(10)) throws(PKError) {
        try register(port.makeSendRight(), name: name, timeout: timeout)
    }

    /// The port registered as `name` (`-[NSPortNameServer portForName:host:]`).
    ///
    /// - Throws: `.nameNotFound`, `.badName`, `.sendTimedOut`/`.receiveTimedOut`, `.interrupted`.
    public func lookUp(_ name: String, timeout: Duration = .seconds(5)) throws(PKError) -> PKZMQSendPort {
        try PKZMQEndpoint.validate(name: name)
        let request = PKZMQMessage(msgid: ZMQNameProtocol.lookUp, components: [.data(Array(name.utf8))])
        let reply = try server.sendRequest(request, sendTimeout: timeout, receiveTimeout: timeout)
        guard let port = try ZMQNameProtocol.check(reply, name: name, service: endpoint) else {
            throw PKError(.protocolViolation, "the name service at \(endpoint) answered a lookup without a port")
        }
        return port
    }

    /// Removes `name`, if `port` holds it and this client (or a copy of it) registered it: the
    /// request carries the key the registration was made with, which a process that only
    /// looked the name up does not have.
    ///
    /// - Throws: `.nameNotFound` if `port` does not hold `name`, or this client did not register
    ///   it; `.badName` if the name is ill-formed; timeouts and `.interrupted` as above.
    public func unregister(name: String, port: PKZMQSendPort, timeout: Duration = .seconds(5)) throws(PKError) {
        try PKZMQEndpoint.validate(name: name)
        guard let registered = keys.byName.withLock({ $0[name] }), registered.port == port else {
            throw PKError(.nameNotFound, "\(port.endpoint) is not registered as \"\(name)\" through this client of \(endpoint)")
        }
        let request = PKZMQMessage(
            msgid: ZMQNameProtocol.unregister, components: [.data(Array(name.utf8)), .port(port), .data(registered.key)])
        let reply = try server.sendRequest(request, sendTimeout: timeout, receiveTimeout: timeout)
        _ = try ZMQNameProtocol.check(reply, name: name, service: endpoint)
        keys.byName.withLock { $0[name] = nil }
    }
}
#endif
