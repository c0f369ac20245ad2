// Delivery beyond the run loop (design section 8): a port as an AsyncSequence, on a
// DispatchQueue, and async request/reply.

import Dispatch
import Testing
@testable import PortKit

/// Runs `body`, failing with `TestTimeout` if it has not finished after `timeout`.
func withDeadline<R: Sendable>(
    _ timeout: Duration, _ what: String, _ body: @escaping @Sendable () async throws -> R
) async throws -> R {
    try await withThrowingTaskGroup(of: R?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try? await Task.sleep(for: patience(timeout))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw TestTimeout(what: what) }
        return value
    }
}

@Suite struct PortAsyncTests {
    /// `for await message in try port.messages()`: every message a thread sends arrives, in
    /// order; leaving the loop invalidates the port.
    @Test func messagesAsAnAsyncSequence() async throws {
        let port = PKReceivePort()
        let right = port.makeSendRight()
        let count = 500
        let sendFailures = Locked<[String]>([])
        let sender = TestThread {
            // The consumer may be slow to start (the concurrency pool is shared): wait for room.
            for id in 0..<count {
                do { try right.send(PKPortMessage(msgid: UInt32(id), data: [UInt8(truncatingIfNeeded: id)]), timeout: patience(.seconds(30))) } catch {
                    sendFailures.withLock { $0.append("\(id): \(error)") }
                }
            }
        }
        let ids = try await withDeadline(.seconds(30), "\(count) messages") {
            var ids: [UInt32] = []
            for await message in try port.messages() {
                #expect(message.data == [UInt8(truncatingIfNeeded: message.msgid)])
                ids.append(message.msgid)
                if ids.count == count { break }
            }
            return ids
        }
        #expect(ids == (0..<UInt32(count)).map { $0 })
        try sender.joinPatiently()
        #expect(sendFailures.value.isEmpty)
        try waitPatiently("the port to be invalidated when the iteration ended") { !port.isValid }
        #expect(!right.isValid)
    }

    /// The sequence finishes when the port is invalidated, after the messages that arrived.
    @Test func theSequenceFinishesWhenThePortIsInvalidated() async throws {
        let port = PKReceivePort()
        let stream = try port.messages()
        let right = port.makeSendRight()
        let sender = TestThread {
            for id in UInt32(0)..<3 { try? right.send(PKPortMessage(msgid: id), timeout: patience(.seconds(30))) }
        }
        let ids = try await withDeadline(.seconds(30), "the sequence to finish") {
            var ids: [UInt32] = []
            for await message in stream {
                ids.append(message.msgid)
                if ids.count == 3 { port.invalidate() }
            }
            return ids
        }
        #expect(ids == [0, 1, 2])
        try sender.joinPatiently()
    }

    /// `deliver(on:)`: messages are handed to the handler on the queue, in order.
    @Test func deliveryOnADispatchQueue() throws {
        let queue = DispatchQueue(label: "portkit.test.delivery")
        let got = Locked<[UInt32]>([])
        let offQueue = Locked(0)
        queue.setSpecific(key: Self.queueKey, value: "delivery")
        let port = PKReceivePort()
        try port.deliver(on: queue) { message in
            if DispatchQueue.getSpecific(key: PortAsyncTests.queueKey) != "delivery" { offQueue.withLock { $0 += 1 } }
            got.withLock { $0.append(message.msgid) }
        }
        let right = port.makeSendRight()
        let count = 300
        let sender = TestThread {
            for id in 0..<count { try? right.send(PKPortMessage(msgid: UInt32(id)), timeout: patience(.seconds(30))) }
        }
        try sender.joinPatiently()
        try waitPatiently("\(count) messages on the queue") { got.value.count == count }
        #expect(got.value == (0..<UInt32(count)).map { $0 })
        #expect(offQueue.value == 0)
        port.invalidate()
        try waitPatiently("invalid") { !right.isValid }
    }

    static let queueKey = DispatchSpecificKey<String>()

    /// `try await right.request(...)`: the reply comes back without the caller running a loop.
    @Test func asyncRequestGetsTheReply() async throws {
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid * 2, data: $0.data.reversed()), timeout: .seconds(5)) }
        }
        let rights = [server.right, try independentRight(to: server.port)]
        try await withDeadline(.seconds(30), "async replies") {
            for right in rights {
                for id in UInt32(1)...10 {
                    let reply = try await right.request(PKPortMessage(msgid: id, data: [1, 2, UInt8(id)]), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10)))
                    #expect(reply.msgid == id * 2)
                    #expect(reply.data == [UInt8(id), 2, 1])
                }
            }
        }
        try server.stop()
    }

    /// Several async requests at once on one right each get their own reply.
    @Test func concurrentAsyncRequests() async throws {
        let server = try PortServer { port, _ in
            port.handler = { try? $0.replyPort?.send(PKPortMessage(msgid: $0.msgid), timeout: .seconds(5)) }
        }
        let right = try independentRight(to: server.port)
        let replies = try await withDeadline(.seconds(30), "concurrent replies") {
            try await withThrowingTaskGroup(of: UInt32.self) { group in
                for id in UInt32(0)..<16 {
                    group.addTask { try await right.request(PKPortMessage(msgid: id), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(10))).msgid }
                }
                var all: [UInt32] = []
                for try await id in group { all.append(id) }
                return all
            }
        }
        #expect(replies.sorted() == Array(0..<16))
        try server.stop()
    }

    /// The async request's receive timeout: a server that keeps the reply port and never
    /// answers gives `.receiveTimedOut`.
    @Test func asyncRequestReceiveTimeout() async throws {
        let kept = Locked<[PKSendPort]>([])
        let server = try PortServer { port, _ in
            port.handler = { message in if let reply = message.replyPort { kept.withLock { $0.append(reply) } } }
        }
        let right = server.right
        let code = try await withDeadline(.seconds(30), "the receive timeout") { () -> PKError.Code? in
            do {
                _ = try await right.request(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .milliseconds(200))
                return nil
            } catch {
                return (error as? PKError)?.code
            }
        }
        #expect(code == .receiveTimedOut)
        kept.value = []
        try server.stop()
    }

    /// The async request's other errors: the port invalid before the request, the port dying
    /// while it waits, and the reply port dropped unanswered.
    @Test func asyncRequestErrors() async throws {
        let dead = try PortServer { _, _ in }
        let deadRight = dead.right
        try dead.stop()
        let kept = Locked<[PKSendPort]>([])
        let dying = try PortServer { port, _ in
            port.handler = { message in
                if let reply = message.replyPort { kept.withLock { $0.append(reply) } }
                port.invalidate()
            }
        }
        let dyingRight = dying.right
        let silent = try PortServer { port, _ in port.handler = { _ in } }
        let silentRight = silent.right
        let codes = try await withDeadline(.seconds(30), "the errors") { () -> [PKError.Code?] in
            var codes: [PKError.Code?] = []
            for right in [deadRight, dyingRight, silentRight] {
                do {
                    _ = try await right.request(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(20)))
                    codes.append(nil)
                } catch {
                    codes.append((error as? PKError)?.code)
                }
            }
            return codes
        }
        #expect(codes == [PKError.Code.invalidPort, .portInvalidated, .portInvalidated])
        kept.value = []
        try dying.joinPatiently()
        try silent.stop()
    }
}
