import Testing
@testable import PortKit

@Suite struct WorkerThreadTests {
    @Test func workerChecksInServesAndStops() throws {
        try onLoopThread { _ in
            let worker = try PKWorkerThread(name: "echo") { context in
                context.checkInData = Array("echo-worker".utf8)
                context.port.handler = { message in
                    try? message.replyPort?.send(PKPortMessage(msgid: message.msgid, data: message.data), timeout: .seconds(5))
                }
            }
            #expect(worker.checkInData == Array("echo-worker".utf8))
            let reply = try worker.port.sendRequest(PKPortMessage(msgid: 5, data: [9, 8]), sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
            #expect(reply?.data == [9, 8])
            try worker.stop()
            try waitUntil("worker port invalid") { !worker.port.isValid }
        }
    }

    @Test func workerThatNeverChecksInTimesOut() throws {
        try onLoopThread { _ in
            let release = Locked(false)
            #expect {
                _ = try PKWorkerThread(name: "sleepy", checkInTimeout: .milliseconds(200)) { _ in
                    try? waitUntil("release", timeout: .seconds(20)) { release.value }
                }
            } throws: { ($0 as? PKError)?.code == .checkInTimedOut }
            release.value = true
        }
    }

    /// A stop of the launcher's loop while it waits for the check-in (here sent by the worker
    /// itself, which then waits to be told the launch failed) ends the launch with
    /// `.interrupted`, long before its deadline, and reaches the run the launch was made in.
    @Test func aStopWhileWaitingForTheCheckInInterruptsTheLaunch() throws {
        struct Abandoned: Error {}
        let (code, outer) = try onLoopThread(timeout: patience(.seconds(40))) { loop in
            let keep = keepAlive(loop, .default)
            defer { keep.invalidate() }
            let code = Locked<PKError.Code?>(nil)
            let launchEnded = Locked(false)
            loop.perform(inModes: [.default]) {
                do throws(PKError) {
                    _ = try PKWorkerThread(name: "stopper", checkInTimeout: patience(.seconds(20))) { _ in
                        loop.stop()
                        try? waitUntil("the launch to fail", timeout: patience(.seconds(20))) { launchEnded.value }
                        throw Abandoned()
                    }
                } catch {
                    code.value = error.code
                }
                launchEnded.value = true
            }
            let outer = loop.run(in: .default, until: .after(patience(.seconds(30))))
            return (code.value, outer)
        }
        #expect(code == .interrupted)
        #expect(outer == .stopped)
    }

    /// A worker whose check-in is dropped unread (its launcher gave up: here the check-in
    /// port, scheduled in a mode nobody runs, is invalidated with the message still in its
    /// mailbox) loses, with the message, the only right to its port: it ends by itself.
    @Test func aWorkerWhoseCheckInIsDroppedUnreadEnds() throws {
        try onLoopThread(timeout: patience(.seconds(30))) { loop in
            let listener = PKReceivePort()
            try loop.add(listener, forMode: "worker-unread-check-in")
            let checkInRight = PKSendPort(localRight: LocalRight(port: listener))
            let workerPort = Locked<PKReceivePort?>(nil)
            let thread = try SystemThread(name: "unread") {
                try? WorkerRuntime.serve(name: "unread", mainPort: nil, checkInRight: checkInRight) { context in
                    workerPort.value = context.port
                }
            }
            try waitUntil("the check-in to be sent", timeout: patience(.seconds(10))) { listener.shared.withLock { !$0.mailbox.isEmpty } }
            listener.invalidate()
            let ended = thread.join(until: .after(patience(.seconds(10))))
            if !ended { thread.detach() }
            #expect(ended, "the worker did not end")
            #expect(workerPort.value?.isValid == false)
            workerPort.value = nil
        }
    }

    @Test func workerThatEndsBeforeCheckingInFails() throws {
        struct SetUpFailed: Error {}
        try onLoopThread { _ in
            #expect {
                _ = try PKWorkerThread(name: "quitter", checkInTimeout: .seconds(20)) { _ in throw SetUpFailed() }
            } throws: { ($0 as? PKError)?.code == .checkInFailed }
        }
    }
}
