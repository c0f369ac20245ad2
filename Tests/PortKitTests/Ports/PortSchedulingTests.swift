// Scheduling a port: its loop keeps it (as NSRunLoop retains the ports added to it), removing
// it from a mode and adding it back, and nested runs inside a handler.

import Dispatch
import Testing
@testable import PortKit

@Suite struct PortSchedulingTests {
    /// A port that no variable holds keeps serving while it is scheduled: its loop keeps it,
    /// as the guide's `[NSMachPort port]` is kept only by the run loop it was added to.
    @Test func aScheduledPortThatNoVariableHoldsKeepsServing() throws {
        let got = Locked<[UInt32]>([])
        try onPortLoopThread { loop in
            weak var weakPort: PKReceivePort?
            let right: PKSendPort = try {
                let port = PKReceivePort { message in got.withLock { $0.append(message.msgid) } }
                try loop.add(port, forMode: .default)
                weakPort = port
                return try independentRight(to: port)
            }()
            #expect(weakPort != nil, "the loop keeps the scheduled port")
            try right.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            try runLoop(loop, "a message") { got.value == [1] }
            weakPort?.invalidate()
            runLoop(loop, for: .milliseconds(10))
            #expect(weakPort == nil, "released once invalidated")
        }
    }

    /// A port delivering on a DispatchQueue whose last reference the caller drops on its own
    /// thread (not the loop's) keeps delivering, and nothing traps.
    @Test func aPortDeliveringOnAQueueNeedsNoVariable() throws {
        let got = Locked<[UInt32]>([])
        let queue = DispatchQueue(label: "portkit.test.unheld")
        var right: PKSendPort? = nil
        weak var weakPort: PKReceivePort?
        do {
            let port = PKReceivePort()
            try port.deliver(on: queue) { message in got.withLock { $0.append(message.msgid) } }
            right = try independentRight(to: port)
            weakPort = port
        }
        let sender = try #require(right)
        for id in UInt32(0)..<10 { try sender.send(PKPortMessage(msgid: id), timeout: .seconds(5)) }
        try waitPatiently("ten messages on the queue") { got.value.count == 10 }
        #expect(got.value == Array(0..<10))
        let port = try #require(weakPort)
        port.invalidate()
        try waitPatiently("the right to see the port gone") { !sender.isValid }
    }

    /// Removed from its only mode, a port delivers nothing (messages wait); added back, it
    /// delivers them all, in order (`removePort:forMode:` then `addPort:forMode:`).
    @Test func removedFromItsModeAndAddedBack() throws {
        try onPortLoopThread { loop in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            let right = port.makeSendRight()
            try right.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            try runLoop(loop, "the first message") { got == [1] }
            loop.remove(port, forMode: .default)
            try right.send(PKPortMessage(msgid: 2), timeout: .seconds(5))
            try right.send(PKPortMessage(msgid: 3), timeout: .seconds(5))
            let other = PKReceivePort()  // keeps .default from being empty
            try loop.add(other, forMode: .default)
            runLoop(loop, for: .milliseconds(30))
            #expect(got == [1])
            #expect(port.isValid)
            try loop.add(port, forMode: .default)
            try runLoop(loop, "the waiting messages") { got.count == 3 }
            #expect(got == [1, 2, 3])
            // Scheduled in a second mode too, it serves there.
            try loop.add(port, forMode: "other-mode")
            try right.send(PKPortMessage(msgid: 4), timeout: .seconds(5))
            try runLoop(loop, in: "other-mode", "a message in the other mode") { got.count == 4 }
            port.invalidate()
            other.invalidate()
        }
    }

    /// A handler that runs the loop again (a nested run in the same mode) while its own
    /// connection has ended with messages still queued behind the current one: the nested run
    /// reads the end of the stream once and then sleeps (it does not spin on the finished
    /// connection, which stays readable), and
    /// the queued messages are delivered after the handler returns, then `onNoSenders`.
    @Test func aNestedRunDoesNotSpinOnAFinishedConnection() throws {
        try onPortLoopThread { loop in
            var log: [String] = []
            let port = PKReceivePort()
            port.handler = { message in
                log.append("message \(message.msgid)")
                if message.msgid == 1 {
                    // Run the loop for a while, one handled source at a time: reading the end
                    // of the stream is one; a finished connection must not count again and again.
                    let deadline = PKDeadline.after(.milliseconds(100))
                    var handled = 0
                    while !deadline.hasPassed {
                        if loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) == .handledSource { handled += 1 }
                    }
                    log.append(handled <= 1 ? "nested run quiet" : "nested run handled \(handled) sources")
                }
            }
            port.onNoSenders = { log.append("no senders") }
            try loop.add(port, forMode: .default)
            let peer = try RawPeer(to: port)
            #expect(peer.write(RawPeer.greeting + RawPeer.frame(msgid: 1) + RawPeer.frame(msgid: 2) + RawPeer.frame(msgid: 3)) == nil)
            peer.close()
            try runLoop(loop, "no senders") { log.contains("no senders") }
            #expect(log == ["message 1", "nested run quiet", "message 2", "message 3", "no senders"])
            port.invalidate()
        }
    }
}
