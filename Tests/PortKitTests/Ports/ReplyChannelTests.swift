// Requests over a connection answered on that connection's reply channel (protocol.md 6.1): what
// the wire carries, a right that answers once, one passed on, two threads sharing a right, the
// sender's departure still seen by the port, and a reply channel that lies.

import Glibc
import Testing
@testable import PortKit

@Suite struct ReplyChannelTests {
    static func code(of body: () throws -> Void) -> PKError.Code? {
        do { try body() } catch let error as PKError { return error.code } catch { return nil }
        return nil
    }

    /// A reply right answers once: the first message through it is the answer, a second send
    /// fails with `.invalidPort` and never reaches the requester.
    @Test func aReplyRightAnswersOnce() throws {
        let second = Locked<PKError.Code?>(nil)
        let server = try PortServer { port, _ in
            port.handler = { message in
                try? message.replyPort?.send(PKPortMessage(msgid: 10), timeout: .seconds(5))
                second.value = Self.code { try message.replyPort?.send(PKPortMessage(msgid: 11), timeout: .seconds(5)) }
            }
        }
        let right = try independentRight(to: server.port)
        let replies = try onPortLoopThread { _ -> [UInt32] in
            var replies: [UInt32] = []
            for _ in 0..<3 {
                replies.append(try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))?.msgid ?? 0)
            }
            return replies
        }
        #expect(replies == [10, 10, 10])
        #expect(second.value == .invalidPort)
        try server.stop()
    }

    /// The right to answer can be passed on in a message: its new holder answers, through a
    /// connection the requester adopts (ATTACH_SENDER on the reply channel).
    @Test func aReplyRightPassedOnIsAnsweredByItsNewHolder() throws {
        let helper = try PortServer(name: "helper") { port, _ in
            port.handler = { message in
                try? message.ports.first?.send(PKPortMessage(msgid: 777, data: message.data), timeout: .seconds(5))
            }
        }
        let helperRight = try independentRight(to: helper.port)
        let server = try PortServer { port, _ in
            port.handler = { message in
                guard let reply = message.replyPort else { return }
                try? helperRight.send(PKPortMessage(msgid: 1, components: [.data(message.data), .port(reply)]), timeout: .seconds(5))
            }
        }
        let right = try independentRight(to: server.port)
        let replies = try onPortLoopThread { _ -> [PKPortMessage?] in
            try (0..<3).map { round in
                try right.sendRequest(PKPortMessage(msgid: 5, data: [UInt8(round)]), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            }
        }
        #expect(replies.map { $0?.msgid } == [777, 777, 777])
        #expect(replies.map { $0?.data } == [[0], [1], [2]])
        try server.stop()
        try helper.stop()
    }

    /// Two threads making requests through one right at once each get their own answers: one
    /// of them holds the reply channel, the other sends a reply port of its own meanwhile.
    @Test func twoThreadsRequestingThroughOneRightGetTheirOwnAnswers() throws {
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid, data: $0.data), timeout: .seconds(5)) }
        }
        let right = try independentRight(to: server.port)
        let mismatches = Locked<[String]>([])
        let threads = (0..<2).map { index in
            TestThread(name: "requester-\(index)") {
                let rounds = 300
                for round in 0..<rounds {
                    let id = UInt32(index * 100_000 + round)
                    do {
                        let reply = try right.sendRequest(PKPortMessage(msgid: id, data: [UInt8(index)]), sendTimeout: .seconds(5),
                                                          receiveTimeout: patience(.seconds(10)))
                        if reply?.msgid != id || reply?.data != [UInt8(index)] {
                            mismatches.withLock { $0.append("request \(id): answer \(String(describing: reply?.msgid))") }
                        }
                    } catch {
                        mismatches.withLock { $0.append("request \(id): \(error)") }
                        return
                    }
                }
            }
        }
        for thread in threads { try thread.joinPatiently(timeout: .seconds(60)) }
        #expect(mismatches.value.isEmpty, "\(mismatches.value.prefix(5))")
        try server.stop()
    }

    /// The requester's loop keeps watching the connection between requests (a duplicate of its
    /// descriptor), yet dropping the right still ends the connection: the port sees its
    /// sender leave while the requester's thread lives on.
    @Test func droppingTheRightEndsTheConnectionThoughItsLoopWatchedIt() throws {
        let noSenders = Locked(false)
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: 1), timeout: .seconds(5)) }
            port.onNoSenders = { noSenders.value = true }
        }
        let port = server.port
        try onPortLoopThread { _ in
            var right: PKSendPort? = try independentRight(to: port)
            for _ in 0..<3 {
                _ = try right?.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            }
            right = nil
            try waitPatiently("the port to see its sender leave") { noSenders.value }
        }
        try server.stop()
    }

    // MARK: - The wire, from a raw port's side

    /// A request's frames on the wire, and what a port's owner may write back: a late answer
    /// (another token) is dropped and the answer taken; NO_REPLY ends the wait at once; a
    /// channel that breaks the protocol fails its request with `.transport`, after which the
    /// right still works and requests send a reply port of their own. The requests and the
    /// answers carry bytes, so both sides' usual-message shortcuts (a plain frame with a token,
    /// and the reader's `nextUsualFrame`) meet a peer that uses the general encoding.
    @Test func whatTheRequesterMakesOfItsReplyChannel() throws {
        let pair = try RawPortSide.pair()
        let right = pair.right
        let script = TestThread(name: "raw-port") {
            pair.side.run { side in
                // 1: a late answer to another request first, then the answer.
                var (request, _) = try side.nextFrame()
                try side.expect(request.repliesBack && !request.hasReplyPort && request.replyToken != 0
                                    && request.components == [.data(Array("request 1".utf8))], "request 1: \(request)")
                var bytes = RawPeer.greeting
                WireEncoder.append(WireFrame(msgid: 500, replyToken: request.replyToken &+ 100, components: [.data(Array("late".utf8))]),
                                   to: &bytes)
                WireEncoder.append(WireFrame(msgid: 501, replyToken: request.replyToken, components: [.data(Array("answer".utf8))]),
                                   to: &bytes)
                try side.write(bytes)
                let first = request.replyToken
                // 2: NO_REPLY.
                (request, _) = try side.nextFrame()
                try side.expect(request.repliesBack && request.replyToken != first, "request 2: \(request)")
                bytes = []
                WireEncoder.append(WireFrame.control(.noReply, replyToken: request.replyToken), to: &bytes)
                try side.write(bytes)
                // 3: a frame without a token breaks the channel.
                (request, _) = try side.nextFrame()
                try side.expect(request.repliesBack, "request 3: \(request)")
                bytes = []
                WireEncoder.append(WireFrame(msgid: 503, components: [.data([3])]), to: &bytes)
                try side.write(bytes)
                // 4: a reply port of its own now; the answer goes there.
                let descriptors: [Int32]
                (request, descriptors) = try side.nextFrame()
                try side.expect(!request.repliesBack && request.hasReplyPort && descriptors.count == 1, "request 4: \(request)")
                bytes = []  // the connection's maker greeted already (protocol.md 3)
                WireEncoder.append(WireFrame(msgid: 504), to: &bytes)
                try side.write(bytes, to: descriptors[0])
                for fd in descriptors { Descriptor.close(fd) }
            }
        }
        let outcomes = try onPortLoopThread { _ -> [String] in
            var outcomes: [String] = []
            for msgid in UInt32(1)...4 {
                do {
                    let request = PKPortMessage(msgid: msgid, data: Array("request \(msgid)".utf8))
                    let reply = try right.sendRequest(request, sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                    outcomes.append("reply \(reply?.msgid ?? 0) \(String(decoding: reply?.data ?? [], as: UTF8.self))")
                } catch let error as PKError {
                    outcomes.append("\(error.code)")
                }
            }
            return outcomes
        }
        try script.joinPatiently()
        #expect(pair.side.failures.isEmpty, "\(pair.side.failures)")
        #expect(outcomes == ["reply 501 answer", "portInvalidated", "transport", "reply 504 "])
        pair.side.close()
    }

    /// A request that ends unanswered says so on the wire (REPLY_CANCELLED with its token), and
    /// the next request has a token of its own.
    @Test func anUnansweredRequestIsCancelledOnTheWire() throws {
        let pair = try RawPortSide.pair()
        let right = pair.right
        let script = TestThread(name: "raw-port") {
            pair.side.run { side in
                let (request, _) = try side.nextFrame()
                try side.expect(request.repliesBack && request.replyToken != 0, "request: \(request)")
                let (cancel, _) = try side.nextFrame()
                try side.expect(cancel.controlCode == .replyCancelled && cancel.replyToken == request.replyToken, "cancel: \(cancel)")
                let (next, _) = try side.nextFrame()
                try side.expect(next.repliesBack && next.replyToken != request.replyToken, "next: \(next)")
                var bytes = RawPeer.greeting
                WireEncoder.append(WireFrame(msgid: 9, replyToken: next.replyToken), to: &bytes)
                try side.write(bytes)
            }
        }
        let outcomes = try onPortLoopThread { _ -> [String] in
            let first = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .milliseconds(100)) }
            let second = try right.sendRequest(PKPortMessage(msgid: 2), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            return ["\(first.map { "\($0)" } ?? "none")", "reply \(second?.msgid ?? 0)"]
        }
        try script.joinPatiently()
        #expect(pair.side.failures.isEmpty, "\(pair.side.failures)")
        #expect(outcomes == ["receiveTimedOut", "reply 9"])
        pair.side.close()
    }
}

extension ReplyChannelTests {
    /// A port side that closes with the request unread resets the connection (ECONNRESET, not
    /// EOF): the remote is gone (`.portInvalidated`), not a liar (`.transport`).
    @Test func aPortThatClosesWithTheRequestUnreadIsGoneNotBroken() throws {
        let pair = try RawPortSide.pair()
        let right = pair.right
        let script = TestThread(name: "raw-port") {
            pair.side.run { side in
                // The greeting and the request's 16-byte frame, unread.
                try side.waitForUnread(WireFormat.greetingByteCount + WireFormat.frameHeaderByteCount)
                side.close()
            }
        }
        let outcome = try onPortLoopThread { _ -> String in
            do {
                _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                return "answered"
            } catch let error as PKError { return "\(error.code): \(error)" } catch { return "\(error)" }
        }
        try script.joinPatiently()
        #expect(pair.side.failures.isEmpty, "\(pair.side.failures)")
        #expect(outcome.hasPrefix("portInvalidated"), "\(outcome)")
    }

    /// A port side that floods the reply channel with answers to other requests cannot hold the
    /// requester past its receive timeout.
    @Test func aFloodOfLateAnswersDoesNotHoldARequestPastItsTimeout() throws {
        let pair = try RawPortSide.pair()
        let right = pair.right
        let done = Locked(false)
        let script = TestThread(name: "raw-port") {
            pair.side.run { side in
                let (request, _) = try side.nextFrame()
                var bytes = RawPeer.greeting
                let stale = WireFrame(msgid: 9, replyToken: request.replyToken &+ 1, components: [.data([UInt8](repeating: 7, count: 1000))])
                for _ in 0..<60 { WireEncoder.append(stale, to: &bytes) }
                try side.write(bytes)
                bytes = []
                for _ in 0..<60 { WireEncoder.append(stale, to: &bytes) }
                let deadline = PKDeadline.after(patience(.seconds(20)))
                while !done.value && !deadline.hasPassed { try side.writeWhileRead(bytes, until: { done.value }) }
            }
        }
        let code = try onPortLoopThread { _ in
            Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .milliseconds(300)) }
        }
        done.value = true
        try script.joinPatiently()
        #expect(pair.side.failures.isEmpty, "\(pair.side.failures)")
        #expect(code == .receiveTimedOut)
    }

    /// A request whose send fails gives its token back: the next request that goes out carries
    /// the token after the last one that went out.
    @Test func aRequestThatNeverWentOutGivesItsTokenBack() throws {
        let pair = try RawPortSide.pair()
        let right = pair.right
        let tokens = Locked<[UInt16]>([])
        let script = TestThread(name: "raw-port") {
            pair.side.run { side in
                for _ in 0..<2 {
                    let (request, _) = try side.nextFrame()
                    tokens.withLock { $0.append(request.replyToken) }
                    var bytes = tokens.value.count == 1 ? RawPeer.greeting : []
                    WireEncoder.append(WireFrame(msgid: 3, replyToken: request.replyToken), to: &bytes)
                    try side.write(bytes)
                }
            }
        }
        let failures = try onPortLoopThread { _ -> [PKError.Code?] in
            _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            let tooBig = PKPortMessage(msgid: 2, components: Array(repeating: .data([]), count: PKPortLimits.default.wire.maxComponents + 1))
            let failed = (0..<3).map { _ in
                Self.code { _ = try right.sendRequest(tooBig, sendTimeout: .seconds(5), receiveTimeout: .seconds(1)) }
            }
            _ = try right.sendRequest(PKPortMessage(msgid: 3), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            return failed
        }
        try script.joinPatiently()
        #expect(pair.side.failures.isEmpty, "\(pair.side.failures)")
        #expect(failures == [.limitExceeded, .limitExceeded, .limitExceeded])
        #expect(tokens.value.count == 2 && tokens.value[1] == tokens.value[0] &+ 1, "tokens \(tokens.value)")
    }

    /// A right whose connection's descriptor cannot be duplicated for the reply channel's watch
    /// (no descriptor left: EMFILE) gives the channel back, neither held nor broken. The
    /// request falls back to a reply port of the loop's, which needs descriptors too (the reply
    /// port goes over the connection as a new one, a socketpair): it fails with `.system`
    /// (socketpair, EMFILE) and leaves no descriptor behind. With descriptors free again, the
    /// next two requests through the same right ask for their answers on its reply channel
    /// (REPLY_BACK, no reply port) and get them. Run in a child process: it lowers its own
    /// descriptor limit and fills it.
    @Test func aReplyChannelWhoseDescriptorCannotBeDuplicatedIsGivenBack() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                do {
                    let (outcomes, failures) = try Self.requestsAroundADescriptorShortage()
                    let expected = ["system socketpair EMFILE", "no descriptor left behind", "reply 102", "reply 103"]
                    endExitTest(outcomes.joined(separator: "\n"),
                                failures: failures + (outcomes == expected ? [] : ["expected \(expected)"]))
                } catch {
                    endExitTest("failed: \(error)", failures: ["\(error)"])
                }
            }
        }
    }

    /// The body of `aReplyChannelWhoseDescriptorCannotBeDuplicatedIsGivenBack`: what each request
    /// came to, and what the raw port side found wrong.
    static func requestsAroundADescriptorShortage() throws -> (outcomes: [String], failures: [String]) {
        // A request through an in-process right makes the loop's reply machinery (its reply
        // port, private mode and descriptors) and watches no connection: the shortage's request
        // is the first to need a duplicate of a connection's descriptor.
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: 1), timeout: .seconds(5)) }
        }
        let pair = try RawPortSide.pair()
        let right = pair.right
        defer { pair.side.close() }
        // Only the requests after the shortage reach the wire; each asks on the reply channel.
        let script = TestThread(name: "raw-port") {
            pair.side.run { side in
                var bytes = RawPeer.greeting
                for _ in 0..<2 {
                    let (request, descriptors) = try side.nextFrame()
                    for fd in descriptors { Descriptor.close(fd) }
                    try side.expect(request.repliesBack && !request.hasReplyPort && request.replyToken != 0,
                                    "request \(request.msgid) asks on the reply channel: \(request)")
                    WireEncoder.append(WireFrame(msgid: request.msgid + 100, replyToken: request.replyToken), to: &bytes)
                    try side.write(bytes)
                    bytes = []
                }
            }
        }
        let outcomes = try onPortLoopThread { loop -> [String] in
            _ = try server.right.sendRequest(PKPortMessage(msgid: 0), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            try server.stop()
            warmUpLoopDescriptors(loop)
            let before = openDescriptorCount()
            var outcomes: [String] = []
            let filled = DescriptorTableFiller()
            do throws(PKError) {
                _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                outcomes.append("answered without descriptors")
            } catch {
                outcomes.append("\(error.code) \(error.call ?? "-") \(error.errno == EMFILE ? "EMFILE" : "errno \(error.errno ?? 0)")")
            }
            filled.release()
            let after = openDescriptorCount()
            outcomes.append(after == before ? "no descriptor left behind" : "descriptors \(before) -> \(after)")
            for msgid in UInt32(2)...3 {
                do throws(PKError) {
                    let reply = try right.sendRequest(PKPortMessage(msgid: msgid), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                    outcomes.append("reply \(reply?.msgid ?? 0)")
                } catch {
                    outcomes.append("request \(msgid): \(error.code)")
                }
            }
            return outcomes
        }
        try script.joinPatiently()
        return (outcomes, pair.side.failures)
    }

    /// A reply right's state: voided while an answer is under way, it does not reopen when
    /// nothing of the answer went out.
    @Test func aTicketVoidedDuringAnAnswerStaysVoid() {
        let ticket = ReplyTicket(token: 1)
        #expect(ticket.beginAnswer())
        #expect(!ticket.void())  // under way: the answer may still go out
        ticket.endAnswer(sent: false)
        #expect(!ticket.isOpen)
        #expect(!ticket.beginAnswer())
    }

    /// A right passed on and then invalidated by its first holder leaves the answer to the new
    /// holder: no NO_REPLY ends the request early.
    @Test func invalidatingAReplyRightAfterPassingItOnLeavesTheAnswerToItsNewHolder() throws {
        let release = Locked(false)
        let helper = try PortServer(name: "helper") { port, _ in
            port.handler = { message in
                // Answers only once the first holder has invalidated its copy.
                let deadline = PKDeadline.after(patience(.seconds(10)))
                while !release.value && !deadline.hasPassed { sleepFor(.milliseconds(1)) }
                try? message.ports.first?.send(PKPortMessage(msgid: 778), timeout: .seconds(5))
            }
        }
        let helperRight = try independentRight(to: helper.port)
        let server = try PortServer { port, _ in
            port.handler = { message in
                guard let reply = message.replyPort else { return }
                try? helperRight.send(PKPortMessage(msgid: 1, components: [.port(reply)]), timeout: .seconds(5))
                reply.invalidate()
                release.value = true
            }
        }
        let right = try independentRight(to: server.port)
        let reply = try onPortLoopThread { _ in
            try right.sendRequest(PKPortMessage(msgid: 5), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
        }
        #expect(reply?.msgid == 778)
        try server.stop()
        try helper.stop()
    }

    /// A right passed on in a message that is then not sent (the receiver's queue stays full)
    /// answers no more, as a send-once right moved into a message: an answer through it fails
    /// with `.invalidPort`, and the request ends at once with `.portInvalidated` (the sender
    /// its reply port adopted is gone). The answer went out, and raced the requester's end of
    /// its request: taken, or dropped while the replier believed it had answered. A message
    /// with ports for a port already invalid, or through a right invalidated, is refused before
    /// its rights are made: the right still answers then.
    enum Target: String, CaseIterable, Sendable { case fullPort, invalidPort, invalidatedConnection }

    @Test(arguments: Target.allCases)
    func aRightPassedOnInAMessageNotSentAnswersNoMore(_ target: Target) throws {
        var limits = PKPortLimits.default
        limits.maxQueuedMessages = 1
        let full = PKReceivePort(limits: limits)
        var through = full.makeSendRight()
        switch target {
        case .fullPort: try through.send(PKPortMessage(msgid: 0), timeout: .seconds(1))
        case .invalidPort: full.invalidate()
        case .invalidatedConnection:
            through = try independentRight(to: full)
            through.invalidate()
        }
        let forwardRight = through
        let forward = Locked<PKError.Code?>(nil)
        let answered = Locked<PKError.Code??>(nil)
        let server = try PortServer { port, _ in
            port.handler = { message in
                guard let reply = message.replyPort else { return }
                forward.value = Self.code { try forwardRight.send(PKPortMessage(msgid: 1, components: [.port(reply)]), before: .now) }
                answered.value = .some(Self.code { try reply.send(PKPortMessage(msgid: 42), timeout: .seconds(5)) })
            }
        }
        let right = try independentRight(to: server.port)
        let code = try onPortLoopThread { _ in
            Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 5), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10))) }
        }
        try waitPatiently("the answer's outcome") { answered.value != nil }
        if target != .fullPort {
            #expect(forward.value == .invalidPort)
            #expect(code == nil)
            #expect(answered.value == .some(nil))
        } else {
            #expect(forward.value == .sendTimedOut)
            #expect(code == .portInvalidated)
            #expect(answered.value == .some(.invalidPort))
        }
        try server.stop()
        full.invalidate()
    }

    /// A check-in whose reply port is a right to answer a request (a worker that sent its
    /// check-in as a request, REPLY_BACK) fails: that right reaches no port, and the
    /// check-in's end closes it. (It was accepted: the launcher got a port already invalid.)
    @Test func aCheckInWhoseReplyPortIsARightToAnswerFails() throws {
        try onLoopThread { _ in
            let listener = try CheckInListener()
            let right = PKSendPort(connection: SendConnection(takingOwnershipOf: try listener.makeWorkerConnection()))
            let worker = TestThread {
                _ = try? right.sendRequest(PKPortMessage(msgid: PKCheckIn.messageID), sendTimeout: .seconds(5), receiveTimeout: .seconds(2))
            }
            defer { try? worker.join() }
            #expect { _ = try listener.wait(for: "replier", until: .after(patience(.seconds(10)))) } throws: { ($0 as? PKError)?.code == .checkInFailed }
        }
    }
}

/// The port's side of a connection, played by a test: reads frames as a receive port would and
/// writes whatever it likes on the reply channel.
final class RawPortSide: @unchecked Sendable {
    let fd: Int32
    private var decoder = WireDecoder()
    private var scratch = ReadScratch(maxDescriptors: WireLimits.default.maxDescriptors)
    private(set) var failures: [String] = []
    private var closed = false

    struct Failure: Error { let text: String }

    /// A connection whose sender is a PortKit send right and whose port side is a `RawPortSide`.
    static func pair() throws -> (right: PKSendPort, side: RawPortSide) {
        let (sender, port) = try Socket.pair()
        try ConnectionSetup.writeGreeting(sender)
        return (PKSendPort(connection: SendConnection(takingOwnershipOf: sender)), RawPortSide(fd: port))
    }

    private init(fd: Int32) { self.fd = fd }

    deinit {
        close()
        scratch.deallocate()
    }

    func close() {
        guard !closed else { return }
        closed = true
        for fd in decoder.takeAllDescriptors() { Descriptor.close(fd) }
        Descriptor.close(fd)
    }

    /// Runs a script, recording its failure.
    func run(_ script: (RawPortSide) throws -> Void) {
        do { try script(self) } catch { failures.append("\(error)") }
    }

    func expect(_ condition: Bool, _ what: String) throws {
        if !condition { throw Failure(text: "unexpected: \(what)") }
    }

    /// The next frame the sender wrote (after its greeting), waiting at most 10 s (patiently).
    func nextFrame() throws -> (WireFrame, [Int32]) {
        let deadline = PKDeadline.after(patience(.seconds(10)))
        while true {
            if let event = try decoder.next(), case .frame(let frame, let descriptors) = event { return (frame, descriptors) }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if deadline.hasPassed { throw Failure(text: "no frame arrived") }
            _ = poll(&pfd, 1, 50)
            guard let got = try scratch.receive(fd, into: &decoder, upTo: 1 << 16) else { continue }
            if got.count == 0 { throw Failure(text: "the sender closed the connection") }
        }
    }

    /// Waits (patiently) until the socket holds at least `count` unread bytes, reading none.
    func waitForUnread(_ count: Int) throws {
        let deadline = PKDeadline.after(patience(.seconds(10)))
        var peek = [UInt8](repeating: 0, count: count)
        while recv(fd, &peek, count, Int32(MSG_PEEK | MSG_DONTWAIT)) < count {
            if deadline.hasPassed { throw Failure(text: "fewer than \(count) bytes arrived") }
            sleepFor(.milliseconds(1))
        }
    }

    /// Writes `bytes` as the requester reads them, until `stop()` holds.
    func writeWhileRead(_ bytes: [UInt8], until stop: () -> Bool) throws {
        var offset = 0
        while offset < bytes.count && !stop() {
            switch try Socket.send(fd, bytes, from: offset, descriptors: []) {
            case .done(let n): offset += n
            case .wouldBlock: sleepFor(.microseconds(100))
            }
        }
    }

    /// Writes all of `bytes` on `target` (the reply channel unless said otherwise).
    func write(_ bytes: [UInt8], to target: Int32? = nil) throws {
        var offset = 0
        let deadline = PKDeadline.after(patience(.seconds(10)))
        while offset < bytes.count {
            switch try Socket.send(target ?? fd, bytes, from: offset, descriptors: []) {
            case .done(let n): offset += n
            case .wouldBlock:
                if deadline.hasPassed { throw Failure(text: "the requester does not read") }
                sleepFor(.milliseconds(1))
            }
        }
    }
}
