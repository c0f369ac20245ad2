#if ZeroMQ
// The reading side of protocol.md's ZeroMQ mapping: a pure state machine fed one frame at a
// time (its bytes and libzmq's "more" flag), answering "need more", "a message", or "a
// violation". A violation drops that one message: the decoder skips the rest of its frames and
// starts afresh with the next message. No sockets here: the tests feed it frames by hand.

/// A message as decoded from the wire, its ports still addresses.
struct ZMQDecodedMessage: Equatable, Sendable {
    enum Component: Equatable, Sendable {
        case data([UInt8])
        case port(ZMQPortAddress)
    }
    var msgid: UInt32
    /// The port id the message is for, at the receiving endpoint.
    var destination: UInt64
    var components: [Component]
    var reply: ZMQPortAddress?
}

struct ZMQMessageDecoder {
    enum Output {
        /// The frame was taken; the message continues (or was being skipped).
        case needMore
        case message(ZMQDecodedMessage)
        /// The message breaks protocol.md; it is dropped. The reason says how.
        case violation(String)
    }

    private enum State {
        case awaitingHeader
        /// Component frames left, then the reply frame if `replyPending`.
        case body(ZMQDecodedMessage, componentsLeft: Int, replyPending: Bool, bytes: Int, ports: Int)
        /// Skipping the frames of a dropped message until its last frame.
        case discarding
    }

    let limits: ZMQWireLimits
    private var state = State.awaitingHeader

    init(limits: ZMQWireLimits) { self.limits = limits }

    /// Whether the decoder is between messages.
    var isIdle: Bool { if case .awaitingHeader = state { true } else { false } }

    /// Takes the next frame of the stream.
    mutating func consume(_ frame: UnsafeRawBufferPointer, more: Bool) -> Output {
        switch state {
        case .discarding:
            if !more { state = .awaitingHeader }
            return .needMore
        case .awaitingHeader:
            return header(frame, more: more)
        case .body(var message, let componentsLeft, let replyPending, var bytes, var ports):
            if componentsLeft > 0 {
                guard let type = frame.first else { return fail("an empty component frame", more) }
                switch type {
                case ZMQWireFormat.typeData:
                    bytes += frame.count - 1
                    if bytes > limits.maxMessageBytes {
                        return fail("the data components exceed \(limits.maxMessageBytes) bytes", more)
                    }
                    message.components.append(.data(Array(UnsafeRawBufferPointer(rebasing: frame[1...]))))
                case ZMQWireFormat.typePort:
                    ports += 1
                    if ports > limits.maxPorts { return fail("more than \(limits.maxPorts) ports", more) }
                    switch Self.portAddress(frame) {
                    case .success(let address): message.components.append(.port(address))
                    case .failure(let reason): return fail(reason.text, more)
                    }
                default:
                    return fail("a component frame of unknown type \(type)", more)
                }
            } else {
                ports += 1
                if ports > limits.maxPorts { return fail("more than \(limits.maxPorts) ports", more) }
                guard frame.first == ZMQWireFormat.typePort else { return fail("the reply-port frame is not a port frame", more) }
                switch Self.portAddress(frame) {
                case .success(let address): message.reply = address
                case .failure(let reason): return fail(reason.text, more)
                }
            }
            let left = componentsLeft > 0 ? componentsLeft - 1 : 0
            let replyLeft = componentsLeft > 0 ? replyPending : false
            return advance(message, componentsLeft: left, replyPending: replyLeft, bytes: bytes, ports: ports, more: more)
        }
    }

    private mutating func header(_ frame: UnsafeRawBufferPointer, more: Bool) -> Output {
        guard frame.count == ZMQWireFormat.headerSize else {
            return fail("the header frame is \(frame.count) bytes, not \(ZMQWireFormat.headerSize)", more)
        }
        guard frame.prefix(4).elementsEqual(ZMQWireFormat.magic) else { return fail("the header's magic is not \"PKZM\"", more) }
        let version = frame.loadLittleEndian(at: 4, as: UInt16.self)
        guard version == ZMQWireFormat.version else { return fail("version \(version) is not supported (only 1)", more) }
        let flags = frame.loadLittleEndian(at: 6, as: UInt16.self)
        guard flags & ~ZMQWireFormat.flagReplyPort == 0 else { return fail("unknown header flags \(flags)", more) }
        let count = Int(frame.loadLittleEndian(at: 12, as: UInt16.self))
        guard frame.loadLittleEndian(at: 14, as: UInt16.self) == 0 else { return fail("the header's reserved field is not 0", more) }
        guard count <= limits.maxComponents else { return fail("\(count) components; the limit is \(limits.maxComponents)", more) }
        var message = ZMQDecodedMessage(
            msgid: frame.loadLittleEndian(at: 8, as: UInt32.self),
            destination: frame.loadLittleEndian(at: 16, as: UInt64.self),
            components: [], reply: nil)
        message.components.reserveCapacity(count)
        return advance(message, componentsLeft: count, replyPending: flags & ZMQWireFormat.flagReplyPort != 0, bytes: 0, ports: 0, more: more)
    }

    /// After a valid frame: the message is complete exactly when no frame is left and libzmq
    /// says none follows.
    private mutating func advance(
        _ message: ZMQDecodedMessage, componentsLeft: Int, replyPending: Bool, bytes: Int, ports: Int, more: Bool
    ) -> Output {
        let framesLeft = componentsLeft + (replyPending ? 1 : 0)
        if framesLeft == 0 {
            if more { return fail("more frames than the header announces", more) }
            state = .awaitingHeader
            return .message(message)
        }
        if !more {
            state = .awaitingHeader
            return .violation("the message ends \(framesLeft) frame(s) before the header says")
        }
        state = .body(message, componentsLeft: componentsLeft, replyPending: replyPending, bytes: bytes, ports: ports)
        return .needMore
    }

    private mutating func fail(_ reason: String, _ more: Bool) -> Output {
        state = more ? .discarding : .awaitingHeader
        return .violation(reason)
    }

    struct Reason: Error { let text: String }

    /// A port frame: type 2, the port id, then a valid endpoint in UTF-8.
    static func portAddress(_ frame: UnsafeRawBufferPointer) -> Result<ZMQPortAddress, Reason> {
        let prefix = ZMQWireFormat.portFramePrefix
        guard frame.count > prefix else { return .failure(Reason(text: "a port frame without an endpoint")) }
        let endpointBytes = UnsafeRawBufferPointer(rebasing: frame[prefix...])
        guard let endpoint = String(validating: endpointBytes, as: UTF8.self) else {
            return .failure(Reason(text: "a port frame whose endpoint is not UTF-8"))
        }
        guard (try? ZMQEndpoint(parsing: endpoint)) != nil else {
            return .failure(Reason(text: "a port frame with an endpoint PortKit does not accept: \"\(endpoint.prefix(80))\""))
        }
        return .success(ZMQPortAddress(endpoint: endpoint, portID: frame.loadLittleEndian(at: 1, as: UInt64.self)))
    }
}
#endif
