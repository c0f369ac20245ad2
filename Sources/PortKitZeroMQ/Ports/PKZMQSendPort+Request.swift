#if ZeroMQ
// Synchronous and async request/reply (CFMessagePortSendRequest) over ZeroMQ: the request
// carries the process's reply port with a fresh port id; the caller waits until the reply,
// the deadline, or the death of the remote port's connection.

import PortKit

extension PKZMQSendPort {
    /// Sends `message` and waits for the reply (`CFMessagePortSendRequest`).
    ///
    /// The request goes out with a reply port of this process (its `replyPort` is replaced).
    /// While waiting, the calling thread's run loop runs in a private mode that holds only the
    /// wait, so the caller's other handlers do not fire. The first message sent to that reply
    /// port is the reply; one that comes after the deadline is dropped.
    ///
    /// - Parameters:
    ///   - message: the request.
    ///   - sendTimeout: how long a full queue (or a connection not yet made) may hold the request.
    ///   - receiveTimeout: how long to wait for the reply; `nil` sends one-way and returns `nil`.
    /// - Returns: the reply, or `nil` for a one-way send.
    /// - Throws: `.sendTimedOut`, `.receiveTimedOut`, `.invalidPort` (invalid before the request
    ///   went out), `.portInvalidated` (the port's connection died while the caller waited, and
    ///   no reply came within `ZMQReplyWaiter.deathGrace`, 250 ms, of its death),
    ///   `.interrupted` (the loop was stopped while it waited: the stop is passed on to the run
    ///   the request was made in), `.limitExceeded`, `.transport`.
    @discardableResult
    public func sendRequest(
        _ message: PKZMQMessage, sendTimeout: Duration, receiveTimeout: Duration?
    ) throws(PKError) -> PKZMQMessage? {
        guard let receiveTimeout else {
            var oneWay = message
            oneWay.replyPort = nil
            try send(oneWay, before: .after(sendTimeout))
            return nil
        }
        let loop = PKRunLoop.current
        // One private mode a nesting depth, reused by every request on this loop: a mode of
        // each request's own left a record in the loop for every request the thread made.
        let mode = PKRunLoopMode("PKZMQReplyMode-\(loop.zmqRequestDepth)")
        loop.zmqRequestDepth += 1
        defer { loop.zmqRequestDepth -= 1 }
        let woken = PKCustomSource(perform: {})
        loop.add(woken, forMode: mode)
        defer { woken.invalidate() }
        let waiter = ZMQReplyWaiter { woken.signal(waking: loop) }
        let pending = try PendingRequest(self, message, waiter: waiter, before: .after(sendTimeout))
        defer { pending.end() }
        let deadline = PKDeadline.after(receiveTimeout)
        while waiter.outcome == nil {
            let result = loop.runPrivately(in: mode, until: deadline, returnAfterSourceHandled: true)
            if result == .timedOut || result == .finished { break }
            if result == .stopped, waiter.outcome == nil {  // passed on to the caller's run by runPrivately
                throw PKError(.interrupted, "the run loop was stopped while waiting for the reply")
            }
        }
        return try Self.reply(from: waiter.outcome, receiveTimeout: receiveTimeout)
    }

    /// Sends `message` and awaits the reply: the async form of
    /// `sendRequest(_:sendTimeout:receiveTimeout:)`. No thread of the task's pool waits: a
    /// request that must wait for the connection, for room, or for the reply endpoint's
    /// address waits up to `sendTimeout` on a thread of its own (one of at most 64 for all
    /// async requests of the process, or suspended until one is free), and the reply is
    /// awaited.
    ///
    /// Cancelling the task ends the wait for the reply at once with `.cancelled` (a reply that
    /// comes later is dropped); a task cancelled before the call sends nothing. It does not end
    /// a wait for the connection or for room (bounded by `sendTimeout`).
    ///
    /// - Throws: as `sendRequest`, except `.interrupted` (no loop of the caller's runs);
    ///   `.cancelled` if the task was cancelled before the reply came.
    public func request(
        _ message: PKZMQMessage, sendTimeout: Duration, receiveTimeout: Duration
    ) async throws(PKError) -> PKZMQMessage {
        if Task.isCancelled { throw PKError(.cancelled, "the task was cancelled; the request was not sent") }
        let signal = AsyncSignal()
        let waiter = ZMQReplyWaiter { signal.fire() }
        let pending = try await PendingRequest.holdingNoTaskThread(self, message, waiter: waiter, before: .after(sendTimeout))
        defer { pending.end() }
        let timer = PKTimer(fireDate: .after(receiveTimeout)) { _ in signal.fire() }
        PKRunLoop.background.perform(inModes: [.common]) { PKRunLoop.current.add(timer, forMode: .common) }
        await withTaskCancellationHandler { await signal.wait() } onCancel: { signal.fire() }
        timer.invalidate()
        if waiter.outcome == nil, Task.isCancelled {
            throw PKError(.cancelled, "the task was cancelled while waiting for the reply")
        }
        return try Self.reply(from: waiter.outcome, receiveTimeout: receiveTimeout)!
    }

    private static func reply(from outcome: ZMQReplyWaiter.Outcome?, receiveTimeout: Duration) throws(PKError) -> PKZMQMessage? {
        switch outcome {
        case .reply(let reply): return reply
        case .died(let reason): throw PKError(.portInvalidated, "the remote port became invalid while waiting for the reply: \(reason)")
        case nil: throw PKError(.receiveTimedOut, "no reply arrived within \(receiveTimeout)")
        }
    }
}

/// A request on the wire: its waiter registered with the reply service under a fresh port id,
/// a watch on the remote port's connection, and the request sent. `end()` undoes the
/// registrations.
private struct PendingRequest: Sendable {
    let service: ZMQReplyService
    let id: UInt64
    let connection: ZMQConnection
    let watch: Int?

    /// One deadline for the reply endpoint's lookup and the send.
    init(_ port: PKZMQSendPort, _ message: PKZMQMessage, waiter: ZMQReplyWaiter, before deadline: PKDeadline) throws(PKError) {
        let connection = try port.right.connection()
        let service = try ZMQReplyService.shared()
        let replyEndpoint = try service.endpoint(toward: port.right.endpoint, before: deadline)
        let id = service.register(waiter)
        // A reply travels on another connection than the request, so it can arrive just after
        // the remote port's death is noticed (a server that answers, then exits): it still
        // wins within a short grace.
        let watch = connection.onDeath { reason in
            PKRunLoop.background.perform(inModes: [.common]) {
                PKRunLoop.current.scheduleTimer(after: ZMQReplyWaiter.deathGrace, forMode: .common) { _ in
                    waiter.finish(.died(reason))
                }
            }
        }
        self.service = service
        self.id = id
        self.connection = connection
        self.watch = watch
        let reply = ZMQPortAddress(endpoint: replyEndpoint, portID: id)
        do throws(PKError) { try port.send(message, reply: reply, on: connection, before: deadline) } catch {
            end()
            throw error
        }
    }

    func end() {
        service.unregister(id)
        connection.removeDeathHandler(watch)
    }

    /// A request made by an async caller: a first try that never waits, then, if it would have
    /// had to (no connection yet, no room, the reply endpoint's address not known: nothing was
    /// sent), the waiting one on a thread of its own, which the task awaits. A thread of Swift
    /// concurrency's pool waiting there could be one that the work that makes room needs.
    static func holdingNoTaskThread(
        _ port: PKZMQSendPort, _ message: PKZMQMessage, waiter: ZMQReplyWaiter, before deadline: PKDeadline
    ) async throws(PKError) -> PendingRequest {
        do throws(PKError) {
            return try PendingRequest(port, message, waiter: waiter, before: .distantPast)
        } catch {
            guard error.code == .sendTimedOut, !deadline.hasPassed else { throw error }
        }
        let result = await WaitingSendThreads.run(name: "PortKitZMQ.send", until: deadline) {
            Result { () throws(PKError) in try PendingRequest(port, message, waiter: waiter, before: deadline) }
        }
        // No thread to be had (none by the deadline, or none could be started): the task's own
        // tries, waiting no more than what is left.
        guard let result else { return try PendingRequest(port, message, waiter: waiter, before: deadline) }
        return try result.get()
    }
}

/// A one-shot signal a task awaits; `fire` from any thread, any number of times.
private final class AsyncSignal: Sendable {
    private let state = ZMQMutex<(fired: Bool, continuation: CheckedContinuation<Void, Never>?)>((false, nil))

    func fire() {
        let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard !state.fired else { return nil }
            state.fired = true
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume()
    }

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = state.withLock { state -> Bool in
                if state.fired { return true }
                state.continuation = continuation
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }
}
#endif
