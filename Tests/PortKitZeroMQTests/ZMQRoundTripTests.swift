#if ZeroMQ
// Round trips and request/reply through ZeroMQ ports in one process, over tcp://127.0.0.1
// (ephemeral ports) and ipc:// (in a private directory).

import Testing
import Foundation
import Glibc
@testable import PortKit
import PortKitZeroMQ

@Suite struct ZMQRoundTripTests {
    static let endpoints: [String] = ["tcp://127.0.0.1:*", "ipc"]

    /// A bindable endpoint for `kind`: tcp as given, ipc in a fresh private directory.
    static func endpoint(_ kind: String, _ directory: TemporaryDirectory, _ name: String = "port") -> String {
        kind == "ipc" ? directory.endpoint(name) : kind
    }

    @Test(arguments: endpoints) func roundTripWithComponentsAndReplyPort(kind: String) throws {
        let directory = TemporaryDirectory()
        try onLoopThread { loop in
            var received: [PKZMQMessage] = []
            let port = try PKZMQReceivePort(bindingTo: Self.endpoint(kind, directory)) { received.append($0) }
            try loop.add(port, forMode: .default)
            let other = try PKZMQReceivePort(bindingTo: Self.endpoint(kind, directory, "other"))
            #expect(!port.endpoint.hasSuffix("*"))

            let right = try PKZMQSendPort(connectingTo: port.endpoint)
            let big = [UInt8]((0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
            let message = PKZMQMessage(
                msgid: 42,
                components: [.data(Array("hello".utf8)), .data([]), .port(other.makeSendRight()), .data(big)],
                replyPort: port.makeSendRight())
            try right.send(message, timeout: .seconds(5))
            try right.send(PKZMQMessage(msgid: 7), timeout: .seconds(5))
            // One data component (held as its bytes alone), empty or not, and one port alone.
            try right.send(PKZMQMessage(msgid: 8, data: [9, 8]), timeout: .seconds(5))
            try right.send(PKZMQMessage(msgid: 9, components: [.data([])]), timeout: .seconds(5))
            try right.send(PKZMQMessage(msgid: 10, components: [.port(other.makeSendRight())]), timeout: .seconds(5))
            try run(loop, until: "five messages") { received.count == 5 }

            let first = received[0]
            #expect(first.msgid == 42)
            #expect(first.components.count == 4)
            #expect(first.components[0].data == Array("hello".utf8))
            #expect(first.components[1].data == [])
            #expect(first.components[2].port?.endpoint == other.endpoint)
            #expect(first.components[3].data == big)
            #expect(first.replyPort == port.makeSendRight())
            #expect(received[1].msgid == 7 && received[1].components.isEmpty && received[1].replyPort == nil)
            #expect(received[2].components.map(\.data) == [[9, 8]] && received[2].data == [9, 8] && received[2].ports.isEmpty)
            #expect(received[3].components.map(\.data) == [[]] && received[3].data.isEmpty)
            #expect(received[4].components.count == 1 && received[4].ports.map(\.endpoint) == [other.endpoint])
            port.invalidate()
            other.invalidate()
        }
    }

    @Test(arguments: endpoints) func requestReply(kind: String) throws {
        let directory = TemporaryDirectory()
        let server = try ZMQEchoServer(endpoint: Self.endpoint(kind, directory))
        defer { server.stop() }
        try onLoopThread { loop in
            let right = try PKZMQSendPort(connectingTo: server.endpoint)
            var modesAfterFirst = 0
            for round in UInt32(1)...20 {
                let reply = try right.sendRequest(
                    PKZMQMessage(msgid: round, data: Array("ping \(round)".utf8)),
                    sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
                #expect(reply?.msgid == round)
                #expect(reply?.text == "ping \(round)")
                if round == 1 { modesAfterFirst = loop.modeItems.count }
            }
            // Every request waited in the same private mode (each made a mode of its own, and
            // the loop kept a record of each for as long as it lived).
            #expect(loop.modeItems.count == modesAfterFirst)
            // A one-way send through the same call returns nil.
            #expect(try right.sendRequest(PKZMQMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: nil) == nil)
        }
    }

    /// The port ids of requests' replies cannot be guessed from one another (protocol.md 10.1:
    /// any message to one counts as its reply): not 0, not repeated, and not a count, whose next
    /// value a peer that received one request would know.
    @Test func replyPortIDsCannotBeGuessed() throws {
        let ids = Locked<[UInt64]>([])
        let server = try ZMQEchoServer(endpoint: "tcp://127.0.0.1:*") { message in
            ids.withLock { $0.append(message.replyPort?.portID ?? 0) }
            try? message.replyPort?.send(PKZMQMessage(msgid: message.msgid), timeout: .seconds(5))
        }
        defer { server.stop() }
        try onLoopThread { loop in
            let right = try PKZMQSendPort(connectingTo: server.endpoint)
            for round in UInt32(1)...8 {
                let reply = try right.sendRequest(PKZMQMessage(msgid: round), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
                #expect(reply?.msgid == round)
            }
        }
        let seen = ids.value
        #expect(seen.count == 8 && !seen.contains(0) && Set(seen).count == 8)
        // Eight random 64-bit ids: that any two are within 1,000 of each other is a chance of
        // about 2^-44.
        let sorted = seen.sorted()
        #expect(zip(sorted, sorted.dropFirst()).allSatisfy { $1 - $0 > 1_000 }, "reply port ids \(seen)")
    }

    /// `PKZMQTransport.replyHost` set to a wildcard (bind on every address): the reply port
    /// travels as the local address toward the destination, which the receiver accepts (a
    /// port component never carries a wildcard, protocol.md 10.3). In a child process, since
    /// the setting is process-wide.
    @Test func aWildcardReplyHostIsAdvertisedAsAnAddress() async {
        await #expect(processExitsWith: .success) {
            PKZMQTransport.replyHost = "0.0.0.0"
            let server = try ZMQEchoServer(endpoint: "tcp://127.0.0.1:*")
            defer { server.stop() }
            let msgid = try onLoopThread { _ -> UInt32? in
                let right = try PKZMQSendPort(connectingTo: server.endpoint)
                return try right.sendRequest(PKZMQMessage(msgid: 3, data: [1]), sendTimeout: .seconds(5),
                                             receiveTimeout: .seconds(10))?.msgid
            }
            precondition(msgid == 3, "no reply through a wildcard reply host")
        }
    }

    @Test func asyncRequestReply() async throws {
        let server = try ZMQEchoServer(endpoint: "tcp://127.0.0.1:*")
        defer { server.stop() }
        let right = try PKZMQSendPort(connectingTo: server.endpoint)
        let reply = try await right.request(PKZMQMessage(msgid: 5, data: [1, 2, 3]), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        #expect(reply.msgid == 5 && reply.data == [1, 2, 3])
    }

    /// Async requests that wait for their connection (nothing bound at the endpoint yet) hold
    /// no thread of Swift concurrency's pool: another task runs while they wait, and once a
    /// port is bound there each request gets its reply. (Each request held a pool thread until
    /// its connection came: with more requests than threads, every other task waited as long.)
    @Test func asyncRequestsWaitingForTheirConnectionLeaveThePoolFree() async throws {
        let directory = TemporaryDirectory()
        let endpoint = directory.endpoint("later")
        let right = try PKZMQSendPort(connectingTo: endpoint)
        let count = UInt32(4 * max(2, sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        let replies = Locked<[UInt32]>([])
        let failures = Locked<[String]>([])
        var requests: [Task<Void, Never>] = []
        for id in UInt32(0)..<count {
            requests.append(Task {
                do throws(PKError) {
                    // The send deadline bounds every wait of this test: a starved pool runs
                    // nothing else until the requests give up.
                    let reply = try await right.request(PKZMQMessage(msgid: id), sendTimeout: patience(.seconds(30)), receiveTimeout: patience(.seconds(30)))
                    replies.withLock { $0.append(reply.msgid) }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            })
        }
        let ranWhileTheyWaited = await Task { replies.value.isEmpty && failures.value.isEmpty }.value
        #expect(ranWhileTheyWaited, "another task ran while the requests waited for their connection")
        let server = try ZMQEchoServer(endpoint: endpoint)
        defer { server.stop() }
        for request in requests { await request.value }
        #expect(failures.value.isEmpty, "\(failures.value)")
        #expect(replies.value.sorted() == Array(0..<count))
    }

    /// Cancelling the task of an async request ends its wait at once with `.cancelled` (it
    /// waited for the reply or the whole receive timeout).
    @Test func cancellingAnAsyncRequestEndsItsWait() async throws {
        let arrived = Locked(false)
        let server = try ZMQEchoServer(endpoint: "tcp://127.0.0.1:*") { _ in arrived.value = true }  // never answers
        defer { server.stop() }
        let right = try PKZMQSendPort(connectingTo: server.endpoint)
        let outcome = Locked<String?>(nil)
        let task = Task {
            do throws(PKError) {
                _ = try await right.request(PKZMQMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(600))
                outcome.value = "a reply"
            } catch {
                outcome.value = "\(error.code)"
            }
        }
        // Waits that suspend, not block: the request's task needs a thread of the pool.
        func awaitCondition(_ what: String, _ condition: () -> Bool) async throws {
            let deadline = PKDeadline.after(patience(.seconds(20)))
            while !condition() {
                if deadline.hasPassed { throw TestTimeout(what: what) }
                try await Task.sleep(for: .milliseconds(5))
            }
        }
        try await awaitCondition("the request to arrive") { arrived.value }
        task.cancel()
        try await awaitCondition("the cancelled request to end") { outcome.value != nil }
        #expect(outcome.value == "\(PKError.Code.cancelled)")
    }

    @Test func requestToASilentPortTimesOut() throws {
        try onLoopThread { loop in
            let silent = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            try loop.add(silent, forMode: .default)
            let right = silent.makeSendRight()
            let started = PKDeadline.now
            expectPKError(.receiveTimedOut) {
                try right.sendRequest(PKZMQMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .milliseconds(300))
            }
            #expect(PKDeadline.now - started >= .milliseconds(300))
            silent.invalidate()
        }
    }

    /// A stop of the caller's loop while a request waits (here by the server, once it has the
    /// request, which it leaves unanswered) ends the request with `.interrupted`, long before
    /// its deadline, and reaches the run the request was made in.
    @Test func aStopWhileWaitingInterruptsTheRequestAndReachesTheOuterRun() throws {
        let requester = Locked<PKRunLoop?>(nil)
        let server = try ZMQEchoServer(endpoint: "tcp://127.0.0.1:*") { _ in requester.value?.stop() }
        defer { server.stop() }
        let (code, outer) = try onLoopThread { loop in
            requester.value = loop
            let keep = PKCustomSource(perform: {})
            loop.add(keep, forMode: .default)
            defer { keep.invalidate() }
            let right = try PKZMQSendPort(connectingTo: server.endpoint)
            let code = Locked<PKError.Code?>(nil)
            loop.perform(inModes: [.default]) {
                do throws(PKError) {
                    try right.sendRequest(PKZMQMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(20))
                } catch {
                    code.value = error.code
                }
            }
            let outer = loop.run(in: .default, until: .after(.seconds(30)))
            return (code.value, outer)
        }
        #expect(code == .interrupted)
        #expect(outer == .stopped)
    }

    @Test func sendToAnEndpointNobodyBoundTimesOut() throws {
        let right = try PKZMQSendPort(connectingTo: "tcp://127.0.0.1:1")
        expectPKError(.sendTimedOut) { try right.send(PKZMQMessage(msgid: 1), timeout: .milliseconds(200)) }
        #expect(right.isValid)
    }

    @Test func invalidatingAReceivePortInvalidatesItsSendRights() throws {
        try onLoopThread { loop in
            var received = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { _ in received += 1 }
            try loop.add(port, forMode: .default)
            var invalidated = 0
            port.onInvalidation = { invalidated += 1 }
            let right = try PKZMQSendPort(connectingTo: port.endpoint)
            try right.send(PKZMQMessage(msgid: 1), timeout: .seconds(5))
            try run(loop, until: "the first message") { received == 1 }
            var watched = false
            let watch = try right.watchInvalidation(on: loop) { watched = true }
            port.invalidate()
            port.invalidate()
            #expect(invalidated == 1)
            #expect(!port.isValid)
            try run(loop, until: "the watch to fire") { watched }
            #expect(!right.isValid)
            expectPKError(.invalidPort) { try right.send(PKZMQMessage(msgid: 2), timeout: .seconds(1)) }
            watch.cancel()
        }
    }

    /// A cancelled watch lets go of its handler (and whatever the handler holds) once its loop
    /// has dropped it. (The watch's source held itself, and its handler, in a cycle that only
    /// its firing broke: the name server's every registration that ended without its port
    /// dying stayed, with its connection.)
    @Test func aCancelledWatchReleasesItsHandler() throws {
        final class Held: Sendable {}
        try onLoopThread { loop in
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            defer { port.invalidate() }
            let right = try PKZMQSendPort(connectingTo: port.endpoint)
            weak var probe: Held?
            do {
                let held = Held()
                probe = held
                let watch = try right.watchInvalidation(on: loop, forMode: .default) { withExtendedLifetime(held) {} }
                watch.cancel()
            }
            loop.runOnePass()
            #expect(probe == nil)
        }
    }

    /// Invalidated from another thread, then again on its loop's thread before the loop ran:
    /// the second call finishes the invalidation there and then, as a receive port of the
    /// core does, rather than leave `onInvalidation` to a pass that may never come (the loop
    /// may stop first). It waited for that pass.
    @Test func anInvalidationAskedElsewhereIsFinishedByOneOnTheLoop() throws {
        try onLoopThread { loop in
            var calls = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            port.onInvalidation = { calls += 1 }
            try loop.add(port, forMode: .default)
            let other = Thread { port.invalidate() }
            other.start()
            try waitUntil("the other thread's invalidation", timeout: patience(.seconds(10))) { !port.isValid }
            #expect(calls == 0)
            port.invalidate()
            #expect(calls == 1)
            loop.runOnePass()
            #expect(calls == 1)
        }
    }

    @Test func anInvalidatedPortsEndpointIsFreeAtOnce() throws {
        let directory = TemporaryDirectory()
        let first = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
        let fixed = first.endpoint
        for endpoint in [fixed, "ipc://@portkit-zmq-rebind-\(getpid())", directory.endpoint("rebind")] {
            var port = endpoint == fixed ? first : try PKZMQReceivePort(bindingTo: endpoint)
            for _ in 0..<20 {
                port.invalidate()
                port = try PKZMQReceivePort(bindingTo: endpoint)
            }
            port.invalidate()
        }
    }

    /// The same while another thread spawns processes: each child holds a copy of every
    /// descriptor until it executes (the listener's too, close-on-exec or not), and an address
    /// without a file (tcp, abstract ipc) is free only when the last copy goes. A bind waits a
    /// moment for that instead of failing.
    @Test func anInvalidatedPortsEndpointIsFreeWhileTheProcessSpawns() throws {
        let spawning = Locked(true)
        let spawned = Locked(0)
        let spawnFailed = Locked<Int32?>(nil)
        let finished = Locked(false)
        let spawner = Thread {
            defer { finished.value = true }
            var argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/true"), nil]
            defer { free(argv[0]) }
            while spawning.value {
                var pid: pid_t = 0
                let failure = posix_spawn(&pid, "/bin/true", nil, nil, &argv, environ)
                guard failure == 0 else {
                    spawnFailed.value = failure
                    break
                }
                var status: Int32 = 0
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                spawned.withLock { $0 += 1 }
            }
        }
        spawner.start()
        defer {
            spawning.value = false
            try? waitUntil("the spawning thread to end", timeout: .seconds(10)) { finished.value }
        }
        try waitUntil("a first spawn") { spawned.value > 0 }
        let first = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
        let fixed = first.endpoint
        for endpoint in [fixed, "ipc://@portkit-zmq-rebind-spawning-\(getpid())"] {
            var port = endpoint == fixed ? first : try PKZMQReceivePort(bindingTo: endpoint)
            for _ in 0..<300 {
                port.invalidate()
                port = try PKZMQReceivePort(bindingTo: endpoint)
            }
            port.invalidate()
        }
        #expect(spawnFailed.value == nil, "posix_spawn failed (\(spawnFailed.value ?? 0)): the test spawned less than it meant to")
    }

    @Test func explicitlyInvalidatedRightRefusesToSend() throws {
        let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
        let right = port.makeSendRight()
        let copy = right
        right.invalidate()
        #expect(!copy.isValid)
        expectPKError(.invalidPort) { try copy.send(PKZMQMessage(msgid: 1), timeout: .seconds(1)) }
        // Another right to the same port is unaffected.
        #expect(port.makeSendRight().isValid)
        port.invalidate()
    }
}
#endif
