#if ZeroMQ
// A peer that dies or falls silent is noticed: kill -9 at once (its kernel closes the
// connection), a stopped process over tcp:// within the heartbeat bound; over ipc:// a stopped
// process is alive (no heartbeats). Each test sets a short heartbeat, a process-wide setting,
// so it runs in a child process of its own (IsolatedRun).

import Testing
import Foundation
import PortKit
import PortKitZeroMQ

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
}
#endif
