// Delivery beyond the run loop (design section 8): a receive port as an AsyncSequence, on a
// DispatchQueue (CFMessagePortSetDispatchQueue), and request/reply with `async`.

import Dispatch
import Synchronization

extension PKReceivePort {
    /// The port's messages as an `AsyncSequence` (design section 8).
    ///
    /// Call it on a port that is not scheduled yet: PortKit schedules it on
    /// `PKRunLoop.background`, so no loop has to be run by hand. (Called on the thread of the
    /// loop the port is scheduled on, it keeps that loop.) The stream replaces `handler`; it
    /// finishes when the port is invalidated, and ending the iteration invalidates the port.
    ///
    /// - Parameter bufferingPolicy: what the stream keeps while the consumer is busy.
    /// - Throws: `PKError` with `.invalidPort` if the port was invalidated.
    public func messages(
        bufferingPolicy: AsyncStream<PKPortMessage>.Continuation.BufferingPolicy = .unbounded
    ) throws(PKError) -> AsyncStream<PKPortMessage> {
        let (stream, continuation) = AsyncStream<PKPortMessage>.makeStream(bufferingPolicy: bufferingPolicy)
        try host { port in
            port.handler = { continuation.yield($0) }
            let previous = port.onInvalidation
            port.onInvalidation = {
                previous?()
                continuation.finish()
            }
        }
        continuation.onTermination = { [weak self] _ in self?.invalidate() }
        return stream
    }

    /// Delivers the port's messages on `queue`, in order (`CFMessagePortSetDispatchQueue`).
    ///
    /// Like `messages()`, an unscheduled port is scheduled on `PKRunLoop.background`; each
    /// message is handed to `handler` with `queue.async`.
    ///
    /// - Throws: `PKError` with `.invalidPort` if the port was invalidated.
    public func deliver(on queue: DispatchQueue, _ handler: @escaping @Sendable (PKPortMessage) -> Void) throws(PKError) {
        try host { port in
            port.handler = { message in queue.async { handler(message) } }
        }
    }

    /// Runs `configure` on the port's loop, scheduling the port on the background loop first if
    /// it is on none.
    private func host(_ configure: @escaping @Sendable (PKReceivePort) -> Void) throws(PKError) {
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

extension PKSendPort {
    /// Sends `message` and awaits the reply: the `async` form of `sendRequest`.
    ///
    /// The reply port lives on `PKRunLoop.background`, so no loop of the caller's runs.
    ///
    /// - Throws: `PKError` with `.sendTimedOut`, `.receiveTimedOut`, `.invalidPort`,
    ///   `.portInvalidated`, `.transport` or `.limitExceeded`, as `sendRequest`.
    public func request(
        _ message: PKPortMessage, sendTimeout: Duration, receiveTimeout: Duration
    ) async throws(PKError) -> PKPortMessage {
        let loop = PKRunLoop.background
        let pending = PendingReply()
        let target = self
        // Set up on the background loop without blocking this task's thread (one of Swift
        // concurrency's few) while that loop gets to it.
        let handOver = HandOver<PKSendPort>()
        await withCheckedContinuation { (setUp: CheckedContinuation<Void, Never>) in loop.perform {
            let replyPort = PKReceivePort()
            pending.port = replyPort
            replyPort.handler = { reply in pending.finish(.success(reply)) }
            replyPort.onNoSenders = {
                pending.finish(.failure(PKError(.portInvalidated, "the remote port's owner released the reply port without answering")))
            }
            try? loop.add(replyPort, forMode: .default)
            pending.watch = try? target.watchInvalidation(on: loop, forMode: .default) {
                pending.finish(.failure(PKError(.portInvalidated, "the remote port became invalid while waiting for the reply")))
            }
            handOver.slot.withLock { $0 = replyPort.makeSendRight() }
            setUp.resume()
        } }
        // Taken under the lock the set-up released: the port made on the loop's thread is then
        // visible here to ThreadSanitizer too, which does not see a continuation's hand-over.
        let replyRight = handOver.slot.withLock { $0 }!
        var request = message
        request.replyPort = replyRight
        do {
            try send(request, before: .after(sendTimeout))
        } catch {
            loop.perform { pending.finish(.failure(error)) }
            throw error
        }
        // The receive timeout counts from the send, as `sendRequest`'s does.
        let replyBy = PKDeadline.after(receiveTimeout)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            loop.perform {
                pending.armTimer(until: replyBy, on: loop) {
                    PKError(.receiveTimedOut, "no reply arrived within \(receiveTimeout)")
                }
                pending.setContinuation(continuation)
            }
        }
        // Under the lock the loop released (as the reply right above).
        let result = pending.outcome.slot.withLock { $0 }!
        return try result.get()
    }
}

/// One async request's state; touched only on the background loop's thread.
/// Passes a value from the background loop to the awaiting task under a lock, so that
/// ThreadSanitizer sees the hand-over (it does not see a continuation's).
private final class HandOver<Value: Sendable>: Sendable {
    let slot = PKMutex<Value?>(nil)
}

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
