// Synchronous request/reply (CFMessagePortSendRequest): send with a reply port, then run the
// caller's loop in a private mode until the reply, the deadline, or the remote port's death.

import Synchronization

/// Gives each request's private reply mode a unique name.
private let replyModeCounter = Atomic<UInt64>(0)

extension PKSendPort {
    /// Sends `message` and waits for the reply (`CFMessagePortSendRequest`).
    ///
    /// The message goes out with a fresh reply port. While waiting, the calling thread's run loop
    /// runs in a private mode that holds only that reply port and a watch on this port's
    /// connection, so the caller's other handlers do not fire. The first message that arrives on
    /// the reply port is the reply.
    ///
    /// - Parameters:
    ///   - message: the request; its `replyPort` is replaced by the private reply port.
    ///   - sendTimeout: how long a full queue may hold the request.
    ///   - receiveTimeout: how long to wait for the reply; `nil` sends one-way and returns `nil`
    ///     at once (as `CFMessagePortSendRequest` does with no reply mode).
    /// - Returns: the reply, or `nil` for a one-way send.
    /// - Throws: `PKError` with `.sendTimedOut`, `.receiveTimedOut`, `.invalidPort` (invalid
    ///   before the request went out), `.portInvalidated` (the port died, or its owner dropped
    ///   the reply port without answering, while the caller waited), `.transport`, or
    ///   `.limitExceeded`.
    @discardableResult
    public func sendRequest(
        _ message: PKPortMessage, sendTimeout: Duration, receiveTimeout: Duration?
    ) throws(PKError) -> PKPortMessage? {
        guard let receiveTimeout else {
            var oneWay = message
            oneWay.replyPort = nil
            try send(oneWay, before: .after(sendTimeout))
            return nil
        }
        let loop = PKRunLoop.current
        let mode = PKRunLoopMode("PKReplyMode-\(replyModeCounter.add(1, ordering: .relaxed).newValue)")
        // The private mode never runs again: leave nothing in it (the loop purges an invalidated
        // source only when its mode runs, and `died` holds the outcome: the reply and the rights
        // in it), then forget it. Defers run in reverse: this one last.
        defer { loop.forgetModeIfEmpty(mode) }
        let outcome = RequestOutcome()
        let replyPort = PKReceivePort { reply in
            if outcome.reply == nil { outcome.reply = reply }
        }
        replyPort.onNoSenders = { outcome.abandoned = true }
        defer { replyPort.invalidate() }
        try loop.add(replyPort, forMode: mode)

        var request = message
        request.replyPort = replyPort.makeSendRight()
        try send(request, before: .after(sendTimeout))
        request.replyPort = nil

        // Watch the remote port, whether reached through a connection of its own or a local
        // right (whose port's death closes no connection of ours): its death ends the wait at
        // once. The watch signals a source of the private mode, so the run returns.
        let died = PKCustomSource { outcome.remoteDied = true }
        loop.add(died, forMode: mode)
        defer {
            loop.remove(died, forMode: mode)
            died.invalidate()
        }
        let watch = try? watchInvalidation(on: loop, forMode: mode) { died.signal() }
        defer { watch?.cancel() }

        let deadline = PKDeadline.after(receiveTimeout)
        while outcome.reply == nil && !outcome.remoteDied && !outcome.abandoned {
            let result = loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
            if result == .timedOut || result == .finished { break }
            if result == .stopped { loop.stop() ; break }  // not ours: pass the stop outward
        }
        if let reply = outcome.reply { return reply }
        if outcome.remoteDied {
            throw PKError(.portInvalidated, "the remote port became invalid while waiting for the reply")
        }
        if outcome.abandoned {
            throw PKError(.portInvalidated, "the remote port's owner released the reply port without answering")
        }
        throw PKError(.receiveTimedOut, "no reply arrived within \(receiveTimeout)")
    }
}

/// What a request's private loop run learned; loop-only.
private final class RequestOutcome {
    var reply: PKPortMessage?
    var remoteDied = false
    var abandoned = false
}
