// A port message (NSPortMessage): a msgid, ordered data and port components, a reply port.

/// One component of a port message: bytes, or a port (`NSPortMessage`'s `components` array
/// of `NSData` and `NSPort`).
public enum PKPortComponent: Sendable {
    /// Bytes, delivered exactly as sent (any length, zero included).
    case data([UInt8])
    /// A send right to a port; the receiver gets a working send right to the same port.
    case port(PKSendPort)

    /// The bytes, if this is a data component.
    public var data: [UInt8]? { if case .data(let bytes) = self { bytes } else { nil } }
    /// The send right, if this is a port component.
    public var port: PKSendPort? { if case .port(let port) = self { port } else { nil } }
}

/// A message sent to a port (`NSPortMessage`, the message of `CFMessagePortSendRequest`).
///
/// `msgid` is the application's message identifier (the guide's check-in is 100). The
/// components arrive in order. `replyPort` is the port the receiver should answer to: for an
/// incoming message it is exactly the port the sender chose (`-[NSPortMessage sendPort]` of a
/// received message, which Foundation's `SocketPort` loses on Linux and PortKit does not).
///
/// A message of one data component (the usual message) keeps only its bytes: it costs no
/// array of components, on either side of a send. `data` hands those bytes out as they are;
/// `components` makes the one-element array when asked.
public struct PKPortMessage: Sendable {
    /// The message identifier (`-[NSPortMessage msgid]`).
    public var msgid: UInt32
    /// Where replies go, if the sender wants any.
    public var replyPort: PKSendPort?
    /// The components, the usual shape held without an array.
    var body: MessageBody<PKPortComponent>

    /// The data and port components, in order.
    public var components: [PKPortComponent] {
        get { body.components }
        set { body.components = newValue }
        _modify { yield &body.components }
    }

    /// A message.
    ///
    /// - Parameters:
    ///   - msgid: the message identifier.
    ///   - components: data and ports, delivered in this order.
    ///   - replyPort: the port the receiver should answer to (the guide passes its own port).
    public init(msgid: UInt32, components: [PKPortComponent] = [], replyPort: PKSendPort? = nil) {
        self.msgid = msgid
        self.replyPort = replyPort
        self.body = MessageBody(components)
    }

    /// A message whose one component is `bytes`.
    public init(msgid: UInt32, data bytes: [UInt8], replyPort: PKSendPort? = nil) {
        self.msgid = msgid
        self.replyPort = replyPort
        self.body = .bytes(bytes)
    }

    /// The bytes of every data component, concatenated (a message of one data component hands
    /// out its bytes as they are, with no copy).
    public var data: [UInt8] { body.data }

    /// The data components decoded as UTF-8 text (invalid sequences repaired).
    public var text: String { String(decoding: data, as: UTF8.self) }

    /// The port components, in order.
    public var ports: [PKSendPort] { body.ports }

    /// How many components the message has (without making the array).
    var componentCount: Int { body.count }
}

extension PKPortMessage: CustomReflectable {
    /// The message as its fields read (`print`, `dump`), whatever the shape it is held in.
    public var customMirror: Mirror {
        Mirror(self, children: ["msgid": msgid, "components": components, "replyPort": replyPort as Any], displayStyle: .struct)
    }
}

extension Array where Element == PKPortMessage {
    /// Moves the message at `index` out, leaving an empty one in its place: a queue that hands
    /// its messages out this way neither retains their components and reply port on the way
    /// out nor releases them again when it is cleared.
    mutating func takeMessage(at index: Int) -> PKPortMessage {
        var taken = PKPortMessage(msgid: 0)
        swap(&taken, &self[index])
        return taken
    }
}
