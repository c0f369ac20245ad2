#if ZeroMQ
// Names across processes (and hosts) over ZeroMQ: a name registered with the name service is
// found from another process and dropped when its owner dies or falls silent.

import Testing
import Foundation
import PortKit
import PortKitZeroMQ

/// A name server on a thread of its own.
final class ZMQNameServerThread: @unchecked Sendable {
    let endpoint: String
    private let server: PKZMQNameServer
    private let finished = Locked(false)

    init(registrationTimeout: Duration = .seconds(5)) throws {
        let ready = Locked<Result<PKZMQNameServer, any Error>?>(nil)
        let finished = self.finished
        Thread.detachNewThread {
            let loop = PKRunLoop.current
            do {
                let server = try PKZMQNameServer(bindingTo: "tcp://127.0.0.1:*", registrationTimeout: registrationTimeout)
                try loop.add(server, forMode: .default)
                ready.value = .success(server)
                while server.isValid { loop.run(in: .default, until: .after(.milliseconds(200))) }
            } catch {
                ready.value = .failure(error)
            }
            finished.value = true
        }
        try waitUntil("the name server") { ready.value != nil }
        server = try ready.value!.get()
        endpoint = server.endpoint
    }

    func stop() {
        server.invalidate()
        try? waitUntil("the name server to stop") { finished.value }
    }
}

@Suite struct ZMQNameServiceTests {
    /// Polls `service` until `name` is gone; returns how long after `since` it went.
    static func timeUntilDropped(_ name: String, at service: PKZMQNameService, since: PKDeadline) throws -> Duration {
        try onLoopThread { _ -> Duration in
            while true {
                do { _ = try service.lookUp(name) } catch let error as PKError where error.code == .nameNotFound {
                    return PKDeadline.now - since
                }
                if PKDeadline.now - since > .seconds(10) { throw TestTimeout(what: "the name \(name) to be dropped") }
                sleepFor(.milliseconds(5))
            }
        }
    }

    @Test func nameIsFoundFromAnotherProcessAndDroppedWhenItsOwnerIsKilled() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                PKZMQTransport.heartbeat = ZMQLivenessTests.heartbeat
                let server = try ZMQNameServerThread()
                defer { server.stop() }
                let service = try PKZMQNameService(endpoint: server.endpoint)

                let owner = try ZMQPeerProcess(["register", server.endpoint, "echo-service"])
                defer { owner.kill() }
                try IsolatedRun.require(try owner.readLine() == "registered", "the owner did not register")

                // Found from a third process, which talks to the port it found.
                let finder = try ZMQPeerProcess(["lookup", server.endpoint, "echo-service"])
                let found = try finder.expectLine(startingWith: "found")
                try IsolatedRun.require(found.hasPrefix("tcp://127.0.0.1:") && found.hasSuffix(" 21"), "found \(found)")
                try IsolatedRun.require(try finder.waitForExit() == 0, "the finder failed")

                // A second registrant of the live name is refused, from a process or from here.
                let rival = try ZMQPeerProcess(["register", server.endpoint, "echo-service"])
                try IsolatedRun.require(try rival.readLine() == "refused nameInUse", "a rival took the live name")
                try onLoopThread { loop in
                    let mine = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
                    try loop.add(mine, forMode: .default)
                    defer { mine.invalidate() }
                    do {
                        try service.register(mine, name: "echo-service")
                        try IsolatedRun.require(false, "this process took the live name")
                    } catch let error as PKError {
                        try IsolatedRun.require(error.code == .nameInUse, "\(error)")
                    }
                }

                // kill -9 of the owner: the name goes at once (its kernel closes the connection).
                let endpoint = try onLoopThread { _ in try service.lookUp("echo-service").endpoint }
                try IsolatedRun.require(endpoint == String(found.split(separator: " ")[0]), "looked up \(endpoint)")
                owner.kill()
                let gone = try ZMQNameServiceTests.timeUntilDropped("echo-service", at: service, since: .now)
                print("a registered owner's kill -9 dropped its name after \(gone)")
                try IsolatedRun.require(gone < ZMQLivenessTests.heartbeat.bound, "dropped after \(gone)")

                // The name is free again.
                let successor = try ZMQPeerProcess(["register", server.endpoint, "echo-service"])
                defer { successor.kill() }
                try IsolatedRun.require(try successor.readLine() == "registered", "the name was not free again")
            }
        }
        IsolatedRun.check(result)
    }

    @Test func nameOfASilentOwnerIsDroppedWithinTheHeartbeatBound() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                PKZMQTransport.heartbeat = ZMQLivenessTests.heartbeat
                let server = try ZMQNameServerThread()
                defer { server.stop() }
                let service = try PKZMQNameService(endpoint: server.endpoint)
                let owner = try ZMQPeerProcess(["register", server.endpoint, "silent"])
                defer { owner.kill(SIGKILL) }
                try IsolatedRun.require(try owner.readLine() == "registered", "the owner did not register")
                owner.kill(SIGSTOP)
                let gone = try ZMQNameServiceTests.timeUntilDropped("silent", at: service, since: .now)
                print("a stopped owner's name dropped after \(gone); heartbeat bound \(ZMQLivenessTests.heartbeat.bound)")
                try IsolatedRun.require(gone < ZMQLivenessTests.heartbeat.bound + .milliseconds(500), "dropped after \(gone)")
            }
        }
        IsolatedRun.check(result)
    }

    @Test func registerLookUpUnregisterInOneProcess() throws {
        let server = try ZMQNameServerThread(registrationTimeout: .milliseconds(500))
        defer { server.stop() }
        let service = try PKZMQNameService(endpoint: server.endpoint)
        try onLoopThread { loop in
            var got: [UInt32] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            try service.register(port, name: "local.port_1")
            let found = try service.lookUp("local.port_1")
            #expect(found == port.makeSendRight())
            try found.send(PKZMQMessage(msgid: 3), timeout: .seconds(5))
            try run(loop, until: "the message through the looked-up right") { got == [3] }
            expectPKError(.nameNotFound) { try service.unregister(name: "local.port_1", port: PKZMQSendPort(connectingTo: "tcp://127.0.0.1:1")) }
            try service.unregister(name: "local.port_1", port: port.makeSendRight())
            expectPKError(.nameNotFound) { _ = try service.lookUp("local.port_1") }
            // A port nobody can reach is refused once the registration timeout passes.
            expectPKError(.transport) { try service.register(PKZMQSendPort(connectingTo: "tcp://127.0.0.1:1"), name: "nowhere") }
            // Invalidating the port drops its name.
            try service.register(port, name: "again")
            port.invalidate()
            try waitUntil("the invalidated port's name to go") { (try? service.lookUp("again")) == nil }
        }
    }
}
#endif
