// A run-loop observer (CFRunLoopObserver): called at chosen points of each pass.

import Synchronization

/// An observer of a run loop's activities (`CFRunLoopObserver`).
///
/// Observers of a mode are called in ascending `order` at the activities they watch while the
/// loop runs that mode. A non-repeating observer is invalidated after its first call.
/// `invalidate()` is safe from any thread.
public final class PKRunLoopObserver: @unchecked Sendable {
    /// The activities this observer watches.
    public let activities: PKRunLoopActivity
    /// Whether the observer stays after its first call.
    public let repeats: Bool
    /// Observers with a lower order are called first.
    public let order: Int
    /// Whether the observer will still be called.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    private let handler: (PKRunLoopObserver, PKRunLoopActivity) -> Void
    private let valid = Atomic<Bool>(true)
    private let link = LoopLink()
    /// The loop the observer was added to.
    var loop: PKRunLoop? {
        get { link.loop }
        set { link.loop = newValue }
    }

    /// An observer (`CFRunLoopObserverCreateWithHandler`).
    ///
    /// - Parameters:
    ///   - activities: the activities to watch.
    ///   - repeats: `false` to be called once only.
    ///   - order: the position among the mode's observers; lower first.
    ///   - handler: called on the loop's thread with the activity that happened.
    public init(
        activities: PKRunLoopActivity, repeats: Bool = true, order: Int = 0,
        handler: @escaping (PKRunLoopObserver, PKRunLoopActivity) -> Void
    ) {
        self.activities = activities
        self.repeats = repeats
        self.order = order
        self.handler = handler
    }

    /// Stops the observer for good and removes it from its loop. Safe from any thread.
    public func invalidate() {
        guard valid.exchange(false, ordering: .acquiringAndReleasing), let loop else { return }
        loop.noteItemInvalidated()
        loop.noteInvalidation()
    }

    /// Set while the handler runs: a run of the loop inside it (a nested run in a mode the
    /// observer is in too) does not call it again, as `CFRunLoop` does not call a firing
    /// observer (it recursed until the stack ran out). Loop-only.
    private var isFiring = false

    func call(_ activity: PKRunLoopActivity) {
        guard isValid, !isFiring, activities.contains(activity) else { return }
        isFiring = true
        handler(self, activity)
        isFiring = false
        if !repeats { invalidate() }
    }
}
