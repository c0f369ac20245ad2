// Starting and joining threads (pthread_create(3), pthread_join(3)), for workers and the
// background loop. The core does not import Foundation.

import CPortKit
import Glibc

/// A joinable thread running a Swift closure. `join(until:)` and `detach` are for one caller at
/// a time (the owner: `PKWorkerThread.stop` lets one through).
package final class SystemThread: @unchecked Sendable {
    private var handle = pthread_t()
    private var joined = false

    /// Starts `body` on a new thread. The corresponding call is `pthread_create(3)`.
    package init(name: String, _ body: @escaping @Sendable () -> Void) throws(PKError) {
        let box = Unmanaged.passRetained(ThreadBody(name: name, body: body)).toOpaque()
        let rc = pthread_create(&handle, nil, { context in
            let body = Unmanaged<ThreadBody>.fromOpaque(context!).takeRetainedValue()
            pk_set_thread_name(body.name)
            body.body()
            return nil
        }, box)
        if rc != 0 {
            Unmanaged<ThreadBody>.fromOpaque(box).release()
            throw PKError(.system, "cannot start thread \(name)", call: "pthread_create", errno: rc)
        }
    }

    /// Whether the calling thread is this thread (which cannot join itself).
    var isCurrent: Bool { pthread_equal(handle, pthread_self()) != 0 }

    /// Waits for the thread to end until `deadline`; returns whether it ended (and was joined).
    /// The corresponding call is `pthread_timedjoin_np(3)` (a jump of the wall clock during the
    /// wait moves its end).
    func join(until deadline: PKDeadline) -> Bool {
        guard !joined else { return true }
        guard pk_thread_join_until(handle, deadline.uptimeNanoseconds) == 0 else { return false }
        joined = true
        return true
    }

    /// Lets the thread end on its own without being joined. The corresponding call is `pthread_detach(3)`.
    func detach() {
        guard !joined else { return }
        joined = true
        pthread_detach(handle)
    }

    deinit { if !joined { pthread_detach(handle) } }
}

private final class ThreadBody {
    let name: String
    let body: @Sendable () -> Void
    init(name: String, body: @escaping @Sendable () -> Void) {
        self.name = name
        self.body = body
    }
}

/// How the scheduler treats the calling thread.
enum ThreadScheduling {
    /// Makes the calling thread a throughput thread: its wake-ups never preempt the thread
    /// running on its CPU. The corresponding call is `sched_setscheduler(2)` with `SCHED_BATCH`.
    /// Returns whether it took. It needs no privilege, except to leave `SCHED_IDLE` (a thread
    /// inherits its creator's policy); a refusal leaves the policy as it was.
    @discardableResult
    static func preferThroughput() -> Bool { pk_prefer_throughput() == 0 }

    /// Whether the calling thread is a throughput thread. The corresponding call is
    /// `sched_getscheduler(2)`.
    static var prefersThroughput: Bool { pk_is_throughput_thread() != 0 }
}

/// Work to do when the process calls `exit` (`atexit(3)`), registered once per handler.
package enum ProcessExit {
    private static let handlers = PKMutex<[@Sendable () -> Void]>([])

    package static func register(_ handler: @escaping @Sendable () -> Void) {
        let first = handlers.withLock { list in
            list.append(handler)
            return list.count == 1
        }
        if first { atexit { ProcessExit.runAll() } }
    }

    private static func runAll() {
        for handler in handlers.withLock({ $0 }) { handler() }
    }
}

/// Threads that async requests wait on (one a request, while its send waits for room or for its
/// connection), so that no thread of Swift concurrency's pool waits: at most `limit` at once,
/// since many requests to a stalled receiver must not use up the user's threads
/// (`RLIMIT_NPROC` counts them). A request beyond the limit is suspended, in turn, until one
/// ends: it blocks no thread either (a blocked pool thread could be the one that the work that
/// makes room needs).
package enum WaitingSendThreads {
    package static let limit = 64

    private struct State {
        var running = 0
        /// Requests waiting for a thread, first come first served; each resumed with true
        /// when given one, false when its deadline passed first (`expiry` ends it then, and is
        /// cancelled if a thread comes first).
        var waiting: [(id: UInt64, slot: CheckedContinuation<Bool, Never>, expiry: Task<Void, Never>?)] = []
        var nextID: UInt64 = 0
    }
    private static let state = PKMutex(State())

    /// Runs `body` on a thread of its own, once fewer than `limit` such threads run, and
    /// returns its value. Returns nil, having run nothing, if no thread was free by `deadline`
    /// (a request's send deadline: threads held by requests to a stalled receiver must not make
    /// a request wait past its own), or none could be started: the caller then runs `body`
    /// itself (past its deadline, a send waits no more).
    package static func run<Value: Sendable>(
        name: String, until deadline: PKDeadline, _ body: @escaping @Sendable () -> Value
    ) async -> Value? {
        guard await takeSlot(until: deadline) else { return nil }
        // The value goes under a lock, which ThreadSanitizer sees (not a continuation's hand-over).
        let outcome = HandOver<Value>()
        let ran = await withCheckedContinuation { (done: CheckedContinuation<Bool, Never>) in
            do throws(PKError) {
                _ = try SystemThread(name: name) {
                    let value = body()
                    outcome.slot.withLock { $0 = value }
                    giveBackSlot()
                    done.resume(returning: true)
                }
            } catch {
                giveBackSlot()
                done.resume(returning: false)
            }
        }
        return ran ? outcome.slot.withLock { $0 } : nil
    }

    /// Takes a thread's slot, waiting in turn until `deadline` at most; whether it got one.
    private static func takeSlot(until deadline: PKDeadline) async -> Bool {
        await withCheckedContinuation { (slot: CheckedContinuation<Bool, Never>) in
            let waiting = state.withLock { state -> UInt64? in
                guard state.running < limit else {
                    state.nextID += 1
                    state.waiting.append((state.nextID, slot, nil))
                    return state.nextID
                }
                state.running += 1
                return nil
            }
            guard let waiting else { return slot.resume(returning: true) }
            guard deadline.uptimeNanoseconds != PKDeadline.distantFuture.uptimeNanoseconds else { return }
            // At the deadline, a request still waiting leaves the queue unserved.
            let delay = Duration.nanoseconds(Int64(clamping: deadline.uptimeNanoseconds &- min(deadline.uptimeNanoseconds, monotonicNanoseconds())))
            let expiry = Task.detached {
                do { try await Task.sleep(for: delay) } catch { return }  // served first
                let expired = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                    guard let index = state.waiting.firstIndex(where: { $0.id == waiting }) else { return nil }
                    return state.waiting.remove(at: index).slot
                }
                expired?.resume(returning: false)
            }
            let stillWaiting = state.withLock { state -> Bool in
                guard let index = state.waiting.firstIndex(where: { $0.id == waiting }) else { return false }
                state.waiting[index].expiry = expiry
                return true
            }
            if !stillWaiting { expiry.cancel() }
        }
    }

    /// Passes the slot to the first request waiting for one, or frees it.
    private static func giveBackSlot() {
        let next = state.withLock { state -> (slot: CheckedContinuation<Bool, Never>, expiry: Task<Void, Never>?)? in
            guard !state.waiting.isEmpty else {
                state.running -= 1
                return nil
            }
            let first = state.waiting.removeFirst()
            return (first.slot, first.expiry)
        }
        next?.expiry?.cancel()  // a sleeping task no more, for a request served before its deadline
        next?.slot.resume(returning: true)
    }

    /// Tests: how many threads run, and how many requests wait for one.
    static var countsForTests: (running: Int, waiting: Int) {
        state.withLock { ($0.running, $0.waiting.count) }
    }
}

/// Passes a value from one thread to a task awaiting it under a lock, so that ThreadSanitizer
/// sees the hand-over (it does not see a continuation's).
final class HandOver<Value: Sendable>: Sendable {
    let slot = PKMutex<Value?>(nil)
}
