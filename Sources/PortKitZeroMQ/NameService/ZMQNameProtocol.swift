#if ZeroMQ
// The name service's requests and replies (protocol.md 10.10): port messages with fixed
// msgids, a name as a data component, a port as a port component, and a one-byte status.

import PortKit

enum ZMQNameProtocol {
    static let register: UInt32 = 1
    static let lookUp: UInt32 = 2
    static let unregister: UInt32 = 3

    /// The one-byte status that starts every reply.
    enum Status: UInt8, Sendable {
        case ok = 0
        case nameInUse = 1
        case nameNotFound = 2
        case badName = 3
        /// The service could not connect to the port within its registration timeout.
        case unreachable = 4
        case badRequest = 5
    }

    /// The bytes of a registration's key: 8 random bytes the registrant draws and sends with its
    /// REGISTER, which an UNREGISTER must carry (a LOOKUP gives anyone the port, so the port
    /// alone proves nothing). The registrant knows it whatever becomes of the answer, and a
    /// REGISTER sent again with the same key is the same registration.
    static let keyLength = 8

    /// A request as the service reads it.
    enum Request {
        case register(name: String, port: PKZMQSendPort, key: [UInt8])
        case lookUp(name: String)
        case unregister(name: String, port: PKZMQSendPort, key: [UInt8])
    }

    /// Reads a request: REGISTER and UNREGISTER are [name, port, key], LOOKUP is [name];
    /// anything else is nil.
    static func request(_ message: PKZMQMessage) -> Request? {
        guard let nameBytes = message.components.first?.data,
              let name = String(validating: nameBytes, as: UTF8.self) else { return nil }
        switch (message.msgid, message.components.count) {
        case (register, 3), (unregister, 3):
            guard let port = message.components[1].port, let key = message.components[2].data, key.count == keyLength else { return nil }
            return message.msgid == register ? .register(name: name, port: port, key: key) : .unregister(name: name, port: port, key: key)
        case (lookUp, 1): return .lookUp(name: name)
        default: return nil
        }
    }

    /// A new registration key.
    static func newKey() -> [UInt8] { (0..<keyLength).map { _ in UInt8.random(in: 0...255) } }

    static func reply(to msgid: UInt32, _ status: Status, port: PKZMQSendPort? = nil) -> PKZMQMessage {
        var components: [PKZMQComponent] = [.data([status.rawValue])]
        if let port { components.append(.port(port)) }
        return PKZMQMessage(msgid: msgid, components: components)
    }

    /// Turns a reply into its port (for a lookup) or an error. A reply is one data component of
    /// one status byte, followed by a port component when the status is ok (a lookup's answer);
    /// any other shape is a protocol violation, so a reply read is exactly what `reply(to:_:port:)`
    /// writes (`ZMQFuzzing` checks it).
    static func check(_ reply: PKZMQMessage?, name: String, service: String) throws(PKError) -> PKZMQSendPort? {
        guard let reply, let statusBytes = reply.components.first?.data, statusBytes.count == 1,
              let status = Status(rawValue: statusBytes[0]) else {
            throw PKError(.protocolViolation, "the name service at \(service) sent a reply PortKit cannot read")
        }
        let port = reply.components.count == 2 ? reply.components[1].port : nil
        guard reply.components.count == 1 || (status == .ok && port != nil) else {
            throw PKError(.protocolViolation, "the name service at \(service) sent a reply of \(reply.components.count) components")
        }
        switch status {
        case .ok: return port
        case .nameInUse: throw PKError(.nameInUse, "the name \"\(name)\" is registered at \(service) by a live owner")
        case .nameNotFound: throw PKError(.nameNotFound, "no port is registered as \"\(name)\" at \(service)")
        case .badName: throw PKError(.badName, "the name service at \(service) refused the name \"\(name)\"")
        case .unreachable: throw PKError(.transport, "the name service at \(service) could not reach the port registered as \"\(name)\"")
        case .badRequest: throw PKError(.protocolViolation, "the name service at \(service) could not read the request")
        }
    }
}
#endif
