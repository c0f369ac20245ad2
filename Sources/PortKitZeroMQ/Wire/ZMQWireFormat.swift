#if ZeroMQ
// The numbers of protocol.md's "ZeroMQ mapping": one port message is one multipart ZeroMQ
// message of a 24-byte header frame, one frame per component, and a reply-port frame.
// Every integer is little-endian.

import PortKit

enum ZMQWireFormat {
    /// "PKZM".
    static let magic: [UInt8] = [0x50, 0x4B, 0x5A, 0x4D]
    static let version: UInt16 = 1
    static let headerSize = 24

    /// Header flags.
    static let flagReplyPort: UInt16 = 1 << 0

    /// The first byte of a component frame (and of the reply-port frame, a port frame).
    static let typeData: UInt8 = 1
    static let typePort: UInt8 = 2

    /// A port frame: type, port id (u64), endpoint.
    static let portFramePrefix = 9
}

/// Where a port lives: an endpoint and the port's id there (0 is the receive port bound at
/// the endpoint; a process's reply port gives each request its own id).
struct ZMQPortAddress: Hashable, Sendable {
    let endpoint: String
    let portID: UInt64
}

/// The limits a decoder enforces (`PKPortLimits`, as protocol.md's ZeroMQ mapping applies them).
struct ZMQWireLimits: Sendable {
    var maxMessageBytes: Int
    var maxComponents: Int
    /// Port frames in one message, the reply port included (`PKPortLimits.maxDescriptors`).
    var maxPorts: Int

    init(_ limits: PKPortLimits) {
        maxMessageBytes = limits.maxMessageBytes
        maxComponents = min(limits.maxComponents, Int(UInt16.max))
        maxPorts = limits.maxDescriptors
    }

    /// `ZMQ_MAXMSGSIZE`: the largest frame a message within these limits can have (a data
    /// frame holding every data byte, or a port frame with the longest endpoint).
    var largestFrame: Int {
        max(1 + maxMessageBytes, ZMQWireFormat.portFramePrefix + PKZMQEndpoint.maxLength, ZMQWireFormat.headerSize)
    }
}

/// Little-endian stores and unaligned loads.
extension Array where Element == UInt8 {
    mutating func appendLittleEndian<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) }
    }
}

extension UnsafeRawBufferPointer {
    func loadLittleEndian<T: FixedWidthInteger>(at offset: Int, as type: T.Type) -> T {
        T(littleEndian: loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}
#endif
