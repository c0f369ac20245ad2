#if ZeroMQ
// Turning a port message into the frames of protocol.md's ZeroMQ mapping, after checking it
// against the limits (a sender refuses what a receiver would drop).

import PortKit

/// A component ready to encode: bytes, or the address of a port.
enum ZMQWireComponent {
    case data([UInt8])
    case port(ZMQPortAddress)
}

enum ZMQMessageEncoder {
    /// Checks a message against `limits`.
    ///
    /// - Throws: `.limitExceeded` naming the limit.
    static func check(components: [ZMQWireComponent], hasReply: Bool, limits: ZMQWireLimits) throws(PKError) {
        if components.count > limits.maxComponents {
            throw PKError(.limitExceeded, "the message has \(components.count) components; the limit is \(limits.maxComponents)")
        }
        var bytes = 0
        var ports = hasReply ? 1 : 0
        for component in components {
            switch component {
            case .data(let data): bytes += data.count
            case .port: ports += 1
            }
        }
        if bytes > limits.maxMessageBytes {
            throw PKError(.limitExceeded, "the message holds \(bytes) data bytes; the limit is \(limits.maxMessageBytes)")
        }
        if ports > limits.maxPorts {
            throw PKError(.limitExceeded, "the message holds \(ports) ports (the reply port included); the limit is \(limits.maxPorts)")
        }
    }

    /// The frames of one message, header first.
    static func frames(
        msgid: UInt32, destination: UInt64, components: [ZMQWireComponent], reply: ZMQPortAddress?
    ) -> [ZMQOutgoingFrame] {
        var header = ZMQWireFormat.magic
        header.reserveCapacity(ZMQWireFormat.headerSize)
        header.appendLittleEndian(ZMQWireFormat.version)
        header.appendLittleEndian(reply == nil ? UInt16(0) : ZMQWireFormat.flagReplyPort)
        header.appendLittleEndian(msgid)
        header.appendLittleEndian(UInt16(components.count))
        header.appendLittleEndian(UInt16(0))
        header.appendLittleEndian(destination)
        var frames = [ZMQOutgoingFrame(prefix: header)]
        frames.reserveCapacity(2 + components.count)
        for component in components {
            switch component {
            case .data(let bytes): frames.append(ZMQOutgoingFrame(prefix: [ZMQWireFormat.typeData], payload: bytes))
            case .port(let address): frames.append(portFrame(address))
            }
        }
        if let reply { frames.append(portFrame(reply)) }
        return frames
    }

    private static func portFrame(_ address: ZMQPortAddress) -> ZMQOutgoingFrame {
        var prefix = [ZMQWireFormat.typePort]
        prefix.appendLittleEndian(address.portID)
        prefix.append(contentsOf: address.endpoint.utf8)
        return ZMQOutgoingFrame(prefix: prefix)
    }
}
#endif
