// Delivery beyond the run loop: a receive port as an AsyncSequence, on a
// DispatchQueue (CFMessagePortSetDispatchQueue), and request/reply with `async`.

import Dispatch
import Synchronization

extension PKReceivePort {
    /// The port's messages as an `AsyncSequence`, for one consumer:
    /// `for await message in try port.messages() { ... }`.
    ///
    /// Call it on a port that is not scheduled yet: PortKit schedules it on
    /// `PKRunLoop.background`, so no loop has to be run by hand, and returns once that loop has
    /// taken it (the calling thread waits for the loop meanwhile). (Called on the thread of the
    /// loop the port is scheduled on, it keeps that loop.) The sequence replaces `handler`; it
    /// finishes when the port is invalidated, after the messages it had taken from the port.
    /// When the consumer is done, the port is invalidated: the task cancelled, or the sequence
    /// and every iterator of it released (leaving `for await message in try port.messages()`
    /// does both).
    ///
    /// Back-pressure: at most `bufferLimit` messages wait for the consumer. Once that many
    /// wait, the port delivers no more until at most half of them do; the rest wait in the
    /// port's own queues, whose limits (`PKPortLimits`) then hold the senders (a send waits for
    /// room until its deadline), as a handler slow to return would. A slow consumer never
    /// makes memory grow without bound; messages held in the port's queues when it is
    /// invalidated go with it, as any undelivered message does. A consumer that sends to its
    /// own port while it lags can wait for room until its send's deadline, since the room comes
    /// from its own taking.
    ///
    /// - Parameter bufferLimit: how many messages may wait for the consumer (below 1 means 1).
    /// - Throws: `PKError` with `.invalidPort` if the port was invalidated.
    public func messages(bufferLimit: Int = 64) throws(PKError) -> PKPortMessageSequence {
        let buffer = DeliveryBuffer(limit: bufferLimit)
        try host { port in
            port.handler = { [unowned(unsafe) port] message in
                if buffer.add(message) { port.holdDelivery() }
            }
            let previous = port.onInvalidation
            port.onInvalidation = {
                previous?()
                buffer.finish(dropping: false)
            }
        }
        return PKPortMessageSequence(consumer: MessageConsumer(port: self, buffer: buffer))
    }

    /// Delivers the port's messages on `queue`, one at a time and in order, even on a
    /// concurrent queue (`CFMessagePortSetDispatchQueue`).
    ///
    /// Like `messages(bufferLimit:)`, an unscheduled port is scheduled on
    /// `PKRunLoop.background`, and at most `bufferLimit` messages wait for `queue`: beyond
    /// that, the port holds the rest in its own queues and their limits hold the senders (and
    /// a handler that sends to its own port while it lags can wait until its send's deadline).
    /// Messages that already wait for `queue` still reach `handler` after the port is
    /// invalidated.
    ///
    /// - Parameters:
    ///   - queue: where `handler` runs.
    ///   - bufferLimit: how many messages may wait for `queue` (below 1 means 1).
    ///   - handler: called on `queue` with each message.
    /// - Throws: `PKError` with `.invalidPort` if the port was invalidated.
    public func deliver(
        on queue: DispatchQueue, bufferLimit: Int = 64, _ handler: @escaping @Sendable (PKPortMessage) -> Void
    ) throws(PKError) {
        let buffer = DeliveryBuffer(limit: bufferLimit)
        try host { port in
            port.handler = { [unowned(unsafe) port] message in
                if buffer.add(message) { port.holdDelivery() }
                // The drain holds the port (to release its hold) only while it runs: the port's
                // handler holding it would keep a port its owner dropped alive.
                if buffer.claimDrain() {
                    let held: PKReceivePort = port  // a strong reference, for the drain
                    queue.async { Self.drain(buffer, of: held, into: handler) }
                }
            }
        }
    }

    /// Hands `buffer`'s messages to `handler` until it is empty (one drain at a time).
    private static func drain(_ buffer: DeliveryBuffer, of port: PKReceivePort, into handler: (PKPortMessage) -> Void) {
        while case .message(let message) = buffer.take(draining: true, releasing: port) { handler(message) }
    }

    /// Runs `configure` on the port's loop, scheduling the port on the background loop first if
    /// it is on none.
    private func host(_ configure: @escaping @Sendable (PKReceivePort) -> Void) throws(PKError) {
        // An invalidated port may be on a loop still (its invalidation finished there, or its
        // loop's thread ended): its invalidation callback has run, and a sequence made on it
        // would never finish.
        guard isValid else { throw PKError(.invalidPort, "the receive port was invalidated") }
        if let loop = runLoop {
            precondition(loop.isOwnedByCurrentThread, "PKReceivePort: a scheduled port is reconfigured on its own loop's thread")
            configure(self)
            return
        }
        let loop = PKRunLoop.background
        let port = UncheckedBox(self)
        let result: Result<Void, PKError> = loop.performAndWait {
            configure(port.value)
            return Result { () throws(PKError) in try loop.add(port.value, forMode: .default) }
        }
        try result.get()
    }
}

/// A receive port's messages, for `for await` (`PKReceivePort.messages(bufferLimit:)`). One
/// consumer at a time: an iterator made later takes from the same messages, and two tasks
/// waiting for the next message at once is a programmer error (it traps). The sequence
/// finishes when the port is invalidated, after the messages it had taken from the port. The
/// port is invalidated when the consumer is done: its task cancelled, or the sequence and
/// every iterator of it released.
public struct PKPortMessageSequence: AsyncSequence, Sendable {
    public typealias Element = PKPortMessage
    public typealias Failure = Never
    let consumer: MessageConsumer

    public func makeAsyncIterator() -> Iterator { Iterator(consumer: consumer) }

    /// Takes the port's messages in the order they were delivered.
    public struct Iterator: AsyncIteratorProtocol {
        public typealias Element = PKPortMessage
        public typealias Failure = Never
        let consumer: MessageConsumer

        /// The next message, or `nil` once the port is invalidated (after the messages the
        /// sequence had taken from it) or the task is cancelled (which invalidates the port).
        public mutating func next() async -> PKPortMessage? { await consumer.next() }
    }
}

/// The consuming end of `messages(bufferLimit:)`: invalidates the port when the consumer
/// leaves (cancelled, or released with the sequence and its iterators).
final class MessageConsumer: Sendable {
    private let port: PKReceivePort
    let buffer: DeliveryBuffer

    init(port: PKReceivePort, buffer: DeliveryBuffer) {
        self.port = port
        self.buffer = buffer
    }

    deinit { end() }

    func next() async -> PKPortMessage? {
        // A cancelled consumer takes nothing more, even from a full buffer.
        if Task.isCancelled {
            end()
            return nil
        }
        switch buffer.take(draining: false, releasing: port) {
        case .message(let message): return message
        case .finished: return nil
        case .empty: break
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (waiter: CheckedContinuation<PKPortMessage?, Never>) in
                buffer.wait(waiter, releasing: port)
            }
        } onCancel: {
            self.end()
        }
    }

    /// The consumer is done: what waits for it is dropped, and the port invalidated.
    private func end() {
        buffer.finish(dropping: true)
        port.invalidate()
    }
}

/// Messages on their way from a port's loop to a consumer beyond it, at most `limit` of them:
/// the loop adds them, and holds the port's delivery when `limit` wait; the consumer takes
/// them, and once half have gone asks the port's loop to release it. The flag changes under
/// the lock, and the hold is made on the loop in the same delivery that set it: the release a
/// consumer asks for (through the port's own routine, which the loop runs later) always
/// follows the hold it saw. The buffer does not hold the port (the port's handler holds the
/// buffer): its consumer passes the port it holds.
final class DeliveryBuffer: Sendable {
    enum Taken {
        case message(PKPortMessage)
        case empty
        case finished
    }

    private struct State {
        var messages: [PKPortMessage] = []
        var head = 0
        var held = false
        var finished = false
        var draining = false
        var waiter: CheckedContinuation<PKPortMessage?, Never>?
        var count: Int { messages.count - head }
    }

    let limit: Int
    private let state = PKMutex(State())

    init(limit: Int) { self.limit = max(1, limit) }

    /// How many messages wait for the consumer (for tests).
    var waiting: Int { state.withLock { $0.count } }

    /// Adds a message delivered by the port (on its loop); returns whether the port must now
    /// hold its delivery. A finished buffer drops it.
    func add(_ message: PKPortMessage) -> Bool {
        let (waiter, hold) = state.withLock { state -> (CheckedContinuation<PKPortMessage?, Never>?, Bool) in
            guard !state.finished else { return (nil, false) }
            if let waiter = state.waiter {
                state.waiter = nil
                return (waiter, false)
            }
            state.messages.append(message)
            guard state.count >= limit, !state.held else { return (nil, false) }
            state.held = true
            return (nil, true)
        }
        waiter?.resume(returning: message)
        return hold
    }

    /// Takes the next message; ends `port`'s hold once at most half of `limit` wait.
    /// `draining`: the caller is the one drain `claimDrain()` started, which ends when it finds
    /// the buffer empty.
    func take(draining: Bool, releasing port: PKReceivePort) -> Taken {
        let (taken, release) = state.withLock { state -> (Taken, Bool) in
            guard state.count > 0 else {
                if draining { state.draining = false }
                return (state.finished ? .finished : .empty, false)
            }
            let message = state.messages.takeMessage(at: state.head)
            state.head += 1
            if state.head == state.messages.count {
                state.messages.removeAllKeepingStorage()
                state.head = 0
            } else if state.head >= 64 && state.head * 2 >= state.messages.count {
                state.messages.removeFirst(state.head)
                state.head = 0
            }
            guard state.held, state.count <= limit / 2 else { return (.message(message), false) }
            state.held = false
            return (.message(message), true)
        }
        if release { port.requestDeliveryRelease() }
        return taken
    }

    /// Whether the caller must start a drain (none is running); the drain then runs until it
    /// finds the buffer empty.
    func claimDrain() -> Bool {
        state.withLock { state in
            guard !state.draining, state.count > 0 else { return false }
            state.draining = true
            return true
        }
    }

    /// Waits for the next message: `waiter` is resumed with it, or with `nil` once finished.
    func wait(_ waiter: CheckedContinuation<PKPortMessage?, Never>, releasing port: PKReceivePort) {
        while true {
            switch take(draining: false, releasing: port) {
            case .message(let message):
                waiter.resume(returning: message)
                return
            case .finished:
                waiter.resume(returning: nil)
                return
            case .empty:
                // Parked, unless a message or the end came since the look above.
                let parked = state.withLock { state in
                    guard state.count == 0, !state.finished else { return false }
                    precondition(state.waiter == nil, "PKPortMessageSequence: two consumers waited at once")
                    state.waiter = waiter
                    return true
                }
                if parked { return }
            }
        }
    }

    /// No more messages are added; a waiting consumer gets `nil` (after those still here,
    /// unless `dropping` them).
    func finish(dropping: Bool) {
        var dropped: [PKPortMessage] = []
        let waiter = state.withLock { state -> CheckedContinuation<PKPortMessage?, Never>? in
            state.finished = true
            if dropping {
                swap(&dropped, &state.messages)
                state.head = 0
            }
            defer { state.waiter = nil }
            return state.waiter
        }
        dropped = []
        waiter?.resume(returning: nil)
    }
}

extension PKSendPort {
    /// Sends `message` and awaits the reply: the `async` form of `sendRequest`.
    ///
    /// The reply port lives on `PKRunLoop.background`, so no loop of the caller's runs.
    ///
    /// Cancelling the task ends the wait at once with `.cancelled`: the reply right it sent
    /// stops working, as when a request times out. (A send waiting for room still waits for its
    /// deadline. A request its receiver cannot take at once, a port of this process whose queue
    /// is full or a socket with no room, waits on a thread of its own, one of at most 64, or
    /// suspended until one is free (or its send deadline passes), so that a consumer of that
    /// port that is a task, `messages()`, keeps the threads it needs to make room. Cancelling
    /// the task does not end that wait. A port the message carries that is a connection has
    /// its ATTACH_SENDER written on the task's thread, which may wait for room there.)
    ///
    /// - Throws: `PKError` with `.sendTimedOut`, `.receiveTimedOut`, `.invalidPort`,
    ///   `.portInvalidated`, `.transport` or `.limitExceeded`, as `sendRequest`; `.cancelled`
    ///   if the task was cancelled before the reply came; `.system` or `.limitExceeded` if the
    ///   request's reply port or its watch on this right could not be set up (nothing was sent).
    public func request(
        _ message: PKPortMessage, sendTimeout: Duration, receiveTimeout: Duration
    ) async throws(PKError) -> PKPortMessage {
        if Task.isCancelled { throw Self.cancelledRequest }
        let loop = PKRunLoop.background
        let pending = PendingReply()
        let target = self
        // Set up on the background loop without blocking this task's thread (one of Swift
        // concurrency's few) while that loop gets to it.
        let handOver = HandOver<Result<PKSendPort, PKError>>()
        await withCheckedContinuation { (setUp: CheckedContinuation<Void, Never>) in loop.perform {
            let replyPort = PKReceivePort()
            pending.port = replyPort
            replyPort.handler = { reply in pending.finish(.success(reply)) }
            replyPort.onNoSenders = {
                pending.finish(.failure(PKError(.portInvalidated, "the remote port's owner released the reply port without answering")))
            }
            // A set-up that fails (out of descriptors for the watch, say) fails the request
            // before it is sent: without its watch, a remote port's death would be learnt only
            // at the receive timeout.
            do throws(PKError) {
                try loop.add(replyPort, forMode: .default)
                pending.watch = try target.watchInvalidation(on: loop, forMode: .default) {
                    pending.finish(.failure(PKError(.portInvalidated, "the remote port became invalid while waiting for the reply")))
                }
                handOver.slot.withLock { $0 = .success(replyPort.makeSendRight()) }
            } catch {
                pending.finish(.failure(error))
                handOver.slot.withLock { $0 = .failure(error) }
            }
            setUp.resume()
        } }
        // Taken under the lock the set-up released: the port made on the loop's thread is then
        // visible here to ThreadSanitizer too, which does not see a continuation's hand-over.
        let replyRight = try handOver.slot.withLock { $0 }!.get()
        var request = message
        request.replyPort = replyRight
        if Task.isCancelled {
            loop.perform { pending.finish(.failure(Self.cancelledRequest)) }
            throw Self.cancelledRequest
        }
        do throws(PKError) {
            let sendBy = PKDeadline.after(sendTimeout)
            if let prepared = try sendUnlessQueueFull(request, before: sendBy) {
                try await Self.sendOnAThreadOfItsOwn(prepared, before: sendBy)
            }
        } catch {
            loop.perform { pending.finish(.failure(error)) }
            throw error
        }
        // The receive timeout counts from the send, as `sendRequest`'s does.
        let replyBy = PKDeadline.after(receiveTimeout)
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                loop.perform {
                    pending.armTimer(until: replyBy, on: loop) {
                        PKError(.receiveTimedOut, "no reply arrived within \(receiveTimeout)")
                    }
                    pending.setContinuation(continuation)
                }
            }
        } onCancel: {
            // Before or after the block above: `finish` takes the first outcome only.
            loop.perform { pending.finish(.failure(Self.cancelledRequest)) }
        }
        // Under the lock the loop released (as the reply right above).
        let result = pending.outcome.slot.withLock { $0 }!
        return try result.get()
    }

    /// Sends a message `sendUnlessQueueFull` prepared (its receiver had no room) on a thread
    /// of its own (`WaitingSendThreads`), which the task awaits. A thread of Swift
    /// concurrency's pool waiting for room could be the one the consumer that makes room needs
    /// (a port read with `messages()`, whose consumer is a task): requests from more tasks than
    /// the pool has threads would then wait for their deadlines.
    private static func sendOnAThreadOfItsOwn(_ prepared: PreparedSend, before deadline: PKDeadline) async throws(PKError) {
        // Past its deadline, the send fails at once: no thread to wait on.
        if deadline.hasPassed { return try prepared.send(before: deadline) }
        let result = await WaitingSendThreads.run(name: "PortKit.send", until: deadline) {
            Result { () throws(PKError) in try prepared.send(before: deadline) }
        }
        // No thread to be had (none by the deadline, or none could be started): the task's own
        // tries, waiting no more than what is left.
        guard let result else { return try prepared.send(before: deadline) }
        try result.get()
    }

    private static var cancelledRequest: PKError {
        PKError(.cancelled, "the task was cancelled while waiting for the reply")
    }
}

/// One async request's state; touched only on the background loop's thread.
private final class PendingReply: @unchecked Sendable {
    var port: PKReceivePort?
    var watch: PKInvalidationWatch?
    var timer: PKTimer?
    private var result: Result<PKPortMessage, PKError>?
    private var continuation: CheckedContinuation<Void, Never>?
    /// The result, handed to the awaiting task.
    let outcome = HandOver<Result<PKPortMessage, PKError>>()

    func finish(_ outcome: Result<PKPortMessage, PKError>) {
        guard result == nil else { return }
        result = outcome
        timer?.invalidate()
        watch?.cancel()
        port?.invalidate()
        timer = nil
        watch = nil
        port = nil
        deliver()
    }

    /// Fails the request with `timeoutError()` at `deadline`, unless it has finished already.
    func armTimer(until deadline: PKDeadline, on loop: PKRunLoop, _ timeoutError: @escaping () -> PKError) {
        guard result == nil else { return }
        // The timer holds the request until it fires or `finish` invalidates it.
        let timer = PKTimer(fireDate: deadline) { _ in self.finish(.failure(timeoutError())) }
        self.timer = timer
        loop.add(timer, forMode: .default)
    }

    func setContinuation(_ continuation: CheckedContinuation<Void, Never>) {
        self.continuation = continuation
        deliver()
    }

    private func deliver() {
        guard let result, let continuation else { return }
        self.continuation = nil
        outcome.slot.withLock { $0 = result }
        continuation.resume()
    }
}

/// Carries a value across a thread hop that PortKit's thread rules make safe.
struct UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
