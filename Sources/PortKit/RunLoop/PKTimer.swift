// A run-loop timer (NSTimer, CFRunLoopTimer): fires on its loop's thread, never early.

import Synchronization

/// A timer that fires on the thread of the run loop it is added to (`NSTimer`, `CFRunLoopTimer`).
///
/// A timer fires at or after its fire date, never before. With a `tolerance` the loop may fire
/// it up to that much later, to wake once for several timers. A repeating timer stays on the
/// grid of its first fire date: if the loop was busy past several fire dates, it fires once and
/// its next fire date is the next point of the grid after now.
///
/// A timer belongs to one loop (in any number of its modes). `invalidate()` may be called from
/// any thread; everything else that changes the timer is loop-only once it is added.
public final class PKTimer: @unchecked Sendable {
    /// The interval of a repeating timer; `nil` for a one-shot timer.
    public let interval: Duration?
    /// How much later than its fire date the loop may fire the timer. Default zero.
    public var tolerance: Duration = .zero {
        didSet { loop?.timersChanged() }
    }

    /// When the timer fires next.
    public var fireDate: PKDeadline {
        get { PKDeadline(uptimeNanoseconds: fireNanoseconds) }
        set { fireNanoseconds = newValue.uptimeNanoseconds; loop?.timersChanged() }
    }

    /// Whether the timer can still fire.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    // Loop-only state, guarded by the owning loop's thread.
    @exclusivity(unchecked) var fireNanoseconds: UInt64
    @exclusivity(unchecked) var isFiring = false
    /// Given by its loop when first added (see `PKRunLoop.nextAddedSequence`).
    @exclusivity(unchecked) var addedSequence: UInt64 = 0
    private let link = LoopLink()
    /// The loop the timer was added to.
    var loop: PKRunLoop? {
        get { link.loop }
        set { link.loop = newValue }
    }
    private let handler: (PKTimer) -> Void
    private let valid = Atomic<Bool>(true)

    /// A timer that first fires at `fireDate` and then, if `interval` is given, every `interval`.
    ///
    /// - Parameters:
    ///   - fireDate: the first fire date.
    ///   - interval: the repeat interval; `nil` (or not positive) for a one-shot timer.
    ///   - tolerance: how late the loop may fire it.
    ///   - handler: called on the loop's thread each time the timer fires.
    public init(
        fireDate: PKDeadline, interval: Duration? = nil, tolerance: Duration = .zero,
        handler: @escaping (PKTimer) -> Void
    ) {
        self.fireNanoseconds = fireDate.uptimeNanoseconds
        self.interval = interval.flatMap { $0 > .zero ? $0 : nil }
        self.tolerance = tolerance
        self.handler = handler
    }

    /// A timer that fires `interval` from now and, if `repeats`, every `interval` after that
    /// (`+[NSTimer timerWithTimeInterval:repeats:block:]`).
    public convenience init(interval: Duration, repeats: Bool, handler: @escaping (PKTimer) -> Void) {
        self.init(fireDate: .after(interval), interval: repeats ? interval : nil, handler: handler)
    }

    /// Stops the timer for good and removes it from its loop. Safe from any thread.
    public func invalidate() {
        guard valid.exchange(false, ordering: .acquiringAndReleasing) else { return }
        guard let loop else { return }
        loop.noteTimersChanged()
        loop.noteItemInvalidated()
        loop.noteInvalidationWaking()
    }

    /// Fires the timer now, on the calling thread, without changing its schedule (`-[NSTimer fire]`).
    public func fire() {
        guard isValid else { return }
        handler(self)
        if interval == nil { invalidate() }
    }

    /// Runs the handler and moves the fire date; loop-only.
    func fireOnLoop(_ loop: PKRunLoop, now: () -> UInt64) {
        // `isFiring` and the fire date count in the loop's earliest dates: each change is noted.
        isFiring = true
        loop.noteTimersChanged()
        handler(self)
        isFiring = false
        defer { loop.noteTimersChanged() }
        guard isValid else { return }
        guard let interval else { invalidate(); return }
        let step = UInt64(max(interval.nanosecondsClamped, 1))
        let current = now()
        if fireNanoseconds <= current {
            let missed = (current - fireNanoseconds) / step + 1
            fireNanoseconds += missed * step
        }
    }

    /// The latest moment the loop may fire the timer.
    var latestNanoseconds: UInt64 {
        let slack = UInt64(max(tolerance.nanosecondsClamped, 0))
        let (sum, overflow) = fireNanoseconds.addingReportingOverflow(slack)
        return overflow ? .max : sum
    }
}
