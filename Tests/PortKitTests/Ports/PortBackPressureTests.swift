// Back-pressure: a receiver that does not read makes senders time out, and loses nothing that
// a send reported as sent; a sender on the receiver's own thread never waits for itself.

import Testing
@testable import PortKit

@Suite struct PortBackPressureTests {
    /// A receiver that does not run its loop: the sender fills the connection until a send
    /// reports `.sendTimedOut`. Then the receiver runs and gets exactly the messages that
    /// `send` reported as sent, in order; the one that timed out never arrives, and the right
    /// still works afterwards.
    @Test func fullQueueTimesOutAndLosesNothing() throws {
        let go = Locked(false)
        let received = Locked<[UInt32]>([])
        let published = TestLatch<PKReceivePort>()
        let receiver = TestThread(name: "idle-receiver") {
            let loop = PKRunLoop.current
            let port = PKReceivePort { message in
                received.withLock { $0.append(message.msgid) }
                if message.data != bytes(1024, seed: UInt8(truncatingIfNeeded: message.msgid)) {
                    received.withLock { $0.append(UInt32.max) }  // a torn message
                }
            }
            try? loop.add(port, forMode: .default)
            published.set(port)
            // Do not run the loop until told to.
            try? waitPatiently("go", timeout: .seconds(60)) { go.value }
            let deadline = PKDeadline.after(patience(.seconds(30)))
            while port.isValid && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
        }
        let port = try published.waitPatiently()
        let right = port.makeSendRight()
        var sent: UInt32 = 0
        var failure: PKError?
        while sent < 1_000_000 {
            do {
                try right.send(PKPortMessage(msgid: sent, data: bytes(1024, seed: UInt8(truncatingIfNeeded: sent))), timeout: .milliseconds(50))
                sent += 1
            } catch {
                failure = error
                break
            }
        }
        #expect(failure?.code == .sendTimedOut)
        #expect(sent > 0)
        #expect(right.isValid, "a send that timed out before writing anything leaves the right valid")
        go.value = true
        try waitPatiently("every message that was sent") { received.value.count >= Int(sent) }
        // The right still works once there is room, and nothing of the timed-out send arrives.
        try right.send(PKPortMessage(msgid: 0xF1_0000, data: bytes(1024, seed: 0)), timeout: .seconds(10))
        try waitPatiently("the message after the timeout") { received.value.count >= Int(sent) + 1 }
        #expect(received.value == Array(0..<sent) + [0xF1_0000])
        port.invalidate()
        try receiver.joinPatiently()
    }

    /// A message bigger than the socket buffer, to a receiver that does not read, is accepted
    /// whole (what the socket does not take waits in the connection's pending bytes); the next
    /// send waits for room, times out with nothing sent and leaves the right valid. Once the
    /// receiver reads, every accepted message arrives whole and in order, the timed-out one
    /// never, and the right still works.
    @Test func aMessageLargerThanTheSocketIsAcceptedWholeAndTheNextSendWaits() async throws {
        try await awaitLoopThread(timeout: patience(.seconds(30))) { loop in
            var got: [(UInt32, Int)] = []
            let port = PKReceivePort { got.append(($0.msgid, $0.data.count)) }
            try loop.add(port, forMode: .default)
            let right = try independentRight(to: port)
            for id in UInt32(1)...3 { try right.send(PKPortMessage(msgid: id, data: [1]), timeout: .seconds(1)) }
            // Nobody reads while this thread sends: the big message cannot fit in the socket.
            try right.send(PKPortMessage(msgid: 99, data: bytes(8 << 20)), timeout: .milliseconds(100))
            #expect {
                try right.send(PKPortMessage(msgid: 100), timeout: .milliseconds(100))
            } throws: { ($0 as? PKError)?.code == .sendTimedOut }
            #expect(right.isValid, "a send that timed out with nothing written leaves the right valid")
            try runLoop(loop, "the accepted messages") { got.count == 4 }
            #expect(got.map(\.0) == [1, 2, 3, 99])
            #expect(got.last?.1 == 8 << 20)
            try right.send(PKPortMessage(msgid: 101), timeout: .seconds(5))
            try runLoop(loop, "a message after the timeout") { got.count == 5 }
            #expect(got.last?.0 == 101)
            port.invalidate()
        }
    }

    /// A sender on the receive port's own loop thread, whose queue is full, is not left waiting
    /// for itself: the send fails at once with `.sendTimedOut` (even with a long deadline, and
    /// with other, idle connections on the port). The loop then delivers every message that was
    /// sent, in order.
    @Test(arguments: [false, true])
    func senderOnTheReceiversOwnThreadDoesNotDeadlock(withAnotherIdleSender: Bool) throws {
        try onPortLoopThread(timeout: .seconds(60)) { loop in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            let idle = withAnotherIdleSender ? try independentRight(to: port) : nil
            let right = port.makeSendRight()
            var sent: UInt32 = 0
            var failure: PKError?
            while sent < 200_000 {
                do {
                    try right.send(PKPortMessage(msgid: sent, data: bytes(256)), timeout: .seconds(120))
                    sent += 1
                } catch {
                    failure = error as? PKError
                    break
                }
            }
            #expect(failure?.code == .sendTimedOut)
            #expect(sent >= UInt32(PKPortLimits.default.maxQueuedMessages), "the queue holds its limit before the sender is refused")
            try runLoop(loop, "every message sent from the loop's own thread") { got.count >= Int(sent) }
            runLoop(loop, for: .milliseconds(20))
            #expect(got == Array(0..<sent))
            // And it can send again.
            try right.send(PKPortMessage(msgid: 0xABCD), timeout: .seconds(1))
            try runLoop(loop, "one more") { got.last == 0xABCD }
            idle?.invalidate()
            port.invalidate()
        }
    }

    /// The same, while another sender's connection has ended (its right was released after
    /// sending): draining for the same-thread sender must not trip over that end of stream,
    /// and the other sender's messages still arrive.
    @Test func senderOnTheReceiversOwnThreadWithAnotherSenderThatLeft() throws {
        try onPortLoopThread(timeout: .seconds(60)) { loop in
            var got: [UInt32] = []
            var noSenders = 0
            let port = PKReceivePort { got.append($0.msgid) }
            port.onNoSenders = { noSenders += 1 }
            try loop.add(port, forMode: .default)
            let other = try independentRight(to: port)
            let otherThread = TestThread {
                for id in UInt32(0)..<5 { try? other.send(PKPortMessage(msgid: 0x8000_0000 + id), timeout: .seconds(5)) }
                other.invalidate()
            }
            try otherThread.joinPatiently()
            let right = port.makeSendRight()
            var sent: UInt32 = 0
            while sent < 200_000 {
                do { try right.send(PKPortMessage(msgid: sent, data: bytes(256)), timeout: .seconds(120)) } catch {
                    #expect((error as? PKError)?.code == .sendTimedOut)
                    break
                }
                sent += 1
            }
            try runLoop(loop, "every message") { got.count >= Int(sent) + 5 }
            #expect(got.filter { $0 < 0x8000_0000 } == Array(0..<sent))
            #expect(got.filter { $0 >= 0x8000_0000 } == (0..<5).map { 0x8000_0000 + $0 })
            port.invalidate()
        }
    }

    /// A sender waiting for room in a full in-process queue learns of the port's invalidation
    /// from another thread at once (`.invalidPort`), while the port's loop is busy elsewhere: it
    /// slept until its deadline, then reported `.sendTimedOut`.
    @Test func aSenderWaitingForRoomLearnsOfAnInvalidationAtOnce() throws {
        var limits = PKPortLimits.default
        limits.maxQueuedMessages = 1
        let port = PKReceivePort(limits: limits)
        let scheduled = TestLatch<Bool>()
        let release = Locked(false)
        let owner = TestThread(name: "busy-owner") {
            do {
                try PKRunLoop.current.add(port, forMode: .default)
                scheduled.set(true)
            } catch {
                scheduled.set(false)
            }
            // Busy: its loop does not run until the test ends.
            try? waitPatiently("the test's end", timeout: .seconds(60)) { release.value }
        }
        defer {
            release.value = true
            try? owner.join()
        }
        #expect(try scheduled.wait())
        let right = port.makeSendRight()
        try right.send(PKPortMessage(msgid: 1), timeout: .seconds(1))
        let outcome = Locked<PKError.Code?>(nil)
        let sender = TestThread(name: "waiting-sender") {
            do { try right.send(PKPortMessage(msgid: 2), timeout: .seconds(60)) } catch let error as PKError {
                outcome.value = error.code
            } catch {}
        }
        try waitUntil("the sender to wait for room") { port.shared.withLock { $0.waitingSenders } == 1 }
        port.invalidate()
        try sender.join(timeout: patience(.seconds(10)))
        #expect(outcome.value == .invalidPort)
    }

    /// A port's own queue limit (`PKPortLimits.maxQueuedMessages`) is the one enforced: with a
    /// limit of 5, a same-thread sender is refused long before the default 1000 messages.
    @Test func aPortsConfiguredQueueLimitIsEnforced() throws {
        try onPortLoopThread(timeout: .seconds(60)) { loop in
            var limits = PKPortLimits()
            limits.maxQueuedMessages = 5
            var got: [UInt32] = []
            let port = PKReceivePort(limits: limits) { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            let right = port.makeSendRight()
            var sent: UInt32 = 0
            while sent < 200_000 {
                do { try right.send(PKPortMessage(msgid: sent, data: bytes(1024)), timeout: .seconds(120)) } catch {
                    #expect((error as? PKError)?.code == .sendTimedOut)
                    break
                }
                sent += 1
            }
            // The socket buffer holds a few hundred 1 KiB messages at most; the default queue
            // limit alone would admit a thousand more.
            #expect(sent < UInt32(PKPortLimits.default.maxQueuedMessages), "sent \(sent)")
            try runLoop(loop, "every message") { got.count >= Int(sent) }
            #expect(got == Array(0..<sent))
            port.invalidate()
        }
    }
}
