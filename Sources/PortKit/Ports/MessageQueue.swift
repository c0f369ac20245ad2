// The queue of a connection's messages read and not yet delivered: a ring that moves messages in
// and out, never copying one.

/// Messages in the order they arrived, moved in by `append` and out by `popFirst`.
///
/// An array with a head index did the same with a placeholder message swapped into each taken
/// slot and the placeholders destroyed when the array was cleared, and checked the array's
/// uniqueness on every change: a dozen calls into the runtime a message that a ring of raw
/// memory does not make. Noncopyable, so the memory has one owner, which frees it.
struct MessageQueue: ~Copyable {
    /// Room for `capacity` messages, a power of two (or none).
    private var storage: UnsafeMutablePointer<PKPortMessage>?
    private var capacity = 0
    /// Where the first message is.
    private var head = 0
    /// How many messages are queued.
    private(set) var count = 0

    init() {}

    deinit {
        destroyMessages()
        storage?.deallocate()
    }

    var isEmpty: Bool { count == 0 }

    /// Queues `message` last.
    mutating func append(_ message: consuming PKPortMessage) {
        if count == capacity { grow() }
        (storage! + ((head + count) & (capacity - 1))).initialize(to: message)
        count += 1
    }

    /// Takes the first message out, or `nil` when there is none.
    mutating func popFirst() -> PKPortMessage? {
        guard count > 0 else { return nil }
        let message = (storage! + head).move()
        count -= 1
        head = count == 0 ? 0 : (head + 1) & (capacity - 1)
        return message
    }

    /// Destroys every queued message, keeping the memory.
    mutating func removeAll() {
        destroyMessages()
        count = 0
        head = 0
    }

    /// Deinitializes the `count` messages from `head` (the caller forgets them).
    private func destroyMessages() {
        guard let storage else { return }
        for index in 0..<count { (storage + ((head + index) & (capacity - 1))).deinitialize(count: 1) }
    }

    /// Twice the room (8 at first), the messages moved to its start in order. Out of line: a
    /// queue grows a few times in its life, and this code would sit among `append`'s.
    @inline(never)
    private mutating func grow() {
        let grown = Swift.max(8, capacity * 2)
        let fresh = UnsafeMutablePointer<PKPortMessage>.allocate(capacity: grown)
        if let storage {
            let first = Swift.min(count, capacity - head)
            (fresh).moveInitialize(from: storage + head, count: first)
            (fresh + first).moveInitialize(from: storage, count: count - first)
            storage.deallocate()
        }
        storage = fresh
        capacity = grown
        head = 0
    }
}
