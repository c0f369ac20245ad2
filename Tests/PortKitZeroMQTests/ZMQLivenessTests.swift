#if ZeroMQ
// A peer that dies or falls silent is noticed: kill -9 at once (its kernel closes the
// connection), a stopped process over tcp:// within the heartbeat bound; over ipc:// a stopped
// process is alive (no heartbeats). Each test sets a short heartbeat, a process-wide setting,
// so it runs in a child process of its own (IsolatedRun).

import Testing
import Foundation
import Glibc
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQLivenessTests {
    static let heartbeat = PKZMQHeartbeat(interval: .milliseconds(200), timeout: .milliseconds(600))

    /// Sets this process's heartbeat to the short one (the peer keeps the default), spawns a
    /// peer holding a port at `endpoint`, connects a right to it, proves the connection with a
    /// request, and runs `body` on a loop thread.
    static func withAnsweringPeer<R: Sendable>(
        _ endpoint: String, _ body: @escaping @Sendable (PKRunLoop, ZMQPeerProcess, PKZMQSendPort) throws -> R
    ) throws -> R {
        PKZMQTransport.heartbeat = heartbeat
        let peer = try ZMQPeerProcess(["hold", endpoint])
        defer { peer.kill(SIGKILL) }
        let bound = try peer.expectLine(startingWith: "ready")
        return try onLoopThread { loop in
            let right = try PKZMQSendPort(connectingTo: bound)
            let reply = try right.sendRequest(PKZMQMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
            try IsolatedRun.require(reply?.msgid == 1, "the peer did not answer")
            return try body(loop, peer, right)
        }
    }

    /// The time from `signal` to a peer to its send right's invalidation watch firing.
    static func timeToNotice(_ signal: Int32, endpoint: String = "tcp://127.0.0.1:*") throws -> Duration {
        try withAnsweringPeer(endpoint) { loop, peer, right in
            var noticedAt: PKDeadline?
            let watch = try right.watchInvalidation(on: loop, forMode: .default) { noticedAt = .now }
            let sentAt = PKDeadline.now
            peer.kill(signal)
            try run(loop, until: "the peer's death to be noticed", timeout: .seconds(10)) { noticedAt != nil }
            try IsolatedRun.require(!right.isValid, "the right is still valid")
            watch.cancel()
            return noticedAt! - sentAt
        }
    }

    @Test func killNineOfAPeerIsNoticedAtOnce() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                for endpoint in ["tcp://127.0.0.1:*", "ipc://@portkit-zmq-test-kill-\(getpid())"] {
                    let noticed = try ZMQLivenessTests.timeToNotice(SIGKILL, endpoint: endpoint)
                    print("kill -9 over \(endpoint.prefix(6)) noticed after \(noticed)")
                    try IsolatedRun.require(noticed < ZMQLivenessTests.heartbeat.bound, "kill -9 noticed after \(noticed)")
                }
            }
        }
        IsolatedRun.check(result)
    }

    @Test func aStoppedPeerIsNoticedWithinTheHeartbeatBound() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                let noticed = try ZMQLivenessTests.timeToNotice(SIGSTOP)
                print("SIGSTOP noticed after \(noticed); heartbeat bound \(ZMQLivenessTests.heartbeat.bound)")
                // Not before the timeout (it was silence, not a closed connection), and within
                // the bound plus scheduling slack.
                try IsolatedRun.require(noticed >= ZMQLivenessTests.heartbeat.timeout, "noticed after only \(noticed)")
                try IsolatedRun.require(noticed < ZMQLivenessTests.heartbeat.bound + .milliseconds(500), "a stopped peer noticed after \(noticed)")
            }
        }
        IsolatedRun.check(result)
    }

    /// A `tcp://` receiver that is alive but behind (its loop busy past the heartbeat bound,
    /// its queue full, so libzmq stops reading the connection, PINGs and all) is not taken for
    /// dead: its senders' sends wait for room, and every message arrives once it reads again.
    @Test func aReceiverThatIsBehindOverTCPIsAlive() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                // The default heartbeats, not the short ones: under load, an I/O thread held up
                // for 600 ms could run an expired timer before it reads a PING.
                let heartbeat = PKZMQHeartbeat.default
                PKZMQTransport.heartbeat = heartbeat
                try onLoopThread { loop in
                    var limits = PKPortLimits.default
                    limits.maxQueuedMessages = 4
                    var received = 0
                    let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*", limits: limits) { _ in received += 1 }
                    defer { port.invalidate() }
                    try loop.add(port, forMode: .default)
                    let right = try PKZMQSendPort(connectingTo: port.endpoint)
                    try right.send(PKZMQMessage(msgid: 0), timeout: .seconds(10))
                    try run(loop, until: "the first message") { received == 1 }
                    // Messages of 64 KiB go alone, one frame each: queues of 4 frames, and
                    // the sockets' buffers, fill long before the last. The loop does not read
                    // for two heartbeat bounds.
                    let total = 200
                    let sender = Locked<String?>(nil)
                    let thread = Thread {
                        for msgid in 1...UInt32(total) {
                            do {
                                try right.send(PKZMQMessage(msgid: msgid, data: [UInt8](repeating: 7, count: 64 * 1024)), timeout: .seconds(30))
                            } catch {
                                sender.value = "message \(msgid): \(error)"
                                return
                            }
                        }
                        sender.value = "sent"
                    }
                    thread.start()
                    sleepFor(heartbeat.bound * 2)
                    try IsolatedRun.require(right.isValid, "a receiver that is behind was taken for dead")
                    try run(loop, until: "every message", timeout: .seconds(30)) { received == total + 1 || sender.value?.hasPrefix("message") == true }
                    try waitUntil("the sender's end", timeout: .seconds(30)) { sender.value != nil }
                    try IsolatedRun.require(sender.value == "sent", "\(sender.value ?? "")")
                    try IsolatedRun.require(received == total + 1 && right.isValid, "\(received) of \(total + 1) arrived")
                }
            }
        }
        IsolatedRun.check(result)
    }

    /// A heartbeat timeout past what the TTL can carry asks the longest TTL instead: 65.5 s
    /// (libzmq keeps a peer's TTL in 16 bits of milliseconds; past 6,553.5 s it refused the
    /// option, and every `tcp://` bind failed).
    @Test func aLongHeartbeatTimeoutAsksTheLongestTTL() throws {
        let heartbeat = PKZMQHeartbeat(interval: .seconds(1), timeout: .seconds(7_200))
        #expect(heartbeat.ttlMilliseconds == 65_500)
        // "Never" saturates, not traps.
        let never = PKZMQHeartbeat(interval: .seconds(Int64.max), timeout: .seconds(Int64.max))
        #expect(never.intervalMilliseconds == Int32.max && never.timeoutMilliseconds == Int32.max && never.ttlMilliseconds == 65_500)
        // The last whole second before the milliseconds overflow, and a fraction more.
        let edge = PKZMQHeartbeat(interval: .seconds(Int64.max / 1000) + .milliseconds(999), timeout: .seconds(3))
        #expect(edge.intervalMilliseconds == Int32.max)
        let socket = try ZMQSocket(.pull)
        defer { socket.close() }
        try socket.setOption(ZMQOption.heartbeatTTL, heartbeat.ttlMilliseconds)
    }

    /// Over ipc:// there are no heartbeats (protocol.md 10.5): a stopped process on this host is
    /// alive, as a stopped owner of a Unix-socket port is. Its right stays valid past the
    /// heartbeat bound, and the peer answers once it continues. (It fails with heartbeats on
    /// either side: this process's connection to the peer, or its reply port's listener, which
    /// would drop the peer's connection that carries the reply.)
    @Test func aStoppedPeerOverIPCIsAlive() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                try ZMQLivenessTests.withAnsweringPeer("ipc://@portkit-zmq-test-stop-\(getpid())") { loop, peer, right in
                    var noticed = false
                    let watch = try right.watchInvalidation(on: loop, forMode: .default) { noticed = true }
                    peer.kill(SIGSTOP)
                    // Twice the heartbeat bound: heartbeats would have ended the connection.
                    let until = PKDeadline.after(ZMQLivenessTests.heartbeat.bound * 2)
                    while !until.hasPassed && !noticed { loop.run(in: .default, until: until) }
                    try IsolatedRun.require(!noticed && right.isValid, "a stopped ipc:// peer was taken for dead")
                    peer.kill(SIGCONT)
                    let later = try right.sendRequest(PKZMQMessage(msgid: 2), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
                    try IsolatedRun.require(later?.msgid == 2, "the continued peer did not answer")
                    watch.cancel()
                }
            }
        }
        IsolatedRun.check(result)
    }

    @Test func requestToAPeerThatFallsSilentFailsWithPortInvalidated() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                try ZMQLivenessTests.withAnsweringPeer("tcp://127.0.0.1:*") { _, peer, right in
                    peer.kill(SIGSTOP)
                    // The stopped peer cannot answer; the heartbeat ends the wait long before its timeout.
                    let started = PKDeadline.now
                    do {
                        _ = try right.sendRequest(PKZMQMessage(msgid: 2), sendTimeout: .seconds(5), receiveTimeout: .seconds(30))
                        try IsolatedRun.require(false, "a stopped peer answered")
                    } catch let error as PKError {
                        try IsolatedRun.require(error.code == .portInvalidated, "\(error)")
                    }
                    let waited = PKDeadline.now - started
                    print("the request failed after \(waited)")
                    try IsolatedRun.require(waited < .seconds(10), "the request waited \(waited)")
                }
            }
        }
        IsolatedRun.check(result)
    }

    /// A listening socket that accepts connections and never says a word: a peer stopped (or
    /// slow) before its ZMTP greeting.
    final class SilentListener {
        let descriptor: Int32
        let endpoint: String
        private var accepted: [Int32] = []

        /// Listens on an ephemeral port of 127.0.0.1 (`path` nil) or at the Unix socket `path`.
        init(path: String? = nil) throws {
            let fd: Int32
            if let path {
                fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                var address = sockaddr_un()
                address.sun_family = sa_family_t(AF_UNIX)
                withUnsafeMutableBytes(of: &address.sun_path) { sunPath in
                    for (index, byte) in path.utf8.enumerated() { sunPath[index] = byte }
                }
                let bound = withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
                }
                try IsolatedRun.require(bound == 0, "cannot bind \(path)")
                endpoint = "ipc://\(path)"
            } else {
                fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_addr.s_addr = inet_addr("127.0.0.1")
                var length = socklen_t(MemoryLayout<sockaddr_in>.size)
                let bound = withUnsafeMutablePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
                }
                try IsolatedRun.require(bound, "cannot bind 127.0.0.1")
                endpoint = "tcp://127.0.0.1:\(UInt16(bigEndian: address.sin_port))"
            }
            descriptor = fd
            try IsolatedRun.require(listen(fd, 16) == 0, "cannot listen")
        }

        /// Accepts the next connection, waiting until `deadline`; false if none came.
        func accept(before deadline: PKDeadline) -> Bool {
            var item = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            guard poll(&item, 1, Descriptors.pollTimeout(until: deadline)) == 1 else { return false }
            let connection = Glibc.accept(descriptor, nil, nil)
            if connection >= 0 { accepted.append(connection) }
            return connection >= 0
        }

        func close() {
            for connection in accepted { Glibc.close(connection) }
            accepted = []
            Glibc.close(descriptor)
        }
    }

    /// A `tcp://` peer that accepts and never greets: the handshake times out (shortened here),
    /// libzmq drops the connection and makes another, again and again, and the send right stays
    /// valid (protocol.md 10.5: a connection that never succeeded keeps trying). Any failed handshake used to kill the connection, so a peer
    /// stopped or slow before its greeting was dead after libzmq's 30 s.
    @Test func aPeerSilentBeforeItsHandshakeOverTCPIsTriedAgain() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                ZMQSocket.handshakeMilliseconds.store(200, ordering: .relaxed)
                let listener = try SilentListener()
                defer { listener.close() }
                let right = try PKZMQSendPort(connectingTo: listener.endpoint)
                let deadline = PKDeadline.after(patience(.seconds(10)))
                // Each connection after the first: the one before's handshake timed out, and the
                // connection lived on.
                for connection in 1...3 {
                    try IsolatedRun.require(listener.accept(before: deadline), "libzmq did not make connection \(connection)")
                }
                try IsolatedRun.require(right.isValid, "a peer silent before its handshake was taken for dead")
            }
        }
        IsolatedRun.check(result)
    }

    /// An `ipc://` peer that accepts and never greets (as a peer stopped before its handshake)
    /// is alive: the connection has no handshake time limit, so it stays the one connection,
    /// and its send right valid, past several times the `tcp://` limit (shortened here). With
    /// libzmq's limit (30 s) the connection failed, and was taken for dead.
    @Test func aPeerSilentBeforeItsHandshakeOverIPCIsAlive() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                ZMQSocket.handshakeMilliseconds.store(200, ordering: .relaxed)
                let directory = TemporaryDirectory()
                let listener = try SilentListener(path: "\(directory.path)/silent")
                defer { listener.close() }
                let right = try PKZMQSendPort(connectingTo: listener.endpoint)
                try IsolatedRun.require(listener.accept(before: .after(patience(.seconds(10)))), "libzmq did not connect")
                // Five times the tcp:// limit: with a limit, libzmq would have connected again.
                try IsolatedRun.require(!listener.accept(before: .after(.seconds(1))), "the connection was dropped and made again")
                try IsolatedRun.require(right.isValid, "a peer silent before its handshake was taken for dead")
            }
        }
        IsolatedRun.check(result)
    }
}
#endif
