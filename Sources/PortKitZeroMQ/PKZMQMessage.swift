#if ZeroMQ
// The port message of the ZeroMQ transport: the same model as PKPortMessage (a msgid, ordered
// data and port components, a reply port), with ports that are ZeroMQ send rights.

import PortKit

/// One component of a ZeroMQ port message: bytes, or a port.
public enum PKZMQComponent: Sendable {
    /// Bytes, delivered exactly as sent (any length, zero included).
    case data([UInt8])
    /// A send right to a ZeroMQ port; it travels as its endpoint, and the receiver gets a send
    /// right that connects there.
    case port(PKZMQSendPort)

    /// The bytes, if this is a data component.
    public var data: [UInt8]? { if case .data(let bytes) = self { bytes } else { nil } }
    /// The send right, if this is a port component.
    public var port: PKZMQSendPort? { if case .port(let port) = self { port } else { nil } }
}

/// A message sent to a ZeroMQ port: `PKPortMessage`'s model over ZeroMQ.
///
/// `msgid` is the application's identifier (the guide's check-in is 100), the components arrive
/// in order, and `replyPort` is where the receiver should answer: for an incoming message,
/// exactly the port the sender chose. protocol.md's "ZeroMQ mapping" gives the frames.
///
/// As `PKPortMessage`, a message of one data component (the usual message) keeps only its bytes:
/// `data` hands them out as they are, `components` makes the one-element array when read.
public struct PKZMQMessage: Sendable {
    /// The message identifier.
    public var msgid: UInt32
    /// Where replies go, if the sender wants any.
    public var replyPort: PKZMQSendPort?
    /// The components, the usual shape held without an array.
    var body: MessageBody<PKZMQComponent>

    /// The data and port components, in order.
    public var components: [PKZMQComponent] {
        get { body.components }
        set { body.components = newValue }
        _modify { yield &body.components }
    }

    /// A message.
    public init(msgid: UInt32, components: [PKZMQComponent] = [], replyPort: PKZMQSendPort? = nil) {
        self.msgid = msgid
        self.replyPort = replyPort
        self.body = MessageBody(components)
    }

    /// `MessageBody.takeBytes()` for this module's messages: the generic one, called from here,
    /// runs unspecialized (about 100 instructions a message; this one about 10).
    mutating func takeBytes() -> [UInt8]? {
        guard case .bytes = body else { return nil }
        var taken = MessageBody<PKZMQComponent>.components([])
        swap(&taken, &body)
        guard case .bytes(let bytes) = consume taken else { preconditionFailure("unreachable: checked above") }
        return bytes
    }

    /// A message whose one component is `bytes`.
    public init(msgid: UInt32, data bytes: [UInt8], replyPort: PKZMQSendPort? = nil) {
        self.msgid = msgid
        self.replyPort = replyPort
        self.body = .bytes(bytes)
    }

    /// The data of a core `PKPortMessage` under the same msgid. Its port components and reply
    /// port are send rights of the Unix-socket transport, which cannot travel over ZeroMQ.
    ///
    /// - Throws: `.limitExceeded` if `message` holds a port or a reply port.
    public init(dataOf message: PKPortMessage) throws(PKError) {
        var components: [PKZMQComponent] = []
        for component in message.components {
            guard case .data(let bytes) = component else {
                throw PKError(.limitExceeded, "a Unix-socket send right cannot travel over ZeroMQ; send a PKZMQSendPort")
            }
            components.append(.data(bytes))
        }
        guard message.replyPort == nil else {
            throw PKError(.limitExceeded, "a Unix-socket reply port cannot travel over ZeroMQ; use a PKZMQSendPort")
        }
        self.init(msgid: message.msgid, components: components)
    }

    /// The bytes of every data component, concatenated (a message of one data component hands
    /// out its bytes as they are, with no copy).
    public var data: [UInt8] { body.data }

    /// The data components decoded as UTF-8 text (invalid sequences repaired).
    public var text: String { String(decoding: data, as: UTF8.self) }

    /// The port components, in order.
    public var ports: [PKZMQSendPort] { body.ports }
}

extension PKZMQComponent: MessageComponent {}

extension PKZMQMessage: CustomReflectable {
    /// The message as its fields read (`print`, `dump`), whatever the shape it is held in.
    public var customMirror: Mirror {
        Mirror(self, children: ["msgid": msgid, "components": components, "replyPort": replyPort as Any], displayStyle: .struct)
    }
}
#endif
