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

#if ZeroMQ
import CZeroMQ
import Glibc
import PortKit

/// A mutex guarding a value that a caller can stop waiting for at a deadline: a connection's
/// socket, which a sender holds while it waits for room (maybe until a distant deadline of its
/// own) and which another sender must not wait for past its deadline. `Mutex` has no timed
/// wait; glibc's mutex has one on CLOCK_MONOTONIC (`pthread_mutex_clocklock`), the clock of
/// PortKit's deadlines. ThreadSanitizer sees glibc's hand-offs itself.
struct ZMQDeadlineMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let value: UnsafeMutablePointer<Value>

    /// A mutex guarding `value`.
    init(_ value: consuming sending Value) {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        self.value = .allocate(capacity: 1)
        self.value.initialize(to: value)
    }

    deinit {
        value.deinitialize(count: 1)
        value.deallocate()
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the value, under the lock.
    borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value.pointee)
    }

    /// Runs `body` with the value under the lock, if the lock is free by `deadline` (at once,
    /// if it is free now, even after the deadline); nil if it is not.
    borrowing func withLock<Result: ~Copyable, E: Error>(
        before deadline: PKDeadline, _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result? {
        if deadline == .distantFuture {
            pthread_mutex_lock(mutex)
        } else {
            let nanoseconds = deadline.uptimeNanoseconds
            var until = timespec(tv_sec: Int(nanoseconds / 1_000_000_000), tv_nsec: Int(nanoseconds % 1_000_000_000))
            guard pkz_mutex_lock_until(mutex, &until) == 0 else { return nil }
        }
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value.pointee)
    }

    /// Runs `body` with the value under the lock if the lock is free now; nil if it is not.
    borrowing func withLockIfAvailable<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result? {
        guard pthread_mutex_trylock(mutex) == 0 else { return nil }
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value.pointee)
    }
}
#endif
