// The one lock PortKit uses: Synchronization's Mutex, made visible to ThreadSanitizer.
//
// On Linux, a contended `Mutex` hands the lock over inside the kernel (a futex), where
// ThreadSanitizer cannot see it, so it reports races on the very state the lock guards. An
// acquire/release pair on an atomic inside the critical section gives the sanitizer the
// happens-before edge it misses; it costs two uncontended atomic operations.

import Synchronization

/// A mutex guarding a value; `Mutex` with hand-offs ThreadSanitizer can see. Shared with the
/// package's other modules (the ZeroMQ transport).
package struct PKMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    private let mutex: Mutex<Value>
    private let handOff = Atomic<UInt>(0)

    /// A mutex guarding `value`.
    package init(_ value: consuming sending Value) { mutex = Mutex(value) }

    /// Runs `body` with the value, under the lock.
    package borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        try mutex.withLock { (value: inout sending Value) throws(E) -> sending Result in
            _ = handOff.wrappingAdd(1, ordering: .acquiring)
            defer { _ = handOff.wrappingAdd(1, ordering: .releasing) }
            return try body(&value)
        }
    }
}
