#if ZeroMQ
// Every call into libzmq: the process's one context, and a socket wrapper whose methods keep
// libzmq's names. A `ZMQSocket` is not thread-safe (nor is the libzmq socket under it): each
// owner guards its socket with a lock or keeps it on one thread, and says which.
//
// Nothing outside `System/` imports CZeroMQ.

import CZeroMQ
import Glibc
import PortKit

/// The process's one ZeroMQ context, made on first use and never terminated (its I/O thread
/// ends with the process): a socket's linger bounds how long it outlives its close.
final class ZMQContext: @unchecked Sendable {
    static let shared = ZMQContext()

    /// The context handle; immutable after init, and libzmq's context is thread-safe.
    let handle: UnsafeMutableRawPointer

    private init() {
        guard let handle = zmq_ctx_new() else {
            fatalError("PortKitZeroMQ cannot create a ZeroMQ context: \(ZMQError.describe(zmq_errno()))")
        }
        // Never block in zmq_ctx_term (it is never called, but a library should not hang a process).
        _ = zmq_ctx_set(handle, ZMQ_BLOCKY, 0)
        self.handle = handle
    }

    /// The libzmq version, as "major.minor.patch".
    static var libraryVersion: String {
        var major: Int32 = 0, minor: Int32 = 0, patch: Int32 = 0
        zmq_version(&major, &minor, &patch)
        return "\(major).\(minor).\(patch)"
    }
}

/// Turning libzmq's errno into PortKit errors.
enum ZMQError {
    static func describe(_ err: Int32) -> String {
        guard let text = zmq_strerror(err) else { return "errno \(err)" }
        return String(cString: text)
    }

    /// A `PKError` for a failed libzmq call.
    static func make(
        _ code: PKError.Code, _ call: StaticString, _ what: String, errno err: Int32,
        file: String = #fileID, line: Int = #line
    ) -> PKError {
        PKError(code, "\(what): \(describe(err))", call: "\(call)", errno: err, file: file, line: line)
    }
}

/// The socket types PortKit uses (protocol.md, "ZeroMQ mapping").
enum ZMQSocketType {
    /// A receive port, and the process's reply port.
    case pull
    /// The sending side of a send right.
    case push
    /// The reading end of a socket monitor.
    case pair

    var rawValue: Int32 {
        switch self {
        case .pull: ZMQ_PULL
        case .push: ZMQ_PUSH
        case .pair: ZMQ_PAIR
        }
    }
}

/// One frame to send, in libzmq's memory (a `zmq_msg_t`): written once when made, then moved
/// into a socket by `ZMQSocket.send`. A frame that was never sent is freed with it.
struct ZMQOutgoingFrame: ~Copyable, @unchecked Sendable {
    // A plain value: libzmq's message is a 64-byte struct that may be moved (its small-message
    // bytes sit inside it, a larger one's behind a pointer); it is nullified by a send.
    fileprivate var message = zmq_msg_t()

    /// A frame of `byteCount` bytes that `write` fills.
    /// The corresponding call is `zmq_msg_init_size(3)`.
    init(byteCount: Int, _ write: (UnsafeMutableRawBufferPointer) -> Void) throws(PKError) {
        // One access to the message for both calls: a small frame's bytes sit inside it, so its
        // data pointer is valid only while the access lasts.
        let failure = withUnsafeMutablePointer(to: &message) { message -> Int32? in
            guard zmq_msg_init_size(message, byteCount) == 0 else {
                let err = zmq_errno()
                // A failed init leaves the message half made; the deinit closes an empty one.
                _ = zmq_msg_init(message)
                return err
            }
            write(UnsafeMutableRawBufferPointer(start: zmq_msg_data(message), count: byteCount))
            return nil
        }
        if let failure {
            throw ZMQError.make(.system, "zmq_msg_init_size", "cannot make a \(byteCount)-byte ZeroMQ frame", errno: failure)
        }
    }

    deinit {
        var message = message
        _ = zmq_msg_close(&message)
    }
}

/// The `zmq_msg_t` a `ZMQHeldFrame` receives into: allocated once, freed by its owner.
struct ZMQFrameStorage: @unchecked Sendable {
    fileprivate let message: UnsafeMutablePointer<zmq_msg_t>

    static func allocate() -> ZMQFrameStorage {
        let message = UnsafeMutablePointer<zmq_msg_t>.allocate(capacity: 1)
        _ = zmq_msg_init(message)
        return ZMQFrameStorage(message: message)
    }

    /// Frees the frame's bytes, if it holds some; the storage stays usable.
    func clear() {
        _ = zmq_msg_close(message)
        _ = zmq_msg_init(message)
    }

    func deallocate() {
        _ = zmq_msg_close(message)
        message.deallocate()
    }
}

/// A frame received and kept, so that the messages of a batch can be read from it one at a
/// time: `ZMQSocket.receive(into:)` fills it, `release` frees the frame's bytes. A value over
/// storage its owner keeps (no reference counting per message); not thread-safe.
struct ZMQHeldFrame {
    private let storage: ZMQFrameStorage
    /// Whether it holds a frame.
    private(set) var isHeld = false
    /// Whether more frames of the same ZeroMQ message follow (libzmq's "more").
    private(set) var more = false
    /// Where reading its bytes has got to; its owner's.
    var offset = 0
    /// The frame's bytes (empty when none is held); valid until `release` or the next receive.
    /// Found once a frame (libzmq checks the message on every call that asks).
    private(set) var bytes = UnsafeRawBufferPointer(start: nil, count: 0)

    init(_ storage: ZMQFrameStorage) { self.storage = storage }

    /// Frees the frame's bytes; idempotent.
    mutating func release() {
        guard isHeld else { return }
        storage.clear()
        isHeld = false
        more = false
        offset = 0
        bytes = UnsafeRawBufferPointer(start: nil, count: 0)
    }

    fileprivate mutating func received(from socket: UnsafeMutableRawPointer) throws(PKError) -> Bool {
        release()
        while zmq_msg_recv(storage.message, socket, ZMQ_DONTWAIT) < 0 {
            let err = zmq_errno()
            if err == EINTR { continue }
            if err == EAGAIN { return false }
            throw ZMQError.make(.transport, "zmq_msg_recv", "receiving a ZeroMQ frame failed", errno: err)
        }
        isHeld = true
        more = zmq_msg_more(storage.message) != 0
        let size = zmq_msg_size(storage.message)
        bytes = UnsafeRawBufferPointer(start: size == 0 ? nil : zmq_msg_data(storage.message), count: size)
        return true
    }
}

/// A libzmq socket. Owns the socket: `close()` it (the deinit closes one that was not).
/// Not thread-safe: see the file header.
final class ZMQSocket {
    private var handle: UnsafeMutableRawPointer?
    let type: ZMQSocketType

    /// A new socket with `ZMQ_LINGER` 0: closing it drops unsent messages at once (a sending
    /// socket sets its own linger afterwards).
    /// The corresponding call is `zmq_socket(3)`.
    init(_ type: ZMQSocketType) throws(PKError) {
        guard let handle = zmq_socket(ZMQContext.shared.handle, type.rawValue) else {
            throw ZMQError.make(.system, "zmq_socket", "cannot create a ZeroMQ socket", errno: zmq_errno())
        }
        self.handle = handle
        self.type = type
        try setOption(ZMQ_LINGER, Int32(0))
    }

    deinit { close() }

    var isOpen: Bool { handle != nil }

    private var open: UnsafeMutableRawPointer {
        guard let handle else { preconditionFailure("PortKitZeroMQ bug: a ZeroMQ socket was used after it was closed") }
        return handle
    }

    /// Closes the socket; idempotent. The corresponding call is `zmq_close(3)`.
    func close() {
        guard let handle else { return }
        self.handle = nil
        _ = zmq_close(handle)
    }

    // MARK: - Options

    /// Sets an `int` option. The corresponding call is `zmq_setsockopt(3)`.
    func setOption(_ option: Int32, _ value: Int32) throws(PKError) {
        var value = value
        if zmq_setsockopt(open, option, &value, MemoryLayout<Int32>.size) != 0 {
            throw ZMQError.make(.system, "zmq_setsockopt", "cannot set ZeroMQ socket option \(option)", errno: zmq_errno())
        }
    }

    /// Sets an `int64_t` option (`ZMQ_MAXMSGSIZE`). The corresponding call is `zmq_setsockopt(3)`.
    func setOption(_ option: Int32, int64 value: Int64) throws(PKError) {
        var value = value
        if zmq_setsockopt(open, option, &value, MemoryLayout<Int64>.size) != 0 {
            throw ZMQError.make(.system, "zmq_setsockopt", "cannot set ZeroMQ socket option \(option)", errno: zmq_errno())
        }
    }

    private func intOption(_ option: Int32) -> Int32? {
        var value: Int32 = 0
        var size = MemoryLayout<Int32>.size
        return zmq_getsockopt(open, option, &value, &size) == 0 ? value : nil
    }

    /// `ZMQ_FD`: a descriptor that becomes readable when the socket's state may have changed.
    /// Edge-triggered in effect: after it wakes a reader, the reader must read `events` (which
    /// resets it) and act until `events` no longer shows what it waits for.
    var pollDescriptor: Int32 {
        var fd: Int32 = -1
        var size = MemoryLayout<Int32>.size
        if zmq_getsockopt(open, ZMQ_FD, &fd, &size) != 0 {
            preconditionFailure("PortKitZeroMQ bug: ZMQ_FD failed on an open socket: \(ZMQError.describe(zmq_errno()))")
        }
        return fd
    }

    /// `ZMQ_EVENTS`: whether a message can be received now (`canReceive`) or sent now
    /// (`canSend`). Reading it processes libzmq's pending commands and rearms `pollDescriptor`.
    var events: (canReceive: Bool, canSend: Bool) {
        let value = intOption(ZMQ_EVENTS) ?? 0
        return (value & Int32(ZMQ_POLLIN) != 0, value & Int32(ZMQ_POLLOUT) != 0)
    }

    /// `ZMQ_LAST_ENDPOINT`: the endpoint the last bind resolved to (the real port of `tcp://H:*`).
    var lastEndpoint: String {
        var buffer = [CChar](repeating: 0, count: 1024)
        var size = buffer.count
        guard zmq_getsockopt(open, ZMQ_LAST_ENDPOINT, &buffer, &size) == 0 else { return "" }
        return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }

    // MARK: - Endpoints

    /// Binds to `endpoint`. The corresponding call is `zmq_bind(3)`.
    ///
    /// - Throws: `.nameInUse` if the address is taken (`EADDRINUSE`), `.badName` for an endpoint
    ///   libzmq refuses, `.system` otherwise.
    func bind(_ endpoint: String) throws(PKError) {
        guard zmq_bind(open, endpoint) != 0 else { return }
        let err = zmq_errno()
        switch err {
        case EADDRINUSE: throw ZMQError.make(.nameInUse, "zmq_bind", "the endpoint \(endpoint) is already bound", errno: err)
        case EINVAL, EPROTONOSUPPORT, ENODEV, EADDRNOTAVAIL, ENOENT:
            throw ZMQError.make(.badName, "zmq_bind", "cannot bind \(endpoint)", errno: err)
        default: throw ZMQError.make(.system, "zmq_bind", "cannot bind \(endpoint)", errno: err)
        }
    }

    /// Stops listening on `endpoint` (a resolved endpoint, as `lastEndpoint` gave it). The
    /// listener closes on libzmq's I/O thread, shortly after; a monitor reports
    /// `ZMQ_EVENT_CLOSED` when it has. The corresponding call is `zmq_unbind(3)`.
    func unbind(_ endpoint: String) -> Bool {
        zmq_unbind(open, endpoint) == 0
    }

    /// Waits up to `timeoutMilliseconds` for a message to receive. The corresponding call is
    /// `zmq_poll(3)`.
    func waitReadable(timeoutMilliseconds: Int) -> Bool {
        var item = zmq_pollitem_t(socket: open, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
        return zmq_poll(&item, 1, timeoutMilliseconds) > 0
    }

    /// Starts connecting to `endpoint`; libzmq connects (and reconnects) in the background.
    /// The corresponding call is `zmq_connect(3)`.
    func connect(_ endpoint: String) throws(PKError) {
        guard zmq_connect(open, endpoint) != 0 else { return }
        let err = zmq_errno()
        let code: PKError.Code = (err == EINVAL || err == EPROTONOSUPPORT) ? .badName : .system
        throw ZMQError.make(code, "zmq_connect", "cannot connect to \(endpoint)", errno: err)
    }

    /// Publishes the socket's connection events on the `inproc://` endpoint `address` (a PAIR
    /// socket reads them); `nil` stops. The corresponding call is `zmq_socket_monitor(3)`.
    func monitor(_ address: String?, events: Int32) throws(PKError) {
        if zmq_socket_monitor(open, address, events) != 0 {
            throw ZMQError.make(.system, "zmq_socket_monitor", "cannot monitor a ZeroMQ socket", errno: zmq_errno())
        }
    }

    // MARK: - Messages

    /// Sends `frame` as a single-frame message without waiting; on success the frame is empty.
    /// The corresponding call is `zmq_msg_send(3)` with `ZMQ_DONTWAIT`.
    ///
    /// - Returns: false if nothing was queued because the socket cannot take a message now (the
    ///   frame is kept, to try again).
    func send(_ frame: inout ZMQOutgoingFrame) throws(PKError) -> Bool {
        while zmq_msg_send(&frame.message, open, ZMQ_DONTWAIT) < 0 {
            let err = zmq_errno()
            if err == EINTR { continue }
            if err == EAGAIN { return false }
            throw ZMQError.make(.transport, "zmq_msg_send", "sending a ZeroMQ frame failed", errno: err)
        }
        return true
    }

    /// Receives one frame without waiting into `frame`, which keeps it until it is released or
    /// receives again. The corresponding call is `zmq_msg_recv(3)` with `ZMQ_DONTWAIT`.
    ///
    /// - Returns: false if no frame was waiting (`frame` then holds none).
    func receive(into frame: inout ZMQHeldFrame) throws(PKError) -> Bool {
        try frame.received(from: open)
    }

    /// Receives one frame without waiting and passes its bytes to `body`, with whether more
    /// frames of the same message follow. The bytes are valid only during `body`.
    /// The corresponding call is `zmq_msg_recv(3)` with `ZMQ_DONTWAIT`.
    ///
    /// - Returns: false if no frame was waiting.
    func receiveFrame(_ body: (UnsafeRawBufferPointer, _ more: Bool) -> Void) throws(PKError) -> Bool {
        var message = zmq_msg_t()
        _ = zmq_msg_init(&message)
        defer { _ = zmq_msg_close(&message) }
        while zmq_msg_recv(&message, open, ZMQ_DONTWAIT) < 0 {
            let err = zmq_errno()
            if err == EINTR { continue }
            if err == EAGAIN { return false }
            throw ZMQError.make(.transport, "zmq_msg_recv", "receiving a ZeroMQ frame failed", errno: err)
        }
        let more = zmq_msg_more(&message) != 0
        let size = zmq_msg_size(&message)
        body(UnsafeRawBufferPointer(start: size == 0 ? nil : zmq_msg_data(&message), count: size), more)
        return true
    }
}

/// The ZeroMQ option numbers the transport sets, so that files outside `System/` need not
/// import CZeroMQ.
enum ZMQOption {
    static let sendHighWaterMark = ZMQ_SNDHWM
    static let receiveHighWaterMark = ZMQ_RCVHWM
    static let maxMessageSize = ZMQ_MAXMSGSIZE
    static let linger = ZMQ_LINGER
    static let immediate = ZMQ_IMMEDIATE
    static let heartbeatInterval = ZMQ_HEARTBEAT_IVL
    static let heartbeatTimeout = ZMQ_HEARTBEAT_TIMEOUT
    static let heartbeatTTL = ZMQ_HEARTBEAT_TTL
    static let reconnectInterval = ZMQ_RECONNECT_IVL
    static let reconnectIntervalMax = ZMQ_RECONNECT_IVL_MAX
    static let handshakeInterval = ZMQ_HANDSHAKE_IVL
}

/// The monitor events the transport reads (`zmq_socket_monitor(3)`).
enum ZMQMonitorEvent {
    static let connected = ZMQ_EVENT_CONNECTED
    static let disconnected = ZMQ_EVENT_DISCONNECTED
    static let closed = ZMQ_EVENT_CLOSED
    static let monitorStopped = ZMQ_EVENT_MONITOR_STOPPED
    static let handshakeSucceeded = ZMQ_EVENT_HANDSHAKE_SUCCEEDED
    static let handshakeFailedNoDetail = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
    static let handshakeFailedProtocol = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
    static let handshakeFailedAuth = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
    /// The handshake failures that show the peer is not a PortKit port (its greeting, socket
    /// type or security refused). `handshakeFailedNoDetail` (a timeout, a connection lost during
    /// the handshake) says nothing of the peer: libzmq reconnects.
    static let handshakeRefused = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
}
#endif
