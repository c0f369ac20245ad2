// Delivery beyond the run loop: a port as an AsyncSequence, on a
// DispatchQueue, and async request/reply.

import Dispatch
import Glibc
import Testing
@testable import PortKit

/// Runs `body`, failing with `TestTimeout` if it has not finished after `timeout`.
func withDeadline<R: Sendable>(
    _ timeout: Duration, _ what: String, _ body: @escaping @Sendable () async throws -> R
) async throws -> R {
    try await withThrowingTaskGroup(of: R?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try? await Task.sleep(for: patience(timeout))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw TestTimeout(what: what) }
        return value
    }
}

/// Waits, without blocking a thread of Swift concurrency's pool (which the tasks under test
/// need), until `condition` holds; fails with `TestTimeout` after `timeout` (patience applied).
/// 30 s by default, as `withDeadline`'s callers allow: other tests (exit tests' parents, long
/// synchronous ones) can hold the pool's two threads for a while, this poll's with them.
func waitAsync(_ what: String, timeout: Duration = .seconds(30), _ condition: @Sendable () -> Bool) async throws {
    let deadline = ContinuousClock.now + patience(timeout)
    while !condition() {
        guard ContinuousClock.now < deadline else { throw TestTimeout(what: what) }
        try? await Task.sleep(for: .milliseconds(1))
    }
}

/// Runs tasks that prefer it on a dispatch queue of its own, off Swift concurrency's pool: a
/// test that holds the background loop until one of its tasks gets somewhere cannot count on
/// the pool, whose two threads other tests may have blocked waiting for that same loop.
final class QueueExecutor: TaskExecutor {
    private let queue = DispatchQueue(label: "portkit.test.executor")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}

/// What `body` returns, run on the background loop (whose state is loop-only), waited for up
/// to `timeout` (patience applied); `nil` if the loop did not get to it by then.
func onBackgroundLoop<R: Sendable>(timeout: Duration = .seconds(30), _ body: @escaping @Sendable () -> R) -> R? {
    let done = DispatchSemaphore(value: 0)
    let result = Locked<R?>(nil)
    PKRunLoop.background.perform {
        result.value = body()
        done.signal()
    }
    let (seconds, attoseconds) = patience(timeout).components
    let nanoseconds = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
    guard done.wait(timeout: .now() + .nanoseconds(nanoseconds)) == .success else { return nil }
    return result.value
}

/// A thread sending messages numbered `ids` through `right` (each carrying its number's low
/// byte, if `withData`), each within 30 s (patience applied): a full port holds it, as it
/// holds any sender. `failures` says which sends failed, and why.
final class NumberedSender: Sendable {
    let thread: TestThread
    let failures = Locked<[String]>([])

    init(_ ids: Range<Int>, through right: PKSendPort, withData: Bool = false) {
        let failures = failures
        thread = TestThread {
            for id in ids {
                let data = withData ? [UInt8(truncatingIfNeeded: id)] : []
                do { try right.send(PKPortMessage(msgid: UInt32(id), data: data), timeout: patience(.seconds(30))) } catch {
                    failures.withLock { $0.append("\(id): \(error)") }
                }
            }
        }
    }

    /// Waits for the thread, then expects that every send went.
    func finish() throws {
        try thread.joinPatiently()
        #expect(failures.value.isEmpty)
    }
}

@Suite struct PortAsyncTests {
    /// `for await message in try port.messages()`: every message a thread sends arrives, in
    /// order, through an in-process right and through a connection; through a buffer of one,
    /// each message is held and released in turn. Leaving the loop invalidates the port.
    @Test(arguments: [(false, 64), (true, 64), (false, 1), (true, 1)])
    func messagesAsAnAsyncSequence(throughAConnection: Bool, bufferLimit: Int) async throws {
        let port = PKReceivePort()
        let right = throughAConnection ? try independentRight(to: port) : port.makeSendRight()
        let count = 500
        // The consumer may be slow to start (the concurrency pool is shared): the sends wait.
        let sender = NumberedSender(0..<count, through: right, withData: true)
        let ids = try await withDeadline(.seconds(30), "\(count) messages") {
            var ids: [UInt32] = []
            for await message in try port.messages(bufferLimit: bufferLimit) {
                #expect(message.data == [UInt8(truncatingIfNeeded: message.msgid)])
                ids.append(message.msgid)
                if ids.count == count { break }
            }
            return ids
        }
        #expect(ids == (0..<UInt32(count)).map { $0 })
        try sender.finish()
        try waitPatiently("the port to be invalidated when the iteration ended") { !port.isValid }
        // (A connection's sender learns it from the hang-up, a moment later.)
        try waitPatiently("the sender's right to become invalid") { !right.isValid }
    }

    /// The sequence finishes when the port is invalidated, after the messages that arrived.
    @Test func theSequenceFinishesWhenThePortIsInvalidated() async throws {
        let port = PKReceivePort()
        let stream = try port.messages()
        let right = port.makeSendRight()
        let sender = TestThread {
            for id in UInt32(0)..<3 { try? right.send(PKPortMessage(msgid: id), timeout: patience(.seconds(30))) }
        }
        let ids = try await withDeadline(.seconds(30), "the sequence to finish") {
            var ids: [UInt32] = []
            for await message in stream {
                ids.append(message.msgid)
                if ids.count == 3 { port.invalidate() }
            }
            return ids
        }
        #expect(ids == [0, 1, 2])
        try sender.joinPatiently()
    }

    /// A port invalidated on its loop before `messages()` or `deliver(on:)` is asked for is
    /// refused with `.invalidPort` (its invalidation had run: the sequence was made, and never
    /// finished). Unscheduled and invalidated, it is refused too.
    @Test func anInvalidatedPortIsRefusedForAsyncDelivery() throws {
        let codes = try onLoopThread { loop -> [PKError.Code?] in
            let scheduled = PKReceivePort()
            try loop.add(scheduled, forMode: .default)
            scheduled.invalidate()
            let unscheduled = PKReceivePort()
            unscheduled.invalidate()
            var codes: [PKError.Code?] = []
            for port in [scheduled, unscheduled] {
                do throws(PKError) { _ = try port.messages(); codes.append(nil) } catch { codes.append(error.code) }
                do throws(PKError) { try port.deliver(on: DispatchQueue(label: "refused")) { _ in }; codes.append(nil) } catch { codes.append(error.code) }
            }
            return codes
        }
        #expect(codes == [.invalidPort, .invalidPort, .invalidPort, .invalidPort])
    }

    /// A consumer that falls behind holds the senders back instead of letting messages pile
    /// up: at most `bufferLimit` wait for it, the port's own queue (its limit) the rest, and a
    /// send beyond that times out. Once the consumer takes them, every message accepted comes,
    /// in order, and the senders go on.
    @Test func aSlowConsumerHoldsTheSendersBack() async throws {
        var limits = PKPortLimits()
        limits.maxQueuedMessages = 8
        let port = PKReceivePort(limits: limits)
        let stream = try port.messages(bufferLimit: 4)
        let right = port.makeSendRight()
        let accepted = try await Self.sendUntilFull(right)
        // The buffer, the batch taken from the mailbox and the mailbox: 4 + 8 + 8.
        #expect(accepted >= 4 && accepted <= 4 + 2 * 8, "accepted \(accepted)")
        let more = 200
        let sender = NumberedSender(accepted..<(accepted + more), through: right)
        let ids = try await withDeadline(.seconds(30), "every accepted message") {
            var ids: [UInt32] = []
            for await message in stream {
                ids.append(message.msgid)
                if ids.count == accepted + more { break }
            }
            return ids
        }
        #expect(ids == (0..<UInt32(accepted + more)).map { $0 })
        try sender.finish()
        port.invalidate()
    }

    /// Sends numbered messages through `right`, on a thread of its own, until one times out;
    /// returns how many went. (Awaited without blocking a thread of Swift concurrency's pool.)
    private static func sendUntilFull(_ right: PKSendPort) async throws -> Int {
        let accepted = Locked(0)
        let done = Locked(false)
        let sender = TestThread {
            defer { done.value = true }
            for id in 0..<1_000 {
                do {
                    try right.send(PKPortMessage(msgid: UInt32(id)), timeout: patience(.milliseconds(300)))
                    accepted.withLock { $0 += 1 }
                } catch {
                    return
                }
            }
        }
        try await waitAsync("a send to time out", timeout: .seconds(60)) { done.value }
        try sender.joinPatiently()
        return accepted.value
    }

    /// Cancelling the consuming task ends its iteration (after what it took) and invalidates
    /// the port, even while the sequence itself is still referenced.
    @Test func cancellingTheConsumerEndsTheSequence() async throws {
        let port = PKReceivePort()
        let stream = try port.messages()
        let right = port.makeSendRight()
        let taken = Locked(0)
        let ended = Locked(false)
        let consumer = Task {
            for await _ in stream { taken.withLock { $0 += 1 } }
            ended.value = true
        }
        try right.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
        try await waitAsync("the first message", timeout: .seconds(30)) { taken.value == 1 }
        consumer.cancel()
        // Polled, not awaited: a consumer that ignored the cancellation would hold up the test.
        try await waitAsync("the cancelled iteration to end", timeout: .seconds(30)) { ended.value }
        #expect(taken.value == 1)
        try await waitAsync("the port to be invalidated") { !port.isValid }
        #expect(!right.isValid)
        withExtendedLifetime(stream) {}
    }

    /// `deliver(on:)` with a handler that is stuck: at most `bufferLimit` messages wait for the
    /// queue and the port's queue holds the rest; a send beyond that times out. Once the
    /// handler goes on, every accepted message comes, in order, and so do later ones.
    @Test func aStuckQueueHoldsTheSendersBack() async throws {
        let queue = DispatchQueue(label: "portkit.test.stuck", attributes: .concurrent)
        let gate = DispatchSemaphore(value: 0)
        let got = Locked<[UInt32]>([])
        var limits = PKPortLimits()
        limits.maxQueuedMessages = 8
        let port = PKReceivePort(limits: limits)
        defer { port.invalidate() }
        try port.deliver(on: queue, bufferLimit: 4) { message in
            if message.msgid == 0 { _ = gate.wait(timeout: .now() + .seconds(60)) }
            got.withLock { $0.append(message.msgid) }
        }
        defer { gate.signal() }  // (a second signal is harmless)
        let right = port.makeSendRight()
        let accepted = try await Self.sendUntilFull(right)
        // The one in the handler, the buffer, the batch taken from the mailbox, the mailbox.
        #expect(accepted >= 5 && accepted <= 1 + 4 + 2 * 8, "accepted \(accepted)")
        gate.signal()
        try await waitAsync("the accepted messages") { got.value.count == accepted }
        let sender = NumberedSender(accepted..<(accepted + 100), through: right)
        try await waitAsync("the later messages") { got.value.count == accepted + 100 || !sender.failures.value.isEmpty }
        try sender.finish()
        #expect(got.value == (0..<UInt32(accepted + 100)).map { $0 })
    }

    /// A consumer that holds the port after every message (a buffer of one) still lets every
    /// sender's turn come: a connection's message waiting behind a flood of in-process ones
    /// (each batch of them up to the port's queue limit, 8) arrives within the first few
    /// batches, not after the flood.
    @Test func aHoldAfterEveryMessageStarvesNoSender() async throws {
        var limits = PKPortLimits()
        limits.maxQueuedMessages = 8
        let port = PKReceivePort(limits: limits)
        defer { port.invalidate() }
        let stream = try port.messages(bufferLimit: 1)
        let connected = try independentRight(to: port)
        let local = port.makeSendRight()
        let flood = 200
        try local.send(PKPortMessage(msgid: 0), timeout: .seconds(5))  // the hold begins
        try connected.send(PKPortMessage(msgid: 1_000), timeout: .seconds(5))
        let sender = NumberedSender(1..<flood, through: local)
        // Two blocks on the port's loop, one after the other, before the consumer starts: the
        // connection's message is read by then (into its queue, while the flood fills the
        // mailbox; or delivered first, if the loop read it before the first in-process one).
        _ = onBackgroundLoop {}
        _ = onBackgroundLoop {}
        let ids = try await withDeadline(.seconds(30), "every message") {
            var ids: [UInt32] = []
            for await message in stream {
                ids.append(message.msgid)
                if ids.count == flood + 1 { break }
            }
            return ids
        }
        try sender.finish()
        #expect(ids.filter { $0 != 1_000 } == (0..<UInt32(flood)).map { $0 })
        let position = ids.firstIndex(of: 1_000) ?? ids.count
        #expect(position < 3 * 8, "the connection's message came at \(position) of \(ids.count)")
    }

    /// A port in a mode of its own, on a loop that runs only that mode, is released there: the
    /// release is the port's own routine, which follows its modes (a block performed in the
    /// common modes would never run, and the port would stay held after the first message).
    /// Delivered on a queue, and the loop run on a thread of its own: neither needs Swift
    /// concurrency's threads, which other tests may hold.
    @Test func aPortInAModeOfItsOwnIsReleasedThere() async throws {
        let got = Locked<[UInt32]>([])
        try await awaitLoopThread(timeout: patience(.seconds(30))) { loop in
            let mode = PKRunLoopMode("PortAsyncTests.private")
            let port = PKReceivePort()
            defer { port.invalidate() }
            try loop.add(port, forMode: mode)
            try port.deliver(on: DispatchQueue(label: "portkit.test.private-mode"), bufferLimit: 1) { message in
                got.withLock { $0.append(message.msgid) }
            }
            let right = port.makeSendRight()
            for id in UInt32(0)..<3 { try right.send(PKPortMessage(msgid: id), timeout: .seconds(5)) }
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while got.value.count < 3 && !deadline.hasPassed {
                loop.run(in: mode, until: .after(.milliseconds(10)))
            }
        }
        #expect(got.value == [0, 1, 2])
    }

    /// The other way round: an in-process message behind a connection's backlog arrives within
    /// the first few rounds too, though each message the slow consumer takes ends a hold (a
    /// resumed round is followed by a whole one, in which the in-process messages come first).
    @Test func aHoldAfterEveryMessageStarvesNoInProcessSender() async throws {
        let port = PKReceivePort()
        defer { port.invalidate() }
        let stream = try port.messages(bufferLimit: 1)
        let connected = try independentRight(to: port)
        let local = port.makeSendRight()
        let backlog = 200
        for id in 0..<backlog { try connected.send(PKPortMessage(msgid: UInt32(id)), timeout: patience(.seconds(30))) }
        // The connection's messages are read into its queue (delivery is held after the first).
        try await waitAsync("the backlog to be read") {
            (onBackgroundLoop { port.queuedOnConnections } ?? 0) >= backlog - 1
        }
        try local.send(PKPortMessage(msgid: 1_000), timeout: .seconds(5))
        let ids = try await withDeadline(.seconds(60), "every message") {
            var ids: [UInt32] = []
            for await message in stream {
                ids.append(message.msgid)
                if ids.count == backlog + 1 { break }
                // Slower than the loop: each message waits in the buffer, and holds the port.
                try? await Task.sleep(for: .milliseconds(1))
            }
            return ids
        }
        #expect(ids.filter { $0 != 1_000 } == (0..<UInt32(backlog)).map { $0 })
        let position = ids.firstIndex(of: 1_000) ?? ids.count
        // (Its turn comes in the first whole round after a release: at most two of the
        // connection's messages go before it. Without that, it came 5th to 200th.)
        #expect(position <= 2, "the in-process message came at \(position) of \(ids.count)")
    }

    /// No-senders waits for the messages a hold keeps in the port: the last in-process right
    /// goes while all but the first of its messages wait there (a buffer of one, not yet taken
    /// from), and `onNoSenders` runs only once the port has delivered the last of them, when
    /// the consumer has taken all but that one.
    @Test func noSendersWaitsForTheMessagesAHoldKeeps() async throws {
        let port = PKReceivePort()
        let taken = Locked(0)
        let takenAtNoSenders = Locked<[Int]>([])
        port.onNoSenders = { takenAtNoSenders.withLock { $0.append(taken.value) } }
        let stream = try port.messages(bufferLimit: 1)
        let count = 5
        do {
            // A counted in-process right (one received in a message, say; the owner's own
            // `makeSendRight()` rights are not senders for no-senders).
            let right = PKSendPort(localRight: LocalRight(port: port))
            for id in 0..<count { try right.send(PKPortMessage(msgid: UInt32(id)), timeout: .seconds(5)) }
        }  // the last right goes
        // The loop has seen it go, with the messages held: its check waits for them.
        try await waitAsync("the loop to see the last right go") {
            onBackgroundLoop { port.noSendersCheckIsPending } ?? false
        }
        #expect(takenAtNoSenders.value.isEmpty, "no-senders ran while messages were held")
        let ids = try await withDeadline(.seconds(30), "the held messages") {
            var ids: [UInt32] = []
            for await message in stream {
                ids.append(message.msgid)
                taken.value = ids.count
                if ids.count == count { break }
            }
            return ids
        }
        try await waitAsync("no-senders") { !takenAtNoSenders.value.isEmpty }
        #expect(ids == (0..<UInt32(count)).map { $0 })
        // (The consumer counts a message after `next()` returns it, and the loop may deliver
        // the last one before that: all but one or two taken.)
        #expect(takenAtNoSenders.value.count == 1 && takenAtNoSenders.value[0] >= count - 2,
                "taken when no-senders ran: \(takenAtNoSenders.value)")
    }

    /// A cancelled consumer takes nothing more, even with messages waiting for it: the
    /// iteration ends and the port is invalidated.
    @Test func aCancelledConsumerTakesNothingMore() async throws {
        let port = PKReceivePort()
        let stream = try port.messages(bufferLimit: 8)
        let right = port.makeSendRight()
        for id in UInt32(0)..<4 { try right.send(PKPortMessage(msgid: id), timeout: .seconds(5)) }
        try await waitAsync("the four in the buffer") { stream.consumer.buffer.waiting == 4 }
        let taken = Locked<[UInt32]?>(nil)
        let consumer = Task {
            withUnsafeCurrentTask { $0?.cancel() }  // cancelled before it takes anything
            var ids: [UInt32] = []
            for await message in stream { ids.append(message.msgid) }
            taken.value = ids
        }
        // Polled, not awaited: a consumer that ignored the cancellation would hold up the test.
        try await waitAsync("the cancelled consumer to end", timeout: .seconds(30)) { taken.value != nil }
        #expect(taken.value == [])
        withExtendedLifetime(consumer) {}
        try await waitAsync("the port to be invalidated") { !port.isValid }
    }

    /// Cancelling the task of an async request ends its wait with `.cancelled`, and the reply
    /// right it sent stops working.
    @Test func cancellingAnAsyncRequest() async throws {
        let kept = Locked<[PKSendPort]>([])
        let server = try PortServer { port, _ in
            port.handler = { message in if let reply = message.replyPort { kept.withLock { $0.append(reply) } } }
        }
        let right = server.right
        let outcome = Locked<String?>(nil)
        let request = Task {
            do {
                _ = try await right.request(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(60)))
                outcome.value = "a reply"
            } catch {
                outcome.value = "\((error as? PKError)?.code.description ?? "\(error)")"
            }
        }
        try await waitAsync("the request to arrive", timeout: .seconds(30)) { !kept.value.isEmpty }
        request.cancel()
        // Polled, not awaited: a request that ignored the cancellation would hold up the test.
        try await waitAsync("the cancelled request to end", timeout: .seconds(30)) { outcome.value != nil }
        #expect(outcome.value == "cancelled")
        try await waitAsync("the reply right to become invalid", timeout: .seconds(30)) { !(kept.value.first?.isValid ?? true) }
        kept.value = []
        try server.stop()
    }

    /// A request whose task is cancelled while its set-up waits for the background loop sends
    /// nothing: it ends with `.cancelled`, and the server's first message is one sent after it.
    /// (The loop is held by a block until the set-up is queued behind it. Another test's block
    /// queued meanwhile can make the cancel come before the request's first look, which sends
    /// nothing either: the test then passes without reaching the set-up's look.)
    @Test func aRequestCancelledDuringItsSetUpSendsNothing() async throws {
        // The test and its request run on a queue of their own, so that the hold ends however
        // busy the pool is (see QueueExecutor).
        let executor = QueueExecutor()
        try await withTaskExecutorPreference(executor) {
            let got = Locked<[UInt32]>([])
            let server = try PortServer { port, _ in
                port.handler = { message in got.withLock { $0.append(message.msgid) } }
            }
            let right = server.right
            let loop = PKRunLoop.background
            let holding = Locked(false)
            let request = Locked<Task<Void, Never>?>(nil)
            let outcome = Locked<String?>(nil)
            loop.perform {
                holding.value = true
                let deadline = ContinuousClock.now + patience(.seconds(30))
                while request.value == nil || loop.queuedPerformBlocks == 0, ContinuousClock.now < deadline {
                    usleep(1_000)
                }
                request.value?.cancel()
            }
            try await waitAsync("the background loop to be held") { holding.value }
            request.value = Task(executorPreference: executor) {
                do {
                    _ = try await right.request(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(60)))
                    outcome.value = "a reply"
                } catch {
                    outcome.value = "\((error as? PKError)?.code.description ?? "\(error)")"
                }
            }
            // Polled, not awaited: a request that ignored the cancellation would hold up the test.
            try await waitAsync("the cancelled request to end") { outcome.value != nil }
            #expect(outcome.value == "cancelled")
            try right.send(PKPortMessage(msgid: 2), timeout: .seconds(5))
            try await waitAsync("the message sent after it") { !got.value.isEmpty }
            #expect(got.value == [2])
            try server.stop()
        }
    }

    /// `deliver(on:)`: messages are handed to the handler on the queue, in order.
    @Test func deliveryOnADispatchQueue() throws {
        let queue = DispatchQueue(label: "portkit.test.delivery")
        let got = Locked<[UInt32]>([])
        let offQueue = Locked(0)
        queue.setSpecific(key: Self.queueKey, value: "delivery")
        let port = PKReceivePort()
        try port.deliver(on: queue) { message in
            if DispatchQueue.getSpecific(key: PortAsyncTests.queueKey) != "delivery" { offQueue.withLock { $0 += 1 } }
            got.withLock { $0.append(message.msgid) }
        }
        let right = port.makeSendRight()
        let count = 300
        let sender = TestThread {
            for id in 0..<count { try? right.send(PKPortMessage(msgid: UInt32(id)), timeout: patience(.seconds(30))) }
        }
        try sender.joinPatiently()
        try waitPatiently("\(count) messages on the queue") { got.value.count == count }
        #expect(got.value == (0..<UInt32(count)).map { $0 })
        #expect(offQueue.value == 0)
        port.invalidate()
        try waitPatiently("invalid") { !right.isValid }
    }

    static let queueKey = DispatchSpecificKey<String>()

    /// `try await right.request(...)`: the reply comes back without the caller running a loop.
    @Test func asyncRequestGetsTheReply() async throws {
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid * 2, data: $0.data.reversed()), timeout: .seconds(5)) }
        }
        let rights = [server.right, try independentRight(to: server.port)]
        try await withDeadline(.seconds(30), "async replies") {
            for right in rights {
                for id in UInt32(1)...10 {
                    let reply = try await right.request(PKPortMessage(msgid: id, data: [1, 2, UInt8(id)]), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                    #expect(reply.msgid == id * 2)
                    #expect(reply.data == [UInt8(id), 2, 1])
                }
            }
        }
        try server.stop()
    }

    /// Several async requests at once on one right each get their own reply.
    /// Async requests to a port read with `messages()`, whose queues are full, hold no thread
    /// of Swift concurrency's pool while they wait for room: the consumer, a task too, gets a
    /// thread, makes room and answers them all. (Each blocked a pool thread in its send; with
    /// more requests than threads, the consumer waited for the sends' deadlines, and the
    /// requests failed with `.sendTimedOut`.)
    @Test func requestsToAFullPortLeaveThePoolToItsConsumer() async throws {
        var limits = PKPortLimits()
        limits.maxQueuedMessages = 1
        let port = PKReceivePort(limits: limits)
        defer { port.invalidate() }
        let stream = try port.messages(bufferLimit: 1)
        let right = port.makeSendRight()
        try await Self.requestMoreThanThreads(through: right, answeredFrom: stream, of: port)
    }

    /// The same through a connection whose socket is full (its send buffer made small, and
    /// the port reads no more while its queue is full): each request's send waited for room
    /// on its task's thread, with more requests than the pool has threads the consumer got
    /// none, and the requests failed with `.sendTimedOut`. Now a request the socket cannot
    /// take at once waits on a thread of its own, with its rights made once (a reply right
    /// made again and the first closed unsent would tell the reply port its sender left).
    @Test func requestsThroughAFullConnectionLeaveThePoolToItsConsumer() async throws {
        var limits = PKPortLimits()
        limits.maxQueuedMessages = 1
        let port = PKReceivePort(limits: limits)
        defer { port.invalidate() }
        let stream = try port.messages(bufferLimit: 1)
        let fd = try port.makeTransferDescriptor()
        var size: Int32 = 4096
        #expect(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size)) == 0)
        let right = PKSendPort(connection: SendConnection(takingOwnershipOf: fd))
        defer { right.invalidate() }
        try await Self.requestMoreThanThreads(through: right, answeredFrom: stream, of: port)
    }

    /// Sends async requests through `right` from more tasks than Swift concurrency's pool has
    /// threads, and than the threads requests may wait on (`WaitingSendThreads.limit`: the rest
    /// wait for one, suspended), to `port`, whose consumer, a task reading `stream`, answers
    /// each; expects every reply, then invalidates the port.
    private static func requestMoreThanThreads(
        through right: PKSendPort, answeredFrom stream: PKPortMessageSequence, of port: PKReceivePort
    ) async throws {
        let consumer = Task {
            for await message in stream {
                try? message.replyPort?.send(PKPortMessage(msgid: message.msgid), timeout: .seconds(5))
            }
        }
        let count = UInt32(WaitingSendThreads.limit + 4 * max(2, sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        let replies = try await withDeadline(.seconds(60), "every reply") {
            try await withThrowingTaskGroup(of: UInt32.self) { group in
                for id in UInt32(0)..<count {
                    group.addTask {
                        try await right.request(PKPortMessage(msgid: id), sendTimeout: patience(.seconds(20)), receiveTimeout: patience(.seconds(30))).msgid
                    }
                }
                var all: [UInt32] = []
                for try await id in group { all.append(id) }
                return all
            }
        }
        #expect(replies.sorted() == Array(0..<count))
        port.invalidate()
        try await withDeadline(.seconds(30), "the consumer to end") { await consumer.value }
    }

    /// A right to a port whose queue (of one message) is full, never read. The port lives as
    /// long as the process: for exit tests' children.
    private static func fullPortNobodyReads() -> PKSendPort {
        var limits = PKPortLimits()
        limits.maxQueuedMessages = 1
        let port = PKReceivePort(limits: limits)
        portsNobodyReads.withLock { $0.append(port) }
        let right = port.makeSendRight()
        try? right.send(PKPortMessage(msgid: 0), timeout: .seconds(1))
        return right
    }
    private static let portsNobodyReads = Locked<[PKReceivePort]>([])

    /// A request waiting for one of the threads requests wait on (all held by requests to a
    /// stalled receiver, with long deadlines) fails at its own send deadline, not theirs. In a
    /// child process of its own, whose threads are its requests' alone.
    @Test func aRequestWaitingForAThreadEndsAtItsOwnDeadline() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                let right = Self.fullPortNobodyReads()
                for id in 0..<WaitingSendThreads.limit {
                    Task { _ = try? await right.request(PKPortMessage(msgid: UInt32(id + 1)), sendTimeout: .seconds(60), receiveTimeout: .seconds(1)) }
                }
                let full = PKDeadline.after(patience(.seconds(30)))
                while WaitingSendThreads.countsForTests.running < WaitingSendThreads.limit && !full.hasPassed { usleep(1_000) }
                let started = PKDeadline.now
                var code: PKError.Code?
                do {
                    _ = try await right.request(PKPortMessage(msgid: 1000), sendTimeout: .milliseconds(500), receiveTimeout: .seconds(1))
                } catch { code = (error as? PKError)?.code }
                let waited = Double(PKDeadline.now.uptimeNanoseconds - started.uptimeNanoseconds) / 1e9
                let report = "with \(WaitingSendThreads.countsForTests.running) threads held, a request with a 0.5 s send timeout ended after \(waited) s with \(code.map { "\($0)" } ?? "a reply")"
                let failures = code == .sendTimedOut && waited < 30 ? [] : [report]
                endExitTest(report, failures: failures)
            }
        }
    }

    /// Async requests to a full port of this process wait on threads of their own, at most
    /// `WaitingSendThreads.limit` at once; the rest wait, suspended, for one of them (each
    /// request started a thread: many requests to a stalled receiver could use up the user's
    /// threads). In a child process of its own, so that the counts are its requests' alone.
    @Test func threadsForWaitingRequestsAreBounded() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                let right = Self.fullPortNobodyReads()
                let count = WaitingSendThreads.limit + 36
                for id in 0..<count {
                    Task { _ = try? await right.request(PKPortMessage(msgid: UInt32(id)), sendTimeout: patience(.seconds(60)), receiveTimeout: .seconds(1)) }
                }
                // Until every request waits (on a thread, or for one; or 30 s, more under a
                // sanitizer), then half a second more, in which no thread beyond the limit may
                // start.
                var mostRunning = 0
                var mostWaiting = 0
                var watchUntil = PKDeadline.after(patience(.seconds(30)))
                var allWaiting = false
                while !watchUntil.hasPassed {
                    let (running, waiting) = WaitingSendThreads.countsForTests
                    mostRunning = max(mostRunning, running)
                    mostWaiting = max(mostWaiting, waiting)
                    if running + waiting == count && !allWaiting {
                        allWaiting = true
                        watchUntil = .after(.milliseconds(500))
                    }
                    usleep(1_000)
                }
                let report = "for \(count) requests, at most \(mostRunning) threads waited for room, and \(mostWaiting) requests for a thread"
                let bounded = mostRunning == WaitingSendThreads.limit && mostWaiting == count - WaitingSendThreads.limit
                endExitTest(report, failures: bounded ? [] : [report])
            }
        }
    }

    @Test func concurrentAsyncRequests() async throws {
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid), timeout: .seconds(5)) }
        }
        let right = try independentRight(to: server.port)
        let replies = try await withDeadline(.seconds(30), "concurrent replies") {
            try await withThrowingTaskGroup(of: UInt32.self) { group in
                for id in UInt32(0)..<16 {
                    group.addTask { try await right.request(PKPortMessage(msgid: id), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10))).msgid }
                }
                var all: [UInt32] = []
                for try await id in group { all.append(id) }
                return all
            }
        }
        #expect(replies.sorted() == Array(0..<16))
        try server.stop()
    }

    /// The async request's receive timeout: a server that keeps the reply port and never
    /// answers gives `.receiveTimedOut`.
    @Test func asyncRequestReceiveTimeout() async throws {
        let kept = Locked<[PKSendPort]>([])
        let server = try PortServer { port, _ in
            port.handler = { message in if let reply = message.replyPort { kept.withLock { $0.append(reply) } } }
        }
        let right = server.right
        let code = try await withDeadline(.seconds(30), "the receive timeout") { () -> PKError.Code? in
            do {
                _ = try await right.request(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .milliseconds(200))
                return nil
            } catch {
                return (error as? PKError)?.code
            }
        }
        #expect(code == .receiveTimedOut)
        kept.value = []
        try server.stop()
    }

    /// The async request's other errors: the port invalid before the request, the port dying
    /// while it waits, and the reply port dropped unanswered.
    @Test func asyncRequestErrors() async throws {
        let dead = try PortServer { _, _ in }
        let deadRight = dead.right
        try dead.stop()
        let kept = Locked<[PKSendPort]>([])
        let dying = try PortServer { port, _ in
            port.handler = { message in
                if let reply = message.replyPort { kept.withLock { $0.append(reply) } }
                port.invalidate()
            }
        }
        let dyingRight = dying.right
        let silent = try PortServer { port, _ in port.handler = { _ in } }
        let silentRight = silent.right
        let codes = try await withDeadline(.seconds(30), "the errors") { () -> [PKError.Code?] in
            var codes: [PKError.Code?] = []
            for right in [deadRight, dyingRight, silentRight] {
                do {
                    _ = try await right.request(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(20)))
                    codes.append(nil)
                } catch {
                    codes.append((error as? PKError)?.code)
                }
            }
            return codes
        }
        #expect(codes == [PKError.Code.invalidPort, .portInvalidated, .portInvalidated])
        kept.value = []
        try dying.joinPatiently()
        try silent.stop()
    }
}
