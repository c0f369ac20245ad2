#if ZeroMQ
// Host names in tcp:// endpoints (docs/decisions.md, "Host names are looked up off libzmq's
// I/O thread"): PortKit looks them up on threads of its own and connects libzmq to the address,
// so a name whose lookup does not answer holds up no one but the sends to it, each until its
// own deadline. The tests answer for names under `.test` (a top-level domain reserved for
// tests) through `HostResolver.lookUpForTests`; `localhost` is looked up for real.

import Testing
import Foundation
import Glibc
@testable import PortKit
@testable import PortKitZeroMQ

/// The answers the tests give for their names: each name answers when its gate opens (a
/// lookup that does not answer until then), with the address given, or with none.
private final class FakeNames: Sendable {
    private let table = Locked<[String: (open: Bool, address: String?)]>([:])

    /// Answers for `name` (a name under `.test`): after `open(_:)` if `closed`.
    func add(_ name: String, address: String?, closed: Bool = false) {
        table.withLock { $0[name] = (!closed, address) }
    }

    func open(_ name: String) { table.withLock { $0[name]?.open = true } }

    /// The hook: blocks a lookup of a closed name until it opens (30 s at most).
    func answer(_ host: String) -> String?? {
        guard table.value[host] != nil else { return .none }
        let deadline = PKDeadline.after(.seconds(30))
        while table.value[host]?.open != true && !deadline.hasPassed { sleepFor(.milliseconds(1)) }
        return .some(table.value[host]?.address)
    }

    /// Installs the hook, once for every test of the suite (the answers of one test's names
    /// do not touch another's).
    static let shared: FakeNames = {
        let names = FakeNames()
        HostResolver.lookUpForTests.withLock { $0 = { names.answer($0) } }
        return names
    }()
}

@Suite(.serialized) struct ZMQHostNameTests {
    /// A unique name under `.test`.
    static func name(_ label: String) -> String { "\(label)-\(getpid())-\(UInt32.random(in: 0 ... .max)).test" }

    /// The port number of a port bound to `tcp://127.0.0.1:*`.
    static func portNumber(of port: PKZMQReceivePort) -> String { String(port.endpoint.split(separator: ":").last!) }

    /// Runs `body` on a loop thread, with a port bound to `tcp://127.0.0.1:*` in the loop's
    /// default mode and the msgids it has received so far.
    func withPort(_ body: @escaping @Sendable (PKRunLoop, PKZMQReceivePort, _ received: () -> [UInt32]) throws -> Void) throws {
        try onLoopThread { loop in
            var received: [UInt32] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { received.append($0.msgid) }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            try body(loop, port, { received })
        }
    }

    @Test func aPortIsReachedThroughAHostName() throws {
        try withPort { loop, port, received in
            let right = try PKZMQSendPort(connectingTo: "tcp://localhost:\(Self.portNumber(of: port))")
            try right.send(PKZMQMessage(msgid: 1), timeout: .seconds(10))
            try run(loop, until: "the message") { received() == [1] }
        }
    }

    /// A name whose lookup does not answer: making a right to it returns at once, a send to it
    /// fails at its own deadline, and another connection's round trip goes on meanwhile. Once
    /// the lookup answers, the right's messages go through.
    @Test func aLookupThatDoesNotAnswerHoldsUpOnlyTheSendsToIt() throws {
        let names = FakeNames.shared
        let stalled = Self.name("stalled")
        names.add(stalled, address: "127.0.0.1", closed: true)
        defer { names.open(stalled) }
        try withPort { loop, port, received in
            let made = Locked<Result<PKZMQSendPort, PKError>?>(nil)
            let endpoint = "tcp://\(stalled):\(Self.portNumber(of: port))"
            Thread { made.value = Result { () throws(PKError) in try PKZMQSendPort(connectingTo: endpoint) } }.start()
            try waitUntil("the right to be made") { made.value != nil }
            let right = try made.value!.get()
            let refused = Locked<PKError?>(nil)
            Thread {
                do throws(PKError) { try right.send(PKZMQMessage(msgid: 1), timeout: .milliseconds(200)) } catch { refused.value = error }
            }.start()
            try waitUntil("the send to end at its own deadline") { refused.value != nil }
            #expect(refused.value?.code == .sendTimedOut)
            // Another connection, meanwhile.
            let direct = try PKZMQSendPort(connectingTo: port.endpoint)
            try direct.send(PKZMQMessage(msgid: 2), timeout: .seconds(10))
            try run(loop, until: "the other connection's message") { received() == [2] }
            // The lookup answers: the right's messages go through.
            names.open(stalled)
            try right.send(PKZMQMessage(msgid: 3), timeout: .seconds(10))
            try run(loop, until: "the message through the name") { received() == [2, 3] }
            #expect(right.isValid)
        }
    }

    /// A name with no address yet: the connection looks it up again while it lives, and
    /// connects once the name has one.
    @Test func aNameWithNoAddressIsLookedUpAgain() throws {
        let names = FakeNames.shared
        let late = Self.name("late")
        names.add(late, address: nil)
        try withPort { loop, port, received in
            let right = try PKZMQSendPort(connectingTo: "tcp://\(late):\(Self.portNumber(of: port))")
            expectPKError(.sendTimedOut) { try right.send(PKZMQMessage(msgid: 1), timeout: .milliseconds(200)) }
            names.add(late, address: "127.0.0.1")
            try right.send(PKZMQMessage(msgid: 2), timeout: .seconds(20))
            try run(loop, until: "the message, once the name has an address") { received() == [2] }
        }
    }

    /// A connection whose handshake has not succeeded (nothing listens at the name's address)
    /// looks the name up again, and follows it to its new address.
    @Test func aConnectionThatNeverConnectedFollowsTheNameToANewAddress() throws {
        let names = FakeNames.shared
        let moved = Self.name("moved")
        names.add(moved, address: "127.0.0.2")  // the port listens on 127.0.0.1 only
        HostResolver.keepFoundMilliseconds.store(200, ordering: .relaxed)
        defer { HostResolver.keepFoundMilliseconds.store(60_000, ordering: .relaxed) }
        try withPort { loop, port, received in
            let right = try PKZMQSendPort(connectingTo: "tcp://\(moved):\(Self.portNumber(of: port))")
            expectPKError(.sendTimedOut) { try right.send(PKZMQMessage(msgid: 1), timeout: .milliseconds(300)) }
            names.add(moved, address: "127.0.0.1")
            try right.send(PKZMQMessage(msgid: 2), timeout: .seconds(20))
            try run(loop, until: "the message, at the new address") { received() == [2] }
        }
    }

    /// A connection whose messages went to the name's address keeps it when the name moves,
    /// even if the monitor has not yet reported its handshake (it reports late): following
    /// would drop the queue of the old address's pipe, and later messages would go elsewhere.
    @Test func aConnectionWhoseMessagesWentOutDoesNotFollowTheName() throws {
        let names = FakeNames.shared
        let name = Self.name("stays")
        names.add(name, address: "127.0.0.1")
        HostResolver.keepFoundMilliseconds.store(100, ordering: .relaxed)
        defer { HostResolver.keepFoundMilliseconds.store(60_000, ordering: .relaxed) }
        try withPort { loop, port, received in
            let endpoint = "tcp://\(name):\(Self.portNumber(of: port))"
            ZMQConnection.handshakeReportsHeldForTests.withLock { _ = $0.insert(endpoint) }
            defer { _ = ZMQConnection.handshakeReportsHeldForTests.withLock { $0.remove(endpoint) } }
            let right = try PKZMQSendPort(connectingTo: endpoint)
            try right.send(PKZMQMessage(msgid: 1), timeout: .seconds(10))
            try run(loop, until: "the first message") { received() == [1] }
            names.add(name, address: "127.0.0.2")  // nothing listens there
            try waitUntil("the name's new address") {
                HostResolver.address(of: name, before: .after(.seconds(1))) == .address("127.0.0.2")
            }
            // Ten follow-up looks of the connection's (one each 100 ms) while messages go.
            for msgid in UInt32(2)...11 {
                try right.send(PKZMQMessage(msgid: msgid), timeout: .seconds(5))
                sleepFor(.milliseconds(100))
            }
            try run(loop, until: "every message, at the first address") { received() == Array(1...11) }
            // Its handshake never reported, it would go on looking the name up.
            try right.right.connectionEvenIfDead().die("the test is over")
        }
    }

    /// A connection that follows its name to a new address takes a new socket: a handshake
    /// with the old address that succeeded unreported (the monitor reports late) takes none of
    /// the messages sent after.
    @Test func aConnectionThatFollowsItsNameSendsOnlyToTheNewAddress() throws {
        let names = FakeNames.shared
        let name = Self.name("follows")
        names.add(name, address: "127.0.0.1")
        HostResolver.keepFoundMilliseconds.store(100, ordering: .relaxed)
        defer { HostResolver.keepFoundMilliseconds.store(60_000, ordering: .relaxed) }
        try withPort { loop, port, received in
            let number = Self.portNumber(of: port)
            nonisolated(unsafe) var receivedThere: [UInt32] = []
            let there = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.2:\(number)") { receivedThere.append($0.msgid) }
            defer { there.invalidate() }
            try loop.add(there, forMode: .default)
            let endpoint = "tcp://\(name):\(number)"
            ZMQConnection.handshakeReportsHeldForTests.withLock { _ = $0.insert(endpoint) }
            defer { _ = ZMQConnection.handshakeReportsHeldForTests.withLock { $0.remove(endpoint) } }
            let right = try PKZMQSendPort(connectingTo: endpoint)
            let connection = try right.right.connectionEvenIfDead()
            try waitUntil("the connection to the first address") { connection.connectedAddress == "tcp://127.0.0.1:\(number)" }
            names.add(name, address: "127.0.0.2")
            try waitUntil("the connection to follow the name") { connection.connectedAddress == "tcp://127.0.0.2:\(number)" }
            try right.send(PKZMQMessage(msgid: 1), timeout: .seconds(10))
            try run(loop, until: "the message, at the new address") { receivedThere == [1] }
            #expect(received().isEmpty)
            #expect(right.isValid)
            connection.die("the test is over")
        }
    }

    /// A caller waiting for a lookup gets its answer though the table forgets it first (a
    /// sweep of a full table forgets every answer).
    @Test func aWaiterGetsItsAnswerThoughTheTableForgotIt() throws {
        let names = FakeNames.shared
        let name = Self.name("forgotten")
        names.add(name, address: "127.0.0.1")
        HostResolver.answeredForTests.withLock { $0 = { host in if host == name { HostResolver.forgetAnswers() } } }
        defer { HostResolver.answeredForTests.withLock { $0 = nil } }
        #expect(HostResolver.address(of: name, before: .after(.seconds(20))) == .address("127.0.0.1"))
    }

    /// The local address toward a name whose lookup does not answer is given up at the
    /// caller's deadline.
    @Test func theLocalAddressTowardANameThatDoesNotAnswerIsGivenUpInTime() throws {
        let names = FakeNames.shared
        let stalled = Self.name("route")
        names.add(stalled, address: "127.0.0.1", closed: true)
        defer { names.open(stalled) }
        let answer = Locked<String??>(nil)
        Thread { answer.value = .some(PKZMQEndpoint.localTCP(toward: "tcp://\(stalled):5", timeout: .milliseconds(200))) }.start()
        try waitUntil("the answer") { answer.value != nil }
        #expect(answer.value == .some(nil))
        names.open(stalled)
        try waitUntil("the lookup's answer") { HostResolver.address(of: stalled, before: .after(.seconds(1))) == .address("127.0.0.1") }
        #expect(PKZMQEndpoint.localTCP(toward: "tcp://\(stalled):5") == "tcp://127.0.0.1:*")
    }

    /// An answer that has expired is still used while the name is looked up again, and after
    /// that lookup fails (DNS down for a while): a send that needs it (the local address
    /// advertised toward the name) does not wait for the new lookup, nor falls back to another
    /// address.
    @Test func anExpiredAnswerIsUsedWhileTheNameIsLookedUpAgain() throws {
        let names = FakeNames.shared
        let name = Self.name("expired")
        names.add(name, address: "127.0.0.1")
        #expect(HostResolver.address(of: name, before: .after(.seconds(10))) == .address("127.0.0.1"))
        names.add(name, address: nil, closed: true)
        defer { names.open(name) }
        HostResolver.expire(name)
        let answer = Locked<HostResolver.Answer?>(nil)
        Thread { answer.value = HostResolver.address(of: name, before: .after(.seconds(20))) }.start()
        try waitUntil("the answer, without the new lookup's") { answer.value != nil }
        #expect(answer.value == .address("127.0.0.1"))
        // The new lookup fails: the address found before stands.
        names.open(name)
        try waitUntil("the new lookup's end") { HostResolver.pendingCount == 0 }
        #expect(HostResolver.address(of: name, before: .after(.seconds(10))) == .address("127.0.0.1"))
    }

    /// Hosts that are neither an address nor a name, which libzmq would look up itself on its
    /// I/O thread (a name in brackets, a zone or interface suffix), are refused.
    @Test(arguments: ["tcp://[portkit-bracketed.test]:1", "tcp://portkit-zone.test%1:1", "tcp://portkit-zone.test%eth0:1"])
    func hostsLibzmqWouldLookUpItselfAreRefused(endpoint: String) {
        expectPKError(.badName) { _ = try PKZMQSendPort(connectingTo: endpoint) }
    }

    /// Numeric hosts are addresses, brackets or not, and need no lookup; the local address
    /// toward a bracketed IPv4 address is found as toward the bare one.
    @Test func numericHostsAreAddresses() {
        for host in ["127.0.0.1", "[127.0.0.1]", "::1", "[::1]", "*"] {
            #expect(HostResolver.kind(of: host) == .address, "\(host)")
        }
        #expect(HostResolver.kind(of: "localhost") == .name)
        #expect(PKZMQEndpoint.localTCP(toward: "tcp://[127.0.0.1]:5") == "tcp://127.0.0.1:*")
    }

    /// Many names whose lookups do not answer (a peer can send any): at most
    /// `HostResolver.maxPending` wait for an answer at once (each holds a descriptor), and a
    /// caller that needs another name's address waits for one to be answered until its own
    /// deadline.
    @Test func manyNamesThatDoNotAnswerHoldABoundedNumberOfLookups() throws {
        let names = FakeNames.shared
        let flood = (0..<(HostResolver.maxPending + 50)).map { Self.name("flood\($0)") }
        for name in flood { names.add(name, address: nil, closed: true) }
        defer {
            for name in flood { names.open(name) }
            // The next test starts with no lookup waiting.
            try? waitUntil("the flood's lookups to end", timeout: .seconds(30)) { HostResolver.pendingCount == 0 }
        }
        for name in flood { HostResolver.whenKnown(name) { _ in } }
        #expect(HostResolver.pendingCount <= HostResolver.maxPending)
        let beyond = Self.name("beyond")
        names.add(beyond, address: nil, closed: true)  // never a real lookup, should a place free
        defer { names.open(beyond) }
        #expect(HostResolver.address(of: beyond, before: .after(.milliseconds(100))) == .unanswered)
    }

    /// A caller that needs a name's address while `HostResolver.maxPending` names wait for
    /// theirs waits for a free place, until its deadline, instead of giving up at once.
    @Test func aCallerThatFindsTheLookupsFullWaitsForAFreePlace() throws {
        try waitUntil("no lookup waiting") { HostResolver.pendingCount == 0 }
        let names = FakeNames.shared
        let full = (0..<HostResolver.maxPending).map { Self.name("full\($0)") }
        for name in full { names.add(name, address: nil, closed: true) }
        defer {
            for name in full { names.open(name) }
            try? waitUntil("the lookups to end", timeout: .seconds(30)) { HostResolver.pendingCount == 0 }
        }
        for name in full { HostResolver.whenKnown(name) { _ in } }
        #expect(HostResolver.pendingCount == HostResolver.maxPending)
        let next = Self.name("next")
        names.add(next, address: "127.0.0.1")
        let answer = Locked<HostResolver.Answer?>(nil)
        Thread { answer.value = HostResolver.address(of: next, before: .after(.seconds(20))) }.start()
        sleepFor(.milliseconds(100))
        #expect(answer.value == nil, "it waits")
        for name in full { names.open(name) }
        try waitUntil("the answer") { answer.value != nil }
        #expect(answer.value == .address("127.0.0.1"))
    }
}
#endif
