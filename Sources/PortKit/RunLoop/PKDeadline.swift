// A point on CLOCK_MONOTONIC, the clock of every PortKit deadline and timer.

/// A moment on the monotonic clock: when a run, a send or a request must give up, or when a
/// timer fires.
///
/// The guide's `[NSDate dateWithTimeIntervalSinceNow:5]` is `.after(.seconds(5))`;
/// `[NSDate distantFuture]` is `.distantFuture`; `[NSDate date]` is `.now`.
public struct PKDeadline: Comparable, Hashable, Sendable, CustomStringConvertible {
    /// Nanoseconds of CLOCK_MONOTONIC.
    public let uptimeNanoseconds: UInt64

    /// Makes a deadline from raw CLOCK_MONOTONIC nanoseconds.
    public init(uptimeNanoseconds: UInt64) { self.uptimeNanoseconds = uptimeNanoseconds }

    /// The present moment.
    public static var now: PKDeadline { PKDeadline(uptimeNanoseconds: monotonicNanoseconds()) }

    /// A deadline that never comes.
    public static let distantFuture = PKDeadline(uptimeNanoseconds: .max)

    /// A deadline that has always passed: an operation with it tries once and does not wait.
    public static let distantPast = PKDeadline(uptimeNanoseconds: 0)

    /// The moment `duration` from now. Negative durations give `now`.
    public static func after(_ duration: Duration) -> PKDeadline { .now + duration }

    /// The deadline moved by `duration`, saturating at `distantPast` and `distantFuture`.
    public static func + (lhs: PKDeadline, rhs: Duration) -> PKDeadline {
        let nanos = rhs.nanosecondsClamped
        if nanos >= 0 {
            let (sum, overflow) = lhs.uptimeNanoseconds.addingReportingOverflow(UInt64(nanos))
            return PKDeadline(uptimeNanoseconds: overflow ? .max : sum)
        }
        let magnitude = UInt64(-(nanos + 1)) + 1
        return PKDeadline(uptimeNanoseconds: lhs.uptimeNanoseconds > magnitude ? lhs.uptimeNanoseconds - magnitude : 0)
    }

    /// The time between two deadlines.
    public static func - (lhs: PKDeadline, rhs: PKDeadline) -> Duration {
        if lhs.uptimeNanoseconds >= rhs.uptimeNanoseconds {
            return .nanoseconds(Int64(clamping: lhs.uptimeNanoseconds - rhs.uptimeNanoseconds))
        }
        return .nanoseconds(-Int64(clamping: rhs.uptimeNanoseconds - lhs.uptimeNanoseconds))
    }

    public static func < (lhs: PKDeadline, rhs: PKDeadline) -> Bool {
        lhs.uptimeNanoseconds < rhs.uptimeNanoseconds
    }

    /// Whether the deadline has passed.
    public var hasPassed: Bool { self.uptimeNanoseconds <= monotonicNanoseconds() }

    public var description: String {
        if self == .distantFuture { return "PKDeadline.distantFuture" }
        return "PKDeadline(\(self - .now) from now)"
    }

    /// Milliseconds to wait from `now` for `epoll_wait`/`poll`, rounded up so that a wait never
    /// ends before the deadline; -1 for `distantFuture`.
    func pollTimeoutMilliseconds(now: UInt64) -> Int32 {
        if uptimeNanoseconds == .max { return -1 }
        if uptimeNanoseconds <= now { return 0 }
        let ms = (uptimeNanoseconds - now + 999_999) / 1_000_000
        return Int32(clamping: ms)
    }
}

extension Duration {
    /// The duration in nanoseconds, clamped to `Int64`.
    var nanosecondsClamped: Int64 {
        let (seconds, attoseconds) = components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        let (sum, overflow2) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000)
        if overflow2 { return seconds < 0 ? .min : .max }
        return sum
    }
}
