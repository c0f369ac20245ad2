#if ZeroMQ
// The plain descriptor calls the transport makes: an eventfd that interrupts a waiting send,
// and poll(2) with a PortKit deadline.

import CZeroMQ
import Glibc
import PortKit

/// A descriptor another thread signals to wake a thread blocked in `Descriptors.wait`. Owns
/// its eventfd. Signalling is sticky: once signalled it stays readable until drained or closed.
final class InterruptSignal: @unchecked Sendable {
    let descriptor: Int32

    /// The corresponding system call is `eventfd(2)`.
    init() throws(PKError) {
        let fd = pkz_eventfd()
        guard fd >= 0 else { throw PKError(.system, "eventfd failed", call: "eventfd", errno: errno) }
        descriptor = fd
    }

    deinit { _ = Glibc.close(descriptor) }

    /// Makes the descriptor readable. Safe from any thread. The corresponding system call is
    /// `write(2)`.
    func signal() {
        var one: UInt64 = 1
        _ = withUnsafeBytes(of: &one) { Glibc.write(descriptor, $0.baseAddress, 8) }
    }

    /// Makes the descriptor unreadable again, until the next `signal`. The corresponding system
    /// call is `read(2)` (which does not block: the eventfd is non-blocking).
    func drain() {
        var count: UInt64 = 0
        _ = withUnsafeMutableBytes(of: &count) { Glibc.read(descriptor, $0.baseAddress, 8) }
    }
}

enum Descriptors {
    /// Milliseconds from now to `deadline` for poll(2), rounded up so that a wait never ends
    /// early; -1 for `distantFuture`, 0 once it has passed.
    static func pollTimeout(until deadline: PKDeadline) -> Int32 {
        if deadline == .distantFuture { return -1 }
        let now = PKDeadline.now.uptimeNanoseconds
        if deadline.uptimeNanoseconds <= now { return 0 }
        return Int32(clamping: (deadline.uptimeNanoseconds - now + 999_999) / 1_000_000)
    }

    /// Waits until one of `descriptors` is readable or `deadline` passes; returns which are
    /// readable (all false on timeout). EINTR is retried. The corresponding system call is
    /// `poll(2)`.
    static func waitReadable(_ descriptors: [Int32], until deadline: PKDeadline) -> [Bool] {
        var fds = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        while true {
            let rc = poll(&fds, nfds_t(fds.count), pollTimeout(until: deadline))
            if rc >= 0 { return fds.map { $0.revents != 0 } }
            if errno != EINTR { return fds.map { _ in false } }
        }
    }
}
#endif
