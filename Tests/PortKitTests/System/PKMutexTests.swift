// PortKit's own futex lock: mutual exclusion under contention, sleepers woken, values of every
// kind (no payload, large, non-copyable) kept and released.

import Glibc
import Synchronization
import Testing
@testable import PortKit

@Suite("PKMutex")
struct PKMutexTests {
    /// Four threads (on two CPUs) add to one counter under the lock, with a read-modify-write
    /// that a lost exclusion would show as a missing count; the holder sometimes sleeps, so
    /// the others go past spinning and sleep on the futex, and must all be woken.
    @Test func contendedIncrementsAreNeverLost() throws {
        let counter = PKMutex<(count: Int, inside: Int, overlaps: Int)>((0, 0, 0))
        let threads = 4
        let rounds = 20_000
        let workers = (0..<threads).map { index in
            TestThread(name: "mutex-\(index)") {
                for round in 0..<rounds {
                    counter.withLock { state in
                        state.inside += 1
                        if state.inside != 1 { state.overlaps += 1 }
                        let seen = state.count
                        if round % 2_000 == 0 { usleep(200) }  // make the others sleep
                        state.count = seen + 1
                        state.inside -= 1
                    }
                }
            }
        }
        for worker in workers { try worker.join(timeout: patience(.seconds(60))) }
        let final = counter.withLock { $0 }
        #expect(final.count == threads * rounds)
        #expect(final.overlaps == 0)
    }

    /// The value is moved in, reached in place, and released with the mutex.
    @Test func theValueLivesAndDiesWithTheMutex() {
        struct Token: ~Copyable {
            let onRelease: @Sendable () -> Void
            deinit { onRelease() }
        }
        let released = Locked(0)
        do {
            let mutex = PKMutex(Token(onRelease: { released.withLock { $0 += 1 } }))
            mutex.withLock { _ in }
            #expect(released.value == 0)
        }
        #expect(released.value == 1, "a non-copyable value is released with its mutex")

        let empty = PKMutex(())
        empty.withLock { _ in }
        let wide = PKMutex((UInt8(1), SIMD16<UInt64>(repeating: 7), "text"))
        let sum = wide.withLock { value -> UInt64 in
            value.1[3] += 1
            return UInt64(value.0) + value.1.wrappedSum()
        }
        #expect(sum == 1 + 16 * 7 + 1)
        #expect(wide.withLock { $0.2 } == "text")
    }

    /// A body that throws leaves the lock free.
    @Test func aThrowingBodyReleasesTheLock() {
        struct Failure: Error {}
        let mutex = PKMutex(0)
        #expect(throws: Failure.self) { try mutex.withLock { (_: inout Int) throws(Failure) in throw Failure() } }
        let value = mutex.withLock { value -> Int in value += 1; return value }
        #expect(value == 1)
    }

    #if DEBUG
    /// Taking the lock again on the thread that holds it is a programmer error: debug builds
    /// trap with a message instead of hanging.
    @Test func takingTheLockAgainOnItsThreadTrapsInDebugBuilds() async {
        var result: ExitTest.Result?
        await exitTestInTurn {
            result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
                let mutex = PKMutex(0)
                // Without the check the second lock would wait for ever: SIGALRM ends the child
                // then, and the missing message fails the test rather than a hang.
                alarm(30)
                mutex.withLock { _ in mutex.withLock { _ in } }
                exit(0)  // reached only if the second lock neither trapped nor hung
            }
        }
        let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("taken again on the thread that holds it"))
    }
    #endif
}
