// The constants of the wire format in one place: sizes, magic, version, flag bits, component
// types and control codes, exactly as `protocol.md` (repository root) specifies them.
// Everything on the wire is little-endian; nothing is padded or aligned.

/// The numbers of the wire format (`protocol.md`).
enum WireFormat {
    /// "PKIT" read as a little-endian `u32` (bytes 0x50 0x4B 0x49 0x54).
    static let magic: UInt32 = 0x5449_4B50
    /// The only protocol version this build speaks.
    static let version: UInt16 = 1

    /// Bytes in a greeting: magic, version, flags, pid, uid.
    static let greetingByteCount = 16
    /// Bytes in a frame header: length, msgid, componentCount, flags, descriptorCount, replyToken.
    static let frameHeaderByteCount = 16
    /// Bytes in a component header: type, 3 reserved bytes, length.
    static let componentHeaderByteCount = 8

    /// Frame flag bit 0: the first descriptor attached to the frame is the message's reply port.
    static let replyPortFlag: UInt16 = 1 << 0
    /// Frame flag bit 1: `msgid` is a control code (`WireControlCode`), not a message id.
    static let controlFlag: UInt16 = 1 << 1
    /// Frame flag bit 2: the message's reply port is this connection's reply channel (its other
    /// direction), and the header's reply token names the request.
    static let replyBackFlag: UInt16 = 1 << 2
    /// Every frame flag bit this version defines; any other set bit is a protocol error.
    static let knownFrameFlags: UInt16 = replyPortFlag | controlFlag | replyBackFlag

    /// Component type of a data component (`length` payload bytes follow its header).
    static let dataComponentType: UInt8 = 1
    /// Component type of a port component (no payload; the port is the next descriptor).
    static let portComponentType: UInt8 = 2
}

/// The control codes a frame with the CONTROL flag may carry in its `msgid` field.
enum WireControlCode: UInt32, Sendable {
    /// The frame's only component is a port: a new sender connection for the receive port that
    /// reads this connection. Used to forward a send right the forwarder does not own.
    case attachSender = 1
    /// Towards the port: the request named by the reply token has ended unanswered; the right
    /// to answer it is void. No components.
    case replyCancelled = 2
    /// On a reply channel: the right to answer the request named by the reply token was
    /// released unanswered. No components.
    case noReply = 3
}

/// Which way a connection's bytes flow, which decides the frames it may carry.
enum WireDirection: Sendable {
    /// From a send right to its receive port: every connection's first direction.
    case toPort
    /// A connection's reply channel: from the receive port's owner back to the sender, carrying
    /// answers to requests made with REPLY_BACK.
    case toRequester
}

extension UnsafeRawBufferPointer {
    /// Loads a little-endian integer from `offset`, which need not be aligned.
    @inline(__always)
    func loadLittleEndian<T: FixedWidthInteger>(_: T.Type, at offset: Int) -> T {
        T(littleEndian: loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}
