#if ZeroMQ
// Process-wide settings of the ZeroMQ transport: heartbeats, and where replies come back.

import PortKit

/// ZeroMQ heartbeats (ZMTP 3.1 PING/PONG, `ZMQ_HEARTBEAT_IVL`/`_TIMEOUT`/`_TTL`): how a peer
/// that went silent without closing its connection (a crashed host, a cut cable, a stopped
/// process) is noticed over `tcp://`.
///
/// `ipc://` connections and binds have none: their peer is on this host, whose kernel reports
/// its death at once, and a stopped local process is alive, as with PortKit's Unix-socket
/// ports (protocol.md 10.5).
public struct PKZMQHeartbeat: Sendable, Equatable {
    /// How often each side sends a PING when the connection is otherwise quiet. Default 1 s.
    /// A receive port's PINGs also tell its senders that it lives while it is behind (its
    /// queue full, libzmq reads nothing from them): keep it below the senders' `timeout`.
    public var interval: Duration
    /// How long a sender (a send right's connection) waits for any traffic after a PING before
    /// it drops the connection. A receive port drops no sender for silence (a sender that is
    /// merely ahead of it would be dropped), and asks its senders, as the TTL its PINGs carry,
    /// to drop it after this long without them (at most 65.5 s, what the TTL can carry).
    /// Default 3 s.
    public var timeout: Duration

    /// Heartbeats every `interval`, dropping a connection silent for `timeout` after a PING.
    public init(interval: Duration = .seconds(1), timeout: Duration = .seconds(3)) {
        self.interval = interval
        self.timeout = timeout
    }

    /// The defaults: 1 s and 3 s.
    public static let `default` = PKZMQHeartbeat()

    /// The longest a silent peer goes unnoticed: `interval + timeout` (plus scheduling delays).
    /// A peer whose process dies on a live host is noticed at once: its kernel closes the
    /// connection.
    public var bound: Duration { interval + timeout }

    var intervalMilliseconds: Int32 { Self.milliseconds(interval) }
    var timeoutMilliseconds: Int32 { Self.milliseconds(timeout) }
    /// The TTL travels in deciseconds, in 16 bits, and libzmq keeps it in 16 bits of
    /// milliseconds once it has it: rounded up to a whole decisecond, at most 65.5 s (a longer
    /// one wraps around at the peer: 65.6 s arrived as 64 ms, and the peer dropped a live
    /// receiver a moment after each PING). A timeout past 65.5 s is the senders' own, and
    /// applies when they can PING.
    var ttlMilliseconds: Int32 { Int32(min((Int64(Self.milliseconds(timeout)) + 99) / 100 * 100, 65_500)) }

    /// At least 1 ms, at most `Int32.max` (saturating: a "never" of `.seconds(Int64.max)`
    /// trapped on the multiplication).
    private static func milliseconds(_ duration: Duration) -> Int32 {
        let (seconds, attoseconds) = duration.components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        let (total, overflowAgain) = whole.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
        if overflow || overflowAgain { return seconds < 0 ? 1 : .max }
        return Int32(clamping: max(1, total))
    }
}

/// Process-wide settings of the ZeroMQ transport. Each applies to the binds and connections
/// made after it is set; set them before making ports.
public enum PKZMQTransport {
    private static let settings = ZMQMutex<Settings>(Settings())

    private struct Settings {
        var heartbeat = PKZMQHeartbeat.default
        var replyHost: String?
    }

    /// The heartbeats of every `tcp://` bind and connection made from now on (receive ports,
    /// the reply port, connections to ports); `ipc://` ones have none.
    public static var heartbeat: PKZMQHeartbeat {
        get { settings.withLock { $0.heartbeat } }
        set { settings.withLock { $0.heartbeat = newValue } }
    }

    /// The host (an address of this machine) whose `tcp://` endpoint replies to requests come
    /// back to. `nil`, the default, picks the local address the kernel uses toward each
    /// destination, which suits hosts that reach each other without address translation. A
    /// wildcard (`0.0.0.0` or `*`) binds every address and tells each destination the local
    /// address the kernel uses toward it, as a receive port bound to a wildcard does.
    public static var replyHost: String? {
        get { settings.withLock { $0.replyHost } }
        set { settings.withLock { $0.replyHost = newValue } }
    }

    /// The version of the libzmq PortKit runs on, as "major.minor.patch".
    public static var libraryVersion: String { ZMQContext.libraryVersion }
}
#endif
