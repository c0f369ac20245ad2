#if ZeroMQ
// Turning a port message into its bytes in protocol.md's ZeroMQ mapping (a frame of its own, or
// its place in a batch), after checking it against the limits (a sender refuses what a receiver
// would drop). Measuring and writing are two passes over the same components, so a message goes
// straight into libzmq's frame, or the connection's batch, with no buffer of its own.

import PortKit

/// A component ready to encode, or as decoded for the tests and the fuzzer: bytes, or the
/// address of a port.
enum ZMQWireComponent: Equatable, Sendable {
    case data([UInt8])
    case port(ZMQPortAddress)
}

/// A component as the encoder reads it: the bytes of a data component, or the address of a port.
protocol ZMQEncodableComponent {
    /// The bytes of a data component; nil for a port.
    var encodableData: [UInt8]? { get }
    /// The address of a port component, as the message's destination reaches it; nil for data.
    var encodablePort: ZMQPortAddress? { get }
}

extension ZMQWireComponent: ZMQEncodableComponent {
    var encodableData: [UInt8]? { if case .data(let bytes) = self { bytes } else { nil } }
    var encodablePort: ZMQPortAddress? { if case .port(let address) = self { address } else { nil } }
}

enum ZMQMessageEncoder {
    /// Checks a message against `limits` and returns the size of its frame.
    ///
    /// - Throws: `.limitExceeded` naming the limit (an endpoint over 255 bytes included).
    static func measure<Components: Collection>(
        components: Components, reply: ZMQPortAddress?, limits: ZMQWireLimits
    ) throws(PKError) -> Int where Components.Element: ZMQEncodableComponent {
        if components.count > limits.maxComponents {
            throw PKError(.limitExceeded, "the message has \(components.count) components; the limit is \(limits.maxComponents)")
        }
        var bytes = 0
        var ports = 0
        var size = ZMQWireFormat.headerSize
        for component in components {
            if let data = component.encodableData {
                bytes += data.count
                size += ZMQWireFormat.dataPrefix + data.count
            } else if let address = component.encodablePort {
                ports += 1
                size += try portSize(address)
            }
        }
        if let reply {
            ports += 1
            size += try portSize(reply)
        }
        if bytes > limits.maxMessageBytes {
            throw PKError(.limitExceeded, "the message holds \(bytes) data bytes; the limit is \(limits.maxMessageBytes)")
        }
        if ports > limits.maxPorts {
            throw PKError(.limitExceeded, "the message holds \(ports) ports (the reply port included); the limit is \(limits.maxPorts)")
        }
        return size
    }

    private static func portSize(_ address: ZMQPortAddress) throws(PKError) -> Int {
        let length = address.endpoint.utf8.count
        if length > PKZMQEndpoint.maxLength {
            throw PKError(.limitExceeded, "a port's endpoint is \(length) bytes; the limit is \(PKZMQEndpoint.maxLength)")
        }
        return ZMQWireFormat.portPrefix + length
    }

    /// Writes the frame of a message into `frame`, which is exactly as long as `measure` said.
    static func write<Components: Collection>(
        msgid: UInt32, destination: UInt64, components: Components, reply: ZMQPortAddress?,
        into frame: UnsafeMutableRawBufferPointer
    ) where Components.Element: ZMQEncodableComponent {
        writeHeader(msgid: msgid, destination: destination, componentCount: components.count, hasReply: reply != nil, into: frame)
        var offset = ZMQWireFormat.headerSize
        for component in components {
            if let data = component.encodableData {
                offset = data.withUnsafeBytes { data in writeData(data, into: frame, at: offset) }
            } else if let address = component.encodablePort {
                offset = writePort(address, into: frame, at: offset)
            }
        }
        if let reply { offset = writePort(reply, into: frame, at: offset) }
        precondition(offset == frame.count, "PortKitZeroMQ bug: a message was measured at \(frame.count) bytes and written in \(offset)")
    }

    /// The frame size of a message of one data component of `byteCount` bytes and no reply
    /// port, the usual message, checked against `limits` without a pass over components. Only
    /// `maxMessageBytes` can refuse it: `maxComponents` is at least 1 (`ZMQWireLimits`), and it
    /// has no port for `maxPorts`.
    ///
    /// - Throws: `.limitExceeded`, as `measure` does.
    static func measureData(byteCount: Int, limits: ZMQWireLimits) throws(PKError) -> Int {
        if byteCount > limits.maxMessageBytes {
            throw PKError(.limitExceeded, "the message holds \(byteCount) data bytes; the limit is \(limits.maxMessageBytes)")
        }
        return ZMQWireFormat.headerSize + ZMQWireFormat.dataPrefix + byteCount
    }

    /// Writes the frame of a message of one data component and no reply port into `frame`,
    /// which is exactly as long as `measureData` said: the same bytes `write` makes of it.
    static func writeData(msgid: UInt32, destination: UInt64, _ data: UnsafeRawBufferPointer, into frame: UnsafeMutableRawBufferPointer) {
        writeHeader(msgid: msgid, destination: destination, componentCount: 1, hasReply: false, into: frame)
        let offset = writeData(data, into: frame, at: ZMQWireFormat.headerSize)
        precondition(offset == frame.count, "PortKitZeroMQ bug: a message was measured at \(frame.count) bytes and written in \(offset)")
    }

    private static func writeHeader(
        msgid: UInt32, destination: UInt64, componentCount: Int, hasReply: Bool, into frame: UnsafeMutableRawBufferPointer
    ) {
        frame.storeLittleEndian(ZMQWireFormat.magicWord, at: 0)
        frame.storeLittleEndian(ZMQWireFormat.version, at: 4)
        frame.storeLittleEndian(hasReply ? ZMQWireFormat.flagReplyPort : UInt16(0), at: 6)
        frame.storeLittleEndian(msgid, at: 8)
        frame.storeLittleEndian(UInt16(truncatingIfNeeded: componentCount), at: 12)
        frame.storeLittleEndian(UInt16(0), at: 14)
        frame.storeLittleEndian(destination, at: 16)
    }

    private static func writeData(_ data: UnsafeRawBufferPointer, into frame: UnsafeMutableRawBufferPointer, at start: Int) -> Int {
        frame[start] = ZMQWireFormat.typeData
        frame.storeLittleEndian(UInt32(truncatingIfNeeded: data.count), at: start + 1)
        let offset = start + ZMQWireFormat.dataPrefix
        if let base = data.baseAddress, let target = frame.baseAddress {
            (target + offset).copyMemory(from: base, byteCount: data.count)
        }
        return offset + data.count
    }

    private static func writePort(_ address: ZMQPortAddress, into frame: UnsafeMutableRawBufferPointer, at start: Int) -> Int {
        var offset = start
        frame[offset] = ZMQWireFormat.typePort
        frame.storeLittleEndian(address.portID, at: offset + 1)
        let endpoint = address.endpoint.utf8
        frame.storeLittleEndian(UInt16(truncatingIfNeeded: endpoint.count), at: offset + 9)
        offset += ZMQWireFormat.portPrefix
        for byte in endpoint {
            frame[offset] = byte
            offset += 1
        }
        return offset
    }

    /// Flags the message whose header starts at `offset` in a batch as FOLLOWED: another
    /// message comes after it in the same frame (protocol.md 10.2).
    static func markFollowed(in batch: UnsafeMutableRawBufferPointer, headerAt offset: Int) {
        let flags = UnsafeRawBufferPointer(batch).loadLittleEndian(at: offset + 6, as: UInt16.self)
        batch.storeLittleEndian(flags | ZMQWireFormat.flagFollowed, at: offset + 6)
    }

    /// `markFollowed` for a batch in an array (tests and the fuzzer).
    static func setFollowed(_ batch: inout [UInt8], headerAt offset: Int) {
        batch.withUnsafeMutableBytes { markFollowed(in: $0, headerAt: offset) }
    }

    /// Clears FOLLOWED in the header at the start of `message` (tests and the fuzzer).
    static func clearFollowed(_ message: inout [UInt8]) {
        message.withUnsafeMutableBytes { bytes in
            let flags = UnsafeRawBufferPointer(bytes).loadLittleEndian(at: 6, as: UInt16.self)
            bytes.storeLittleEndian(flags & ~ZMQWireFormat.flagFollowed, at: 6)
        }
    }

    /// The frame of a message as bytes (tests, the fuzzer, and the checks of the name service).
    ///
    /// - Throws: `.limitExceeded` as `measure` does.
    static func frame(
        msgid: UInt32, destination: UInt64, components: [ZMQWireComponent], reply: ZMQPortAddress?,
        limits: ZMQWireLimits = ZMQWireLimits(.default)
    ) throws(PKError) -> [UInt8] {
        let size = try measure(components: components, reply: reply, limits: limits)
        return [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
            write(msgid: msgid, destination: destination, components: components, reply: reply,
                  into: UnsafeMutableRawBufferPointer(buffer))
            count = size
        }
    }
}
#endif
