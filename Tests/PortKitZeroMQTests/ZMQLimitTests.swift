#if ZeroMQ
// What a port accepts: an oversized frame costs its sender the connection, a message breaking
// another rule is dropped and reported, and neither harms the port or its other senders.

import Testing
import PortKit
import PortKitZeroMQ

@Suite struct ZMQLimitTests {
    static var smallLimits: PKPortLimits {
        var limits = PKPortLimits()
        limits.maxMessageBytes = 1024
        limits.maxComponents = 8
        limits.maxDescriptors = 2
        return limits
    }

    @Test func oversizedFrameDropsItsSenderAndNobodyElse() throws {
        try onLoopThread { loop in
            var received: [UInt32] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*", limits: Self.smallLimits) { received.append($0.msgid) }
            try loop.add(port, forMode: .default)
            let good = try PKZMQSendPort(connectingTo: port.endpoint)
            try good.send(PKZMQMessage(msgid: 1, data: [UInt8](repeating: 1, count: 1024)), timeout: .seconds(5))
            try run(loop, until: "the first good message") { received == [1] }

            let bad = try RawZMQSocket(pushingTo: port.endpoint)
            #expect(bad.waitForEvent(RawZMQSocket.handshakeSucceeded), "events: \(bad.seen)")
            // Over the largest frame a port takes: its limits' largest message, or a batch's
            // 16 KiB if larger (here it is).
            try bad.send([handMadeMessage(msgid: 666, data: [[UInt8](repeating: 0xEE, count: 20_000)])])
            // libzmq (ZMQ_MAXMSGSIZE) closes the offender's connection; the loop keeps serving.
            let deadline = PKDeadline.after(.seconds(10))
            var dropped = false
            while !dropped && !deadline.hasPassed {
                loop.run(in: .default, until: .after(.milliseconds(20)))
                dropped = bad.waitForEvent(RawZMQSocket.disconnected, timeout: .milliseconds(1))
            }
            #expect(dropped, "the oversized sender's connection was not dropped; events: \(bad.seen)")

            try good.send(PKZMQMessage(msgid: 2), timeout: .seconds(5))
            try run(loop, until: "the second good message") { received == [1, 2] }
            #expect(port.isValid && good.isValid)
            port.invalidate()
        }
    }

    @Test func messageOverALimitIsDroppedAndReported() throws {
        try onLoopThread { loop in
            var received: [UInt32] = []
            var violations: [String] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*", limits: Self.smallLimits) { received.append($0.msgid) }
            port.onProtocolViolation = { error in
                #expect(error.code == .protocolViolation)
                violations.append(error.message)
            }
            try loop.add(port, forMode: .default)
            let raw = try RawZMQSocket(pushingTo: port.endpoint)
            let bad: [[[UInt8]]] = [
                [handMadeMessage(msgid: 10, data: [[UInt8](repeating: 1, count: 600), [UInt8](repeating: 2, count: 600)])],  // 1200 bytes
                [handMadeMessage(msgid: 11, data: Array(repeating: [], count: 9))],                  // 9 components
                [handMadeMessage(msgid: 12, data: [], destination: 5)],                               // not port id 0
                [Array("PKZX".utf8) + [UInt8](repeating: 0, count: 20)],                             // bad magic
                [Array(handMadeMessage(msgid: 13, data: [[1], [2]]).dropLast())],                     // ends early
                [handMadeMessage(msgid: 14, data: [[1]]) + [1, 9]],                                   // bytes after the end
                [handMadeMessage(msgid: 15, data: [[1]], reply: ("http://example.com:80", 1))],       // bad endpoint
                [handMadeMessage(msgid: 16, data: []), [7, 7, 7]],                                    // two frames
            ]
            for frames in bad { try raw.send(frames) }
            try raw.send([handMadeMessage(msgid: 17, data: [Array("fine".utf8)], reply: ("tcp://127.0.0.1:9", 3))])
            try run(loop, until: "the valid message after the bad ones") { received.contains(17) }
            #expect(received == [17])
            #expect(violations.count == bad.count, "\(violations)")
            port.invalidate()
        }
    }

    @Test func senderRefusesAMessageOverTheLimits() throws {
        let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
        let right = port.makeSendRight()
        expectPKError(.limitExceeded) {
            try right.send(PKZMQMessage(msgid: 1, data: [UInt8](repeating: 0, count: PKPortLimits.default.maxMessageBytes + 1)), timeout: .seconds(1))
        }
        expectPKError(.limitExceeded) {
            try right.send(PKZMQMessage(msgid: 1, components: Array(repeating: .port(right), count: 17)), timeout: .seconds(1))
        }
        port.invalidate()
    }

    /// Limits set to "no limit" (`Int.max`) are a valid choice: the port is made (its
    /// ZMQ_MAXMSGSIZE saturates instead of overflowing) and receives data and ports.
    @Test func unboundedLimitsMakeAWorkingPort() throws {
        let limits = {
            var limits = PKPortLimits()
            limits.maxDescriptors = .max
            limits.maxComponents = .max
            limits.maxMessageBytes = .max
            return limits
        }()
        try onLoopThread { loop in
            var received: [PKZMQMessage] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*", limits: limits) { received.append($0) }
            try loop.add(port, forMode: .default)
            let other = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            let right = try PKZMQSendPort(connectingTo: port.endpoint)
            try right.send(PKZMQMessage(msgid: 4, components: [.data([1, 2]), .port(other.makeSendRight())]), timeout: .seconds(5))
            try run(loop, until: "the message") { received.count == 1 }
            #expect(received[0].msgid == 4)
            #expect(received[0].components.count == 2)
            if case .port(let carried) = received[0].components.last {
                #expect(carried == other.makeSendRight())
            } else {
                Issue.record("the second component is not a port")
            }
            port.invalidate()
            other.invalidate()
        }
    }
}
#endif
