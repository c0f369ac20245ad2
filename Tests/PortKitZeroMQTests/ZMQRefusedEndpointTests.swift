#if ZeroMQ
// An endpoint libzmq refuses to connect to must fail cleanly: a typed error, and libzmq's
// reaper thread still closing sockets afterwards. A socket monitor left running when its
// reader goes makes the reaper block for good on the monitor's last event (libzmq issue
// #3575), after which no socket of the process is ever closed, so each test runs in a child
// process of its own (IsolatedRun): a hang there cannot stall the tests around it.

import Testing
import Foundation
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQRefusedEndpointTests {
    /// Endpoints that pass for endpoints at first sight but that libzmq's `zmq_connect` refuses
    /// (EINVAL): PortKit must refuse them first, with `.badName`.
    static let refusedByLibzmq = ["tcp://127.0.0.1:*", "tcp://*:5555", "tcp://-x:1", "tcp://a b:1", "tcp://_x:1", "tcp://.x:1"]

    /// Checks that libzmq's reaper thread still closes sockets: a socket closed now reaches
    /// the end of its life there, where its monitor's last event (`monitorStopped`) is sent.
    static func requireSocketsAreReaped(_ when: String) throws {
        let address = "inproc://portkit-zmq-test-reaped-\(UInt64.random(in: 0 ... .max))"
        let reader = try ZMQSocket(.pair)
        defer { reader.close() }
        try reader.connect(address)
        let socket = try ZMQSocket(.pull)
        try socket.monitor(address, events: ZMQMonitorEvent.monitorStopped)
        socket.close()
        var stopped = false
        let deadline = PKDeadline.after(patience(.seconds(10)))
        while !stopped && !deadline.hasPassed {
            guard reader.waitReadable(timeoutMilliseconds: 10) else { continue }
            _ = try reader.receiveFrame { bytes, _ in
                if bytes.count >= 2 && Int32(bytes.loadUnaligned(as: UInt16.self)) == ZMQMonitorEvent.monitorStopped { stopped = true }
            }
        }
        try IsolatedRun.require(stopped, "\(when), libzmq's reaper did not finish a closed socket")
    }

    /// Found by review: `PKZMQSendPort(connectingTo: "tcp://127.0.0.1:*")` passed PortKit's
    /// checks, started the connection's socket monitor, then `zmq_connect` failed (EINVAL) and
    /// the monitor's reader was released while monitoring still ran: libzmq's reaper blocked for
    /// ever, and no socket was closed again.
    @Test func aRefusedEndpointFailsWithBadNameAndSocketsAreStillReaped() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                try ZMQRefusedEndpointTests.requireSocketsAreReaped("before any refused endpoint")
                for endpoint in ZMQRefusedEndpointTests.refusedByLibzmq {
                    do {
                        _ = try PKZMQSendPort(connectingTo: endpoint)
                        try IsolatedRun.require(false, "a send right to \(endpoint) was made")
                    } catch let error as PKError {
                        try IsolatedRun.require(error.code == .badName, "\(endpoint): \(error)")
                    }
                }
                try ZMQRefusedEndpointTests.requireSocketsAreReaped("after send rights to refused endpoints")
                // The connection itself, given an endpoint that skipped PortKit's checks: its
                // monitor has started when zmq_connect fails, and must be stopped before its
                // reader goes.
                do {
                    _ = try ZMQConnection(endpoint: .tcp(host: "a b", port: "1"))
                    try IsolatedRun.require(false, "a connection to tcp://a b:1 was made")
                } catch let error as PKError {
                    try IsolatedRun.require(error.code == .badName, "\(error)")
                }
                try ZMQRefusedEndpointTests.requireSocketsAreReaped("after a connection whose zmq_connect failed")
            }
        }
        IsolatedRun.check(result)
    }

    /// Found by review: a peer's message whose reply port names a host libzmq refuses
    /// (`tcp://-x:1`) was delivered; answering it threw `.badName` (which `send` does not
    /// document) and hung libzmq's reaper as above. Such a message breaks protocol.md 10.3: it
    /// is dropped and reported as a violation, and the process keeps closing sockets.
    @Test func aReplyPortAtARefusedHostIsAViolation() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                let outcome = try onLoopThread { loop -> String in
                    var outcome: String?
                    let port = try PKZMQReceivePort(bindingTo: "ipc://@portkit-zmq-test-refused-\(getpid())") { message in
                        do {
                            try message.replyPort?.send(PKZMQMessage(msgid: 2), timeout: .seconds(1))
                            outcome = "replied"
                        } catch {
                            outcome = "reply failed: \(error)"
                        }
                    }
                    port.onProtocolViolation = { _ in outcome = "violation" }
                    defer { port.invalidate() }
                    try loop.add(port, forMode: .default)
                    let raw = try RawZMQSocket(pushingTo: port.endpoint)
                    try raw.send([handMadeMessage(msgid: 1, data: [], reply: ("tcp://-x:1", 0))])
                    try run(loop, until: "the message or its violation") { outcome != nil }
                    return outcome!
                }
                try IsolatedRun.require(outcome == "violation", "the message was delivered: \(outcome)")
                try ZMQRefusedEndpointTests.requireSocketsAreReaped("after a reply port at a refused host")
            }
        }
        IsolatedRun.check(result)
    }
}
#endif
