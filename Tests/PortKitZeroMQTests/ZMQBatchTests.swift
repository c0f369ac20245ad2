#if ZeroMQ
// Batches (protocol.md 10.2, docs/decisions.md "Batches over ZeroMQ"): a receive port reads
// every message of a batch, from PortKit or from a plain libzmq peer, across its loop's passes;
// a sender's stream goes out in batches that keep every message, its order and its place among
// larger messages, the tail of a burst included, and a batch waits for a receiver that is behind
// without losing a message it accepted. The tests that need batches widen the connection's
// window (`ZMQConnection.setBatchWindow`), so that a slow machine or a sanitizer still batches.

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

    /// A send right to `port` whose connection batches every message it can (a window of 1 s).
    static func batchingRight(to port: PKZMQReceivePort) throws -> PKZMQSendPort {
        let right = try PKZMQSendPort(connectingTo: port.endpoint)
        try right.right.connection().setBatchWindow(1_000_000_000)
        return right
    }

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

    @Test func aStreamTravelsInBatchesAndArrivesWholeAndInOrder() throws {
        let count = 3000
        let (indices, frames) = try onLoopThread { loop in
            var indices: [Int] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { indices.append(Self.index(of: $0)) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try Self.batchingRight(to: port)
            let sender = Thread {
                for index in 0..<count { try? right.send(Self.numbered(index), timeout: .seconds(10)) }
            }
            sender.start()
            try run(loop, until: "\(count) messages", timeout: .seconds(30)) { indices.count == count }
            return (indices, port.inbox.framesReceived)
        }
        #expect(indices == Array(0..<count))
        // About 500 messages of 33 bytes fill a 16 KiB batch; the flusher may send some early.
        #expect(frames < count / 10, "\(count) messages came in \(frames) frames")
    }

    @Test func theTailOfABurstArrivesWithoutAnotherSend() throws {
        try onLoopThread { loop in
            var indices: [Int] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { indices.append(Self.index(of: $0)) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = try Self.batchingRight(to: port)
            // The first goes alone (nothing was sent before it); the next two wait in a batch
            // for the flusher, which sends it once this thread sleeps in its loop.
            for index in 0..<3 { try right.send(Self.numbered(index), timeout: .seconds(5)) }
            try run(loop, until: "the three messages") { indices.count == 3 }
            #expect(indices == [0, 1, 2])
        }
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
            // Small ones batched, one over the batch's message limit (sent alone, after the
            // batch), small ones again, one that fills the batch past its capacity.
            let sizes = [4, 4, 4, ZMQBatch.messageLimit + 1, 4, 4, ZMQBatch.messageLimit, 4]
                + [Int](repeating: ZMQBatch.messageLimit, count: 10) + [4]
            for (index, size) in sizes.enumerated() {
                try right.send(Self.numbered(index, size: size), timeout: .seconds(5))
            }
            try run(loop, until: "every message") { received.count == sizes.count }
            #expect(received.map(\.index) == Array(sizes.indices))
            #expect(received.map(\.size) == sizes)
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
            let senders = (1...2).map { sender in
                Thread {
                    for index in 0..<count { try? right.send(Self.numbered(index, msgid: UInt32(sender)), timeout: .seconds(10)) }
                }
            }
            for sender in senders { sender.start() }
            try run(loop, until: "both streams", timeout: .seconds(30)) { next[1] == count && next[2] == count }
            #expect(outOfOrder == 0)
            return next
        }
        #expect(next == [0, count, count])
    }

    /// The receiver is behind: its queue (one message in libzmq's pipe each side, and the
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
                let data = Self.numbered(index, size: 1000).data
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
            try send(0, before: .after(.seconds(10)))  // waits for the connection
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
    /// before the process ends, and libzmq delivers it.
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
