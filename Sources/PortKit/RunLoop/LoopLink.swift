// The loop an item (timer, custom source, observer) belongs to, readable from any thread: an
// item's `invalidate()` and a source's `signal()` run anywhere, while the loop sets the link
// on its own thread when the item is added.

/// A weak, lock-guarded reference from an item to its loop.
final class LoopLink: Sendable {
    private struct Weak { weak var loop: PKRunLoop? }
    private let state = PKMutex<Weak>(Weak())

    init() {}

    var loop: PKRunLoop? {
        get { state.withLock { $0.loop } }
        set { state.withLock { $0.loop = newValue } }
    }
}
