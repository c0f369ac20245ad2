// A custom input source (a version-0 CFRunLoopSource): signalled from any thread, performed on
// its loop's thread.

import Synchronization

/// A custom input source (`CFRunLoopSource` version 0, the guide's Listings 3-3 to 3-9).
///
/// Another thread hands the source work (in the guide, a command buffer), calls `signal()`,
/// and wakes the loop with `PKRunLoop.wakeUp()` (or both at once with `signal(waking:)`). On
/// its next pass in one of the source's modes the loop clears the signal and calls `perform`
/// (a run asked to return after one source performs one: the others signalled stay so, and go
/// first among sources of their order at the next run).
/// `schedule` and `cancel` are called on the loop's thread when the source is added to and
/// removed from a mode, as `CFRunLoopSourceContext`'s schedule and cancel routines are.
///
/// `signal()`, `signal(waking:)` and `invalidate()` are safe from any thread.
public final class PKCustomSource: @unchecked Sendable {
    /// Sources with a lower order are performed first within a pass.
    public let order: Int
    /// Whether the source is signalled and not yet performed.
    public var isSignalled: Bool { signalled.load(ordering: .acquiring) }
    /// Whether the source can still be performed.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    private let scheduleHandler: ((PKRunLoop, PKRunLoopMode) -> Void)?
    private let cancelHandler: ((PKRunLoop, PKRunLoopMode) -> Void)?
    private let performHandler: () -> Void
    private let signalled = Atomic<Bool>(false)
    private let valid = Atomic<Bool>(true)
    private let link = LoopLink()
    /// The modes of its loop the source is in. Loop-only.
    @exclusivity(unchecked) var modes: [PKRunLoopMode] = []
    /// Given by its loop when first added (see `PKRunLoop.nextAddedSequence`).
    @exclusivity(unchecked) var addedSequence: UInt64 = 0
    /// The loop the source was added to.
    var loop: PKRunLoop? {
        get { link.loop }
        set { link.loop = newValue }
    }

    /// A custom source (`CFRunLoopSourceCreate` with a version-0 context).
    ///
    /// - Parameters:
    ///   - order: the position among the mode's sources; lower first.
    ///   - schedule: called on the loop's thread when the source is added to a mode.
    ///   - cancel: called on the loop's thread when the source leaves a mode (removed,
    ///     invalidated, or its loop's thread ended).
    ///   - perform: called on the loop's thread after the source was signalled.
    public init(
        order: Int = 0,
        schedule: ((PKRunLoop, PKRunLoopMode) -> Void)? = nil,
        cancel: ((PKRunLoop, PKRunLoopMode) -> Void)? = nil,
        perform: @escaping () -> Void
    ) {
        self.order = order
        self.scheduleHandler = schedule
        self.cancelHandler = cancel
        self.performHandler = perform
    }

    /// Marks the source as ready to perform (`CFRunLoopSourceSignal`). Safe from any thread;
    /// it does not wake the loop: call `PKRunLoop.wakeUp()` too, or use `signal(waking:)`.
    public func signal() {
        if !signalled.exchange(true, ordering: .acquiringAndReleasing) { loop?.noteSignalled(self) }
    }

    /// Signals the source and wakes `loop` so it performs the source promptly.
    public func signal(waking loop: PKRunLoop) {
        signal()
        loop.wakeUp()
    }

    /// `signal(waking:)` for a source the caller knows was added to the loop that `doorbell`
    /// is of: it skips the lock and the weak load of the source's own link, and the caller
    /// holds the doorbell, not the loop (see `LoopDoorbell`).
    func signal(ringing doorbell: LoopDoorbell) {
        if !signalled.exchange(true, ordering: .acquiringAndReleasing) { doorbell.noteSignalled(self) }
        doorbell.wakeUp()
    }

    /// Removes the source from every mode of its loop, for good (`CFRunLoopSourceInvalidate`).
    /// Safe from any thread; the loop calls `cancel` for each mode on its own thread.
    public func invalidate() {
        guard valid.exchange(false, ordering: .acquiringAndReleasing) else { return }
        loop?.noteInvalidated(self)
    }

    func scheduled(on loop: PKRunLoop, mode: PKRunLoopMode) { scheduleHandler?(loop, mode) }
    func cancelled(on loop: PKRunLoop, mode: PKRunLoopMode) { cancelHandler?(loop, mode) }

    /// Clears the signal and performs; returns whether it performed. Loop-only.
    func performIfSignalled() -> Bool {
        guard isValid, signalled.exchange(false, ordering: .acquiringAndReleasing) else { return false }
        performHandler()
        return true
    }
}
