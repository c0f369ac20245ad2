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

    @Test func workerThatEndsBeforeCheckingInFails() throws {
        struct SetUpFailed: Error {}
        try onLoopThread { _ in
            #expect {
                _ = try PKWorkerThread(name: "quitter", checkInTimeout: .seconds(20)) { _ in throw SetUpFailed() }
            } throws: { ($0 as? PKError)?.code == .checkInFailed }
        }
    }
}
