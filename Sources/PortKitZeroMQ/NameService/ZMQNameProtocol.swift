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

    /// The bytes of a registration's key: the server gives it in its answer to REGISTER, and an
    /// UNREGISTER must carry it (a LOOKUP gives anyone the port, so the port alone proves
    /// nothing).
    static let keyLength = 8

    /// A request as the service reads it.
    enum Request {
        case register(name: String, port: PKZMQSendPort)
        case lookUp(name: String)
        case unregister(name: String, port: PKZMQSendPort, key: [UInt8])
    }

    /// Reads a request: REGISTER is [name, port], LOOKUP is [name], UNREGISTER is [name, port,
    /// key]; anything else is nil.
    static func request(_ message: PKZMQMessage) -> Request? {
        guard let nameBytes = message.components.first?.data,
              let name = String(validating: nameBytes, as: UTF8.self) else { return nil }
        switch (message.msgid, message.components.count) {
        case (register, 2): return message.components[1].port.map { .register(name: name, port: $0) }
        case (unregister, 3):
            guard let port = message.components[1].port, let key = message.components[2].data, key.count == keyLength else { return nil }
            return .unregister(name: name, port: port, key: key)
        case (lookUp, 1): return .lookUp(name: name)
        default: return nil
        }
    }

    /// A reply: the status, then a lookup's port or a registration's key.
    static func reply(to msgid: UInt32, _ status: Status, port: PKZMQSendPort? = nil, key: [UInt8]? = nil) -> PKZMQMessage {
        var components: [PKZMQComponent] = [.data([status.rawValue])]
        if let port { components.append(.port(port)) }
        if let key { components.append(.data(key)) }
        return PKZMQMessage(msgid: msgid, components: components)
    }

    /// What an ok reply carries.
    enum Answer: Equatable {
        case done
        case port(PKZMQSendPort)
        case key([UInt8])

        var port: PKZMQSendPort? { if case .port(let port) = self { port } else { nil } }
        var key: [UInt8]? { if case .key(let key) = self { key } else { nil } }
    }

    /// Turns a reply into its answer or an error. A reply is one data component of one status
    /// byte, followed, when the status is ok, by a port component (a lookup's answer) or a data
    /// component of `keyLength` bytes (a registration's key); any other shape is a protocol
    /// violation, so a reply read is exactly what `reply(to:_:port:key:)` writes (`ZMQFuzzing`
    /// checks it).
    static func check(_ reply: PKZMQMessage?, name: String, service: String) throws(PKError) -> Answer {
        guard let reply, let statusBytes = reply.components.first?.data, statusBytes.count == 1,
              let status = Status(rawValue: statusBytes[0]) else {
            throw PKError(.protocolViolation, "the name service at \(service) sent a reply PortKit cannot read")
        }
        var answer = Answer.done
        if reply.components.count == 2, status == .ok {
            if let port = reply.components[1].port {
                answer = .port(port)
            } else if let key = reply.components[1].data, key.count == keyLength {
                answer = .key(key)
            }
        }
        guard reply.components.count == 1 || answer != .done else {
            throw PKError(.protocolViolation, "the name service at \(service) sent a reply of \(reply.components.count) components")
        }
        switch status {
        case .ok: return answer
        case .nameInUse: throw PKError(.nameInUse, "the name \"\(name)\" is registered at \(service) by a live owner")
        case .nameNotFound: throw PKError(.nameNotFound, "no port is registered as \"\(name)\" at \(service)")
        case .badName: throw PKError(.badName, "the name service at \(service) refused the name \"\(name)\"")
        case .unreachable: throw PKError(.transport, "the name service at \(service) could not reach the port registered as \"\(name)\"")
        case .badRequest: throw PKError(.protocolViolation, "the name service at \(service) could not read the request")
        }
    }
}
#endif
