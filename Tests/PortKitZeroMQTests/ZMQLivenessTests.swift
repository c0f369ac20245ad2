#if ZeroMQ
// A peer that dies or falls silent is noticed: kill -9 at once (its kernel closes the
// connection), a stopped process within the heartbeat bound.

import Testing
import Foundation
import PortKit
import PortKitZeroMQ

@Suite(.serialized) struct ZMQLivenessTests {
    static let heartbeat = PKZMQHeartbeat(interval: .milliseconds(200), timeout: .milliseconds(600))

    /// Spawns a peer holding a port, connects to it, and returns the time from `signal` to the
    /// send right's invalidation watch firing.
    func timeToNotice(_ signal: Int32, endpoint: String = "tcp://127.0.0.1:*") throws -> Duration {
        PKZMQTransport.heartbeat = Self.heartbeat
        let peer = try ZMQPeerProcess(["hold", endpoint])
        let bound = try peer.expectLine(startingWith: "ready")
        defer { peer.kill(SIGKILL) }
        return try onLoopThread { loop in
            let right = try PKZMQSendPort(connectingTo: bound)
            // A request proves the connection is up before the peer goes.
            let reply = try right.sendRequest(PKZMQMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
            #expect(reply?.msgid == 1)
            var noticedAt: PKDeadline?
            let watch = try right.watchInvalidation(on: loop, forMode: .default) { noticedAt = .now }
            let sentAt = PKDeadline.now
            peer.kill(signal)
            try run(loop, until: "the peer's death to be noticed", timeout: .seconds(10)) { noticedAt != nil }
            #expect(!right.isValid)
            watch.cancel()
            return noticedAt! - sentAt
        }
    }

    @Test func killNineOfAPeerIsNoticedAtOnce() throws {
        for endpoint in ["tcp://127.0.0.1:*", "ipc://@portkit-zmq-test-kill-\(getpid())"] {
            let noticed = try timeToNotice(SIGKILL, endpoint: endpoint)
            print("kill -9 over \(endpoint.prefix(6)) noticed after \(noticed)")
            #expect(noticed < Self.heartbeat.bound, "kill -9 noticed after \(noticed)")
        }
    }

    @Test func aStoppedPeerIsNoticedWithinTheHeartbeatBound() throws {
        let noticed = try timeToNotice(SIGSTOP)
        print("SIGSTOP noticed after \(noticed); heartbeat bound \(Self.heartbeat.bound)")
        // Not before the timeout (it was silence, not a closed connection), and within the
        // bound plus scheduling slack.
        #expect(noticed >= Self.heartbeat.timeout)
        #expect(noticed < Self.heartbeat.bound + .milliseconds(500), "a stopped peer noticed after \(noticed)")
    }

    @Test func requestToAPeerThatDiesFailsWithPortInvalidated() throws {
        PKZMQTransport.heartbeat = Self.heartbeat
        let peer = try ZMQPeerProcess(["hold", "tcp://127.0.0.1:*"])
        let bound = try peer.expectLine(startingWith: "ready")
        try onLoopThread { _ in
            let right = try PKZMQSendPort(connectingTo: bound)
            _ = try right.sendRequest(PKZMQMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
            peer.kill(SIGSTOP)
            // The stopped peer cannot answer; the heartbeat ends the wait long before its timeout.
            let started = PKDeadline.now
            expectPKError(.portInvalidated) {
                try right.sendRequest(PKZMQMessage(msgid: 2), sendTimeout: .seconds(5), receiveTimeout: .seconds(30))
            }
            #expect(PKDeadline.now - started < .seconds(10))
        }
        peer.kill(SIGKILL)
    }
}
#endif
