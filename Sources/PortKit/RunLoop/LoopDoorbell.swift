// The part of a loop that other threads ring: its wake-up eventfd and the queue of custom
// sources signalled for it. An object of its own so that a sender can hold it cheaply: a loop
// has weak references (its items' links to it), so every retain and release of a loop takes
// the Swift runtime's slow path (a side table, three locked instructions each), where this
// has none. A port's in-process sender rings its loop's doorbell for the first message of each
// batch it queues (one a message in a round trip).

import Synchronization

/// A loop's wake-up and signalled-source queue, shared with the threads that wake it. The loop
/// makes it and its eventfd and holds it; a sender holds it from the port's lock to the end of
/// its ring. The eventfd lives as long as the doorbell, so a sender that still holds one never
/// writes a descriptor that was closed, even if the loop is gone meanwhile.
final class LoopDoorbell: Sendable {
    /// The eventfd, -1 until the loop makes its kernel objects (see `PKRunLoop.makeKernelObjects`).
    let wakeDescriptor = Atomic<Int32>(-1)
    /// A wake-up was asked for and the loop has not taken it yet.
    let wakePending = Atomic<Bool>(false)
    /// Set when a custom source may have been signalled since the last scan, so a pass looks at
    /// the mode's custom sources only then (a loop with a thousand idle ports scans nothing).
    let signalHint = Atomic<Bool>(true)
    /// Custom sources signalled since the loop last looked, in the order they were signalled:
    /// a pass performs these, never scanning the mode's other sources.
    /// `nil` once the loop's thread has ended: a source signalled then is not kept (its
    /// closures may hold the loop, which would then keep its descriptors for good).
    let signalledQueue = PKMutex<[PKCustomSource]?>([])

    init() {}

    deinit {
        let wake = wakeDescriptor.load(ordering: .acquiring)
        if wake >= 0 { Descriptor.close(wake) }
    }

    /// Notes that `source`, a custom source of the loop, was signalled: the loop's next pass in
    /// one of the source's modes performs it. Safe from any thread.
    func noteSignalled(_ source: PKCustomSource) {
        signalledQueue.withLock { $0?.append(source) }
        signalHint.store(true, ordering: .releasing)
    }

    /// Wakes the loop if it sleeps (`PKRunLoop.wakeUp()`). Safe from any thread.
    func wakeUp() {
        if !wakePending.exchange(true, ordering: .sequentiallyConsistent) {
            // No eventfd yet: the loop has never slept, and signals itself when it makes one.
            let wake = wakeDescriptor.load(ordering: .sequentiallyConsistent)
            if wake >= 0 { EventFD.signal(wake) }
        }
    }
}
