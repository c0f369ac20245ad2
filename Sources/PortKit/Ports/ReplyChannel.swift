// A connection's reply channel (protocol.md, "Replies on the request's connection"): a socket is
// two-way, so the answer to a request sent over a connection can come back on that connection
// instead of on a new one made for the request. The requester reads the channel while it waits
// (`ReplyChannelReader`); the receive port's owner answers through a `ReplyRight`.

import Synchronization

/// The requester's side of one connection's reply channel: the decoder of what the port's owner
/// wrote back, and the tokens that tell one request's answer from a late answer to another.
///
/// Held by one request at a time (`SendConnection.claimReplyChannel()`), on that request's
/// thread; the claim hands it from thread to thread under the connection's lock.
final class ReplyChannelReader: @unchecked Sendable {
    // Unchecked: one request uses them at a time (the claim), and the checks cost a lookup in
    // thread-local storage each.
    @exclusivity(unchecked) private var decoder = WireDecoder(limits: PKPortLimits.default.wire, direction: .toRequester)
    @exclusivity(unchecked) private var scratch = ReadScratch(maxDescriptors: PKPortLimits.default.wire.maxDescriptors)
    @exclusivity(unchecked) private var lastToken: UInt16 = 0

    deinit {
        scratch.deallocate()
        for fd in decoder.takeAllDescriptors() { Descriptor.close(fd) }
    }

    /// A token for the next request: never 0, and a different one for each of the last 65,535
    /// requests on this connection.
    func nextToken() -> UInt16 {
        lastToken &+= 1
        if lastToken == 0 { lastToken = 1 }
        return lastToken
    }

    /// Takes back the token of a request that never went out (its send failed), so that
    /// failed sends do not wear the tokens round to one an unread answer still carries.
    func giveBack(_ token: UInt16) {
        if token == lastToken { lastToken &-= 1 }
    }

    /// What the port's owner wrote back.
    enum Event {
        /// An answer to request `token`; the receiver owns its rights.
        case message(PKPortMessage, token: UInt16)
        /// The right to answer request `token` was released unanswered.
        case noReply(token: UInt16)
        /// The right to answer request `token` was passed on: `descriptor` is a new connection to
        /// the requester's reply port, which must adopt it (or close it).
        case attach(descriptor: Int32, token: UInt16)
    }

    /// How a read ended.
    enum Outcome {
        /// The socket holds nothing more just now.
        case idle
        /// The port's side of the connection is closed.
        case ended
        /// The port's owner broke the protocol on the channel: it cannot be read any more.
        case failed(String)
    }

    /// Reads what `fd` (the requester's duplicate of the connection) holds, handing each event
    /// to `handle`: one read (what is left wakes the loop again: epoll is level-triggered), or,
    /// with `toTheEnd` (after a hang-up, when what is left is finite), every read until the
    /// socket would block or ends.
    func read(_ fd: Int32, on loop: PKRunLoop, toTheEnd: Bool, _ handle: (Event) -> Void) -> Outcome {
        // An idle channel keeps no read buffer of its own: it reads into its loop's.
        var outcome = Outcome.idle
        loop.withReadStorage { storage in
            let borrowed = decoder.borrowStorage(&storage)
            outcome = readAvailable(fd, toTheEnd: toTheEnd, handle)
            if borrowed { decoder.reclaimStorage(&storage) }
        }
        return outcome
    }

    private func readAvailable(_ fd: Int32, toTheEnd: Bool, _ handle: (Event) -> Void) -> Outcome {
        while true {
            let got: (count: Int, truncated: Bool)?
            do throws(PKError) { got = try scratch.receive(fd, into: &decoder, upTo: ReceiveConnection.readChunk) } catch {
                // A reset (the port's side closed with our request unread) is its end.
                if Socket.isPeerGone(error.errno) { return .ended }
                return .failed("reading the reply channel failed: \(error)")
            }
            guard let (count, truncated) = got else { return .idle }
            if truncated { return .failed("the reply channel carried more descriptors than a message may, or one that is not a Unix-domain stream socket") }
            if let failure = decodeAvailable(handle) { return .failed(failure) }
            if count == 0 { return .ended }
            // Once per wake-up, as a port reads its connections: a peer that keeps the socket
            // full must not hold the loop past the request's deadline (the loop comes back).
            if !toTheEnd { return .idle }
        }
    }

    private func decodeAvailable(_ handle: (Event) -> Void) -> String? {
        var frame = WireFrame(msgid: 0)
        var descriptors: [Int32] = []
        while true {
            // An answer of its bytes alone skips the general decoding (the same message), and a
            // read that held only such answers ends here. (The spare stays empty: an answer is
            // the requester's to keep, and no bytes come back to reuse.)
            if let usual = decoder.nextUsualFrame(reusing: &scratch.spare) {
                handle(.message(PKPortMessage(msgid: usual.msgid, data: usual.bytes), token: usual.replyToken))
                continue
            }
            if decoder.isDrained { return nil }
            let found: WireDecoder.Found?
            do throws(WireError) { found = try decoder.next(frame: &frame, descriptors: &descriptors) } catch {
                return error.description
            }
            guard let found else { return nil }
            guard case .frame = found else { continue }  // the greeting
            switch frame.controlCode {
            case .attachSender: handle(.attach(descriptor: descriptors[0], token: frame.replyToken))
            case .noReply: handle(.noReply(token: frame.replyToken))
            case .replyCancelled, nil:
                // The decoder admits no REPLY_CANCELLED on a reply channel: this is a message.
                handle(.message(ReceiveConnection.message(taking: &frame, descriptors: descriptors), token: frame.replyToken))
            }
        }
    }
}

/// The state of one request's answer, shared by the `ReplyRight` that answers it and the
/// connection it arrived on (which voids it when the requester cancels).
final class ReplyTicket: Sendable {
    let token: UInt16
    private let state = Atomic<UInt8>(ReplyTicket.open)

    static let open: UInt8 = 0
    static let answering: UInt8 = 1
    static let answered: UInt8 = 2
    static let void: UInt8 = 3

    init(token: UInt16) { self.token = token }

    var isOpen: Bool { state.load(ordering: .acquiring) == Self.open }

    /// Set by `void()` whatever the state: an answer under way when the right was voided does
    /// not reopen it if nothing of it went out.
    private let voided = Atomic<Bool>(false)

    /// Takes the right to answer; `false` if it was answered, is being answered, or is void.
    func beginAnswer() -> Bool {
        state.compareExchange(expected: Self.open, desired: Self.answering, ordering: .acquiringAndReleasing).exchanged
    }

    /// The answer went out (`true`), or nothing of it did and the right stays open (unless it
    /// was voided meanwhile).
    func endAnswer(sent: Bool) {
        if sent {
            state.store(Self.answered, ordering: .releasing)
        } else {
            state.store(voided.load(ordering: .acquiring) ? Self.void : Self.open, ordering: .releasing)
            // A `void()` between the load and the store found `answering` and left it: look again.
            if voided.load(ordering: .acquiring) { state.store(Self.void, ordering: .releasing) }
        }
    }

    /// Voids the right; returns whether it was open until now (an answer under way finishes).
    @discardableResult
    func void() -> Bool {
        voided.store(true, ordering: .releasing)
        return state.compareExchange(expected: Self.open, desired: Self.void, ordering: .acquiringAndReleasing).exchanged
    }
}

/// The right to answer one request made with REPLY_BACK: writes on the reply channel of the
/// connection the request came in on, with the request's token. It answers once; after that,
/// after it was passed on in a message (ATTACH_SENDER), after the requester gave up
/// (REPLY_CANCELLED), or after `invalidate()`, it is invalid.
/// Released unanswered, it tells the requester so (NO_REPLY), which ends its wait at once.
final class ReplyRight: Sendable {
    let writer: SendConnection
    let ticket: ReplyTicket
    /// Passed on to another holder (ATTACH_SENDER on the channel): that holder answers now.
    private let handedOn = Atomic<Bool>(false)

    init(writer: SendConnection, ticket: ReplyTicket) {
        self.writer = writer
        self.ticket = ticket
    }

    deinit {
        if !handedOn.load(ordering: .acquiring) { tellNoReply() }
    }

    var isValid: Bool { ticket.isOpen && writer.isValid }

    /// Sends the answer: the first message sent through the right, and the only one.
    func send(_ frame: some WireEncodable, descriptors: [Int32], before deadline: PKDeadline) throws(PKError) {
        guard ticket.beginAnswer() else {
            throw PKError(.invalidPort, "cannot send: this reply right was already used or passed on, or its request has ended")
        }
        do throws(PKError) {
            try writer.write(frame, descriptors: descriptors, before: deadline)
        } catch {
            ticket.endAnswer(sent: !Self.nothingSent(error))
            throw error
        }
        ticket.endAnswer(sent: true)
    }

    /// Whether a failed write sent nothing: a timeout, a message over the limits, or
    /// descriptors the kernel refused for now. The right then stays open (to answer again, or
    /// NO_REPLY).
    private static func nothingSent(_ error: PKError) -> Bool {
        error.code == .sendTimedOut || error.code == .limitExceeded
            || (error.code == .system && Socket.isRefusedForNow(error.errno))
    }

    /// A new connection to the requester's reply port, passed over the reply channel
    /// (ATTACH_SENDER with the request's token), as a descriptor to attach to a message.
    func makeTransferDescriptor(before deadline: PKDeadline) throws(PKError) -> Int32 {
        // Taken as an answer is (copies of the right on other threads may answer, pass it on
        // or invalidate it meanwhile: none of them gets it too, and no NO_REPLY follows).
        guard ticket.beginAnswer() else {
            throw PKError(.invalidPort, "cannot send a port: this reply right was already used or passed on, or its request has ended")
        }
        let readEnd: Int32, writeEnd: Int32
        do throws(PKError) {
            (readEnd, writeEnd) = try Socket.pair()
            do throws(PKError) { try ConnectionSetup.writeGreeting(writeEnd) } catch {
                Descriptor.close(readEnd)
                Descriptor.close(writeEnd)
                throw error
            }
        } catch {
            ticket.endAnswer(sent: false)  // nothing went out on the reply channel
            throw error
        }
        defer { Descriptor.close(readEnd) }
        do throws(PKError) {
            try writer.write(WireFrame.attachSender(replyToken: ticket.token), descriptors: [readEnd], before: deadline)
        } catch {
            Descriptor.close(writeEnd)
            ticket.endAnswer(sent: !Self.nothingSent(error))
            throw error
        }
        // Passed on, as a Mach send-once right moved into a message: this right answers no
        // more, even if the message that carries the new one is not sent after all (the
        // requester then sees its reply port's sender leave, and ends its wait); an answer
        // through it would otherwise reach a request already ended, and be dropped.
        handedOn.store(true, ordering: .releasing)
        ticket.endAnswer(sent: true)
        return writeEnd
    }

    /// Gives the right up unanswered: the requester learns at once, unless the right was passed
    /// on (its new holder may still answer).
    func invalidate() {
        if handedOn.load(ordering: .acquiring) { ticket.void() } else { tellNoReply() }
    }

    private func tellNoReply() {
        guard ticket.void() else { return }
        try? writer.write(WireFrame.control(.noReply, replyToken: ticket.token), descriptors: [], before: .now)
    }
}
