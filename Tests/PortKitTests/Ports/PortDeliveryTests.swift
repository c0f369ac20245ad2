// Delivery under load and ports travelling inside messages: many threads to one port (each
// sender's messages whole and in order), rights forwarded A -> B -> C and sent several times,
// and reply-port round trips.

import Testing
@testable import PortKit

@Suite struct PortDeliveryTests {
    static let threadCount = 8
    static let perThread = 10_000

    /// The payload of message `seq` from sender `thread`: the sender, the sequence number, then
    /// a filler whose length and bytes depend on both, so that a torn or interleaved message
    /// shows.
    static func payload(thread: Int, seq: Int) -> [UInt8] {
        var bytes: [UInt8] = [UInt8(thread)]
        withUnsafeBytes(of: UInt32(seq).littleEndian) { bytes.append(contentsOf: $0) }
        let filler = UInt8(truncatingIfNeeded: thread &* 31 &+ seq)
        bytes.append(contentsOf: repeatElement(filler, count: (seq &* 7 &+ thread) % 97))
        return bytes
    }

    /// Checks one received message against `payload(thread:seq:)` and the per-sender order.
    /// Returns a problem, or nil.
    static func check(_ message: PKPortMessage, next: inout [Int]) -> String? {
        let data = message.data
        guard message.components.count == 1, data.count >= 5, Int(data[0]) < threadCount else {
            return "a message with \(message.components.count) components and \(data.count) bytes"
        }
        let thread = Int(data[0])
        let seq = Int(UInt32(data[1]) | UInt32(data[2]) << 8 | UInt32(data[3]) << 16 | UInt32(data[4]) << 24)
        guard seq == next[thread] else { return "sender \(thread): got \(seq), expected \(next[thread])" }
        guard data == payload(thread: thread, seq: seq), message.msgid == UInt32(seq) else {
            return "sender \(thread): message \(seq) was torn"
        }
        next[thread] += 1
        return nil
    }

    /// Eight threads send ten thousand messages each to one port, every thread through a send
    /// right of its own: none is lost, torn or reordered within its sender.
    @Test func eightThreadsWithRightsOfTheirOwnLoseAndReorderNothing() async throws {
        try await awaitThread(timeout: patience(.seconds(330))) { try Self.eightSenders(sharingOneRight: false) }
    }

    /// The same through ONE send right shared by the eight threads: each message arrives whole
    /// (never interleaved with another thread's) and each thread's messages stay in order.
    @Test func eightThreadsSharingOneRightLoseAndReorderNothing() async throws {
        try await awaitThread(timeout: patience(.seconds(330))) { try Self.eightSenders(sharingOneRight: true) }
    }

    static func eightSenders(sharingOneRight: Bool) throws {
        let total = threadCount * perThread
        let sendFailures = Locked<[String]>([])
        try onPortLoopThread(timeout: .seconds(300)) { loop in
            var next = [Int](repeating: 0, count: threadCount)
            var received = 0
            var problems: [String] = []
            let port = PKReceivePort { message in
                received += 1
                if let problem = check(message, next: &next), problems.count < 10 { problems.append(problem) }
            }
            try loop.add(port, forMode: .default)
            let rights: [PKSendPort] = sharingOneRight
                ? Array(repeating: port.makeSendRight(), count: threadCount)
                : try rightsByMessage(to: port, count: threadCount, on: loop)
            #expect(Set(rights).count == (sharingOneRight ? 1 : threadCount))
            let senders = rights.enumerated().map { index, right in
                TestThread(name: "sender-\(index)") {
                    for seq in 0..<perThread {
                        do {
                            try right.send(PKPortMessage(msgid: UInt32(seq), data: payload(thread: index, seq: seq)), timeout: patience(.seconds(60)))
                        } catch {
                            sendFailures.withLock { $0.append("sender \(index) at \(seq): \(error)") }
                            return
                        }
                    }
                }
            }
            try runLoop(loop, timeout: .seconds(240), "\(total) messages") {
                received >= total || !sendFailures.value.isEmpty
            }
            for sender in senders { try sender.joinPatiently(timeout: .seconds(60)) }
            runLoop(loop, for: .milliseconds(20))  // nothing more arrives
            #expect(sendFailures.value.isEmpty, "\(sendFailures.value)")
            #expect(problems.isEmpty, "\(problems)")
            #expect(received == total)
            #expect(next == [Int](repeating: perThread, count: threadCount))
            port.invalidate()
        }
    }

    /// A right received in a message travels on: B gets a right to P from the test's loop and
    /// forwards it to C; C uses it. A right sent several times (three messages, and three
    /// components of one message) gives as many working rights. Every message reaches P.
    @Test func rightsForwardedAlongAChainAndSentSeveralTimesAllWork() throws {
        let cGot = Locked<Int>(0)
        // C: every port component it receives is a right to P; it sends through each, tagged.
        let c = try PortServer(name: "C") { port, _ in
            port.handler = { message in
                for (index, right) in message.ports.enumerated() {
                    try? right.send(PKPortMessage(msgid: 3000 + message.msgid * 10 + UInt32(index)), timeout: .seconds(5))
                }
                cGot.withLock { $0 += 1 }
            }
        }
        let cRight = c.right
        // B: sends through the right it got, then forwards that very right to C three times in
        // three messages, and once more three times in one message.
        let b = try PortServer(name: "B") { port, _ in
            port.handler = { message in
                guard let toP = message.ports.first else { return }
                try? toP.send(PKPortMessage(msgid: 2000), timeout: .seconds(5))
                for round in UInt32(1)...3 {
                    try? cRight.send(PKPortMessage(msgid: round, components: [.port(toP)]), timeout: .seconds(5))
                }
                try? cRight.send(PKPortMessage(msgid: 4, components: [.port(toP), .port(toP), .port(toP)]), timeout: .seconds(5))
                try? toP.send(PKPortMessage(msgid: 2001), timeout: .seconds(5))
            }
        }
        try onPortLoopThread { loop in
            var got: [UInt32] = []
            let p = PKReceivePort { got.append($0.msgid) }
            try loop.add(p, forMode: .default)
            try b.right.send(PKPortMessage(msgid: 1, components: [.port(p.makeSendRight())]), timeout: .seconds(5))
            let expected: Set<UInt32> = [2000, 2001, 3010, 3020, 3030, 3040, 3041, 3042]
            try runLoop(loop, "every forwarded right to deliver") { Set(got).isSuperset(of: expected) }
            runLoop(loop, for: .milliseconds(20))
            #expect(got.count == expected.count, "\(got)")
            #expect(Set(got) == expected)
            // B's own messages keep their order.
            #expect(got.firstIndex(of: 2000)! < got.firstIndex(of: 2001)!)
            p.invalidate()
        }
        #expect(cGot.value == 4)
        try b.stop()
        try c.stop()
    }

    /// When every right that travelled in messages is released, the port learns that it has no
    /// senders left: forwarding leaks no connection.
    @Test func forwardedRightsReleasedLeaveThePortWithoutSenders() throws {
        try onPortLoopThread { loop in
            var noSenders = 0
            var got: [UInt32] = []
            let p = PKReceivePort { got.append($0.msgid) }
            p.onNoSenders = { noSenders += 1 }
            try loop.add(p, forMode: .default)
            var rights = try rightsByMessage(to: p, count: 2, on: loop)
            // Forward each received right once more (the ATTACH_SENDER road).
            var carried: [PKSendPort] = []
            let carrier = PKReceivePort { carried.append(contentsOf: $0.ports) }
            try loop.add(carrier, forMode: .default)
            try carrier.makeSendRight().send(PKPortMessage(msgid: 9, components: rights.map { .port($0) }), timeout: .seconds(5))
            try runLoop(loop, "forwarded rights") { carried.count == 2 }
            rights += carried
            carried = []
            for (index, right) in rights.enumerated() { try right.send(PKPortMessage(msgid: UInt32(index)), timeout: .seconds(5)) }
            try runLoop(loop, "messages through four rights") { got.count == 4 }
            #expect(Set(got) == [0, 1, 2, 3])
            #expect(noSenders == 0)
            for right in rights { right.invalidate() }
            rights = []
            try runLoop(loop, "no senders") { noSenders > 0 }
            #expect(p.isValid)
            carrier.invalidate()
            p.invalidate()
        }
    }

    /// A port reads the next message into the bytes of one it delivered: a handler that keeps
    /// messages (here every other one) must find their bytes unchanged by the ones after, of
    /// the same size (overwritten in place) and of other sizes.
    @Test func messagesAHandlerKeepsAreNotChangedByTheNextOnes() throws {
        let kept = try onPortLoopThread { loop in
            var kept: [[UInt8]] = []
            var count = 0
            let port = PKReceivePort { message in
                if message.msgid % 2 == 0 { kept.append(message.data) }
                count += 1
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try independentRight(to: port)  // through a socket, as from another process
            for index in 0..<200 {
                let size = index % 3 == 0 ? 64 : 40
                try right.send(PKPortMessage(msgid: UInt32(index), data: [UInt8](repeating: UInt8(index), count: size)),
                               timeout: .seconds(5))
                // One read a message, so that each is read after the one before was delivered.
                try runLoop(loop, "message \(index)") { count == index + 1 }
            }
            return kept
        }
        let expected = stride(from: 0, to: 200, by: 2).map { [UInt8](repeating: UInt8($0), count: $0 % 3 == 0 ? 64 : 40) }
        #expect(kept.count == expected.count)
        let changed = zip(kept, expected).filter { $0 != $1 }.count
        #expect(changed == 0, "\(changed) of the kept messages changed after their delivery")
    }

    /// A message read through a socket after the one before was delivered and let go is read
    /// into that one's bytes, with no allocation: a 120-byte message after a 200-byte one has
    /// the larger one's capacity. (The handler keeps only what it saw, not the bytes.)
    @Test func theNextMessageIsReadIntoTheBytesOfTheOneDelivered() throws {
        let received = try onPortLoopThread { loop in
            var received: [(intact: Bool, capacity: Int)] = []
            let port = PKReceivePort { message in
                let data = message.data
                received.append((data == [UInt8](repeating: UInt8(data.count), count: data.count), data.capacity))
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try independentRight(to: port)
            for (index, size) in [200, 120].enumerated() {
                try right.send(PKPortMessage(msgid: UInt32(index), data: [UInt8](repeating: UInt8(size), count: size)),
                               timeout: .seconds(5))
                try runLoop(loop, "message \(index)") { received.count == index + 1 }
            }
            return received.map { ($0.intact, $0.capacity) }
        }
        #expect(received.map(\.0) == [true, true])
        #expect(received[1].1 >= 200, "the second message came in a new array (capacity \(received[1].1))")
    }

    /// Small messages a handler keeps are not read into the storage of a large one delivered
    /// before them (each would hold its capacity).
    @Test func keptSmallMessagesDoNotHoldALargeOnesStorage() throws {
        let capacities = try onPortLoopThread { loop in
            var capacities: [Int] = []
            var kept: [[UInt8]] = []
            var count = 0
            let port = PKReceivePort { message in
                count += 1
                guard message.msgid > 0 else { return }
                kept.append(message.data)
                capacities.append(message.data.capacity)
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try independentRight(to: port)
            for index in 0...20 {  // one read each: each is read after the one before was delivered
                let size = index == 0 ? 4000 : 1 + index % 2
                try right.send(PKPortMessage(msgid: UInt32(index), data: [UInt8](repeating: 2, count: size)), timeout: .seconds(5))
                try runLoop(loop, "message \(index)") { count == index + 1 }
            }
            return capacities
        }
        let large = capacities.filter { $0 >= 1000 }.count
        #expect(large == 0, "\(large) of 20 kept messages of 1 or 2 bytes hold \(capacities.max() ?? 0) bytes each")
    }

    /// The guide's reply port: the receiver answers on `replyPort`, the sender answers that
    /// answer, and so on, a hundred times.
    @Test func replyPortRoundTrips() throws {
        let server = try PortServer(name: "ponger") { port, _ in
            port.handler = { message in
                guard let reply = message.replyPort else { return }
                try? reply.send(PKPortMessage(msgid: message.msgid + 1, data: message.data + [UInt8(truncatingIfNeeded: message.msgid)], replyPort: port.makeSendRight()), timeout: .seconds(5))
            }
        }
        try onPortLoopThread { loop in
            var last: PKPortMessage?
            var rounds = 0
            let me = PKReceivePort()
            me.handler = { message in
                last = message
                rounds += 1
                guard rounds < 100, let back = message.replyPort else { return }
                try? back.send(PKPortMessage(msgid: message.msgid + 1, data: [], replyPort: me.makeSendRight()), timeout: .seconds(5))
            }
            try loop.add(me, forMode: .default)
            try server.right.send(PKPortMessage(msgid: 0, data: [42], replyPort: me.makeSendRight()), timeout: .seconds(5))
            try runLoop(loop, "100 round trips") { rounds == 100 }
            #expect(last?.msgid == 199)
            #expect(last?.replyPort != nil)
            me.invalidate()
        }
        try server.stop()
    }

    /// A reply port that is itself a right received in a message (not the replier's own port)
    /// carries the answer to the right place.
    @Test func aForwardedRightWorksAsAReplyPort() throws {
        let server = try PortServer(name: "answerer") { port, _ in
            port.handler = { message in
                try? message.replyPort?.send(PKPortMessage(msgid: message.msgid, data: [7]), timeout: .seconds(5))
            }
        }
        try onPortLoopThread { loop in
            var answers: [UInt32] = []
            let target = PKReceivePort { answers.append($0.msgid) }
            try loop.add(target, forMode: .default)
            let toTarget = try rightsByMessage(to: target, count: 1, on: loop)[0]
            try server.right.send(PKPortMessage(msgid: 77, replyPort: toTarget), timeout: .seconds(5))
            try runLoop(loop, "the answer") { !answers.isEmpty }
            #expect(answers == [77])
            target.invalidate()
        }
        try server.stop()
    }
}
