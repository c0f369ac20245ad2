// The one lock PortKit uses: a futex lock of its own around a value.
//
// Not Synchronization's `Mutex`, for two reasons measured on Linux. Its word holds the owner's
// thread id (a priority-inheritance futex), which each inlined copy of its lock caches per
// thread: a new thread made a `gettid` system call at every place it first took a lock, seven
// for a worker's start. And a contended `Mutex` hands the lock over inside the kernel, where
// ThreadSanitizer cannot see it, so PortKit paired every lock with two more atomic operations
// for the sanitizer's sake.
//
// This lock's word is 0 (free), 1 (held) or 2 (held, and a thread may sleep on it): the futex
// mutex of Drepper's "Futexes Are Tricky". Taking a free lock is one compare-and-exchange with
// acquire ordering, releasing it one exchange with release ordering, and a contended lock
// passes through the same word, so the sanitizer sees every hand-over as it is. The word and
// the value live in one allocation, so their addresses stay put when the struct moves. Debug
// builds also keep the holder's thread id, so that taking the lock again on the thread that
// holds it traps instead of hanging.

import CPortKit
import Synchronization

/// A mutex guarding a value. `package`: the ZeroMQ transport's tests use it too (the transport
/// itself has `ZMQMutex`, docs/decisions.md).
package struct PKMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    private let word: UnsafeMutablePointer<Atomic<UInt32>>
    /// The holder's thread id (debug builds only), beside the word.
    private let holder: UnsafeMutablePointer<Atomic<Int32>>
    private let value: UnsafeMutablePointer<Value>

    /// A mutex guarding `value`.
    package init(_ value: consuming sending Value) {
        let offset = Self.valueOffset
        let raw = UnsafeMutableRawPointer.allocate(
            byteCount: offset + MemoryLayout<Value>.size,
            alignment: Swift.max(MemoryLayout<UInt32>.alignment, MemoryLayout<Value>.alignment))
        word = raw.bindMemory(to: Atomic<UInt32>.self, capacity: 1)
        word.initialize(to: Atomic(0))
        holder = (raw + MemoryLayout<UInt32>.size).bindMemory(to: Atomic<Int32>.self, capacity: 1)
        holder.initialize(to: Atomic(0))
        self.value = (raw + offset).bindMemory(to: Value.self, capacity: 1)
        self.value.initialize(to: value)
    }

    deinit {
        value.deinitialize(count: 1)
        holder.deinitialize(count: 1)
        word.deinitialize(count: 1)
        UnsafeMutableRawPointer(word).deallocate()  // the allocation starts with the word
    }

    /// Where the value starts: after the word and the holder, at the value's alignment.
    private static var valueOffset: Int {
        let alignment = MemoryLayout<Value>.alignment
        return (MemoryLayout<UInt32>.size + MemoryLayout<Int32>.size + alignment - 1) / alignment * alignment
    }

    /// Runs `body` with the value, under the lock. Not re-entrant: taking the lock again on
    /// the thread that holds it deadlocks (debug builds trap instead).
    package borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        lock()
        defer { unlock() }
        return try body(&value.pointee)
    }

    @inline(__always)
    private func lock() {
        if !_fastPath(word.pointee.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged) {
            lockContended()
        }
        #if DEBUG
        holder.pointee.store(ThreadIdentity.current, ordering: .relaxed)
        #endif
    }

    @inline(never)
    private func lockContended() {
        #if DEBUG
        if holder.pointee.load(ordering: .relaxed) == ThreadIdentity.current {
            preconditionFailure("PKMutex: the lock is taken again on the thread that holds it")
        }
        #endif
        // A holder on another CPU usually lets go within a few hundred cycles: spin a little
        // before asking the kernel to put this thread to sleep.
        for _ in 0..<Self.spins {
            pk_spin_pause()
            if word.pointee.load(ordering: .relaxed) == 0,
               word.pointee.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged {
                return
            }
        }
        // Mark the lock contended (2) while taking it, so that its holder's unlock wakes a
        // sleeper; sleep while it stays held.
        while word.pointee.exchange(2, ordering: .acquiring) != 0 {
            pk_futex_wait(futexAddress, 2)
        }
    }

    @inline(__always)
    private func unlock() {
        #if DEBUG
        holder.pointee.store(0, ordering: .relaxed)
        #endif
        if _slowPath(word.pointee.exchange(0, ordering: .releasing) == 2) {
            pk_futex_wake_one(futexAddress)
        }
    }

    /// The word as the kernel sees it: `Atomic<UInt32>` is laid out as a `UInt32`.
    private var futexAddress: UnsafeMutablePointer<UInt32> {
        UnsafeMutableRawPointer(word).assumingMemoryBound(to: UInt32.self)
    }

    /// Busy-wait rounds before sleeping.
    private static var spins: Int { 100 }
}
