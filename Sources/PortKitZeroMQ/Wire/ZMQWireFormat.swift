#if ZeroMQ
// The numbers of protocol.md's "ZeroMQ mapping": a ZeroMQ frame holds one port message, or
// several one after another (a batch); a message is a 24-byte header and then its components
// and its reply port, each a type byte and a length. Every integer is little-endian.

import PortKit

enum ZMQWireFormat {
    /// "PKZM".
    static let magic: [UInt8] = [0x50, 0x4B, 0x5A, 0x4D]
    /// The magic as one little-endian u32, for writing it in one store.
    static let magicWord: UInt32 = 0x4D5A_4B50
    /// Version 2: the whole message in one frame. (Version 1 sent a frame per component.)
    static let version: UInt16 = 2
    static let headerSize = 24

    /// The largest frame a sender makes of a batch (a message larger than this goes alone); a
    /// receive port accepts frames up to this size whatever its limits (`ZMQ_MAXMSGSIZE`).
    static let largestBatch = 16 * 1024

    /// Header flags.
    static let flagReplyPort: UInt16 = 1 << 0
    /// Another message follows this one in the same frame (a batch, protocol.md 10.2).
    static let flagFollowed: UInt16 = 1 << 1
    /// Every flag a receiver knows.
    static let knownFlags: UInt16 = flagReplyPort | flagFollowed

    /// The first byte of a component (and of the reply port, a port component).
    static let typeData: UInt8 = 1
    static let typePort: UInt8 = 2

    /// A data component before its bytes: type, length (u32).
    static let dataPrefix = 5
    /// A port component before its endpoint: type, port id (u64), endpoint length (u16).
    static let portPrefix = 11
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
    /// Port components in one message, the reply port included (`PKPortLimits.maxDescriptors`).
    var maxPorts: Int

    /// Traps on a limit no message can meet, as the core's ports do (`PKPortLimits`).
    init(_ limits: PKPortLimits) {
        precondition(limits.maxComponents >= 1, "PKPortLimits.maxComponents must be at least 1, not \(limits.maxComponents)")
        precondition(limits.maxDescriptors >= 1, "PKPortLimits.maxDescriptors must be at least 1, not \(limits.maxDescriptors)")
        precondition(limits.maxMessageBytes >= 0, "PKPortLimits.maxMessageBytes must not be negative")
        limits.checkQueueAndGreetingLimits()
        maxMessageBytes = limits.maxMessageBytes
        maxComponents = min(limits.maxComponents, Int(UInt16.max))
        maxPorts = limits.maxDescriptors
    }

    /// `ZMQ_MAXMSGSIZE`: the largest frame a receive port takes, a batch's or one message's.
    var largestAcceptedFrame: Int { max(largestFrame, ZMQWireFormat.largestBatch) }

    /// The largest frame a message within these limits can have (every data byte, a data
    /// component's prefix for each component, and the longest endpoint for each port).
    /// Saturates at `Int.max` (no limit) for limits too large to add up.
    var largestFrame: Int {
        let terms = [
            (ZMQWireFormat.headerSize, 1), (maxMessageBytes, 1), (ZMQWireFormat.dataPrefix, maxComponents),
            (ZMQWireFormat.portPrefix + PKZMQEndpoint.maxLength, maxPorts),
        ]
        var total = 0
        for (size, count) in terms {
            let (product, overflowed) = size.multipliedReportingOverflow(by: count)
            if overflowed { return .max }
            let (sum, overflowedSum) = total.addingReportingOverflow(product)
            if overflowedSum { return .max }
            total = sum
        }
        return total
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

extension UnsafeMutableRawBufferPointer {
    func storeLittleEndian<T: FixedWidthInteger>(_ value: T, at offset: Int) {
        storeBytes(of: value.littleEndian, toByteOffset: offset, as: T.self)
    }
}
#endif
