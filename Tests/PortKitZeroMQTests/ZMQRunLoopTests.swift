#if ZeroMQ
// A ZeroMQ port as a run-loop source: the ZMQ_FD edge rule (no message missed, no busy loop),
// fairness toward other sources, modes, invalidation from other threads and at thread end,
// and descriptor hygiene.

import Testing
import Foundation
import Glibc
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQRunLoopTests {
    /// Sends `count` messages (msgid = index) through `right` (queued at the sender; they reach
    /// the port's socket shortly after).
    func preload(_ right: PKZMQSendPort, _ count: Int) throws {
        for index in 0..<count { try right.send(PKZMQMessage(msgid: UInt32(index)), timeout: .seconds(10)) }
    }

    /// Waits (10 s at most) until the inbox's ZMQ_FD is readable: its socket has commands to
    /// process (a connection attached, or a message waiting), and nothing has processed them.
    func waitForSignal(_ inbox: ZMQInbox) -> Bool {
        var item = pollfd(fd: inbox.descriptor, events: Int16(POLLIN), revents: 0)
        return poll(&item, 1, 10_000) == 1
    }

    @Test func messagesThatArrivedBeforeSchedulingAreAllDelivered() throws {
        try onLoopThread { loop in
            var received: [UInt32] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { received.append($0.msgid) }
            // Queue well past one drain budget while nobody watches the socket, and consume the
            // socket's signal before it is scheduled (a bind processes the socket's commands, as
            // a receive does; one that fails adds no command of its own). The first send waited
            // for the connection (ZMQ_IMMEDIATE), so by the time 500 are queued the port's side
            // has almost surely attached it: then no edge is left for the loop to see, for these
            // messages or the rest of the connection's, since nobody has read it yet, and only
            // the drain at scheduling finds them (without it this test times out). Should the
            // attachment come later, its own signal delivers them and the test proves less.
            try preload(port.makeSendRight(), 500)
            #expect(waitForSignal(port.inbox), "the port's socket was never signalled")
            #expect(throws: PKError.self) { try port.inbox.bind(ZMQEndpoint(parsing: port.endpoint)) }
            try loop.add(port, forMode: .default)
            try run(loop, until: "500 messages") { received.count == 500 }
            #expect(received == (0..<500).map { UInt32($0) })
            port.invalidate()
        }
    }

    /// A bind from another thread while the port is scheduled (the reply service binds its
    /// endpoints lazily, from the requesting thread) processes the socket's commands, and with
    /// them the signal of a message that arrived meanwhile. A bind that fails does not signal
    /// the socket again (a successful one does: its listener comes with a command): the loop
    /// must still receive the message.
    @Test func aFailedBindFromAnotherThreadDoesNotSwallowAMessage() throws {
        try onLoopThread { loop in
            var received: [UInt32] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { received.append($0.msgid) }
            try loop.add(port, forMode: .default)
            let right = try PKZMQSendPort(connectingTo: port.endpoint)
            try right.send(PKZMQMessage(msgid: 1), timeout: .seconds(5))
            try run(loop, until: "the first message") { received == [1] }
            // The inbox read until its socket was empty, so the next message raises a new signal
            // (libzmq's activate_read) once it is in the socket's queue. Let it, and then bind
            // from another thread, to the endpoint the port already holds, before the loop looks.
            try right.send(PKZMQMessage(msgid: 2), timeout: .seconds(5))
            #expect(waitForSignal(port.inbox), "the second message never signalled the port's socket")
            let inbox = port.inbox
            let taken = try ZMQEndpoint(parsing: port.endpoint)
            let bound = Locked<Result<String, PKError>?>(nil)
            let done = DispatchSemaphore(value: 0)
            Thread {
                bound.value = Result { () throws(PKError) in try inbox.bind(taken) }
                done.signal()
            }.start()
            // The loop does not run meanwhile: only the bind's wake-up can tell it.
            #expect(done.wait(timeout: .now() + 10) == .success, "the bind on the other thread did not return")
            #expect(throws: PKError.self) { try #require(bound.value).get() }
            try run(loop, until: "the second message") { received == [1, 2] }
            port.invalidate()
        }
    }

    /// A handler that replaces the port's handler hands the messages after it to the new one,
    /// within one wake-up's batch too (a batch keeps the handler it loaded until one changes
    /// it): first with a batch of three made by hand, which is one batch for sure, then through
    /// a socket, end to end (whether libzmq hands those over in one wake-up or several).
    @Test func aHandlerReplacedByAHandlerTakesTheNextMessage() throws {
        let got = try onLoopThread { loop in
            var got: [String] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            port.handler = { message in
                got.append("first \(message.msgid)")
                port.handler = { got.append("second \($0.msgid)") }
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            var batch = (1...3).map { ZMQDecoded<PKZMQComponent>(msgid: UInt32($0), destination: 0, components: [], reply: nil) }[...]
            port.inbox.onMessages { batch.popFirst() }

            port.handler = { message in
                got.append("third \(message.msgid)")
                port.handler = { got.append("fourth \($0.msgid)") }
            }
            try preload(port.makeSendRight(), 3)
            try run(loop, until: "three messages through the socket") { got.count == 6 }
            return got
        }
        #expect(got == ["first 1", "second 2", "second 3", "third 0", "fourth 1", "fourth 2"])
    }

    /// A violation handler that replaces the port's handler hands the next message of the
    /// same batch to the new one: user code between two messages may change the handler.
    @Test func aViolationHandlerThatReplacesTheHandlerIsSeenByTheNextMessage() throws {
        let got = try onLoopThread { loop in
            var got: [String] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            port.handler = { got.append("old \($0.msgid)") }
            port.onProtocolViolation = { _ in port.handler = { got.append("new \($0.msgid)") } }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            // The first is for a port id that is not a receive port's: a violation.
            var batch = [ZMQDecoded<PKZMQComponent>(msgid: 1, destination: 7, components: [], reply: nil),
                         ZMQDecoded<PKZMQComponent>(msgid: 2, destination: 0, components: [], reply: nil)][...]
            port.inbox.onMessages { batch.popFirst() }
            return got
        }
        #expect(got == ["new 2"])
    }

    /// A port receives the next message into the bytes of one it delivered: a handler that
    /// keeps messages (here every other one) must find their bytes unchanged by the ones after,
    /// of the same size (overwritten in place) and of other sizes.
    @Test func messagesAHandlerKeepsAreNotChangedByTheNextOnes() throws {
        let kept = try onLoopThread { loop in
            var kept: [[UInt8]] = []
            var count = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
                if message.msgid % 2 == 0 { kept.append(message.data) }
                count += 1
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = port.makeSendRight()
            for index in 0..<200 {
                let size = index % 3 == 0 ? 64 : 40
                try right.send(PKZMQMessage(msgid: UInt32(index), data: [UInt8](repeating: UInt8(index), count: size)),
                               timeout: .seconds(10))
            }
            try run(loop, until: "200 messages") { count == 200 }
            return kept
        }
        let expected = stride(from: 0, to: 200, by: 2).map { [UInt8](repeating: UInt8($0), count: $0 % 3 == 0 ? 64 : 40) }
        #expect(kept.count == expected.count)
        let changed = zip(kept, expected).filter { $0 != $1 }.count
        #expect(changed == 0, "\(changed) of the kept messages changed after their delivery")
    }

    /// A message received after the one before was delivered and let go is received into that
    /// one's bytes, with no allocation: a 120-byte message after a 200-byte one has the larger
    /// one's capacity. (The handler keeps only what it saw, not the bytes.)
    @Test func theNextMessageIsReceivedIntoTheBytesOfTheOneDelivered() throws {
        let received = try onLoopThread { loop in
            var received: [(intact: Bool, capacity: Int)] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
                let data = message.data
                received.append((data == [UInt8](repeating: UInt8(data.count), count: data.count), data.capacity))
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = port.makeSendRight()
            for (index, size) in [200, 120].enumerated() {
                try right.send(PKZMQMessage(msgid: UInt32(index), data: [UInt8](repeating: UInt8(size), count: size)),
                               timeout: .seconds(10))
                try run(loop, until: "message \(index)") { received.count == index + 1 }
            }
            return received.map { ($0.intact, $0.capacity) }
        }
        #expect(received.map(\.0) == [true, true])
        #expect(received[1].1 >= 200, "the second message came in a new array (capacity \(received[1].1))")
    }

    /// Small messages a handler keeps are not received into the storage of a large one
    /// delivered before them (each would hold its capacity).
    @Test func keptSmallMessagesDoNotHoldALargeOnesStorage() throws {
        let capacities = try onLoopThread { loop in
            var capacities: [Int] = []
            var kept: [[UInt8]] = []
            var count = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
                count += 1
                guard message.msgid > 0 else { return }
                kept.append(message.data)
                capacities.append(message.data.capacity)
            }
            defer { port.invalidate() }
            try loop.add(port, forMode: .default)
            let right = port.makeSendRight()
            try right.send(PKZMQMessage(msgid: 0, data: [UInt8](repeating: 1, count: 4000)), timeout: .seconds(10))
            try run(loop, until: "the large message") { count == 1 }
            for index in 1...100 {
                try right.send(PKZMQMessage(msgid: UInt32(index), data: [UInt8](repeating: 2, count: 1 + index % 2)),
                               timeout: .seconds(10))
            }
            try run(loop, until: "101 messages") { count == 101 }
            return capacities
        }
        let large = capacities.filter { $0 >= 1000 }.count
        #expect(large == 0, "\(large) of 100 kept messages of 1 or 2 bytes hold \(capacities.max() ?? 0) bytes each")
    }

    @Test func aFloodYieldsToOtherSourcesBetweenBudgets() throws {
        try onLoopThread { loop in
            var received = 0
            var receivedWhenOtherRan: Int?
            let other = PKCustomSource { receivedWhenOtherRan = received }
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { _ in
                received += 1
                if received == 1 { other.signal() }
            }
            loop.add(other, forMode: .default)
            try preload(port.makeSendRight(), 1000)
            sleepFor(.milliseconds(200))
            try loop.add(port, forMode: .default)
            try run(loop, until: "1000 messages") { received == 1000 }
            let seen = try #require(receivedWhenOtherRan)
            #expect(seen < 1000, "the other source ran only after the whole flood")
            port.invalidate()
            other.invalidate()
        }
    }

    @Test func anIdlePortDoesNotSpinTheLoop() throws {
        try onLoopThread { loop in
            var received = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { _ in received += 1 }
            try loop.add(port, forMode: .default)
            let right = port.makeSendRight()
            try right.send(PKZMQMessage(msgid: 1), timeout: .seconds(5))
            try run(loop, until: "the message") { received == 1 }
            var sleeps = 0
            let observer = PKRunLoopObserver(activities: .beforeWaiting) { _, _ in sleeps += 1 }
            loop.add(observer, forMode: .default)
            // 300 ms with the connection open and heartbeats flowing: a handful of wake-ups
            // (heartbeats reach libzmq's own thread, not ours), never a spin.
            loop.run(in: .default, until: .after(.milliseconds(300)))
            #expect(sleeps < 20, "the loop slept \(sleeps) times in 300 ms")
            // And a message sent after the quiet spell still arrives.
            try right.send(PKZMQMessage(msgid: 2), timeout: .seconds(5))
            try run(loop, until: "the second message") { received == 2 }
            observer.invalidate()
            port.invalidate()
        }
    }

    @Test func aPortDeliversOnlyInItsModes() throws {
        try onLoopThread { loop in
            let custom = PKRunLoopMode("ZMQCustomMode")
            var received = 0
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { _ in received += 1 }
            try loop.add(port, forMode: custom)
            let keepDefaultBusy = PKCustomSource {}
            loop.add(keepDefaultBusy, forMode: .default)
            try port.makeSendRight().send(PKZMQMessage(msgid: 1), timeout: .seconds(5))
            loop.run(in: .default, until: .after(.milliseconds(200)))
            #expect(received == 0)
            try run(loop, in: custom, until: "delivery in the port's mode") { received == 1 }
            loop.remove(port, forMode: custom)
            try port.makeSendRight().send(PKZMQMessage(msgid: 2), timeout: .seconds(5))
            loop.run(in: custom, until: .after(.milliseconds(200)))
            #expect(received == 1)
            try loop.add(port, forMode: custom)
            try run(loop, in: custom, until: "delivery once added again") { received == 2 }
            keepDefaultBusy.invalidate()
            port.invalidate()
        }
    }

    /// A handler that invalidates its own port gets no other message, not even one of the
    /// same wake-up's batch already waiting at the socket.
    @Test func aHandlerThatInvalidatesItsPortGetsNoMoreMessages() throws {
        let got = try onLoopThread { loop in
            var got: [UInt32] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            port.handler = { message in
                got.append(message.msgid)
                if message.msgid == 1 { port.invalidate() }
            }
            // Queued before the port is scheduled, so most arrive before its first wake-up.
            try preload(port.makeSendRight(), 10)
            try loop.add(port, forMode: .default)
            try run(loop, until: "the message that invalidates") { got.contains(1) }
            // The port has left the mode, which is empty now: the run returns at once.
            #expect(loop.run(in: .default, until: .after(.seconds(10))) == .finished)
            return got
        }
        #expect(got == [0, 1])
    }

    @Test func invalidationFromAnotherThreadRunsOnTheLoop() throws {
        let invalidatedOn = Locked<Int32?>(nil)
        let port = try onLoopThread { loop -> PKZMQReceivePort in
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            try loop.add(port, forMode: .default)
            port.onInvalidation = { invalidatedOn.value = loop.isOwnedByCurrentThread ? 1 : 0 }
            let loopThread: Int32 = 1
            Thread.detachNewThread { port.invalidate() }
            try run(loop, until: "the invalidation") { invalidatedOn.value != nil }
            #expect(invalidatedOn.value == loopThread)
            return port
        }
        #expect(!port.isValid)
    }

    /// Runs `loop` in a mode of its own (never a common one, nor a port's) until `condition`
    /// holds.
    func runOtherMode(_ loop: PKRunLoop, until what: String, _ condition: () -> Bool) throws {
        let other = PKRunLoopMode("other")
        let keeper = PKTimer(fireDate: .distantFuture) { _ in }
        loop.add(keeper, forMode: other)
        defer { keeper.invalidate() }
        let deadline = PKDeadline.after(patience(.seconds(20)))
        while !condition() {
            if deadline.hasPassed { throw TestTimeout(what: what) }
            loop.run(in: other, until: .after(.milliseconds(5)))
        }
    }

    /// Whether a port can bind `endpoint` now (the previous one released it).
    func canBind(_ endpoint: String) -> Bool {
        guard let port = try? PKZMQReceivePort(bindingTo: endpoint) else { return false }
        port.invalidate()
        return true
    }

    /// A port that has left its modes is released on another thread: its socket closes, and
    /// its endpoint is free, at the loop's next pass in a mode that is not a common one. (The
    /// close waited for a run of a common mode, and the thread's end dropped it: the socket
    /// and its endpoint stayed.)
    @Test func aPortInNoModeReleasedOnAnotherThreadReleasesItsEndpoint() throws {
        let directory = TemporaryDirectory()
        let endpoint = directory.endpoint("released-elsewhere")
        try onLoopThread { loop in
            let port = Locked<PKZMQReceivePort?>(try PKZMQReceivePort(bindingTo: endpoint))
            try loop.add(port.value!, forMode: .default)
            loop.remove(port.value!, forMode: .default)
            #expect(!canBind(endpoint))
            let releaser = Thread { port.value = nil }
            releaser.start()
            try runOtherMode(loop, until: "the endpoint to be released") { canBind(endpoint) }
        }
    }

    /// A port that has left its modes is invalidated from another thread: the invalidation is
    /// finished on the loop's thread at its next pass, in a mode that is not a common one.
    @Test func aPortInNoModeInvalidatedFromAnotherThreadIsFinishedOnItsLoop() throws {
        let directory = TemporaryDirectory()
        let endpoint = directory.endpoint("invalidated-elsewhere")
        try onLoopThread { loop in
            let invalidatedOn = Locked<Bool?>(nil)
            let port = try PKZMQReceivePort(bindingTo: endpoint)
            port.onInvalidation = { invalidatedOn.value = loop.isOwnedByCurrentThread }
            try loop.add(port, forMode: .default)
            loop.remove(port, forMode: .default)
            Thread.detachNewThread { port.invalidate() }
            try runOtherMode(loop, until: "the invalidation") { invalidatedOn.value != nil }
            #expect(invalidatedOn.value == true)
            #expect(canBind(endpoint))
        }
    }

    /// Invalidated from another thread while in its mode; removed from it before the loop runs
    /// that mode or a common one: the removal finishes the invalidation.
    @Test func aPortInvalidatedElsewhereThenRemovedFromItsModeIsFinished() throws {
        try onLoopThread { loop in
            let invalidated = Locked(false)
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*")
            port.onInvalidation = { invalidated.value = true }
            try loop.add(port, forMode: .default)
            let invalidator = Thread { port.invalidate() }
            invalidator.start()
            try waitUntil("the invalidation to be asked for", timeout: patience(.seconds(10))) { !port.isValid }
            #expect(!invalidated.value)
            loop.remove(port, forMode: .default)
            #expect(invalidated.value)
        }
    }

    /// Whether a plain Unix socket can bind the abstract address of `ipc://@name` now (no retry,
    /// as a port's bind has for an address this process released lately).
    func abstractAddressIsFree(_ name: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(name.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { path in
            for (index, byte) in bytes.enumerated() { path[index + 1] = byte }  // path[0] = 0: abstract
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + 1 + bytes.count)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 }
        }
    }

    /// A port whose inbox failed to bind again the address it holds (`EADDRINUSE`: libzmq made
    /// a listener and closed it, and reported it closed) frees its address when `invalidate()`
    /// returns. The failed binds' ZMQ_EVENT_CLOSED stayed queued and ended the close's wait for
    /// the real listener at once, so the address was still taken for a moment after.
    @Test func anEndpointReboundAfterFailedBindsIsFreeWhenInvalidated() throws {
        for round in 0..<20 {
            let name = "portkit-zmq-test-rebind-\(getpid())-\(round)"
            let port = try PKZMQReceivePort(bindingTo: "ipc://@\(name)")
            let endpoint = try ZMQEndpoint(parsing: port.endpoint)
            for _ in 0..<3 {
                #expect(throws: PKError.self) { try port.inbox.bind(endpoint) }
            }
            port.invalidate()
            #expect(abstractAddressIsFree(name), "round \(round): the address was still taken after invalidate()")
        }
    }

    @Test func theEndOfTheLoopThreadInvalidatesThePortAndReleasesItsEndpoint() throws {
        let directory = TemporaryDirectory()
        let endpoint = directory.endpoint("thread-end")
        let invalidated = Locked(false)
        let port = try onLoopThread { loop -> PKZMQReceivePort in
            let port = try PKZMQReceivePort(bindingTo: endpoint)
            port.onInvalidation = { invalidated.value = true }
            try loop.add(port, forMode: .default)
            return port
        }
        try waitUntil("the port to be invalidated at thread end") { invalidated.value }
        #expect(!port.isValid)
        let again = try PKZMQReceivePort(bindingTo: endpoint)
        again.invalidate()
    }

    /// Ports, rights, requests and dead connections: the descriptor count comes back to where
    /// it started. Run in a child process, so that no other test's descriptors blur the count.
    @Test func portsAndRightsLeaveNoDescriptorsBehind() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            var outcome = "no outcome"
            do {
                let kinds = ["tcp://127.0.0.1:*", "ipc://@portkit-zmq-fd-test-\(getpid())"]
                var round = 0
                func serveAndRequest(_ kind: String) throws {
                    // A fresh endpoint each round: a right made to an endpoint whose previous
                    // owner has just gone may share the connection about to be found dead.
                    round += 1
                    let server = try ZMQEchoServer(endpoint: kind.hasPrefix("ipc") ? "\(kind)-\(round)" : kind)
                    try onLoopThread { _ in
                        let right = try PKZMQSendPort(connectingTo: server.endpoint)
                        for round in UInt32(1)...3 {
                            _ = try right.sendRequest(PKZMQMessage(msgid: round), sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
                        }
                    }
                    server.stop()
                }
                // Warm up what lives for the process: the context, the background loop, the
                // reply service and its endpoints, the first threads' loops.
                for kind in kinds { try serveAndRequest(kind) }
                sleepFor(.milliseconds(500))
                let before = openDescriptorCount()
                for kind in kinds {
                    for _ in 0..<10 { try serveAndRequest(kind) }
                }
                // Connections to the stopped servers die; their monitors end on the background loop.
                do {
                    try waitUntil("descriptors to return", timeout: .seconds(10)) { openDescriptorCount() <= before }
                    outcome = "ok"
                } catch {
                    outcome = "descriptors before \(before), after \(openDescriptorCount()): \(describeDescriptors())"
                }
            } catch {
                outcome = "\(error)"
            }
            // Exit 0 either way, so that the outcome (the reason of a failure) is observed.
            print(outcome)
            exit(0)
        }
        if let output = result?.standardOutputContent {
            #expect(String(decoding: output, as: UTF8.self) == "ok\n")
        }
    }
}
#endif
