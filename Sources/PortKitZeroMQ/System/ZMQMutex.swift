#if ZeroMQ
// The ZeroMQ transport's lock: Synchronization's `Mutex` with hand-offs ThreadSanitizer can see
// (a contended `Mutex` hands the lock over in the kernel, out of the sanitizer's sight; an
// acquiring load and a releasing store of an atomic inside the critical section give it the
// edge it misses). A load and a store, not two read-modify-writes: on x86 they are plain moves,
// where each locked instruction costs about 4.7 ns here, two a lock, several locks a message.
//
// Why not the core's `PKMutex` (a futex lock of PortKit's own): a generic of another module
// reaches this one without its body (PortKit's serialized module carries none for
// `PKMutex.withLock`, even marked `@inlinable`; measured with `swiftc -emit-sil`,
// docs/performance-history.md), so every call ran unspecialized and looked up generic metadata at run
// time: about a tenth of a ZeroMQ message's cost. Declared here, the compiler specializes and
// inlines it as PortKit does `PKMutex`.

import Synchronization

/// A mutex guarding a value, with hand-offs ThreadSanitizer can see.
struct ZMQMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    private let mutex: Mutex<Value>
    private let handOff = Atomic<UInt>(0)

    /// A mutex guarding `value`.
    init(_ value: consuming sending Value) { mutex = Mutex(value) }

    /// Runs `body` with the value, under the lock.
    borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        try mutex.withLock { (value: inout sending Value) throws(E) -> sending Result in
            // The value stored is of no interest: the sanitizer orders each releasing store
            // before the acquiring load that reads it, that is, one holder before the next.
            _ = handOff.load(ordering: .acquiring)
            defer { handOff.store(0, ordering: .releasing) }
            return try body(&value)
        }
    }

    /// Runs `body` with the value under the lock if the lock is free now; nil if it is not.
    borrowing func withLockIfAvailable<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result? {
        try mutex.withLockIfAvailable { (value: inout sending Value) throws(E) -> sending Result in
            _ = handOff.load(ordering: .acquiring)
            defer { handOff.store(0, ordering: .releasing) }
            return try body(&value)
        }
    }
}
#endif
