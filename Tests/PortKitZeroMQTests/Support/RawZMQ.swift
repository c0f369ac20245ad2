#if ZeroMQ
// A bare libzmq socket for tests that must break protocol.md on purpose (PortKit itself never
// sends such messages), with a monitor to see the connection's events.

import CZeroMQ
import Foundation
import PortKit

final class RawZMQSocket: @unchecked Sendable {
    private static let context = RawContext()
    private final class RawContext: @unchecked Sendable {
        let handle: UnsafeMutableRawPointer = zmq_ctx_new()!
    }

    private let socket: UnsafeMutableRawPointer
    private let monitor: UnsafeMutableRawPointer
    /// The monitor events seen so far, in order.
    private(set) var seen: [Int32] = []

    /// A PUSH socket connected to `endpoint`, monitored.
    init(pushingTo endpoint: String) throws {
        socket = zmq_socket(Self.context.handle, ZMQ_PUSH)!
        var zero: Int32 = 0
        zmq_setsockopt(socket, ZMQ_LINGER, &zero, 4)
        let address = "inproc://raw-monitor-\(UInt64.random(in: 0 ... .max))"
        guard zmq_socket_monitor(socket, address, ZMQ_EVENT_ALL) == 0 else { throw PeerError(description: "monitor") }
        monitor = zmq_socket(Self.context.handle, ZMQ_PAIR)!
        zmq_setsockopt(monitor, ZMQ_LINGER, &zero, 4)
        guard zmq_connect(monitor, address) == 0, zmq_connect(socket, endpoint) == 0 else { throw PeerError(description: "connect") }
    }

    deinit {
        // Stop monitoring first: libzmq sends monitor events with a blocking send, and an event
        // for a closed reader would block the context's I/O thread for good.
        zmq_socket_monitor(socket, nil, 0)
        zmq_close(socket)
        zmq_close(monitor)
    }

    /// Sends `frames` as one multipart message, waiting up to 5 s.
    func send(_ frames: [[UInt8]]) throws {
        var timeout: Int32 = 5000
        zmq_setsockopt(socket, ZMQ_SNDTIMEO, &timeout, 4)
        for (index, frame) in frames.enumerated() {
            let flags = index < frames.count - 1 ? ZMQ_SNDMORE : 0
            let rc = frame.withUnsafeBytes { zmq_send(socket, $0.baseAddress, $0.count, flags) }
            guard rc >= 0 else { throw PeerError(description: "zmq_send: \(String(cString: zmq_strerror(zmq_errno())))") }
        }
    }

    /// Waits up to `timeout` for a monitor event `event` (a ZMQ_EVENT_* value).
    func waitForEvent(_ event: Int32, timeout: Duration = .seconds(10)) -> Bool {
        let deadline = PKDeadline.after(timeout)
        while !seen.contains(event) {
            if deadline.hasPassed { return false }
            var item = zmq_pollitem_t(socket: monitor, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
            guard zmq_poll(&item, 1, 50) > 0 else { continue }
            var buffer = [UInt8](repeating: 0, count: 256)
            let size = zmq_recv(monitor, &buffer, buffer.count, 0)
            if size >= 2 { seen.append(Int32(UInt16(buffer[0]) | UInt16(buffer[1]) << 8)) }
            var more: Int32 = 0
            var length = 4
            zmq_getsockopt(monitor, ZMQ_RCVMORE, &more, &length)
            if more != 0 { _ = zmq_recv(monitor, &buffer, buffer.count, 0) }
        }
        return true
    }

    static let handshakeSucceeded = ZMQ_EVENT_HANDSHAKE_SUCCEEDED
    static let disconnected = ZMQ_EVENT_DISCONNECTED
}

/// A valid message, written out by hand from protocol.md section 10.2: one frame, the header,
/// a data component for each of `data`, and the reply port if given.
func handMadeMessage(msgid: UInt32, data: [[UInt8]], reply: (String, UInt64)? = nil, destination: UInt64 = 0) -> [UInt8] {
    var bytes: [UInt8] = Array("PKZM".utf8)
    func put<T: FixedWidthInteger>(_ value: T) {
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }
    put(UInt16(2))
    put(UInt16(reply == nil ? 0 : 1))
    put(msgid)
    put(UInt16(data.count))
    put(UInt16(0))
    put(destination)
    for chunk in data {
        bytes.append(1)
        put(UInt32(chunk.count))
        bytes += chunk
    }
    if let (endpoint, id) = reply {
        bytes.append(2)
        put(id)
        put(UInt16(endpoint.utf8.count))
        bytes += Array(endpoint.utf8)
    }
    return bytes
}
#endif
