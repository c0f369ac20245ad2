// PKWorkerThread's life beyond the check-in: stop() joins the thread and leaves the worker's
// port invalid; a worker reports to the launcher's main port; check-in failures.

import Testing
@testable import PortKit

@Suite struct WorkerThreadLifecycleTests {
    /// `stop()` returns only once the worker's thread has ended: its port is invalid at once
    /// (no waiting), a send to it fails with `.invalidPort`, and nothing it was asked after
    /// the stop is handled. A second `stop()` does nothing.
    @Test func stopJoinsAndTheWorkersPortIsInvalidAfterwards() throws {
        let ended = Locked(false)
        let handled = Locked<[UInt32]>([])
        try onPortLoopThread { _ in
            let worker = try PKWorkerThread(name: "stopper") { context in
                context.port.handler = { message in handled.withLock { $0.append(message.msgid) } }
                let loop = context.loop
                // Learn when the worker's thread is done with its loop: its port's
                // invalidation runs there as the thread finishes.
                context.port.onInvalidation = { ended.value = loop.isOwnedByCurrentThread }
            }
            try worker.port.send(PKPortMessage(msgid: 1), before: .after(.seconds(5)))
            try worker.stop()
            #expect(ended.value, "the worker's thread finished before stop() returned")
            #expect(!worker.port.isValid)
            #expect {
                try worker.port.send(PKPortMessage(msgid: 2), before: .after(.seconds(1)))
            } throws: { ($0 as? PKError)?.code == .invalidPort }
            try worker.stop()
            #expect(handled.value == [1])
        }
    }

    /// A worker still busy in a handler when `stop(timeout:)` gives up: the call fails with
    /// `.receiveTimedOut`, and the thread, left to end on its own, ends once it is free (its
    /// port's invalidation runs on its thread as it finishes).
    @Test func aWorkerBusyPastTheStopTimeoutIsReportedAndEndsOnItsOwn() throws {
        let release = Semaphore()
        let ended = Semaphore()
        try onPortLoopThread { _ in
            let worker = try PKWorkerThread(name: "busy") { context in
                context.port.handler = { message in
                    if message.msgid == 7 { release.wait(until: .after(.seconds(30))) }
                }
                context.port.onInvalidation = { ended.signal() }
            }
            try worker.port.send(PKPortMessage(msgid: 7), timeout: .seconds(5))
            #expect {
                try worker.stop(timeout: .milliseconds(100))
            } throws: { ($0 as? PKError)?.code == .receiveTimedOut }
            release.signal()
            #expect(ended.wait(until: .after(.seconds(10))), "the worker ended once its handler returned")
        }
    }

    /// `stop()` called by the worker itself, from one of its handlers, asks and returns (a
    /// thread cannot join itself); the worker ends once that handler returns.
    @Test func aWorkerStoppedFromItsOwnHandlerEnds() throws {
        let outcome = Locked("not called")
        let ended = Semaphore()
        let holder = Locked<PKWorkerThread?>(nil)
        try onPortLoopThread { _ in
            let worker = try PKWorkerThread(name: "self-stop") { context in
                context.port.handler = { message in
                    guard message.msgid == 9 else { return }
                    do throws(PKError) {
                        try holder.value?.stop()
                        outcome.value = "returned"
                    } catch {
                        outcome.value = "threw \(error)"
                    }
                }
                context.port.onInvalidation = { ended.signal() }
            }
            holder.value = worker
            try worker.port.send(PKPortMessage(msgid: 9), timeout: .seconds(5))
            #expect(ended.wait(until: .after(.seconds(10))), "the worker ended after stopping itself")
            #expect(outcome.value == "returned")
            holder.value = nil
        }
    }

    /// A worker reaches its launcher through `mainPort`, and the launcher's loop delivers what
    /// it sends there; the check-in data arrives with the check-in.
    @Test func aWorkerReportsToItsMainPort() throws {
        try onPortLoopThread { loop in
            var reports: [String] = []
            let mainPort = PKReceivePort { reports.append($0.text) }
            try loop.add(mainPort, forMode: .default)
            let worker = try PKWorkerThread(name: "reporter", mainPort: mainPort.makeSendRight()) { context in
                context.checkInData = Array(context.name.utf8)
                let main = context.mainPort
                context.port.handler = { message in
                    try? main?.send(PKPortMessage(msgid: 1, data: Array("done \(message.text)".utf8)), timeout: .seconds(5))
                }
            }
            #expect(worker.checkInData == Array("reporter".utf8))
            for job in ["a", "b", "c"] { try worker.port.send(PKPortMessage(msgid: 7, data: Array(job.utf8)), timeout: .seconds(5)) }
            try runLoop(loop, "three reports") { reports.count == 3 }
            #expect(reports == ["done a", "done b", "done c"])
            try worker.stop()
            mainPort.invalidate()
        }
    }

    /// While `init` waits for the check-in, the launcher's own ports are not served (the wait
    /// runs a private mode); they are served afterwards.
    @Test func theLaunchersHandlersWaitDuringTheCheckIn() throws {
        try onPortLoopThread { loop in
            var log: [String] = []
            let mine = PKReceivePort { log.append("mine \($0.msgid)") }
            try loop.add(mine, forMode: .default)
            let right = mine.makeSendRight()
            let worker = try PKWorkerThread(name: "early-talker") { _ in
                // The worker talks to the launcher's port before it checks in.
                try right.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            }
            log.append("checked in")
            try runLoop(loop, "the launcher's port") { log.count == 2 }
            #expect(log == ["checked in", "mine 1"])
            try worker.stop()
            mine.invalidate()
        }
    }

    /// A worker that never checks in makes `init` fail with `.checkInTimedOut`; a worker whose
    /// thread ends first (its set-up throws) with `.checkInFailed`, before the deadline.
    @Test func checkInFailures() throws {
        struct Refused: Error {}
        try onPortLoopThread { _ in
            let release = Locked(false)
            let start = PKDeadline.now
            #expect {
                _ = try PKWorkerThread(name: "mute", checkInTimeout: .milliseconds(300)) { _ in
                    try? waitPatiently("release", timeout: .seconds(20)) { release.value }
                }
            } throws: { ($0 as? PKError)?.code == .checkInTimedOut }
            #expect(PKDeadline.now - start >= .milliseconds(300), "never early")
            release.value = true

            let start2 = PKDeadline.now
            #expect {
                _ = try PKWorkerThread(name: "quitter", checkInTimeout: .seconds(20)) { _ in throw Refused() }
            } throws: { ($0 as? PKError)?.code == .checkInFailed }
            #expect(PKDeadline.now - start2 < .seconds(20))
        }
    }

    /// Several workers, each stopped: all threads end; their ports are all invalid.
    @Test func severalWorkersStartAndStop() throws {
        try onPortLoopThread(timeout: .seconds(60)) { _ in
            let workers = try (0..<6).map { index in
                try PKWorkerThread(name: "w\(index)") { context in
                    context.port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid + 1), timeout: .seconds(5)) }
                }
            }
            for (index, worker) in workers.enumerated() {
                let reply = try worker.port.sendRequest(PKPortMessage(msgid: UInt32(index)), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                #expect(reply?.msgid == UInt32(index) + 1)
            }
            for worker in workers { try worker.stop() }
            #expect(workers.allSatisfy { !$0.port.isValid })
        }
    }
}
