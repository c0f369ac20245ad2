// Synchronous request/reply (CFMessagePortSendRequest): the reply, each distinct error, and the
// caller's other handlers staying quiet while it waits.

import Glibc
import Testing
@testable import PortKit

@Suite struct PortRequestTests {
    /// How the request's target is reached: the server's own `makeSendRight()` (a local right)
    /// or a right with a connection of its own (as one received in a message).
    enum Road: String, CaseIterable, Sendable { case localRight, ownConnection }

    static func right(_ server: PortServer, _ road: Road) throws -> PKSendPort {
        switch road {
        case .localRight: server.right
        case .ownConnection: try independentRight(to: server.port)
        }
    }

    static func code(of body: () throws -> Void) -> PKError.Code? {
        do { try body() } catch let error as PKError { return error.code } catch { return nil }
        return nil
    }

    @Test(arguments: Road.allCases)
    func replyArrives(_ road: Road) throws {
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid + 1, data: $0.data + [0]), timeout: .seconds(5)) }
        }
        let right = try Self.right(server, road)
        try onPortLoopThread { _ in
            for id in UInt32(0)..<20 {
                let reply = try right.sendRequest(PKPortMessage(msgid: id, data: [UInt8(id)]), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                #expect(reply?.msgid == id + 1)
                #expect(reply?.data == [UInt8(id), 0])
            }
            // A one-way request (no receive timeout) returns nil at once.
            #expect(try right.sendRequest(PKPortMessage(msgid: 1000), sendTimeout: .seconds(5), receiveTimeout: nil) == nil)
        }
        try server.stop()
    }

    /// `.sendTimedOut`: the target's queue is full (its loop does not read) for longer than the
    /// send timeout.
    @Test func sendTimedOut() throws {
        let hold = Locked(true)
        let published = TestLatch<PKReceivePort>()
        let server = TestThread(name: "stalled-server") {
            let loop = PKRunLoop.current
            let port = PKReceivePort()
            try? loop.add(port, forMode: .default)
            published.set(port)
            try? waitPatiently("release", timeout: .seconds(60)) { !hold.value }
            port.invalidate()
        }
        let port = try published.waitPatiently()
        let right = port.makeSendRight()
        try onPortLoopThread { _ in
            // Fill the connection without waiting.
            var filled = false
            for _ in 0..<100_000 {
                do { try right.send(PKPortMessage(msgid: 1, data: bytes(1024)), before: .now) } catch {
                    #expect((error as? PKError)?.code == .sendTimedOut)
                    filled = true
                    break
                }
            }
            try #require(filled)
            let code = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 2), sendTimeout: .milliseconds(50), receiveTimeout: patience(.seconds(10))) }
            #expect(code == .sendTimedOut)
        }
        hold.value = false
        try server.joinPatiently()
    }

    /// `.receiveTimedOut`: the server keeps the reply port but never answers.
    @Test(arguments: Road.allCases)
    func receiveTimedOut(_ road: Road) throws {
        let kept = Locked<[PKSendPort]>([])
        let server = try PortServer { port, _ in
            port.handler = { message in if let reply = message.replyPort { kept.withLock { $0.append(reply) } } }
        }
        let right = try Self.right(server, road)
        try onPortLoopThread { _ in
            let code = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .milliseconds(200)) }
            #expect(code == .receiveTimedOut)
        }
        #expect(kept.value.count == 1)
        kept.value = []
        try server.stop()
    }

    /// `.invalidPort`: the port was invalid before the request went out.
    @Test(arguments: Road.allCases)
    func invalidPortBeforeTheRequest(_ road: Road) throws {
        let server = try PortServer { _, _ in }
        let right = try Self.right(server, road)
        try server.stop()
        try waitPatiently("the right to see its port gone") { !right.isValid }
        try onPortLoopThread { _ in
            let code = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(5)) }
            #expect(code == .invalidPort)
        }
    }

    /// `.portInvalidated`: the remote port is invalidated while the caller waits (its owner
    /// keeps the reply port, so only the port's death can end the wait early).
    @Test(arguments: Road.allCases)
    func remoteInvalidatedWhileWaiting(_ road: Road) throws {
        let kept = Locked<[PKSendPort]>([])
        let server = try PortServer { port, _ in
            port.handler = { message in
                if let reply = message.replyPort { kept.withLock { $0.append(reply) } }
                port.invalidate()
            }
        }
        let right = try Self.right(server, road)
        try onPortLoopThread { _ in
            let start = PKDeadline.now
            let code = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(15)) }
            #expect(code == .portInvalidated)
            #expect(PKDeadline.now - start < .seconds(15), "the wait ended before its deadline")
        }
        try server.joinPatiently()
        kept.value = []
    }

    /// `.interrupted`: the caller's loop is stopped while the request waits (here by the
    /// server, once it has the request, which it keeps unanswered). The request ends at once,
    /// not at its deadline, and the stop reaches the run the request was made in.
    @Test(arguments: Road.allCases)
    func aStopWhileWaitingInterruptsTheRequestAndReachesTheOuterRun(_ road: Road) throws {
        let kept = Locked<[PKSendPort]>([])
        let requester = Locked<PKRunLoop?>(nil)
        let server = try PortServer { port, _ in
            port.handler = { message in
                if let reply = message.replyPort { kept.withLock { $0.append(reply) } }
                requester.value?.stop()
            }
        }
        let right = try Self.right(server, road)
        let (code, outer) = try onPortLoopThread { loop in
            requester.value = loop
            let keep = keepAlive(loop, .default)
            defer { keep.invalidate() }
            let code = Locked<PKError.Code?>(nil)
            loop.perform(inModes: [.default]) {
                code.value = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(20))) }
            }
            let outer = loop.run(in: .default, until: .after(patience(.seconds(30))))
            return (code.value, outer)
        }
        #expect(code == .interrupted)
        #expect(outer == .stopped)
        kept.value = []
        try server.stop()
    }

    /// A request made between the passes of a hosted loop (its host waits for `descriptor`)
    /// leaves the loop's timerfd armed for the host's mode, not for the request's private one:
    /// a timer of the host's mode still makes the descriptor readable.
    @Test(arguments: Road.allCases)
    func aRequestBetweenAHostedLoopsPassesLeavesItsTimerArmed(_ road: Road) throws {
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid + 1), timeout: .seconds(5)) }
        }
        let right = try Self.right(server, road)
        let fired = try onPortLoopThread { loop in
            let mode: PKRunLoopMode = "request-hosted"
            _ = loop.descriptor
            let fired = Locked(false)
            let timer = loop.scheduleTimer(after: .milliseconds(50), forMode: mode) { _ in fired.value = true }
            defer { timer.invalidate() }
            loop.runOnePass(in: mode)  // the host's first pass
            let reply = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            #expect(reply?.msgid == 2)
            try runAsHost(loop, mode, "the hosted loop's timer after a request") { fired.value }
            return fired.value
        }
        #expect(fired)
        try server.stop()
    }

    /// Work for a hosted loop's own mode.
    enum HostWork: String, CaseIterable, Sendable { case perform, signal }

    /// Work for the host's mode that arrives while a request made between a hosted loop's
    /// passes waits (a perform block, or a signal of a custom source, from the server before
    /// it answers) wakes only the request's private run, which cannot do it: the loop's
    /// descriptor stays readable, and the host's next pass does it.
    @Test(arguments: Road.allCases, HostWork.allCases)
    func workForTheHostsModeDuringARequestBetweenItsPassesWakesTheHost(_ road: Road, _ work: HostWork) throws {
        let mode: PKRunLoopMode = "request-hosted-work"
        let requester = Locked<(PKRunLoop, PKCustomSource)?>(nil)
        let done = Locked(false)
        let server = try PortServer { port, _ in
            port.handler = { message in
                if let (loop, source) = requester.value {
                    switch work {
                    case .perform: loop.perform(inModes: [mode]) { done.value = true }
                    case .signal: source.signal(waking: loop)
                    }
                }
                try? message.replyPort?.send(PKPortMessage(msgid: message.msgid + 1), timeout: .seconds(5))
            }
        }
        let right = try Self.right(server, road)
        try onPortLoopThread { loop in
            _ = loop.descriptor
            let source = PKCustomSource { done.value = true }
            loop.add(source, forMode: mode)
            defer { source.invalidate() }
            requester.value = (loop, source)
            loop.runOnePass(in: mode)  // the host's first pass
            let reply = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
            #expect(reply?.msgid == 2)
            try runAsHost(loop, mode, "the \(work) that came during a request") { done.value }
        }
        #expect(done.value)
        requester.value = nil
        try server.stop()
    }

    /// `.portInvalidated`: the remote port's owner drops the reply port without answering.
    @Test(arguments: Road.allCases)
    func remoteDropsTheReplyPortWithoutAnswering(_ road: Road) throws {
        let server = try PortServer { port, _ in
            port.handler = { _ in }  // the message, reply port included, is released unanswered
        }
        let right = try Self.right(server, road)
        try onPortLoopThread { _ in
            let code = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(15)) }
            #expect(code == .portInvalidated)
        }
        #expect(server.port.isValid)
        try server.stop()
    }

    /// While a request waits (here from inside a handler, a nested run), the caller's other
    /// ports are not served: a message the server sends to one of them before answering is
    /// delivered only after the request returns.
    @Test func otherHandlersDoNotFireDuringARequest() throws {
        let server = try PortServer { port, _ in
            port.handler = { message in
                // First a message to the caller's other port, then the answer.
                if let other = message.ports.first { try? other.send(PKPortMessage(msgid: 55), timeout: .seconds(5)) }
                try? message.replyPort?.send(PKPortMessage(msgid: 56), timeout: .seconds(5))
            }
        }
        try onPortLoopThread { loop in
            var log: [String] = []
            let other = PKReceivePort { log.append("other \($0.msgid)") }
            try loop.add(other, forMode: .default)
            let trigger = PKReceivePort { message in
                log.append("trigger \(message.msgid) begins")
                do {
                    let reply = try server.right.sendRequest(
                        PKPortMessage(msgid: 1, components: [.port(other.makeSendRight())]),
                        sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                    log.append("reply \(reply?.msgid ?? 0)")
                } catch {
                    log.append("error \(error)")
                }
                log.append("trigger \(message.msgid) ends")
            }
            try loop.add(trigger, forMode: .default)
            try trigger.makeSendRight().send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            try trigger.makeSendRight().send(PKPortMessage(msgid: 2), timeout: .seconds(5))
            try runLoop(loop, "both triggers and the other port's message") { log.filter { $0.hasPrefix("other") }.count == 2 }
            // Each request returned before anything else ran; the other port's messages came after.
            #expect(log.prefix(3) == ["trigger 1 begins", "reply 56", "trigger 1 ends"], "\(log)")
            #expect(log.contains("trigger 2 ends"))
            let firstOther = try #require(log.firstIndex { $0.hasPrefix("other") })
            #expect(firstOther > 2)
            let t2begin = try #require(log.firstIndex(of: "trigger 2 begins"))
            let t2end = try #require(log.firstIndex(of: "trigger 2 ends"))
            #expect(log[t2begin...t2end] == ["trigger 2 begins", "reply 56", "trigger 2 ends"], "\(log)")
            other.invalidate()
            trigger.invalidate()
        }
        try server.stop()
    }

    /// A request whose target right is also watched (`watchInvalidation`) on the caller's loop
    /// still learns of the target's death at once.
    @Test func aWatchedTargetsDeathStillEndsARequest() throws {
        let kept = Locked<[PKSendPort]>([])
        let server = try PortServer { port, _ in
            port.handler = { message in
                if let reply = message.replyPort { kept.withLock { $0.append(reply) } }
                port.invalidate()
            }
        }
        let right = try independentRight(to: server.port)
        try onPortLoopThread { loop in
            var watched = 0
            let watch = try right.watchInvalidation(on: loop, forMode: .default) { watched += 1 }
            runLoop(loop, for: .milliseconds(10))  // the watch is now registered with the loop
            let code = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(20))) }
            #expect(code == .portInvalidated)
            try runLoop(loop, "the watch") { watched == 1 }
            watch.cancel()
        }
        try server.joinPatiently()
        kept.value = []
    }

    /// A reply port is reused from one request to the next, its senders revoked in between: an
    /// answer to a request that timed out, sent late, fails with `.invalidPort` and is never
    /// taken for the answer to the next request.
    @Test(arguments: Road.allCases)
    func aLateAnswerIsRefusedAndNeverTakenForTheNext(_ road: Road) throws {
        let kept = Locked<PKSendPort?>(nil)
        let lateAnswer = Locked<PKError.Code?>(nil)
        let server = try PortServer { port, _ in
            port.handler = { message in
                if message.msgid == 1 {
                    kept.value = message.replyPort  // answered only later, too late
                    return
                }
                if let stale = kept.value {
                    lateAnswer.value = Self.code { try stale.send(PKPortMessage(msgid: 901), timeout: .seconds(5)) }
                }
                try? message.replyPort?.send(PKPortMessage(msgid: 902), timeout: .seconds(5))
            }
        }
        let right = try Self.right(server, road)
        let second = try onPortLoopThread { _ -> UInt32? in
            let first = Self.code { _ = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .milliseconds(200)) }
            guard first == .receiveTimedOut else { return nil }
            return try right.sendRequest(PKPortMessage(msgid: 2), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))?.msgid
        }
        #expect(second == 902)
        #expect(lateAnswer.value == .invalidPort)
        kept.value = nil
        try server.stop()
    }

    /// Requests reuse their loop's reply machinery: a thousand of them, by either road, leave
    /// the loop with no more modes and the process with no more descriptors than the first
    /// one did. Run in a child process, so that no other test's descriptors blur the count.
    @Test func manyRequestsLeaveNothingBehind() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                var report: [String] = []
                for road in Road.allCases {
                    do {
                        let server = try PortServer { port, _ in
                            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid), timeout: .seconds(5)) }
                        }
                        let right = try Self.right(server, road)
                        let counts = try onPortLoopThread { loop in
                            _ = try right.sendRequest(PKPortMessage(msgid: 0), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                            warmUpLoopDescriptors(loop)
                            let before = (loop.modeItems.count, openDescriptorCount())
                            for id in UInt32(1)...1000 {
                                _ = try right.sendRequest(PKPortMessage(msgid: id), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                            }
                            // The server closes its side of each reply connection on its own thread.
                            var after = openDescriptorCount()
                            let settle = PKDeadline.after(patience(.seconds(10)))
                            while after > before.1 && !settle.hasPassed {
                                sleepFor(.milliseconds(5))
                                after = openDescriptorCount()
                            }
                            return "modes \(before.0) -> \(loop.modeItems.count), descriptors \(before.1) -> \(after)"
                        }
                        try server.stop()
                        report.append("\(road): \(counts)")
                    } catch {
                        report.append("\(road): \(error)")
                    }
                }
                let grown = report.filter { line in
                    let numbers = line.split(whereSeparator: { !$0.isNumber }).compactMap { Int($0) }
                    // The count before may still include the first reply's connection, which the
                    // server closes on its own thread: after may be lower, never higher.
                    return !(numbers.count == 4 && numbers[0] == numbers[1] && numbers[3] <= numbers[2])
                }
                endExitTest(report.joined(separator: "\n"), failures: grown)
            }
        }
    }

    /// Requests whose replies carry ports leave nothing behind: the reply, its rights and their
    /// descriptors go when the request returns, and no mode is added after the first request
    /// (its reply machinery is reused). (Once each request's private mode stayed, holding its
    /// reply and the descriptors of the rights in it for the loop's life: found by the soak.)
    ///
    /// Run in a child process (an exit test), so that no other test's descriptors blur the count.
    @Test func requestsLeaveNoModeOrDescriptorBehind() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                do {
                    let (modes, descriptors) = try Self.manyRequestsCarryingPorts()
                    endExitTest("200 requests: modes \(modes.0) -> \(modes.1), descriptors \(descriptors.0) -> \(descriptors.1)",
                                failures: (modes.1 == modes.0 ? [] : ["modes grew"]) + (descriptors.1 <= descriptors.0 ? [] : ["descriptors grew"]))
                } catch {
                    endExitTest("failed: \(error)", failures: ["\(error)"])
                }
            }
        }
    }

    /// The body of `requestsLeaveNoModeOrDescriptorBehind`: the loop's mode count and the
    /// process's descriptor count after the first request and after 200 more.
    static func manyRequestsCarryingPorts() throws -> ((Int, Int), (Int, Int)) {
        let server = try PortServer { port, _ in
            port.handler = { message in
                try? message.replyPort?.send(PKPortMessage(msgid: 1, components: message.components), timeout: .seconds(5))
            }
        }
        let counts = try onPortLoopThread { loop in
            let carried = PKReceivePort()
            try loop.add(carried, forMode: .default)
            defer { carried.invalidate() }
            let right = try independentRight(to: server.port)
            _ = try right.sendRequest(PKPortMessage(msgid: 5, components: [.port(carried.makeSendRight())]), sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
            loop.run(in: .default, until: .now)
            warmUpLoopDescriptors(loop)
            let modes = loop.modeItems.count
            let descriptors = openDescriptorCount()
            for round in 0..<200 {
                let reply = try right.sendRequest(PKPortMessage(msgid: 5, components: [.port(carried.makeSendRight())]), sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
                guard reply?.ports.count == 1 else { throw PeerError(description: "request \(round): a reply without its port") }
                loop.run(in: .default, until: .now)
            }
            _ = try? runLoop(loop, "descriptors to settle") { openDescriptorCount() <= descriptors }
            return ((modes, loop.modeItems.count), (descriptors, openDescriptorCount()))
        }
        server.port.invalidate()
        try server.joinPatiently()
        return counts
    }
}
