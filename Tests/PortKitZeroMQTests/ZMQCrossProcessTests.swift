#if ZeroMQ
// ZeroMQ ports between processes: every peer is the PortKitZMQPeer helper, spawned (never
// forked).

import Testing
import Foundation
import PortKit
import PortKitZeroMQ

@Suite(.serialized) struct ZMQCrossProcessTests {
    @Test func secondBinderIsRefusedOnALiveIPCEndpoint() throws {
        let directory = TemporaryDirectory()
        let endpoint = directory.endpoint("claimed")

        // Another process holds it: this one is refused, and libzmq did not steal it.
        let holder = try ZMQPeerProcess(["echo", endpoint])
        #expect(try holder.expectLine(startingWith: "ready") == endpoint)
        expectPKError(.nameInUse) { _ = try PKZMQReceivePort(bindingTo: endpoint) }
        let reply = try onLoopThread { _ in
            try PKZMQSendPort(connectingTo: endpoint).sendRequest(PKZMQMessage(msgid: 5), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        }
        #expect(reply?.msgid == 5)

        // The holder dies by kill -9: the kernel drops its lock, and the endpoint is free at once.
        holder.kill()
        try holder.waitForExit()
        let port = try PKZMQReceivePort(bindingTo: endpoint)

        // This process holds it: another process is refused.
        let second = try ZMQPeerProcess(["bind", endpoint])
        #expect(try second.readLine() == "refused nameInUse")
        second.endInput()
        #expect(try second.waitForExit() == 0)

        // Released on invalidation: the socket file and the lock file go, and a new binder wins.
        port.invalidate()
        #expect(!FileManager.default.fileExists(atPath: directory.path + "/claimed"))
        #expect(!FileManager.default.fileExists(atPath: directory.path + "/claimed.lock"))
        let third = try ZMQPeerProcess(["bind", endpoint])
        #expect(try third.readLine() == "bound")
        third.endInput()
        #expect(try third.waitForExit() == 0)
    }

    @Test func eightSendersOfTenThousandMessagesLoseNone() throws {
        let senders = 8
        let count = 10_000
        try onLoopThread(timeout: .seconds(180)) { loop in
            var next = [Int](repeating: 0, count: senders + 1)
            var outOfOrder = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
                if message.msgid == 0 {
                    try? message.replyPort?.send(PKZMQMessage(msgid: 0), timeout: .seconds(10))
                    return
                }
                let sender = Int(message.msgid)
                let index = message.data.withUnsafeBytes { Int(UInt32(littleEndian: $0.loadUnaligned(as: UInt32.self))) }
                if index != next[sender] { outOfOrder += 1 }
                next[sender] = index + 1
            }
            try loop.add(port, forMode: .default)
            let peers = try (1...senders).map { try ZMQPeerProcess(["flood", port.endpoint, "\($0)", "\(count)"]) }
            do {
                try run(loop, until: "every message", timeout: .seconds(150)) { next.dropFirst().allSatisfy { $0 == count } }
            } catch {
                Issue.record("after 150 s, each sender's next index: \(next.dropFirst())")
                throw error
            }
            #expect(outOfOrder == 0)
            #expect(Array(next.dropFirst()) == [Int](repeating: count, count: senders))
            // Each sender's final request is answered only after its messages: it prints "done".
            let deadline = PKDeadline.after(.seconds(30))
            for peer in peers {
                while peer.process.isRunning && !deadline.hasPassed { loop.run(in: .default, until: .after(.milliseconds(20))) }
                #expect(try peer.expectLine(startingWith: "done", timeout: .seconds(1)) == "")
                #expect(try peer.waitForExit() == 0)
            }
            port.invalidate()
        }
    }

    @Test func guideCheckInOverZeroMQBetweenTwoProcesses() throws {
        try onLoopThread { loop in
            var workerPort: PKZMQSendPort?
            var answers: [String] = []
            let myPort = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
                if message.msgid == 100 {
                    workerPort = message.replyPort  // the guide's [portMessage sendPort]
                } else if message.msgid == 2 {
                    answers.append(message.text)
                }
            }
            try loop.add(myPort, forMode: .default)
            let worker = try ZMQPeerProcess(["checkin", myPort.endpoint])
            try run(loop, until: "the worker's check-in (msgid 100)", timeout: .seconds(20)) { workerPort != nil }
            let toWorker = try #require(workerPort)
            var workerGone = false
            let watch = try toWorker.watchInvalidation(on: loop, forMode: .default) { workerGone = true }
            for text in ["the guide's check-in", "over zeromq", "between two processes"] {
                try toWorker.send(PKZMQMessage(msgid: 1, data: Array(text.utf8), replyPort: myPort.makeSendRight()), timeout: .seconds(5))
            }
            try run(loop, until: "three answers") { answers.count == 3 }
            #expect(answers == ["THE GUIDE'S CHECK-IN", "OVER ZEROMQ", "BETWEEN TWO PROCESSES"])
            try toWorker.send(PKZMQMessage(msgid: 99), timeout: .seconds(5))
            #expect(try worker.waitForExit() == 0)
            try run(loop, until: "the worker's port to be seen gone") { workerGone }
            #expect(!toWorker.isValid)
            watch.cancel()
            myPort.invalidate()
        }
    }
}
#endif
