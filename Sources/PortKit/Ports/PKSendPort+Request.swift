// Synchronous request/reply (CFMessagePortSendRequest): send with a reply port, then run the
// caller's loop in a private mode until the reply, the deadline, or the remote port's death.
//
// Each loop keeps its reply machinery from one request to the next (a `ReplySlot` per nesting
// depth): the reply port, the private mode and the source that reports the remote's death are
// made once. Between two requests the reply port's senders are revoked
// (`PKReceivePort.revokeSenders()`), so a late answer to one request is refused, never taken
// for the answer to the next.

extension PKSendPort {
    /// Sends `message` and waits for the reply (`CFMessagePortSendRequest`).
    ///
    /// The message goes out with a reply port private to this request. While waiting, the
    /// calling thread's run loop runs in a private mode that holds only that reply port and a
    /// watch on this port, so the caller's other handlers do not fire. The first message that
    /// arrives on the reply port is the reply; once the request returns, the reply right it
    /// sent is invalid, and an answer sent through it later fails with `.invalidPort`.
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
        let slot = try ReplySlot.take(on: loop)
        defer { slot.finish(on: loop) }

        var request = message
        request.replyPort = slot.port.makeSendRight()
        try send(request, before: .after(sendTimeout))
        request.replyPort = nil

        // Watch the remote port, whether reached through a connection of its own or a local
        // right (whose port's death closes no connection of ours): its death ends the wait at
        // once, through a source of the private mode.
        slot.watch(self, on: loop)

        let deadline = PKDeadline.after(receiveTimeout)
        while slot.reply == nil && !slot.remoteDied && !slot.abandoned {
            let result = loop.run(in: slot.mode, until: deadline, returnAfterSourceHandled: true)
            if result == .timedOut || result == .finished { break }
            if result == .stopped { loop.stop() ; break }  // not ours: pass the stop outward
        }
        if let reply = slot.reply { return reply }
        if slot.remoteDied {
            throw PKError(.portInvalidated, "the remote port became invalid while waiting for the reply")
        }
        if slot.abandoned {
            throw PKError(.portInvalidated, "the remote port's owner released the reply port without answering")
        }
        throw PKError(.receiveTimedOut, "no reply arrived within \(receiveTimeout)")
    }
}

/// One loop's request machinery at one nesting depth, reused by every request made there:
/// a reply port and a death-report source, both in a private mode. Loop-only.
final class ReplySlot {
    let mode: PKRunLoopMode
    let port: PKReceivePort
    private let died = PKCustomSource {}
    /// Counts the slot's requests, so that a death reported for an earlier one is ignored.
    private var generation: UInt64 = 0
    private var inUse = false
    private var watch: PKInvalidationWatch?

    // The current request's outcome.
    private(set) var reply: PKPortMessage?
    private(set) var remoteDied = false
    private(set) var abandoned = false

    private init(mode: PKRunLoopMode) {
        self.mode = mode
        self.port = PKReceivePort()
    }

    /// The slot for a request made now on `loop` (the loop's thread), set up on first use.
    static func take(on loop: PKRunLoop) throws(PKError) -> ReplySlot {
        let depth = loop.requestDepth
        if depth == loop.replySlots.count {
            let slot = ReplySlot(mode: PKRunLoopMode("PKReplyMode-\(depth)"))
            try slot.install(on: loop)
            loop.replySlots.append(slot)
        }
        let slot = loop.replySlots[depth]
        precondition(!slot.inUse, "PortKit bug: a reply slot taken twice")
        slot.inUse = true
        slot.generation += 1
        slot.reply = nil
        slot.remoteDied = false
        slot.abandoned = false
        loop.requestDepth += 1
        return slot
    }

    private func install(on loop: PKRunLoop) throws(PKError) {
        port.handler = { [unowned self] reply in
            if inUse && self.reply == nil { self.reply = reply }
        }
        port.onNoSenders = { [unowned self] in
            if inUse { abandoned = true }
        }
        try loop.add(port, forMode: mode)
        loop.add(died, forMode: mode)
    }

    /// Watches `remote` for the current request.
    func watch(_ remote: PKSendPort, on loop: PKRunLoop) {
        let current = generation
        watch = try? remote.watchInvalidation(on: loop, forMode: mode) { [weak self] in
            // A report for an earlier request (queued before its watch was cancelled) is stale.
            guard let self, inUse, generation == current else { return }
            remoteDied = true
            died.signal()
        }
    }

    /// Ends the request: the reply right it sent stops working, and the slot is free again.
    func finish(on loop: PKRunLoop) {
        watch?.cancel()
        watch = nil
        port.revokeSenders()
        reply = nil
        inUse = false
        loop.requestDepth -= 1
    }
}
