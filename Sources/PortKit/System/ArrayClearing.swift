// Emptying the small arrays a loop pass reuses (signalled sources, queued messages, pending
// writes) without giving up their storage.

extension Array {
    /// Removes every element and keeps the storage, as `removeAll(keepingCapacity: true)` does,
    /// but element by element from the end: for the one or two elements a pass usually leaves,
    /// that is a few instructions, where `removeAll(keepingCapacity:)` goes through
    /// `replaceSubrange` (about 150 instructions even for one element; it was a tenth of a
    /// thread round trip).
    @inline(__always)
    mutating func removeAllKeepingStorage() {
        while !isEmpty { removeLast() }
    }
}
