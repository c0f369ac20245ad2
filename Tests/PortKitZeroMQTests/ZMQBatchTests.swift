#if ZeroMQ
// Batches (protocol.md 10.2, docs/decisions.md "Batches over ZeroMQ"): a receive port reads
// every message of a batch, from PortKit or from a plain libzmq peer, across its loop's passes;
// a sender's stream goes out in batches that keep every message, its order and its place among
// larger messages, the tail of a burst included, and a batch waits for a receiver that is behind
// without losing a message it accepted. The tests that need batches widen the connection's
// window (`ZMQConnection.setBatchWindow`), so that a slow machine or a sanitizer still batches;
// the ones that count frames also pause the flusher for that connection
// (`ZMQConnection.pauseFlusher`), so that only full batches go out until they resume it.

import Testing
import Foundation
import Glibc
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQBatchTests {
    /// A message whose data is `index` as a little-endian u32.
    static func numbered(_ index: Int, msgid: UInt32 = 1, size: Int = 4) -> PKZMQMessage {
        var data = [UInt8](repeating: 0, count: max(size, 4))
        withUnsafeBytes(of: UInt32(index).littleEndian) { data.replaceSubrange(0..<4, with: $0) }
        return PKZMQMessage(msgid: msgid, data: data)
    }

    static func index(of message: PKZMQMessage) -> Int {
        message.data.withUnsafeBytes { Int(UInt32(littleEndian: $0.loadUnaligned(as: UInt32.self))) }
    }

    /// Sends message `index` (1,000 bytes of data) on `connection` itself, not through a right.
    static func send(_ index: Int, on connection: ZMQConnection, before deadline: PKDeadline) throws(PKError) {
        let data = numbered(index, size: 1000).data
        let size = try ZMQMessageEncoder.measureData(byteCount: data.count, limits: ZMQWireLimits(.default))
        let sent = data.withUnsafeBytes { data in
            Result { () throws(PKError) in
                try connection.send(byteCount: size, before: deadline) { frame in
                    ZMQMessageEncoder.writeData(msgid: 1, destination: 0, data, into: frame)
                }
            }
        }
        try sent.get()
    }

    /// A send right to `port` whose connection batches every message it can (a window of 1 s),
    /// once connected (a batch is opened only on a connection whose handshake succeeded).
    static func batchingRight(to port: PKZMQReceivePort) throws -> PKZMQSendPort {
        let right = try PKZMQSendPort(connectingTo: port.endpoint)
        let connection = try right.right.connection()
        connection.setBatchWindow(1_000_000_000)
        let deadline = PKDeadline.after(.seconds(10))
        while !connection.isEstablished {
            if deadline.hasPassed { throw TestTimeout(what: "the connection's handshake") }
            sleepFor(.milliseconds(1))
        }
        return right
    }

    /// The encoded size of a message of one data component of `payload` bytes.
    static func encodedSize(payload: Int) -> Int { ZMQWireFormat.headerSize + ZMQWireFormat.dataPrefix + payload }

    @Test func aPlainPeersBatchIsDeliveredWholeAndInOrderAcrossPasses() throws {
        try onLoopThread { loop in
            var received: [UInt32] = []
            var violations = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { received.append($0.msgid) }
            port.onProtocolViolation = { _ in violations += 1 }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let raw = try RawZMQSocket(pushingTo: port.endpoint)
            // 200 messages in one frame: more than a pass's budget (64), so the frame is held
            // across passes.
            let count = 200
            var frame: [UInt8] = []
            for msgid in 1...count {
                var message = handMadeMessage(msgid: UInt32(msgid), data: [[UInt8(msgid & 0xFF)]])
                if msgid < count { ZMQMessageEncoder.setFollowed(&message, headerAt: 0) }
                frame += message
            }
            try raw.send([frame])
            // Then a batch whose second message is broken: the first is delivered, the rest of
            // that frame dropped with one violation, and the next frame read as usual.
            var first = handMadeMessage(msgid: 1001, data: [[1]])
            ZMQMessageEncoder.setFollowed(&first, headerAt: 0)
            var broken = handMadeMessage(msgid: 1002, data: [[2]])
            broken[4] = 9  // version 9
            ZMQMessageEncoder.setFollowed(&broken, headerAt: 0)
            try raw.send([first + broken + handMadeMessage(msgid: 1003, data: [[3]])])
            try raw.send([handMadeMessage(msgid: 1004, data: [[4]])])
            try run(loop, until: "every message") { received.last == 1004 }
            #expect(received == (1...count).map { UInt32($0) } + [1001, 1004])
            #expect(violations == 1)
            #expect(port.inbox.framesReceived == 3)
        }
    }

    @Test func aStreamTravelsInFullBatchesAndArrivesWholeAndInOrder() throws {
        let count = 3000
        let (indices, frames, errors) = try onLoopThread { loop in
            var indices: [Int] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { indices.append(Self.index(of: $0)) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try Self.batchingRight(to: port)
            let connection = try right.right.connection()
            connection.pauseFlusher()
            let errors = Locked<[PKError]>([])
            let sender = Thread {
                for index in 0..<count {
                    do throws(PKError) { try right.send(Self.numbered(index), timeout: .seconds(10)) } catch {
                        errors.withLock { $0.append(error) }
                        return
                    }
                }
                connection.resumeFlusher()
            }
            sender.start()
            try run(loop, until: "\(count) messages", timeout: .seconds(30)) { indices.count == count || !errors.value.isEmpty }
            return (indices, port.inbox.framesReceived, errors.value)
        }
        #expect(errors.isEmpty, "\(errors)")
        #expect(indices == Array(0..<count))
        // The first message goes alone (nothing came before it); the rest fill batches of 16 KiB,
        // 496 messages of 33 bytes each, the last one partly.
        let perBatch = ZMQBatch.capacity / Self.encodedSize(payload: 4)
        #expect(frames == 1 + (count - 1 + perBatch - 1) / perBatch)
    }

    /// Sends three messages to a new port on `loop` through a batching right, and waits for
    /// them: the first goes alone (nothing was sent before it); the next two wait in a batch for
    /// the flusher, which sends it once this thread sleeps in its loop.
    func sendABurstOfThree(on loop: PKRunLoop, within timeout: Duration = .seconds(10)) throws {
        var indices: [Int] = []
        let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { indices.append(Self.index(of: $0)) }
        defer { port.invalidate() }
        try loop.add(port, forMode: .default)
        let right = try Self.batchingRight(to: port)
        for index in 0..<3 { try right.send(Self.numbered(index), timeout: .seconds(5)) }
        try run(loop, until: "the three messages", timeout: timeout) { indices.count == 3 }
        #expect(indices == [0, 1, 2])
    }

    @Test func theTailOfABurstArrivesWithoutAnotherSend() throws {
        try onLoopThread { loop in try sendABurstOfThree(on: loop) }
    }

    @Test func aLargeMessageKeepsItsPlaceAfterABatch() throws {
        try onLoopThread { loop in
            var received: [(index: Int, size: Int)] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") {
                received.append((Self.index(of: $0), $0.data.count))
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try Self.batchingRight(to: port)
            let connection = try right.right.connection()
            connection.pauseFlusher()
            // Payloads whose messages are the largest that join a batch, and one byte more.
            let largest = ZMQBatch.messageLimit - Self.encodedSize(payload: 0)
            // Alone (the first); a batch of three; alone, after that batch; a batch of the two
            // small ones and seven of the largest (2,048 bytes each: seven fit in 16 KiB with the
            // small ones' 66); the eighth overfills it: that batch goes, and it opens the next;
            // the last, small, joins it.
            let sizes = [4, 4, 4, largest, largest + 1, 4, 4] + [Int](repeating: largest, count: 8) + [4]
            for (index, size) in sizes.enumerated() {
                try right.send(Self.numbered(index, size: size), timeout: .seconds(5))
            }
            connection.resumeFlusher()
            try run(loop, until: "every message") { received.count == sizes.count }
            #expect(received.map(\.index) == Array(sizes.indices))
            #expect(received.map(\.size) == sizes)
            #expect(port.inbox.framesReceived == 5)
        }
    }

    @Test func twoThreadsStreamingToOnePortKeepEachOnesOrder() throws {
        let count = 2000
        let next = try onLoopThread { loop in
            var next = [0, 0, 0]
            var outOfOrder = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
                let sender = Int(message.msgid)
                if Self.index(of: message) != next[sender] { outOfOrder += 1 }
                next[sender] += 1
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try Self.batchingRight(to: port)
            let errors = Locked<[PKError]>([])
            let senders = (1...2).map { sender in
                Thread {
                    for index in 0..<count {
                        do throws(PKError) { try right.send(Self.numbered(index, msgid: UInt32(sender)), timeout: .seconds(10)) } catch {
                            errors.withLock { $0.append(error) }
                            return
                        }
                    }
                }
            }
            for sender in senders { sender.start() }
            try run(loop, until: "both streams", timeout: .seconds(30)) { (next[1] == count && next[2] == count) || !errors.value.isEmpty }
            #expect(errors.value.isEmpty, "\(errors.value)")
            #expect(outOfOrder == 0)
            return next
        }
        #expect(next == [0, count, count])
    }

    /// The receiver is behind: its queue (one frame in libzmq's pipe each side, and the
    /// socket's buffer) fills, a send finds no room until its deadline and fails with nothing
    /// sent, and the batch of messages accepted before it waits: once the receiver reads,
    /// every accepted message arrives, in order, sent by the flusher (which tried again while
    /// the queue was full); the refused one never does.
    @Test func messagesABatchAcceptedSurviveAFullQueue() throws {
        try onLoopThread { loop in
            var small = PKPortLimits()
            small.maxQueuedMessages = 1
            var indices: [Int] = []
            let port = try PKZMQReceivePort(bindingTo: "ipc://@portkit-batch-full-\(getpid())-\(UInt32.random(in: 0 ... .max))",
                                            limits: small) { indices.append(Self.index(of: $0)) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)  // but the loop does not run until the queue is full
            let connection = try ZMQConnection(endpoint: ZMQEndpoint(parsing: port.endpoint), limits: small)
            defer { connection.die("the test is over") }
            connection.setBatchWindow(1_000_000_000)
            func send(_ index: Int, before deadline: PKDeadline) throws(PKError) {
                try Self.send(index, on: connection, before: deadline)
            }
            try send(0, before: .after(.seconds(10)))  // waits for the connection
            // A batch opens only once the handshake is known to have succeeded.
            try run(loop, until: "the handshake") { connection.isEstablished }
            var accepted = 1
            var refused: PKError?
            while refused == nil && accepted < 100_000 {
                do throws(PKError) {
                    try send(accepted, before: .after(.milliseconds(50)))
                    accepted += 1
                } catch {
                    refused = error
                }
            }
            #expect(refused?.code == .sendTimedOut)
            try run(loop, until: "the \(accepted) accepted messages", timeout: .seconds(30)) { indices.count >= accepted }
            #expect(indices == Array(0..<accepted))
            // Nothing more: the next message sent is the next one received.
            try send(1_000_000, before: .after(.seconds(10)))
            try run(loop, until: "the last message", timeout: .seconds(10)) { indices.count > accepted }
            #expect(indices.dropFirst(accepted) == [1_000_000])
        }
    }

    /// A send waiting for room (its receiver reads nothing) holds up no other thread's send on
    /// the same connection: that one fails at its own deadline. Once the receiver reads, the
    /// waiting send goes through, and every message accepted arrives, in order. (A send held
    /// the connection's lock while it waited for room, so the other waited, whatever its own
    /// deadline, until the first one's: 60 s here.)
    @Test func aSendWaitingForRoomHoldsUpNoOtherSend() throws {
        try onLoopThread { loop in
            var small = PKPortLimits()
            small.maxQueuedMessages = 1
            var indices: [Int] = []
            let port = try PKZMQReceivePort(bindingTo: "ipc://@portkit-batch-waiter-\(getpid())-\(UInt32.random(in: 0 ... .max))",
                                            limits: small) { indices.append(Self.index(of: $0)) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)  // but the loop does not run until the queue is full
            let connection = try ZMQConnection(endpoint: ZMQEndpoint(parsing: port.endpoint), limits: small)
            defer { connection.die("the test is over") }
            connection.setBatchWindow(0)  // every message alone
            try Self.send(0, on: connection, before: .after(.seconds(10)))  // waits for the connection
            // Full once two sends in a row find no room (one could miss it on a loaded machine).
            var accepted = 1
            var refusals = 0
            while accepted < 100_000 && refusals < 2 {
                do throws(PKError) {
                    try Self.send(accepted, on: connection, before: .after(.milliseconds(50)))
                    accepted += 1
                    refusals = 0
                } catch {
                    #expect(error.code == .sendTimedOut)
                    refusals += 1
                }
            }
            #expect(accepted < 100_000, "the receiver's queue never filled")
            let last = accepted
            let first = Locked<Result<Void, PKError>?>(nil)
            Thread { first.value = Result { () throws(PKError) in try Self.send(last, on: connection, before: .after(.seconds(60))) } }.start()
            try waitUntil("the first send to wait for room") { connection.sendsWaitingForRoom == 1 }
            let second = Locked<Result<Void, PKError>?>(nil)
            Thread { second.value = Result { () throws(PKError) in try Self.send(1_000_000, on: connection, before: .after(.milliseconds(200))) } }.start()
            try waitUntil("the second send to end, at its own deadline") { second.value != nil }
            if case .failure(let error)? = second.value { #expect(error.code == .sendTimedOut) } else { Issue.record("the second send went through") }
            #expect(first.value == nil, "the first send was to wait until the receiver reads")
            // The receiver reads: the first send goes through.
            try run(loop, until: "the messages accepted", timeout: .seconds(30)) { indices.count > last }
            try waitUntil("the first send to end") { first.value != nil }
            #expect(throws: Never.self) { try first.value?.get() }
            #expect(indices == Array(0...last))
        }
    }

    /// A sender waiting for room toward a receiver that reads nothing holds up neither the
    /// flusher, which serves every connection, nor another connection's batch, which goes out
    /// meanwhile; once the receiver reads, every message its sender sent arrives. (The stalled
    /// port is bound over `ipc://`, which has no heartbeats: nothing lets the stuck sender
    /// through. When that sender's wait held its connection's lock, a flusher that waited for
    /// the lock would have held the other batch up for good, past the burst's 20 s.)
    @Test func aReceiverThatIsBehindLosesNothingAndOtherConnectionsBatchesStillGo() throws {
        try onLoopThread { loop in
            var small = PKPortLimits()
            small.maxQueuedMessages = 1
            // Not scheduled: it reads nothing until the end of the test.
            let stalled = try PKZMQReceivePort(bindingTo: "ipc://@portkit-batch-stalled-\(getpid())-\(UInt32.random(in: 0 ... .max))",
                                               limits: small)
            defer { stalled.invalidate() }
            let toStalled = try ZMQConnection(endpoint: ZMQEndpoint(parsing: stalled.endpoint), limits: small)
            defer { toStalled.die("the test is over") }
            toStalled.setBatchWindow(1_000_000_000)
            let total = 1000
            let sent = Locked(0)
            let errors = Locked<[PKError]>([])
            let data = [UInt8](repeating: 7, count: 1000)
            let size = try ZMQMessageEncoder.measureData(byteCount: data.count, limits: ZMQWireLimits(.default))
            let sender = Thread {
                for _ in 0..<total {
                    let result = data.withUnsafeBytes { data in
                        Result { () throws(PKError) in
                            try toStalled.send(byteCount: size, before: .after(.seconds(60))) { frame in
                                ZMQMessageEncoder.writeData(msgid: 1, destination: 0, data, into: frame)
                            }
                        }
                    }
                    if case .failure(let error) = result {
                        errors.withLock { $0.append(error) }
                        return
                    }
                    sent.withLock { $0 += 1 }
                }
            }
            sender.start()
            // Until the sender is stuck: it has started, and its count stops growing, short of
            // the total.
            let stuck = PKDeadline.after(.seconds(20))
            while sent.value == 0 && errors.value.isEmpty && !stuck.hasPassed { sleepFor(.milliseconds(1)) }
            var last = -1
            while sent.value != last && !stuck.hasPassed {
                last = sent.value
                sleepFor(.milliseconds(100))
            }
            #expect(sent.value < total, "the stalled receiver's queue never filled")

            try sendABurstOfThree(on: loop, within: .seconds(20))

            // The stalled receiver reads at last: every message its sender sent arrives.
            var stalledReceived = 0
            stalled.handler = { _ in stalledReceived += 1 }
            try loop.add(stalled, forMode: .default)
            try run(loop, until: "the stalled receiver's messages", timeout: .seconds(30)) {
                stalledReceived == total || !errors.value.isEmpty
            }
            #expect(errors.value.isEmpty, "\(errors.value)")
            #expect(stalledReceived == total)
        }
    }

    @Test func messagesSentFarApartGoAloneAndAtOnce() throws {
        try onLoopThread { loop in
            var indices: [Int] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { indices.append(Self.index(of: $0)) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try PKZMQSendPort(connectingTo: port.endpoint)
            // Each sent after the one before has arrived (far more than the 2 µs window).
            for index in 0..<20 {
                try right.send(Self.numbered(index), timeout: .seconds(5))
                try run(loop, until: "message \(index)") { indices.count == index + 1 }
            }
            #expect(indices == Array(0..<20))
            #expect(port.inbox.framesReceived == 20)
        }
    }

    /// A process that sends a burst and exits at once: the batch it left goes to libzmq
    /// before the process ends, and what libzmq holds is written before it ends. (The peer
    /// batches with the default 2 µs window: on a machine too slow for it, every message goes
    /// alone, and the test checks only the second half.)
    @Test func aBurstSentJustBeforeExitArrives() throws {
        try onLoopThread { loop in
            let count = 500
            var indices: [Int] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { indices.append(Self.index(of: $0)) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let peer = try ZMQPeerProcess(["burst", port.endpoint, "\(count)"])
            do { try run(loop, until: "the burst", timeout: .seconds(10)) { indices.count == count } } catch { Issue.record("received \(indices.count)"); throw error }
            #expect(indices == Array(0..<count))
            #expect(try peer.expectLine(startingWith: "sent", timeout: .seconds(10)) == "")
        }
    }

}
#endif
