#if ZeroMQ
// The reading side of protocol.md's ZeroMQ mapping: a pure state machine fed one frame at a
// time (its bytes and libzmq's "more" flag), answering "need more", "a message", or "a
// violation". A frame holds one message, or a batch of them one after another (each but the
// last flagged FOLLOWED); a violation drops the message it is in and the rest of its frame,
// never the port. A ZeroMQ message of several frames is dropped whole: the decoder skips the
// rest of its frames and starts afresh with the next. No sockets here: the tests feed it frames
// by hand.

import PortKit

/// A component as the decoder makes it: from bytes (`MessageComponent.data(_:)`), or from a
/// port's address. The receive ports decode straight into `PKZMQComponent` (no second array
/// per message); the tests and the fuzzer into `ZMQWireComponent`, whose ports stay addresses.
protocol ZMQDecodableComponent: MessageComponent {
    static func decoded(port: ZMQPortAddress) -> Self
}

extension ZMQWireComponent: ZMQDecodableComponent {
    static func decoded(port: ZMQPortAddress) -> Self { .port(port) }
    var data: [UInt8]? { if case .data(let bytes) = self { bytes } else { nil } }
    var port: ZMQPortAddress? { if case .port(let address) = self { address } else { nil } }
}

/// A message as decoded from the wire, its reply port still an address.
struct ZMQDecoded<Component: ZMQDecodableComponent> {
    var msgid: UInt32
    /// The port id the message is for, at the receiving endpoint.
    var destination: UInt64
    /// The components; one data component (the usual message) is its bytes alone, with no
    /// array, as a message holds them (`MessageBody`).
    var body: MessageBody<Component>
    var reply: ZMQPortAddress?

    init(msgid: UInt32, destination: UInt64, components: [Component], reply: ZMQPortAddress?) {
        self.init(msgid: msgid, destination: destination, body: MessageBody(components), reply: reply)
    }

    init(msgid: UInt32, destination: UInt64, body: MessageBody<Component>, reply: ZMQPortAddress?) {
        self.msgid = msgid
        self.destination = destination
        self.body = body
        self.reply = reply
    }

    /// The components, in order (made into an array for a message of one data component).
    var components: [Component] {
        get { body.components }
        set { body.components = newValue }
        _modify { yield &body.components }
    }
}

extension ZMQDecoded: Equatable where Component: Equatable {
    /// Equal when they decode to the same message.
    static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.msgid == rhs.msgid && lhs.destination == rhs.destination && lhs.reply == rhs.reply
            && lhs.components == rhs.components
    }
}
extension ZMQDecoded: Sendable where Component: Sendable {}

/// A decoded message whose ports are all still addresses.
typealias ZMQDecodedMessage = ZMQDecoded<ZMQWireComponent>
/// The decoder the tests and the fuzzer use.
typealias ZMQMessageDecoder = ZMQDecoder<ZMQWireComponent>

struct ZMQDecoder<Component: ZMQDecodableComponent> {
    enum Output {
        /// The frame was taken and skipped: it belongs to a message already dropped.
        case needMore
        case message(ZMQDecoded<Component>)
        /// The message breaks protocol.md; it is dropped. The reason says how.
        case violation(String)
    }

    let limits: ZMQWireLimits
    /// Skipping the frames of a dropped multipart message until its last frame.
    private var discarding = false

    init(limits: ZMQWireLimits) { self.limits = limits }

    /// Whether the decoder is between messages.
    var isIdle: Bool { !discarding }

    /// Takes the next frame of the stream and returns what it holds, in order: each message of
    /// a batch, up to a violation that drops the rest of the frame; or `.needMore` alone for a
    /// skipped frame.
    mutating func consume(_ frame: UnsafeRawBufferPointer, more: Bool) -> [Output] {
        if let verdict = begin(frameWithMore: more) { return [verdict] }
        var outputs: [Output] = []
        var offset = 0
        var none: [UInt8] = []
        while offset < frame.count || outputs.isEmpty {
            outputs.append(next(in: frame, at: &offset, reusing: &none))
        }
        return outputs
    }

    /// Starts a frame the socket delivered with libzmq's "more" flag `more`: nil when its
    /// messages are to be read with `next(in:at:reusing:)`, from offset 0 until the offset
    /// reaches the frame's end; `.needMore` for a frame to skip (the rest of a message already
    /// dropped); a violation for the first frame of a ZeroMQ message of several frames.
    mutating func begin(frameWithMore more: Bool) -> Output? {
        if discarding {
            if !more { discarding = false }
            return .needMore
        }
        if more {
            discarding = true
            return .violation("the message has more than one ZeroMQ frame (a PortKit message is one frame since version 2)")
        }
        return nil
    }

    /// Reads the message that starts at `offset` in `frame` and moves `offset` past it: to the
    /// next message of a batch, or to the frame's end. A violation moves it to the frame's end
    /// (what follows a broken message cannot be found). A message of one data component gets
    /// its bytes in `spare`'s storage when it has the room (see `SpareBytes.copy(_:reusing:)`).
    func next(in frame: UnsafeRawBufferPointer, at offset: inout Int, reusing spare: inout [UInt8]) -> Output {
        var reader = Reader(frame: frame, offset: offset)
        switch reader.message(limits: limits, reusing: &spare) {
        case .success(let message):
            offset = reader.offset
            return .message(message)
        case .failure(let reason):
            offset = frame.count
            return .violation(reason.text)
        }
    }

    struct Reason: Error { let text: String }

    /// Reads one message from `offset`; every read checks the bytes left first.
    private struct Reader {
        let frame: UnsafeRawBufferPointer
        var offset: Int

        init(frame: UnsafeRawBufferPointer, offset: Int) {
            self.frame = frame
            self.offset = offset
        }

        var left: Int { frame.count - offset }

        mutating func message(limits: ZMQWireLimits, reusing spare: inout [UInt8]) -> Result<ZMQDecoded<Component>, Reason> {
            guard left >= ZMQWireFormat.headerSize else {
                return .failure(Reason(text: "the message is \(left) bytes, shorter than the \(ZMQWireFormat.headerSize)-byte header"))
            }
            let start = offset
            guard frame.loadLittleEndian(at: start, as: UInt32.self) == ZMQWireFormat.magicWord else {
                return .failure(Reason(text: "the header's magic is not \"PKZM\""))
            }
            let version = frame.loadLittleEndian(at: start + 4, as: UInt16.self)
            guard version == ZMQWireFormat.version else {
                return .failure(Reason(text: "version \(version) is not supported (only \(ZMQWireFormat.version))"))
            }
            let flags = frame.loadLittleEndian(at: start + 6, as: UInt16.self)
            guard flags & ~ZMQWireFormat.knownFlags == 0 else { return .failure(Reason(text: "unknown header flags \(flags)")) }
            let count = Int(frame.loadLittleEndian(at: start + 12, as: UInt16.self))
            guard frame.loadLittleEndian(at: start + 14, as: UInt16.self) == 0 else {
                return .failure(Reason(text: "the header's reserved field is not 0"))
            }
            guard count <= limits.maxComponents else { return .failure(Reason(text: "\(count) components; the limit is \(limits.maxComponents)")) }
            var message = ZMQDecoded<Component>(
                msgid: frame.loadLittleEndian(at: start + 8, as: UInt32.self),
                destination: frame.loadLittleEndian(at: start + 16, as: UInt64.self),
                body: .components([]), reply: nil)
            offset = start + ZMQWireFormat.headerSize

            var bytes = 0
            var ports = 0
            if count == 1 && left > 0 && frame[offset] == ZMQWireFormat.typeData {
                // One data component, the common case: its bytes alone, no array.
                switch data(bytes: &bytes, limits: limits, reusing: &spare) {
                case .success(let data): message.body = .bytes(data)
                case .failure(let reason): return .failure(reason)
                }
            } else if count == 1 {
                // One port (or a broken component): an array literal, not the growth path.
                switch component(bytes: &bytes, ports: &ports, limits: limits) {
                case .success(let component): message.body = .components([component])
                case .failure(let reason): return .failure(reason)
                }
            } else if count > 1 {
                // No more than the frame can hold (a component takes at least a data prefix):
                // a small frame that announces many components allocates nothing for them.
                var components: [Component] = []
                components.reserveCapacity(min(count, left / ZMQWireFormat.dataPrefix))
                for _ in 0..<count {
                    switch component(bytes: &bytes, ports: &ports, limits: limits) {
                    case .success(let component): components.append(component)
                    case .failure(let reason): return .failure(reason)
                    }
                }
                message.body = .components(components)
            }
            if flags & ZMQWireFormat.flagReplyPort != 0 {
                guard left > 0 else { return .failure(Reason(text: "the message ends before its reply port")) }
                guard frame[offset] == ZMQWireFormat.typePort else { return .failure(Reason(text: "the reply port is not a port component")) }
                ports += 1
                guard ports <= limits.maxPorts else { return .failure(Reason(text: "more than \(limits.maxPorts) ports")) }
                switch port() {
                case .success(let address): message.reply = address
                case .failure(let reason): return .failure(reason)
                }
            }
            if flags & ZMQWireFormat.flagFollowed != 0 {
                guard left > 0 else { return .failure(Reason(text: "the frame ends where its message announces another (FOLLOWED)")) }
            } else {
                guard left == 0 else { return .failure(Reason(text: "\(left) bytes follow the message's last component")) }
            }
            return .success(message)
        }

        private mutating func component(bytes: inout Int, ports: inout Int, limits: ZMQWireLimits)
            -> Result<Component, Reason>
        {
            guard left > 0 else { return .failure(Reason(text: "the message ends before the components its header announces")) }
            switch frame[offset] {
            case ZMQWireFormat.typeData:
                var none: [UInt8] = []
                return data(bytes: &bytes, limits: limits, reusing: &none).map { .data($0) }
            case ZMQWireFormat.typePort:
                ports += 1
                guard ports <= limits.maxPorts else { return .failure(Reason(text: "more than \(limits.maxPorts) ports")) }
                return port().map { .decoded(port: $0) }
            case let type:
                return .failure(Reason(text: "a component of unknown type \(type)"))
            }
        }

        /// A data component (its type byte is at `offset`): type 1, the length, the bytes.
        private mutating func data(bytes: inout Int, limits: ZMQWireLimits, reusing spare: inout [UInt8]) -> Result<[UInt8], Reason> {
            guard left >= ZMQWireFormat.dataPrefix else { return .failure(Reason(text: "a data component's length is cut off")) }
            let length = Int(frame.loadLittleEndian(at: offset + 1, as: UInt32.self))
            offset += ZMQWireFormat.dataPrefix
            guard length <= left else {
                return .failure(Reason(text: "a data component of \(length) bytes where \(left) are left"))
            }
            bytes += length
            guard bytes <= limits.maxMessageBytes else {
                return .failure(Reason(text: "the data components exceed \(limits.maxMessageBytes) bytes"))
            }
            let data = SpareBytes.copy(UnsafeRawBufferPointer(rebasing: frame[offset..<offset + length]), reusing: &spare)
            offset += length
            return .success(data)
        }

        /// A port component: type 2, the port id, the endpoint's length, a valid endpoint in UTF-8.
        private mutating func port() -> Result<ZMQPortAddress, Reason> {
            guard left >= ZMQWireFormat.portPrefix else { return .failure(Reason(text: "a port component is cut off")) }
            let portID = frame.loadLittleEndian(at: offset + 1, as: UInt64.self)
            let length = Int(frame.loadLittleEndian(at: offset + 9, as: UInt16.self))
            offset += ZMQWireFormat.portPrefix
            guard length > 0 else { return .failure(Reason(text: "a port component without an endpoint")) }
            guard length <= left else { return .failure(Reason(text: "a port's endpoint of \(length) bytes where \(left) are left")) }
            let endpointBytes = UnsafeRawBufferPointer(rebasing: frame[offset..<offset + length])
            offset += length
            guard let endpoint = String(validating: endpointBytes, as: UTF8.self) else {
                return .failure(Reason(text: "a port component whose endpoint is not UTF-8"))
            }
            guard let parsed = try? ZMQEndpoint(parsing: endpoint) else {
                return .failure(Reason(text: "a port component with an endpoint PortKit does not accept: \"\(endpoint.prefix(80))\""))
            }
            guard parsed.isConnectable else {
                return .failure(Reason(text: "a port component with an endpoint nobody can connect to: \"\(endpoint)\""))
            }
            return .success(ZMQPortAddress(endpoint: endpoint, portID: portID))
        }
    }
}
#endif
