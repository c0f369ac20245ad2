import Glibc
import Testing
@testable import PortKit

@Suite struct PortBasicsTests {
    @Test func messageBetweenThreadsKeepsDataAndReplyPort() throws {
        let received = Locked<[String]>([])
        let replies = Locked<Int>(0)
        try onLoopThread { loop in
            let port = PKReceivePort()
            port.handler = { message in
                received.withLock { $0.append("\(message.msgid):\(message.text)") }
                if let reply = message.replyPort {
                    try? reply.send(PKPortMessage(msgid: message.msgid + 1, data: Array("pong".utf8)), timeout: .seconds(5))
                }
                if message.msgid == 3 { loop.stop() }
            }
            try loop.add(port, forMode: .default)
            let right = port.makeSendRight()
            let sender = TestThread {
                let loop2 = PKRunLoop.current
                let replyPort = PKReceivePort { _ in replies.withLock { $0 += 1 } }
                try? loop2.add(replyPort, forMode: .default)
                for id in UInt32(1)...3 {
                    try? right.send(PKPortMessage(msgid: id, data: Array("hello \(id)".utf8), replyPort: replyPort.makeSendRight()), timeout: .seconds(5))
                }
                let deadline = PKDeadline.after(patience(.seconds(10)))
                while replies.value < 3 && !deadline.hasPassed { loop2.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
                replyPort.invalidate()
            }
            #expect(loop.run(in: .default, until: .after(.seconds(10))) == .stopped)
            try sender.join()
            port.invalidate()
        }
        #expect(received.value == ["1:hello 1", "2:hello 2", "3:hello 3"])
        #expect(replies.value == 3)
    }

    /// A handler that replaces the port's handler hands the messages after it to the new one,
    /// within one delivery too (a delivery keeps the handler it loaded until one changes it),
    /// in memory and over a socket.
    @Test(arguments: [false, true]) func aHandlerReplacedByAHandlerTakesTheNextMessage(overSocket: Bool) throws {
        let got = try onPortLoopThread { loop in
            var got: [String] = []
            let port = PKReceivePort()
            port.handler = { message in
                got.append("first \(message.msgid)")
                port.handler = { got.append("second \($0.msgid)") }
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = overSocket ? try independentRight(to: port) : port.makeSendRight()
            // All three wait before the loop runs: one delivery hands them over.
            for msgid in 1...3 { try right.send(PKPortMessage(msgid: UInt32(msgid)), timeout: .seconds(5)) }
            try runLoop(loop, "three messages") { got.count == 3 }
            return got
        }
        #expect(got == ["first 1", "second 2", "second 3"])
    }

    /// A message of one data component keeps only its bytes (no array of components); every
    /// other shape keeps its array. Whatever the shape, `components`, `data` and `ports` read
    /// back what was set, and changing `components` in place changes the shape.
    @Test func aMessagesComponentsReadBackAsSetWhateverTheirShape() throws {
        let port = PKReceivePort()
        defer { port.invalidate() }
        let right = port.makeSendRight()
        var message = PKPortMessage(msgid: 1, data: [1, 2])
        #expect(describe(message.components) == ["data 1,2"])
        #expect(message.data == [1, 2] && message.ports.isEmpty)
        message.components.append(.port(right))
        #expect(describe(message.components) == ["data 1,2", "port"])
        #expect(message.data == [1, 2] && message.ports.count == 1)
        message.components.removeLast()
        message.components.append(.data([3]))
        #expect(describe(message.components) == ["data 1,2", "data 3"] && message.data == [1, 2, 3])
        message.components = [.data([])]
        #expect(describe(message.components) == ["data "] && message.data.isEmpty)
        message.components = []
        #expect(message.components.isEmpty && message.data.isEmpty && message.ports.isEmpty)
        message.components = [.port(right)]
        #expect(describe(message.components) == ["port"] && message.data.isEmpty && message.ports.count == 1)
        #expect(describe(PKPortMessage(msgid: 2, components: [.data([4])]).components) == ["data 4"])
    }

    /// Components changed in place (`append`, a subscript) are changed where they are: the
    /// message does not copy its array for every change (which made building a message one
    /// component at a time quadratic), and `print` shows the components, not how they are held.
    @Test func componentsChangeInPlaceAndPrintAsComponents() {
        var message = PKPortMessage(msgid: 1, components: [.data([1]), .data([2])])
        message.components.reserveCapacity(64)
        let storage = message.components.withUnsafeBufferPointer { $0.baseAddress }
        for index in 3...40 { message.components.append(.data([UInt8(index)])) }
        message.components[0] = .data([0])
        #expect(message.components.withUnsafeBufferPointer { $0.baseAddress } == storage)
        #expect(message.components.count == 40 && message.data == [0] + (2...40).map { UInt8($0) })
        var one = PKPortMessage(msgid: 2, data: [7])
        one.components.append(.data([8]))
        #expect(one.data == [7, 8])
        #expect(String(describing: PKPortMessage(msgid: 3, data: [9])).contains("components: [PortKit.PKPortComponent.data([9])]"))
    }

    /// Every shape of message arrives with its components as sent, in memory and over a
    /// socket: none, one data component (empty or not), one port, and mixes.
    @Test(arguments: [false, true]) func everyShapeOfMessageArrivesAsSent(overSocket: Bool) throws {
        let got = try onPortLoopThread { loop -> [[String]] in
            var got: [[String]] = []
            let port = PKReceivePort { got.append(describe($0.components)) }
            let other = PKReceivePort()
            defer { port.invalidate(); other.invalidate() }
            try loop.add(port, forMode: .default)
            try loop.add(other, forMode: .default)
            let right = overSocket ? try independentRight(to: port) : port.makeSendRight()
            let shapes: [[PKPortComponent]] = [
                [], [.data([])], [.data([7, 8])], [.port(other.makeSendRight())],
                [.data([1]), .port(other.makeSendRight()), .data([2, 3])], [.data([4]), .data([])],
            ]
            for (index, components) in shapes.enumerated() {
                try right.send(PKPortMessage(msgid: UInt32(index), components: components), timeout: .seconds(5))
            }
            try runLoop(loop, "every shape") { got.count == shapes.count }
            return got
        }
        #expect(got == [[], ["data "], ["data 7,8"], ["port"], ["data 1", "port", "data 2,3"], ["data 4", "data "]])
    }

    /// A message over the port's limits, sent in memory, fails with `.limitExceeded` as it
    /// would through a socket, and the port receives nothing of it: too many data bytes, ports
    /// (the reply port counts) or components.
    @Test func anInMemoryMessageOverThePortsLimitsIsRefused() throws {
        let (codes, got) = try onPortLoopThread { loop -> ([PKError.Code?], [UInt32]) in
            var limits = PKPortLimits()
            limits.maxMessageBytes = 8
            limits.maxDescriptors = 2
            limits.maxComponents = 3
            var got: [UInt32] = []
            let port = PKReceivePort(limits: limits) { got.append($0.msgid) }
            let other = PKReceivePort()
            defer { port.invalidate(); other.invalidate() }
            try loop.add(port, forMode: .default)
            try loop.add(other, forMode: .default)
            let right = port.makeSendRight()
            let otherRight = other.makeSendRight()
            let overLimits = [
                PKPortMessage(msgid: 1, data: bytes(9)),
                PKPortMessage(msgid: 2, components: [.port(otherRight), .port(otherRight)], replyPort: otherRight),
                PKPortMessage(msgid: 3, components: Array(repeating: .data([1]), count: 4)),
            ]
            let codes = overLimits.map { message -> PKError.Code? in
                do throws(PKError) { try right.send(message, timeout: .seconds(5)) } catch { return error.code }
                return nil
            }
            let atLimits = PKPortMessage(msgid: 4, components: [.data(bytes(8)), .port(otherRight)], replyPort: otherRight)
            try right.send(atLimits, timeout: .seconds(5))
            try runLoop(loop, "the message at the limits") { !got.isEmpty }
            return (codes, got)
        }
        #expect(codes == [.limitExceeded, .limitExceeded, .limitExceeded])
        #expect(got == [4])
    }

    @Test func portInsideMessageGivesWorkingSendRight() throws {
        let got = Locked<[UInt32]>([])
        try onLoopThread { loop in
            let target = PKReceivePort { message in got.withLock { $0.append(message.msgid) } }
            try loop.add(target, forMode: .default)
            var carried: PKSendPort?
            let carrier = PKReceivePort { message in carried = message.ports.first }
            try loop.add(carrier, forMode: .default)
            try carrier.makeSendRight().send(PKPortMessage(msgid: 1, components: [.port(target.makeSendRight())]), timeout: .seconds(1))
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while carried == nil && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
            let right = try #require(carried)
            // Forward it once more (a right received in a message travels on).
            var forwarded: PKSendPort?
            let second = PKReceivePort { message in forwarded = message.ports.first }
            try loop.add(second, forMode: .default)
            try second.makeSendRight().send(PKPortMessage(msgid: 2, components: [.port(right)]), timeout: .seconds(1))
            while forwarded == nil && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
            try #require(forwarded).send(PKPortMessage(msgid: 42), timeout: .seconds(1))
            try right.send(PKPortMessage(msgid: 41), timeout: .seconds(1))
            while got.value.count < 2 && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
            target.invalidate(); carrier.invalidate(); second.invalidate()
        }
        #expect(Set(got.value) == [41, 42])
    }

    @Test func requestReplyBetweenThreads() throws {
        let serverLoop = TestLatch<PKSendPort>()
        let server = TestThread {
            let loop = PKRunLoop.current
            let port = PKReceivePort()
            port.handler = { message in
                if message.msgid == 99 { port.invalidate(); return }
                try? message.replyPort?.send(PKPortMessage(msgid: message.msgid, data: message.data.reversed()), timeout: .seconds(5))
            }
            try? loop.add(port, forMode: .default)
            serverLoop.set(port.makeSendRight())
            loop.run(in: .default, until: .after(.seconds(20)))
        }
        let right = try serverLoop.wait()
        try onLoopThread { _ in
            let reply = try right.sendRequest(PKPortMessage(msgid: 7, data: [1, 2, 3]), sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
            #expect(reply?.data == [3, 2, 1])
            #expect(reply?.msgid == 7)
        }
        try right.send(PKPortMessage(msgid: 99), timeout: .seconds(5))
        try server.join()
        #expect(!right.isValid)
    }

    /// A queue or greeting limit below its least traps in the port's initializer, as the
    /// documentation says and as the message limits did (these were taken as given: a queue
    /// of 0 messages, a negative greeting timeout).
    @Test(arguments: ["maxQueuedMessages", "maxQueuedBytes", "maxPendingGreetings", "greetingTimeout"])
    func aLimitBelowItsLeastTraps(limit: String) async {
        var result: ExitTest.Result?
        await exitTestInTurn {
            result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [limit] in
                var limits = PKPortLimits()
                switch limit {
                case "maxQueuedMessages": limits.maxQueuedMessages = 0
                case "maxQueuedBytes": limits.maxQueuedBytes = -1
                case "maxPendingGreetings": limits.maxPendingGreetings = 0
                default: limits.greetingTimeout = .milliseconds(-1)
                }
                _ = PKReceivePort(limits: limits)
                exit(0)  // reached only if the initializer did not trap
            }
        }
        let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("PKPortLimits.\(limit)"), "\(message)")
    }
}

/// A message's components as text: "data" and its bytes, or "port".
private func describe(_ components: [PKPortComponent]) -> [String] {
    components.map { component in
        switch component {
        case .data(let bytes): "data " + bytes.map(String.init).joined(separator: ",")
        case .port: "port"
        }
    }
}
