// Synchronous request/reply (CFMessagePortSendRequest): send with a reply port, then run the
// caller's loop in a private mode until the reply, the deadline, or the remote port's death.
//
// Each loop keeps its reply machinery from one request to the next (a `ReplySlot` per nesting
// depth): the reply port, the private mode and the source that reports the remote's death are
// made once. Between two requests the reply port's senders are revoked
// (`PKReceivePort.revokeSenders()`), so a late answer to one request is refused, never taken
// for the answer to the next.
//
// A request over a connection asks for its answer on that connection's reply channel
// (protocol.md, REPLY_BACK): no reply connection is made, and the slot keeps its watch on the
// connection (a duplicate of its descriptor, in the private mode) from one request to the next
// to the same remote. The slot reads the channel only while one of its requests holds it; a
// request that finds it held by another thread's request makes a reply connection as before.

extension PKSendPort {
    /// Sends `message` and waits for the reply (`CFMessagePortSendRequest`).
    ///
    /// The message goes out with a reply port private to this request: through a right with a
    /// connection of its own (received in a message, looked up by name, a worker process's
    /// port), that is the connection's reply channel, so the answer comes back on the socket the
    /// request went out on (protocol.md 6.1); otherwise a reply port of the loop's. While
    /// waiting, the calling thread's run loop runs in a private mode that holds only that reply
    /// port and a watch on this port, so the caller's other handlers do not fire. The first
    /// message that arrives for the request is the reply; once the request returns, the reply
    /// right it sent is invalid, and an answer sent through it later fails with `.invalidPort`
    /// (on a connection's reply channel, once the port's loop has read the cancel: an answer
    /// sent before that, as from the handler still running the request, goes out and is
    /// discarded by the requester).
    ///
    /// - Parameters:
    ///   - message: the request; its `replyPort` is replaced by the private reply port.
    ///   - sendTimeout: how long a full queue may hold the request.
    ///   - receiveTimeout: how long to wait for the reply; `nil` sends one-way and returns `nil`
    ///     at once (as `CFMessagePortSendRequest` does with no reply mode).
    /// - Returns: the reply, or `nil` for a one-way send.
    /// - Throws: `PKError` with `.sendTimedOut`, `.receiveTimedOut`, `.invalidPort` (invalid
    ///   before the request went out), `.portInvalidated` (the port died, or its owner dropped
    ///   the reply port without answering, while the caller waited), `.interrupted` (the loop
    ///   was stopped while it waited: the stop is passed on to the run the request was made
    ///   in), `.transport`, or `.limitExceeded`.
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
        if case .connection(let connection) = storage, let token = slot.claimReplyChannel(of: connection, on: loop) {
            // The answer comes back on this connection (REPLY_BACK); the slot's watch on it
            // reads the answer and reports the remote's death.
            request.replyPort = nil
            try send(request, replyBackToken: token, before: .after(sendTimeout))
            slot.requestSent()
        } else {
            request.replyPort = slot.port.makeSendRight()
            try send(request, before: .after(sendTimeout))
            request.replyPort = nil
            // Watch the remote port, whether reached through a connection of its own or a local
            // right (whose port's death closes no connection of ours): its death ends the wait at
            // once, through a source of the private mode.
            slot.watch(self, on: loop)
        }

        let deadline = PKDeadline.after(receiveTimeout)
        var stopped = false
        while slot.reply == nil && !slot.remoteDied && !slot.abandoned && slot.channelFailure == nil {
            let result = loop.runPrivately(in: slot.mode, until: deadline, returnAfterSourceHandled: true)
            if result == .timedOut || result == .finished { break }
            if result == .stopped {  // passed on to the caller's run by runPrivately
                stopped = true
                break
            }
        }
        if let reply = slot.reply { return reply }
        if slot.remoteDied {
            throw PKError(.portInvalidated, "the remote port became invalid while waiting for the reply")
        }
        if slot.abandoned {
            throw PKError(.portInvalidated, "the remote port's owner released the reply port without answering")
        }
        if let failure = slot.channelFailure {
            throw PKError(.transport, "the remote port's owner broke the protocol on the reply channel: \(failure)")
        }
        if stopped { throw PKError(.interrupted, "the run loop was stopped while waiting for the reply") }
        throw PKError(.receiveTimedOut, "no reply arrived within \(receiveTimeout)")
    }
}

/// One loop's request machinery at one nesting depth, reused by every request made there:
/// a reply port and a death-report source, both in a private mode. Loop-only, so its state
/// skips the run-time exclusivity checks (as the loop's own state does).
final class ReplySlot {
    let mode: PKRunLoopMode
    let port: PKReceivePort
    private let died = PKCustomSource {}
    /// Counts the slot's requests, so that a death reported for an earlier one is ignored.
    @exclusivity(unchecked) private var generation: UInt64 = 0
    @exclusivity(unchecked) private var inUse = false
    @exclusivity(unchecked) private var watch: PKInvalidationWatch?
    /// The watch on the last connection asked through its reply channel, kept between requests.
    @exclusivity(unchecked) private var link: ConnectionLink?
    /// The current request's hold on a connection's reply channel.
    @exclusivity(unchecked) private var claim: (connection: SendConnection, reader: ReplyChannelReader, token: UInt16, sent: Bool)?

    // The current request's outcome.
    @exclusivity(unchecked) private(set) var reply: PKPortMessage?
    @exclusivity(unchecked) private(set) var remoteDied = false
    @exclusivity(unchecked) private(set) var abandoned = false
    /// The reply channel broke the protocol (the request fails; the channel is not used again).
    @exclusivity(unchecked) private(set) var channelFailure: String?

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
        slot.channelFailure = nil
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
        // Weak, though the slot lives as long as its loop: `unowned` saved about 1,000
        // instructions a request between threads (the weak reference gives the slot a side
        // table, and its retains and releases the slow path), yet measured 4 % slower on one
        // CPU, in alternating comparisons with functions aligned and not; no cause found.
        watch = try? remote.watchInvalidation(on: loop, forMode: mode) { [weak self] in
            // A report for an earlier request (queued before its watch was cancelled) is stale.
            guard let self, inUse, generation == current else { return }
            remoteDied = true
            died.signal()
        }
    }

    /// Takes `connection`'s reply channel for the current request and watches it (keeping the
    /// watch from the previous request when it was on the same connection). Returns the
    /// request's token, or `nil` when the channel is not available (held by another request,
    /// broken, or the watch cannot be made): the request then makes a reply connection.
    func claimReplyChannel(of connection: SendConnection, on loop: PKRunLoop) -> UInt16? {
        guard let reader = connection.claimReplyChannel() else { return nil }
        if let link, link.serial != connection.serial { dropLink() }
        if link == nil {
            guard let made = try? ConnectionLink(connection, slot: self, on: loop, mode: mode) else {
                connection.releaseReplyChannel(broken: false)
                return nil
            }
            link = made
        }
        link!.watchReplies()
        let token = reader.nextToken()
        claim = (connection, reader, token, false)
        return token
    }

    /// The request went out: an unanswered end cancels it (REPLY_CANCELLED).
    func requestSent() { claim?.sent = true }

    /// What the watched connection reported. Loop-only.
    fileprivate func linkReported(_ events: PKIOEvents, _ link: ConnectionLink, on loop: PKRunLoop) {
        let hungUp = !events.intersection([.hangUp, .error]).isEmpty
        // The claim's parts, not the claim: a copy of it, kept for the closure below, cost three
        // retains and releases a reply.
        guard let reader = claim?.reader, let current = claim?.token else {
            // No request of this slot holds the channel (another thread's request reads it):
            // stop waking for its bytes; once the connection is gone, stop watching it.
            if hungUp { dropLink() } else { link.watchHangUpOnly() }
            return
        }
        // After a hang-up, read to the end: an answer written before it still counts.
        let outcome = reader.read(link.descriptor, on: loop, toTheEnd: hungUp) { event in
            switch event {
            case .message(let message, let token):
                if token == current && reply == nil { reply = message }
                // Otherwise a late answer to an earlier request: dropped with its rights.
            case .noReply(let token):
                if token == current { abandoned = true }
            case .attach(let descriptor, let token):
                if token == current { port.adoptHandedOverFromAnyThread(descriptor) } else { Descriptor.close(descriptor) }
            }
        }
        switch outcome {
        case .idle:
            // A hang-up with nothing more to read: the remote is gone.
            if hungUp {
                if reply == nil { remoteDied = true }
                dropLink()
            }
        case .ended:
            if reply == nil { remoteDied = true }
            dropLink()
        case .failed(let failure):
            if reply == nil { channelFailure = failure }
            channelBroken = true
            dropLink()
        }
    }

    /// Stops watching the last connection (it is gone, or its channel broke).
    private func dropLink() {
        link?.close()
        link = nil
    }

    /// The channel broke during the current request: nothing more is said on it, and it is
    /// not used again.
    @exclusivity(unchecked) private var channelBroken = false

    /// Ends the request: the reply right it sent stops working, and the slot is free again.
    func finish(on loop: PKRunLoop) {
        watch?.cancel()
        watch = nil
        if let claim {
            if claim.sent && reply == nil && !abandoned && !remoteDied && !channelBroken {
                // Unanswered: the right to answer is void from now on (best effort: a full
                // socket drops the cancel, and the token still tells a late answer apart).
                try? claim.connection.write(WireFrame.control(.replyCancelled, replyToken: claim.token),
                                            descriptors: [], before: .now)
            }
            if !claim.sent { claim.reader.giveBack(claim.token) }
            claim.connection.releaseReplyChannel(broken: channelBroken)
            channelBroken = false
            self.claim = nil
        }
        port.revokeSenders()
        reply = nil
        inUse = false
        loop.requestDepth -= 1
    }
}

/// A reply slot's watch on one connection: a duplicate of its descriptor in the slot's mode,
/// read while a request of the slot holds the connection's reply channel. Loop-only.
private final class ConnectionLink {
    let serial: UInt64
    let descriptor: Int32
    private var source: PKDescriptorSource!
    private var closed = false

    init(_ connection: SendConnection, slot: ReplySlot, on loop: PKRunLoop, mode: PKRunLoopMode) throws(PKError) {
        serial = connection.serial
        descriptor = try Descriptor.duplicate(connection.fd)
        source = PKDescriptorSource(descriptor: descriptor, events: .readable, handler: { [unowned slot, unowned self, unowned loop] events in
            slot.linkReported(events, self, on: loop)
        }, cancel: { [unowned self] in
            // The source left its loop for good (closed, or the thread ended).
            closeDescriptor()
        })
        do throws(PKError) { try loop.add(source, forMode: mode) } catch {
            source = nil
            closeDescriptor()
            throw error
        }
    }

    /// Watches for answers (a request of the slot holds the channel).
    func watchReplies() {
        if source.events != .readable { source.events = .readable }
    }

    /// Stops waking for the channel's bytes: another thread's request reads them.
    func watchHangUpOnly() {
        if source.events != [.hangUp] { source.events = [.hangUp] }
    }

    func close() {
        source?.invalidate()
        closeDescriptor()
    }

    private func closeDescriptor() {
        guard !closed else { return }
        closed = true
        Descriptor.close(descriptor)
    }
}
