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
    /// The duration in nanoseconds, rounded toward zero and clamped to `Int64`.
    ///
    /// One 128-by-64-bit division of the attoseconds' magnitude (a `div` instruction), not
    /// `components`, which divides by 10^18 twice through the runtime's 128-bit division
    /// (about 190 instructions; a request turns two timeouts into deadlines).
    var nanosecondsClamped: Int64 {
        let attoseconds = self.attoseconds
        let magnitude = attoseconds.magnitude
        let high = UInt64(truncatingIfNeeded: magnitude >> 64)
        let low = UInt64(truncatingIfNeeded: magnitude)
        let perNanosecond: UInt64 = 1_000_000_000
        // A quotient of 2^64 or more does not fit (the division would trap).
        guard high < perNanosecond else { return attoseconds < 0 ? .min : .max }
        let nanoseconds = perNanosecond.dividingFullWidth((high: high, low: low)).quotient
        if attoseconds < 0 {
            return nanoseconds > Int64.max.magnitude ? .min : -Int64(nanoseconds)
        }
        return nanoseconds > Int64.max.magnitude ? .max : Int64(nanoseconds)
    }
}
