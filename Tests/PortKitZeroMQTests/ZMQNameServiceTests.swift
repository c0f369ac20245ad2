#if ZeroMQ
// Names across processes (and hosts) over ZeroMQ: a name registered with the name service is
// found from another process and dropped when its owner dies or falls silent.

import Testing
import Foundation
import PortKit
@testable import PortKitZeroMQ

/// A name server on a thread of its own.
final class ZMQNameServerThread: @unchecked Sendable {
    let endpoint: String
    private let server: PKZMQNameServer
    private let finished = Locked(false)

    /// A server scheduled in `mode` only, on a loop that runs only `mode`.
    init(registrationTimeout: Duration = .seconds(5), mode: PKRunLoopMode = .default) throws {
        let ready = Locked<Result<PKZMQNameServer, any Error>?>(nil)
        let finished = self.finished
        Thread.detachNewThread {
            let loop = PKRunLoop.current
            do {
                let server = try PKZMQNameServer(bindingTo: "tcp://127.0.0.1:*", registrationTimeout: registrationTimeout)
                try loop.add(server, forMode: mode)
                ready.value = .success(server)
                while server.isValid { loop.run(in: mode, until: .after(.milliseconds(200))) }
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

    /// A process that looked a name up has its port, not the registration's key: it cannot
    /// unregister the name, through the client nor with a raw UNREGISTER naming the port (a
    /// LOOKUP gave anyone all an UNREGISTER asked for, and so the name to take over). Its
    /// registrant can.
    @Test func onlyItsRegistrantUnregistersAName() throws {
        let server = try ZMQNameServerThread()
        defer { server.stop() }
        let owner = try PKZMQNameService(endpoint: server.endpoint)
        let stranger = try PKZMQNameService(endpoint: server.endpoint)
        try onLoopThread { loop in
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { _ in }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            try owner.register(port, name: "owned")
            let found = try stranger.lookUp("owned")
            expectPKError(.nameNotFound) { try stranger.unregister(name: "owned", port: found) }
            let serverRight = try PKZMQSendPort(connectingTo: server.endpoint)
            func status(_ components: [PKZMQComponent]) throws -> [UInt8]? {
                let request = PKZMQMessage(msgid: ZMQNameProtocol.unregister, components: components)
                return try serverRight.sendRequest(request, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))?.components.first?.data
            }
            let name = PKZMQComponent.data(Array("owned".utf8))
            #expect(try status([name, .port(found), .data([UInt8](repeating: 7, count: 8))]) == [ZMQNameProtocol.Status.nameNotFound.rawValue])
            #expect(try status([name, .port(found)]) == [ZMQNameProtocol.Status.badRequest.rawValue])
            #expect(try stranger.lookUp("owned") == found)
            try owner.unregister(name: "owned", port: port.makeSendRight())
            expectPKError(.nameNotFound) { _ = try stranger.lookUp("owned") }
        }
    }

    /// A REGISTER sent again with its key (its answer was lost, or came after the client gave
    /// up) is the same registration: answered ok. Another key is another registrant, refused
    /// while the name lives; the key removes the name. Through the client, registering a port
    /// under its name again is ok too. (With the key in the server's answer only, a lost answer
    /// left a name its registrant could neither remove nor register again.)
    @Test func aRegistrationAskedForAgainWithItsKeyIsTheSame() throws {
        let server = try ZMQNameServerThread()
        defer { server.stop() }
        let service = try PKZMQNameService(endpoint: server.endpoint)
        try onLoopThread { loop in
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { _ in }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            let right = port.makeSendRight()
            let serverRight = try PKZMQSendPort(connectingTo: server.endpoint)
            let name = PKZMQComponent.data(Array("asked.again".utf8))
            let key: [UInt8] = [1, 2, 3, 4, 5, 6, 7, 8]
            func status(_ msgid: UInt32, _ components: [PKZMQComponent]) throws -> [UInt8]? {
                let request = PKZMQMessage(msgid: msgid, components: components)
                return try serverRight.sendRequest(request, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))?.components.first?.data
            }
            // The first REGISTER's answer is lost: it asked for none.
            try serverRight.send(PKZMQMessage(msgid: ZMQNameProtocol.register, components: [name, .port(right), .data(key)]), timeout: .seconds(5))
            try waitUntil("the name to be registered") { (try? service.lookUp("asked.again")) != nil }
            #expect(try status(ZMQNameProtocol.register, [name, .port(right), .data(key)]) == [ZMQNameProtocol.Status.ok.rawValue])
            #expect(try status(ZMQNameProtocol.register, [name, .port(right), .data([8, 7, 6, 5, 4, 3, 2, 1])])
                    == [ZMQNameProtocol.Status.nameInUse.rawValue])
            #expect(try status(ZMQNameProtocol.unregister, [name, .port(right), .data(key)]) == [ZMQNameProtocol.Status.ok.rawValue])
            expectPKError(.nameNotFound) { _ = try service.lookUp("asked.again") }
            // Through the client.
            try service.register(right, name: "asked.again")
            try service.register(right, name: "asked.again")
            try service.unregister(name: "asked.again", port: right)
            expectPKError(.nameNotFound) { _ = try service.lookUp("asked.again") }
        }
    }

    /// Registrations waiting for their ports are bounded: with 64 waiting (toward an address
    /// nobody binds, each holding a connection being made), another REGISTER is answered
    /// "unreachable" at once, not after the registration timeout (60 s here), and the 64 end at
    /// their timeout as before. Each was a connection, and about six descriptors, more.
    @Test func registrationsWaitingForTheirPortsAreBounded() throws {
        let server = try ZMQNameServerThread(registrationTimeout: .seconds(60))
        defer { server.stop() }
        let service = try PKZMQNameService(endpoint: server.endpoint)
        try onLoopThread { _ in
            let serverRight = try PKZMQSendPort(connectingTo: server.endpoint)
            let nowhere = try PKZMQSendPort(connectingTo: "tcp://127.0.0.1:1")
            // Unanswered REGISTERs (no reply port), carried out all the same (protocol.md 10.10).
            for index in 0..<PKZMQNameServer.maxPendingRegistrations {
                try serverRight.send(PKZMQMessage(msgid: ZMQNameProtocol.register, components: [
                    .data(Array("waiting.\(index)".utf8)), .port(nowhere), .data(ZMQNameProtocol.newKey()),
                ]), timeout: .seconds(5))
            }
            let started = PKDeadline.now
            expectPKError(.transport) {
                try service.register(nowhere, name: "one.more", timeout: patience(.seconds(20)))
            }
            let waited = Double(PKDeadline.now.uptimeNanoseconds - started.uptimeNanoseconds) / 1e9
            #expect(waited < 30, "answered after \(waited) s")
        }
    }

    /// An ill-formed name is answered "bad name" (status 3, protocol.md 10.10) whatever the
    /// request: a LOOKUP and an UNREGISTER of one were answered "not found", as if the name
    /// were merely unregistered.
    @Test func anIllFormedNameIsABadNameForEveryRequest() throws {
        let server = try ZMQNameServerThread()
        defer { server.stop() }
        let service = try PKZMQNameService(endpoint: server.endpoint)
        try onLoopThread { _ in
            let serverRight = try PKZMQSendPort(connectingTo: server.endpoint)
            // What a client that skips PortKit's own check would send.
            let lookUp = PKZMQMessage(msgid: ZMQNameProtocol.lookUp, components: [.data(Array("no/slashes".utf8))])
            let reply = try serverRight.sendRequest(lookUp, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
            #expect(reply?.components.first?.data == [ZMQNameProtocol.Status.badName.rawValue])
            expectPKError(.badName) {
                try service.unregister(name: "no/slashes", port: PKZMQSendPort(connectingTo: "tcp://127.0.0.1:1"))
            }
            let unregister = PKZMQMessage(msgid: ZMQNameProtocol.unregister, components: [
                .data(Array("no/slashes".utf8)), .port(try PKZMQSendPort(connectingTo: "tcp://127.0.0.1:1")), .data([UInt8](repeating: 0, count: 8)),
            ])
            let unregistered = try serverRight.sendRequest(unregister, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
            #expect(unregistered?.components.first?.data == [ZMQNameProtocol.Status.badName.rawValue])
            expectPKError(.nameNotFound) { _ = try service.lookUp("well.formed") }
        }
    }

    /// A registration that fails (nobody binds its port's endpoint) keeps nothing: the
    /// server's connection toward that endpoint goes once nothing else holds it. (The
    /// registration held it in two reference cycles, its watch's and its confirmation's, for
    /// the process's life, reconnecting every second: a few hundred such REGISTERs used up
    /// libzmq's sockets.)
    @Test func aFailedRegistrationKeepsNoConnection() throws {
        let server = try ZMQNameServerThread(registrationTimeout: .milliseconds(300))
        defer { server.stop() }
        let service = try PKZMQNameService(endpoint: server.endpoint)
        let directory = TemporaryDirectory()
        let endpoint = directory.endpoint("nobody")
        // The connection the server will use: one per endpoint in a process, shared.
        weak var probe: ZMQConnection?
        probe = try ZMQConnectionCache.shared.connection(to: ZMQEndpoint(parsing: endpoint))
        try onLoopThread { _ in
            expectPKError(.transport) { try service.register(PKZMQSendPort(connectingTo: endpoint), name: "nowhere") }
        }
        // The cache keeps the last connections made: push this one out.
        for index in 0..<ZMQConnectionCache.recentCapacity {
            _ = try ZMQConnectionCache.shared.connection(to: ZMQEndpoint(parsing: directory.endpoint("other-\(index)")))
        }
        try waitUntil("the connection to be released", timeout: patience(.seconds(10))) { probe == nil }
    }

    /// Found by review: the server sent each reply waiting up to 5 s for a connection to the
    /// reply port, on its loop's thread, so a few requests whose reply port nobody listens at
    /// stalled every other client. A reply now never holds the loop: it waits for its
    /// connection off the loop, and is dropped if none comes (protocol.md 10.10).
    @Test func requestsWithUnreachableReplyPortsDoNotStallTheServer() throws {
        let server = try ZMQNameServerThread()
        defer { server.stop() }
        let service = try PKZMQNameService(endpoint: server.endpoint)
        try onLoopThread { loop in
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            try service.register(port, name: "reachable")
            // Enough lookups that blocking 5 s on each would outlast the lookups below.
            let serverRight = try PKZMQSendPort(connectingTo: server.endpoint)
            let count = max(3, Int(patience(.seconds(2)) / .seconds(5)) + 2)
            for index in 0..<count {
                let nobody = try PKZMQSendPort(connectingTo: "ipc://@portkit-zmq-test-nobody-\(getpid())-\(UInt32.random(in: 0 ... .max))-\(index)")
                try serverRight.send(PKZMQMessage(msgid: 2, components: [.data(Array("reachable".utf8))], replyPort: nobody), timeout: .seconds(5))
            }
            let found = try service.lookUp("reachable", timeout: patience(.seconds(2)))
            #expect(found == port.makeSendRight())
            expectPKError(.nameNotFound) { _ = try service.lookUp("unknown", timeout: patience(.seconds(2))) }
        }
    }

    /// Found by review: the server confirmed a registration (and timed it out, and watched the
    /// registered port) in the common modes only, so a server scheduled in a mode of its own,
    /// on a loop that runs only that mode, never answered a REGISTER.
    @Test func aServerInAModeOfItsOwnConfirmsRegistrations() throws {
        let server = try ZMQNameServerThread(registrationTimeout: .seconds(5), mode: PKRunLoopMode("PKZMQNameServerTestMode"))
        defer { server.stop() }
        let service = try PKZMQNameService(endpoint: server.endpoint)
        try onLoopThread { loop in
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            try loop.add(port, forMode: .default)
            try service.register(port, name: "own.mode", timeout: patience(.seconds(10)))
            #expect(try service.lookUp("own.mode") == port.makeSendRight())
            // The watch on the registered port works in that mode too: its name goes with it.
            port.invalidate()
            try waitUntil("the invalidated port's name to go", timeout: patience(.seconds(10))) {
                (try? service.lookUp("own.mode")) == nil
            }
        }
    }

    /// Found by review: the server's port kept only itself alive on its loop, and called the
    /// server through an unowned reference, so a server that was scheduled and then dropped
    /// trapped on the first request. A scheduled server is kept by its loop, as a port is
    /// (`-[NSRunLoop addPort:forMode:]`), until it is invalidated; then it is released.
    @Test func aScheduledServerThatWasDroppedKeepsServing() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            IsolatedRun.report {
                final class Handle: @unchecked Sendable {
                    weak var server: PKZMQNameServer?
                    var endpoint: String?
                    var error: (any Error)?
                }
                let handle = Locked(Handle())
                let (stop, finished) = (Locked(false), Locked(false))
                Thread.detachNewThread {
                    let loop = PKRunLoop.current
                    do {
                        // Made, scheduled and dropped in this scope.
                        try {
                            let server = try PKZMQNameServer(bindingTo: "tcp://127.0.0.1:*")
                            try loop.add(server, forMode: .default)
                            handle.withLock { $0.server = server; $0.endpoint = server.endpoint }
                        }()
                    } catch {
                        handle.withLock { $0.error = error }
                    }
                    while !stop.value { loop.run(in: .default, until: .after(.milliseconds(50))) }
                    finished.value = true
                }
                try waitUntil("the name server", timeout: patience(.seconds(10))) { handle.withLock { $0.endpoint != nil || $0.error != nil } }
                if let error = handle.withLock({ $0.error }) { throw error }
                let service = try PKZMQNameService(endpoint: handle.withLock { $0.endpoint! })
                try onLoopThread { loop in
                    let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
                    try loop.add(port, forMode: .default)
                    defer { port.invalidate() }
                    try service.register(port, name: "dropped.server", timeout: patience(.seconds(10)))
                    let found = try service.lookUp("dropped.server", timeout: patience(.seconds(5)))
                    try IsolatedRun.require(found == port.makeSendRight(), "looked up \(found)")
                }
                // Invalidated, it is released (the loop no longer keeps it).
                handle.withLock { $0.server?.invalidate() }
                try waitUntil("the invalidated server to be released", timeout: patience(.seconds(10))) {
                    handle.withLock { $0.server == nil }
                }
                stop.value = true
                try waitUntil("the server's thread to end", timeout: patience(.seconds(10))) { finished.value }
            }
        }
        IsolatedRun.check(result)
    }
}
#endif
