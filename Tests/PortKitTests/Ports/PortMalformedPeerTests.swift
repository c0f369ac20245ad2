// A peer that breaks the wire protocol loses its own connection and nothing else: the port
// stays valid, its other senders keep delivering, and the bad peer sees its connection closed
// (EOF, or EPIPE on a write, never SIGPIPE).

import Glibc
import Testing
@testable import PortKit

@Suite struct PortMalformedPeerTests {
    enum Garbage: String, CaseIterable, Sendable {
        case badMagic
        case randomBytesAfterGreeting
        case hugeLength
        case lengthBelowHeader
        case unknownComponentType
        case unknownFlags
        case missingDescriptor
        case truncatedFrameThenClose
        case truncatedGreetingThenClose

        /// The bytes the bad peer writes (after which it closes, for the truncated cases).
        var bytes: [UInt8] {
            switch self {
            case .badMagic:
                return Array("GET / HTTP/1.1\r\n\r\n".utf8)
            case .randomBytesAfterGreeting:
                var generator = SystemRandomNumberGenerator()
                return RawPeer.greeting + (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) } + [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
            case .hugeLength:
                return RawPeer.greeting + RawPeer.header(length: 0xFFFF_FFFF, msgid: 1, components: 1, flags: 0, descriptors: 0)
            case .lengthBelowHeader:
                return RawPeer.greeting + RawPeer.header(length: 3, msgid: 1, components: 0, flags: 0, descriptors: 0)
            case .unknownComponentType:
                return RawPeer.greeting + RawPeer.header(length: 24, msgid: 1, components: 1, flags: 0, descriptors: 0) + [9, 0, 0, 0, 0, 0, 0, 0]
            case .unknownFlags:
                return RawPeer.greeting + RawPeer.header(length: 16, msgid: 1, components: 0, flags: 0x80, descriptors: 0)
            case .missingDescriptor:
                // REPLY_PORT set, one descriptor claimed, none attached.
                return RawPeer.greeting + RawPeer.header(length: 16, msgid: 1, components: 0, flags: 1, descriptors: 1)
            case .truncatedFrameThenClose:
                return RawPeer.greeting + Array(RawPeer.frame(msgid: 1, data: PortKitTests.bytes(100)).prefix(60))
            case .truncatedGreetingThenClose:
                return Array(RawPeer.greeting.prefix(9))
            }
        }

        var closesAfterWriting: Bool { self == .truncatedFrameThenClose || self == .truncatedGreetingThenClose }
    }

    @Test(arguments: Garbage.allCases)
    func aMalformedPeerLosesOnlyItsOwnConnection(_ garbage: Garbage) throws {
        try onPortLoopThread { loop in
            var got: [UInt32] = []
            var invalidated = 0
            let port = PKReceivePort { got.append($0.msgid) }
            port.onInvalidation = { invalidated += 1 }
            try loop.add(port, forMode: .default)
            let good = try independentRight(to: port)
            let local = port.makeSendRight()
            try good.send(PKPortMessage(msgid: 100), timeout: .seconds(1))
            try runLoop(loop, "a good message") { got == [100] }

            let bad = try RawPeer(to: port)
            #expect(bad.write(garbage.bytes) == nil)
            if garbage.closesAfterWriting { bad.shutdownWrite() }
            try runLoop(loop, "the bad connection to be closed") { bad.peerClosed }
            // The bad peer's further writes fail with EPIPE (MSG_NOSIGNAL: no signal).
            try runLoop(loop, "EPIPE") { bad.write(RawPeer.frame(msgid: 5)) != nil }
            #expect(bad.write(RawPeer.frame(msgid: 6)) == EPIPE)

            // The port and its other senders are untouched.
            #expect(port.isValid)
            #expect(good.isValid)
            try good.send(PKPortMessage(msgid: 101), timeout: .seconds(1))
            try local.send(PKPortMessage(msgid: 102), timeout: .seconds(1))
            let another = try RawPeer(to: port)
            #expect(another.write(RawPeer.greeting + RawPeer.frame(msgid: 103, data: [1, 2, 3])) == nil)
            try runLoop(loop, "messages after the bad peer") { got.count == 4 }
            #expect(got.first == 100)
            #expect(Set(got) == [100, 101, 102, 103])
            #expect(invalidated == 0)
            port.invalidate()
            #expect(invalidated == 1)
            try another.waitUntilClosedByPort()
        }
    }

    /// Frames that arrived before the error on the same connection, even in the same read,
    /// are delivered first, in order; then the connection is closed.
    @Test func framesBeforeTheErrorAreDeliveredFirst() throws {
        try onPortLoopThread { loop in
            var got: [UInt32] = []
            var noSenders = 0
            let port = PKReceivePort { got.append($0.msgid) }
            port.onNoSenders = { noSenders += 1 }
            try loop.add(port, forMode: .default)
            let peer = try RawPeer(to: port)
            var stream = RawPeer.greeting
            for id in UInt32(1)...5 { stream += RawPeer.frame(msgid: id, data: [UInt8(id)]) }
            stream += RawPeer.header(length: 0xFFFF_FFFF, msgid: 6, components: 1, flags: 0, descriptors: 0)
            #expect(peer.write(stream) == nil)  // one write: the reader gets it in one read
            try runLoop(loop, "the connection to be closed") { peer.peerClosed && noSenders > 0 }
            runLoop(loop, for: .milliseconds(20))
            #expect(got == [1, 2, 3, 4, 5])
            #expect(noSenders == 1)
            #expect(port.isValid)
            port.invalidate()
        }
    }

    /// Descriptors a bad frame brought are closed with its connection (no leak): a right sent
    /// in a frame that then breaks the protocol is released, and its port sees no senders.
    @Test func descriptorsOfABrokenConnectionAreClosed() throws {
        try onPortLoopThread { loop in
            var noSendersOnTarget = 0
            let target = PKReceivePort()
            target.onNoSenders = { noSendersOnTarget += 1 }
            try loop.add(target, forMode: .default)
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            let peer = try RawPeer(to: port)
            #expect(peer.write(RawPeer.greeting) == nil)
            // A frame with one port component but a descriptor count of two, carrying one
            // descriptor (a right to `target`): its body breaks the rules.
            let transfer = try target.makeTransferDescriptor()
            var frame = RawPeer.header(length: 24, msgid: 1, components: 1, flags: 0, descriptors: 2)
            frame += [2, 0, 0, 0, 0, 0, 0, 0]
            let sent = try Socket.send(peer.fd, frame, from: 0, descriptors: [transfer])
            close(transfer)
            guard case .done(let count) = sent else { Issue.record("the frame was not sent"); return }
            #expect(count == frame.count)
            try runLoop(loop, "the broken connection and the carried right to be closed") {
                peer.peerClosed && noSendersOnTarget > 0
            }
            #expect(noSendersOnTarget == 1)
            #expect(target.isValid && port.isValid)
            target.invalidate()
            port.invalidate()
        }
    }
}
