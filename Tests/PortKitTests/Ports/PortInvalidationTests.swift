// Invalidation on each cause, delivered once, on the owning loop, after the messages that had
// already arrived; watches on send rights; no SIGPIPE when sending to a dead port.

import Glibc
import Testing
@testable import PortKit

@Suite struct PortInvalidationTests {
    /// A log that the owning loop's thread writes and the test reads.
    final class Log: @unchecked Sendable {
        let entries = Locked<[String]>([])
        func add(_ entry: String) { entries.withLock { $0.append(entry) } }
        var value: [String] { entries.value }
        func count(_ entry: String) -> Int { value.filter { $0 == entry }.count }
    }

    // MARK: - Explicit invalidation of the receive port

    /// Invalidated on its own thread (here from its handler): `onInvalidation` runs once, there;
    /// no handler runs afterwards; local and independent rights become invalid and a send
    /// through them fails with `.invalidPort`.
    /// A handler that captures its own port (as the guide's often do) does not keep the port
    /// alive once it is invalidated: invalidation releases the handler, and the loop lets go.
    /// Undelivered messages that hold rights to their own port are dropped after the port's
    /// lock is let go: a right's release takes that lock again (it once trapped, then hung).
    @Test func undeliveredMessagesCarryingRightsToTheirOwnPortAreDroppedSafely() throws {
        let (invalidated, revokedValid) = try onPortLoopThread { loop -> (Bool, Bool) in
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            // Queued in the mailbox, not yet delivered: its reply port and a component are rights
            // to the same port.
            try port.makeSendRight().send(PKPortMessage(msgid: 1, components: [.port(port.makeSendRight())], replyPort: port.makeSendRight()), timeout: .seconds(5))
            port.invalidate()

            // The same when a reused reply port revokes its senders between requests.
            let reused = PKReceivePort()
            try loop.add(reused, forMode: .default)
            try reused.makeSendRight().send(PKPortMessage(msgid: 2, replyPort: reused.makeSendRight()), timeout: .seconds(5))
            reused.revokeSenders()
            let revokedValid = reused.isValid
            reused.invalidate()
            return (!port.isValid, revokedValid)
        }
        #expect(invalidated)
        #expect(revokedValid)
    }

    /// What a reused reply port's revoked senders left is dropped, whichever way it came: a
    /// message in the mailbox, one taken from it but not delivered yet (the revoke comes from
    /// a handler), one on a connection that has not greeted yet, one on a connection handed
    /// over from another thread and not adopted yet. The revoked rights fail and their watch
    /// fires; a right made afterwards works, and its message alone is delivered. (`revokeSenders`
    /// looks at each part before touching it: the mailbox, the local queue, the connections and
    /// the adoptions are filled here; the connections with messages ready and those awaiting
    /// their greeting, in the next two tests.)
    @Test func revokingSendersDropsEverythingTheyLeft() throws {
        let (delivered, codes, watched) = try onPortLoopThread { loop -> ([UInt32], [PKError.Code?], Int) in
            var delivered: [UInt32] = []
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            let local = PKSendPort(localRight: LocalRight(port: port))
            let other = PKSendPort(localRight: LocalRight(port: port))
            var pending: PKSendPort?
            port.handler = { message in
                delivered.append(message.msgid)
                guard message.msgid == 2 else { return }
                // 3 waits in the local queue; 8 goes to the mailbox; a connection made on another
                // thread waits for the loop to adopt it, with 5 on it.
                try? other.send(PKPortMessage(msgid: 8), timeout: .seconds(5))
                if let handedOver = try? onPortLoopThread({ _ in try port.makeTransferDescriptor() }) {
                    pending = PKSendPort(connection: SendConnection(takingOwnershipOf: handedOver))
                    try? pending?.send(PKPortMessage(msgid: 5), timeout: .seconds(5))
                }
                port.revokeSenders()
                try? PKSendPort(localRight: LocalRight(port: port)).send(PKPortMessage(msgid: 6), timeout: .seconds(5))
            }
            var watched = 0
            let watch = try local.watchInvalidation(on: loop, forMode: .default) { watched += 1 }
            try local.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            try runLoop(loop, "the first message") { !delivered.isEmpty }
            let connected = try independentRight(to: port)  // adopted at once: not greeted yet
            try connected.send(PKPortMessage(msgid: 4), timeout: .seconds(5))
            try other.send(PKPortMessage(msgid: 2), timeout: .seconds(5))
            try other.send(PKPortMessage(msgid: 3), timeout: .seconds(5))

            try runLoop(loop, "the fresh right's message") { delivered.contains(6) }
            try runLoop(loop, "the revoked right's watch") { watched == 1 }
            runLoop(loop, for: .milliseconds(20))
            watch.cancel()
            let codes = [local, other, connected, pending].map { right -> PKError.Code? in
                guard let right else { return nil }
                do throws(PKError) {
                    try right.send(PKPortMessage(msgid: 7), timeout: .seconds(5))
                    return nil
                } catch { return error.code }
            }
            runLoop(loop, for: .milliseconds(20))
            port.invalidate()
            return (delivered, codes, watched)
        }
        #expect(delivered == [1, 2, 6])
        #expect(codes == [.invalidPort, .invalidPort, .invalidPort, .invalidPort])
        #expect(watched == 1)
    }

    /// Messages read from a connection but not yet delivered when its senders are revoked are
    /// dropped: a raw sender's greeting and three frames arrive in one read, the first frame's
    /// handler revokes the senders while the other two wait in the connection's queue (the
    /// connection on the port's list of those with messages ready), and neither is delivered.
    /// The connection is closed; a right made after the revoke works. (Two things see to it:
    /// the revoke empties the ready list, and closing a connection empties its queue. Undoing
    /// both fails this test; either alone does not, the other still dropping the two.)
    @Test func revokingSendersDropsMessagesReadButNotDelivered() throws {
        let (delivered, closed) = try onPortLoopThread { loop -> ([UInt32], Bool) in
            var delivered: [UInt32] = []
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            port.handler = { message in
                delivered.append(message.msgid)
                guard message.msgid == 1 else { return }
                port.revokeSenders()
                try? PKSendPort(localRight: LocalRight(port: port)).send(PKPortMessage(msgid: 9), timeout: .seconds(5))
            }
            let peer = try RawPeer(to: port)
            // One write, read whole before anything is delivered: 2 and 3 are queued behind 1.
            var stream = RawPeer.greeting
            for id in UInt32(1)...3 { stream += RawPeer.frame(msgid: id, data: [UInt8(id)]) }
            #expect(peer.write(stream) == nil)
            try runLoop(loop, "the fresh right's message") { delivered.contains(9) }
            // Waited for, not looked at once: a child process another test is spawning holds a
            // copy of every descriptor until its exec, and the peer sees the close only then.
            let closed = (try? peer.waitUntilClosedByPort()) != nil
            runLoop(loop, for: .milliseconds(20))
            peer.close()
            port.invalidate()
            return (delivered, closed)
        }
        #expect(delivered == [1, 9], "the frames read with the first one are dropped by the revoke")
        #expect(closed, "the revoke closed the raw sender's connection")
    }

    /// A connection accepted from a named socket that has not greeted yet is ended by the revoke
    /// too, and leaves the port's list of connections awaiting their greeting: that list's
    /// limit still holds afterwards. With room for two, three silent connections accepted after
    /// the revoke make the oldest of them go (had the revoked one stayed on the list, it would
    /// be taken for the oldest, and "evicted" again at every accept, while the silent ones
    /// piled up beyond the limit).
    @Test func revokingSendersEndsConnectionsAwaitingTheirGreeting() throws {
        let dir = TemporaryNameDirectory()
        let (revokedClosed, evicted) = try onPortLoopThread { loop -> (Bool, [Bool]) in
            var limits = PKPortLimits()
            limits.maxPendingGreetings = 2
            limits.greetingTimeout = .seconds(3600)  // never reached: only an eviction drops a silent one here
            var delivered: [UInt32] = []
            let port = PKReceivePort(limits: limits) { delivered.append($0.msgid) }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            try dir.server.register(port, name: "revoked")
            var silent: [Int32] = []
            defer { for fd in silent { Descriptor.close(fd) } }
            func connectSilently() throws -> Int32 {
                guard case .success(let fd) = Socket.connect(to: dir.path + "/revoked.sock") else {
                    throw PeerError(description: "connect failed")
                }
                silent.append(fd)
                return fd
            }
            // A silent connection, then a client that greets and sends: once the client's
            // message is delivered, the silent one (accepted before it) awaits its greeting.
            let revoked = try connectSilently()
            let client = try dir.server.lookUp("revoked")
            try client.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            try runLoop(loop, "the client's message") { delivered == [1] }
            #expect(!Socket.peerHasHungUp(revoked), "the silent connection awaits its greeting")
            port.revokeSenders()
            let revokedClosed = Socket.peerHasHungUp(revoked)
            // Three silent connections after the revoke: the third evicts the first.
            let later = try (0..<3).map { _ in try connectSilently() }
            try runLoop(loop, "the oldest silent connection's eviction") { Socket.peerHasHungUp(later[0]) }
            runLoop(loop, for: .milliseconds(20))
            return (revokedClosed, later.map { Socket.peerHasHungUp($0) })
        }
        #expect(revokedClosed, "the revoke closed the connection that had not greeted")
        #expect(evicted == [true, false, false], "only the oldest silent connection after the revoke is evicted")
    }

    /// A no-senders check a hold put off does not outlive a revoke: the last counted in-process
    /// right goes while its messages are held (the check waits for them), the revoke drops
    /// them, and once the hold ends `onNoSenders` does not run for the revoked senders.
    @Test func revokingSendersDropsANoSendersCheckAHoldPutOff() throws {
        let (pendingBefore, pendingAfter, noSenders, delivered) = try onPortLoopThread { loop -> (Bool, Bool, Int, [UInt32]) in
            var delivered: [UInt32] = []
            var noSenders = 0
            let port = PKReceivePort { delivered.append($0.msgid) }
            port.onNoSenders = { noSenders += 1 }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            port.holdDelivery()
            do {
                let right = PKSendPort(localRight: LocalRight(port: port))
                for id in UInt32(1)...2 { try right.send(PKPortMessage(msgid: id), timeout: .seconds(5)) }
            }  // the last counted right goes
            try runLoop(loop, "the check to wait for the held messages") { port.noSendersCheckIsPending }
            let pendingBefore = port.noSendersCheckIsPending
            port.revokeSenders()
            let pendingAfter = port.noSendersCheckIsPending
            port.requestDeliveryRelease()
            runLoop(loop, for: .milliseconds(20))
            return (pendingBefore, pendingAfter, noSenders, delivered)
        }
        #expect(pendingBefore)
        #expect(!pendingAfter, "the revoke dropped the check")
        #expect(noSenders == 0, "no-senders ran for revoked senders")
        #expect(delivered.isEmpty, "the revoke dropped the held messages")
    }

    /// The last in-process right and the last connection going in one wait make one drop to no
    /// senders, and one report: the connection's end (a descriptor event, in that pass) reports
    /// it and takes the in-process right's leaving, which the port's routine (in the next pass)
    /// then does not report again.
    @Test func noSendersIsReportedOnceWhenTheLastRightsGoTogether() throws {
        let reports = try onPortLoopThread { loop -> Int in
            var reports = 0
            var delivered: [UInt32] = []
            let port = PKReceivePort { delivered.append($0.msgid) }
            port.onNoSenders = { reports += 1 }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            var local: PKSendPort? = PKSendPort(localRight: LocalRight(port: port))
            var connected: PKSendPort? = try independentRight(to: port)
            try connected?.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            try runLoop(loop, "the connection's message") { delivered == [1] }
            // Both go just before the loop waits: the wait reports the connection's end and the
            // in-process right's leaving (a wake-up for the port's routine) together.
            let observer = PKRunLoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
                local = nil
                connected = nil
            }
            loop.add(observer, forMode: .default)
            try runLoop(loop, "no-senders") { reports > 0 }
            runLoop(loop, for: .milliseconds(20))
            withExtendedLifetime((local, connected)) {}
            return reports
        }
        #expect(reports == 1)
    }

    @Test func anInvalidatedPortWhoseHandlerCapturesItIsReleased() throws {
        let released = try onPortLoopThread { loop -> Bool in
            weak var watched: PKReceivePort?
            do {
                let port = PKReceivePort()
                port.handler = { message in if message.msgid == 9 { port.invalidate() } }
                try loop.add(port, forMode: .default)
                watched = port
                try port.makeSendRight().send(PKPortMessage(msgid: 9), timeout: .seconds(5))
                try runLoop(loop, "the port's invalidation") { !port.isValid }
            }
            return watched == nil
        }
        #expect(released)
    }

    @Test func explicitInvalidationOnTheOwningThread() throws {
        try onPortLoopThread { loop in
            let log = Log()
            let owner = currentThreadID
            let port = PKReceivePort()
            port.handler = { message in
                log.add("message \(message.msgid)")
                if message.msgid == 2 { port.invalidate() }
            }
            port.onInvalidation = { log.add(currentThreadID == owner ? "invalidated" : "invalidated elsewhere") }
            try loop.add(port, forMode: .default)
            let local = port.makeSendRight()
            let independent = try independentRight(to: port)
            for id in UInt32(1)...4 { try local.send(PKPortMessage(msgid: id), timeout: .seconds(1)) }
            try runLoop(loop, "invalidation") { log.value.contains("invalidated") }
            runLoop(loop, for: .milliseconds(20))
            #expect(log.value == ["message 1", "message 2", "invalidated"])
            #expect(!port.isValid)
            #expect(!local.isValid)
            try waitPatiently("the independent right to become invalid") { !independent.isValid }
            for right in [local, independent] {
                #expect { try right.send(PKPortMessage(msgid: 9), timeout: .seconds(1)) } throws: {
                    ($0 as? PKError)?.code == .invalidPort
                }
            }
            port.invalidate()  // a second time does nothing
            runLoop(loop, for: .milliseconds(10))
            #expect(log.count("invalidated") == 1)
        }
    }

    /// Invalidated from another thread while its loop runs: `onInvalidation` runs once, on the
    /// owning loop; every message delivered came before it, none after.
    @Test func explicitInvalidationFromAnotherThread() throws {
        let log = Log()
        let server = try PortServer { port, _ in
            let owner = currentThreadID
            port.handler = { log.add("message \($0.msgid)") }
            port.onInvalidation = { log.add(currentThreadID == owner ? "invalidated" : "invalidated elsewhere") }
        }
        let right = server.right
        let independent = try independentRight(to: server.port)
        for id in UInt32(1)...50 { try right.send(PKPortMessage(msgid: id), timeout: .seconds(5)) }
        try waitPatiently("some messages") { log.value.count >= 10 }
        try server.stop()
        #expect(log.count("invalidated") == 1)
        #expect(log.value.last == "invalidated")
        #expect(!right.isValid)
        try waitPatiently("the independent right to become invalid") { !independent.isValid }
        #expect { try independent.send(PKPortMessage(msgid: 9), timeout: .seconds(1)) } throws: {
            ($0 as? PKError)?.code == .invalidPort
        }
    }

    // MARK: - The loop's thread ends

    /// A port whose loop's thread ends is invalidated: `onInvalidation` runs once, on that
    /// thread; senders see their rights become invalid and a send fails with `.invalidPort`.
    @Test func theLoopsThreadEnding() throws {
        let log = Log()
        let rights = TestLatch<[PKSendPort]>()
        let release = Locked(false)
        let ownerID = Locked<Int32>(0)
        let thread = TestThread(name: "short-lived-owner") {
            let loop = PKRunLoop.current
            ownerID.value = currentThreadID
            let port = PKReceivePort { log.add("message \($0.msgid)") }
            port.onInvalidation = { log.add(currentThreadID == ownerID.value ? "invalidated" : "invalidated elsewhere") }
            try? loop.add(port, forMode: .default)
            rights.set([port.makeSendRight(), (try? independentRight(to: port))].compactMap { $0 })
            let deadline = PKDeadline.after(patience(.seconds(20)))
            while !release.value && !deadline.hasPassed { loop.run(in: .default, until: .after(.milliseconds(5))) }
            // The thread ends without invalidating the port.
        }
        let both = try rights.waitPatiently()
        try #require(both.count == 2)
        for right in both { try right.send(PKPortMessage(msgid: 1), timeout: .seconds(5)) }
        try waitPatiently("both messages") { log.value.count == 2 }
        release.value = true
        try thread.joinPatiently()
        try waitPatiently("invalidation") { log.value.contains("invalidated") || log.value.contains("invalidated elsewhere") }
        #expect(log.value == ["message 1", "message 1", "invalidated"])
        try waitPatiently("the rights to become invalid") { both.allSatisfy { !$0.isValid } }
        for right in both {
            #expect { try right.send(PKPortMessage(msgid: 2), timeout: .seconds(1)) } throws: {
                ($0 as? PKError)?.code == .invalidPort
            }
        }
    }

    /// Invalidated from another thread while its loop is idle, after which the loop's thread
    /// ends without running again: the invalidation is still delivered once, on that thread,
    /// and every sender sees its right become invalid.
    @Test func invalidatedWhileIdleThenTheThreadEnds() throws {
        let log = Log()
        let published = TestLatch<PKReceivePort>()
        let independentRightLatch = TestLatch<PKSendPort>()
        let invalidated = Locked(false)
        let thread = TestThread(name: "idle-owner") {
            let loop = PKRunLoop.current
            let owner = currentThreadID
            let port = PKReceivePort { log.add("message \($0.msgid)") }
            port.onInvalidation = { log.add(currentThreadID == owner ? "invalidated" : "invalidated elsewhere") }
            try? loop.add(port, forMode: .default)
            if let right = try? independentRight(to: port) { independentRightLatch.set(right) }
            loop.runOnePass()
            published.set(port)
            try? waitPatiently("invalidate", timeout: .seconds(20)) { invalidated.value }
            // The thread ends without running its loop again.
        }
        let port = try published.waitPatiently()
        let right = try independentRightLatch.waitPatiently()
        port.invalidate()
        invalidated.value = true
        try thread.joinPatiently()
        try waitPatiently("invalidation to be delivered") { !log.value.isEmpty }
        #expect(log.value == ["invalidated"])
        try waitPatiently("the right to become invalid") { !right.isValid }
    }

    // MARK: - A port in no mode, on another thread

    /// Runs `loop` in a mode of its own (never a common one, and so never the modes of a
    /// `perform`) until `condition` holds.
    private func runOtherMode(_ loop: PKRunLoop, _ what: String, until condition: () -> Bool) throws {
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

    /// Schedules `holder`'s port in the default mode, gives it a connection and removes it from
    /// the mode; returns the connection's other end. Keeps no reference to the port.
    private static func connectAndLeaveModes(_ holder: Locked<PKReceivePort?>, on loop: PKRunLoop) throws -> Int32 {
        let port = try #require(holder.value)
        try loop.add(port, forMode: .default)
        let writeEnd = try port.makeTransferDescriptor()
        loop.runOnePass()
        loop.remove(port, forMode: .default)
        return writeEnd
    }

    /// A port that has left its modes is released on another thread: its connections close
    /// at the loop's next pass, though the loop runs a mode that is not a common one. (They
    /// waited for a pass in a common mode, and were dropped unclosed when the thread ended.)
    @Test func aPortReleasedOnAnotherThreadInNoModeClosesItsConnections() throws {
        try onPortLoopThread { loop in
            let port = Locked<PKReceivePort?>(PKReceivePort())
            let writeEnd = try Self.connectAndLeaveModes(port, on: loop)
            defer { Descriptor.close(writeEnd) }
            try TestThread { port.value = nil }.joinPatiently()
            try runOtherMode(loop, "the connection to close") { Socket.peerHasHungUp(writeEnd) }
        }
    }

    /// The same port released on another thread while its loop's thread is ending without
    /// running its loop again: the thread's end closes the connections.
    @Test func aPortReleasedOnAnotherThreadAsItsThreadEndsClosesItsConnections() throws {
        let published = TestLatch<Locked<PKReceivePort?>>()
        let writeEnd = TestLatch<Int32>()
        let released = Locked(false)
        let thread = TestThread(name: "ending-owner") {
            let holder = Locked<PKReceivePort?>(PKReceivePort())
            guard let fd = try? Self.connectAndLeaveModes(holder, on: PKRunLoop.current) else { return }
            writeEnd.set(fd)
            published.set(holder)
            try? waitPatiently("the release", timeout: .seconds(20)) { released.value }
        }
        let port = try published.waitPatiently()
        let fd = try writeEnd.waitPatiently()
        defer { Descriptor.close(fd) }
        port.value = nil
        released.value = true
        try thread.joinPatiently()
        try waitPatiently("the connection to close") { Socket.peerHasHungUp(fd) }
    }

    /// A port that has left its modes is invalidated from another thread: the invalidation is
    /// finished on its loop's thread at the next pass, whatever mode that runs, and closes
    /// its connections. (It waited for the port's adopter, which was in no mode.)
    @Test func aPortInNoModeInvalidatedFromAnotherThreadIsFinishedOnItsLoop() throws {
        try onPortLoopThread { loop in
            let owner = currentThreadID
            let log = Log()
            let port = PKReceivePort()
            port.onInvalidation = { log.add(currentThreadID == owner ? "invalidated" : "invalidated elsewhere") }
            try loop.add(port, forMode: .default)
            let writeEnd = try port.makeTransferDescriptor()
            defer { Descriptor.close(writeEnd) }
            loop.runOnePass()
            loop.remove(port, forMode: .default)
            try TestThread { port.invalidate() }.joinPatiently()
            try runOtherMode(loop, "the invalidation") { !log.value.isEmpty && Socket.peerHasHungUp(writeEnd) }
            #expect(log.value == ["invalidated"])
        }
    }

    /// A port in no mode is invalidated from another thread while its loop waits for a
    /// request's reply: `onInvalidation` runs after the wait, not inside it (the wait's private
    /// mode runs nothing of the caller's). (The clean-up's block ran in the wait's first pass.)
    @Test func anInvalidationOfAPortInNoModeWaitsForARequestToEnd() throws {
        try onPortLoopThread { loop in
            let log = Log()
            let port = PKReceivePort()
            port.onInvalidation = { log.add("invalidated") }
            try loop.add(port, forMode: .default)
            loop.remove(port, forMode: .default)
            let target = UncheckedBox(port)
            let server = try PortServer { serverPort, _ in
                serverPort.handler = { message in
                    target.value.invalidate()
                    try? message.replyPort?.send(PKPortMessage(msgid: 2), timeout: .seconds(5))
                }
            }
            defer { try? server.stop() }
            let reply = try server.right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: patience(.seconds(20)))
            #expect(reply?.msgid == 2)
            #expect(log.value.isEmpty, "onInvalidation ran inside the request's wait")
            try runOtherMode(loop, "the invalidation") { !log.value.isEmpty }
            #expect(log.value == ["invalidated"])
        }
    }

    /// Invalidated from another thread while in its mode; removed from it before the loop runs
    /// that mode again: the removal finishes the invalidation.
    @Test func aPortInvalidatedElsewhereThenRemovedFromItsModeIsFinished() throws {
        try onPortLoopThread { loop in
            let log = Log()
            let port = PKReceivePort()
            port.onInvalidation = { log.add("invalidated") }
            try loop.add(port, forMode: .default)
            try TestThread { port.invalidate() }.joinPatiently()
            // A pass in another mode: the port is still in its own, so nothing is finished yet.
            try runOtherMode(loop, "a pass") { loop.queuedPerformBlocks == 0 }
            #expect(log.value.isEmpty)
            loop.remove(port, forMode: .default)
            #expect(log.value == ["invalidated"])
        }
    }

    // MARK: - Senders leaving

    /// A sender invalidates its right after sending: the receiver gets every message it sent,
    /// then `onNoSenders`, once, on the owning loop; the port stays valid and
    /// `onInvalidation` does not run.
    @Test func sendRightInvalidatedAfterSending() throws {
        try onPortLoopThread { loop in
            let log = Log()
            let owner = currentThreadID
            let port = PKReceivePort { log.add("message \($0.msgid)") }
            port.onNoSenders = { log.add(currentThreadID == owner ? "no senders" : "no senders elsewhere") }
            port.onInvalidation = { log.add("invalidated") }
            try loop.add(port, forMode: .default)
            let right = try rightsByMessage(to: port, count: 1, on: loop)[0]
            // The sender thread sends and leaves before the loop reads anything.
            let sender = TestThread {
                for id in UInt32(1)...200 { try? right.send(PKPortMessage(msgid: id, data: bytes(100)), timeout: .seconds(5)) }
                right.invalidate()
            }
            try sender.joinPatiently()
            #expect(!right.isValid)
            #expect { try right.send(PKPortMessage(msgid: 999), timeout: .seconds(1)) } throws: {
                ($0 as? PKError)?.code == .invalidPort
            }
            try runLoop(loop, "no senders") { log.value.contains { $0.hasPrefix("no senders") } }
            runLoop(loop, for: .milliseconds(20))
            #expect(log.value == (1...200).map { "message \($0)" } + ["no senders"])
            #expect(port.isValid)
            port.invalidate()
            #expect(log.count("invalidated") == 1)
        }
    }

    /// The last in-process right leaves after a message whose handler sends the port on in a
    /// message (a right of its own for whoever reads it): the port still has a sender, and
    /// `onNoSenders` waits until that one has gone too.
    @Test func noSendersWaitsForARightTheLastMessagesHandlerGaveOut() throws {
        try onPortLoopThread { loop in
            let log = Log()
            let holder = PKReceivePort()
            try loop.add(holder, forMode: "ns-holder")  // a mode nobody runs: its mailbox keeps the right
            let port = PKReceivePort()
            port.handler = { [unowned port] message in
                log.add("message \(message.msgid)")
                try? holder.makeSendRight().send(PKPortMessage(msgid: 9, replyPort: port.makeSendRight()), timeout: .seconds(1))
            }
            port.onNoSenders = { log.add("no senders") }
            try loop.add(port, forMode: .default)
            let right = try rightsByMessage(to: port, count: 1, on: loop)[0]
            try right.send(PKPortMessage(msgid: 1), timeout: .seconds(1))
            right.invalidate()
            try runLoop(loop, "message 1") { log.value.contains("message 1") }
            #expect(log.value == ["message 1"])
            holder.invalidate()  // drops the message, and the right in it
            try runLoop(loop, "no senders") { log.value.contains("no senders") }
            #expect(log.value == ["message 1", "no senders"])
            port.invalidate()
        }
    }

    /// A raw sender closes its connection cleanly after its frames (the end of a sender's
    /// life, or its process dying): every frame is delivered, then `onNoSenders`.
    @Test func peerClosingAfterItsFrames() throws {
        try onPortLoopThread { loop in
            let log = Log()
            let port = PKReceivePort { log.add("message \($0.msgid)") }
            port.onNoSenders = { log.add("no senders") }
            try loop.add(port, forMode: .default)
            let peer = try RawPeer(to: port)
            var stream = RawPeer.greeting
            for id in UInt32(1)...5 { stream += RawPeer.frame(msgid: id, data: [UInt8(id)]) }
            #expect(peer.write(stream) == nil)
            peer.close()
            try runLoop(loop, "no senders") { log.value.contains("no senders") }
            #expect(log.value == (1...5).map { "message \($0)" } + ["no senders"])
            #expect(port.isValid)
            port.invalidate()
        }
    }

    /// The connection breaks (the receiver drops it for a protocol error): the right over it
    /// becomes invalid, its watch fires once, a send fails with `.invalidPort`, and the port
    /// learns it has no senders, after the messages that came before the break.
    @Test func connectionBroken() throws {
        try onPortLoopThread { loop in
            let log = Log()
            let port = PKReceivePort { log.add("message \($0.msgid)") }
            port.onNoSenders = { log.add("no senders") }
            try loop.add(port, forMode: .default)
            // A right over a connection of its own (an in-process message would carry an
            // in-process right, which has no socket to break).
            let right = PKSendPort(connection: SendConnection(takingOwnershipOf: try port.makeTransferDescriptor()))
            var watchFired = 0
            try right.watchInvalidation(on: loop, forMode: .default) { watchFired += 1 }
            try right.send(PKPortMessage(msgid: 1), timeout: .seconds(1))
            // Garbage on the right's own socket breaks the connection.
            guard case .connection(let connection) = right.storage else { Issue.record("not a connection"); return }
            let garbage: [UInt8] = [0xDE, 0xAD, 0xBE, 0xEF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
            _ = garbage.withUnsafeBytes { Glibc.send(connection.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            try runLoop(loop, "the break to be seen") { watchFired > 0 && log.value.contains("no senders") }
            runLoop(loop, for: .milliseconds(20))
            #expect(watchFired == 1)
            #expect(log.value == ["message 1", "no senders"])
            #expect(!right.isValid)
            #expect { try right.send(PKPortMessage(msgid: 2), timeout: .seconds(1)) } throws: {
                ($0 as? PKError)?.code == .invalidPort
            }
            #expect(port.isValid)
            port.invalidate()
        }
    }

    // MARK: - Watching a send right

    /// `watchInvalidation` fires once, on the watching loop, when the port dies; for a local
    /// right and for an independent one, and twice-watched rights fire each watch.
    @Test func watchInvalidationFiresOnceWhenThePortDies() throws {
        let server = try PortServer { _, _ in }
        let local = server.right
        let independent = try independentRight(to: server.port)
        let fired = Locked<[String]>([])
        try onPortLoopThread { loop in
            let owner = currentThreadID
            func note(_ name: String) -> () -> Void { { fired.withLock { $0.append(currentThreadID == owner ? name : name + " elsewhere") } } }
            let w1 = try local.watchInvalidation(on: loop, note("local"))
            let w2 = try independent.watchInvalidation(on: loop, note("independent"))
            let w3 = try independent.watchInvalidation(on: loop, note("independent again"))
            let cancelled = try independent.watchInvalidation(on: loop, note("cancelled"))
            cancelled.cancel()
            runLoop(loop, for: .milliseconds(20))
            #expect(fired.value.isEmpty)
            try server.stop()
            try runLoop(loop, "every watch") { fired.value.count >= 3 }
            runLoop(loop, for: .milliseconds(30))
            #expect(fired.value.sorted() == ["independent", "independent again", "local"])
            _ = (w1, w2, w3)
        }
    }

    /// A watch on a right that is already invalid fires once, on the loop's next pass.
    @Test func watchOnAnInvalidRightFiresOnce() throws {
        let server = try PortServer { _, _ in }
        let local = server.right
        let independent = try independentRight(to: server.port)
        try server.stop()
        try waitPatiently("invalid") { !independent.isValid }
        try onPortLoopThread { loop in
            var fired: [String] = []
            try local.watchInvalidation(on: loop) { fired.append("local") }
            try independent.watchInvalidation(on: loop) { fired.append("independent") }
            try runLoop(loop, "both watches") { fired.count == 2 }
            runLoop(loop, for: .milliseconds(20))
            #expect(fired.sorted() == ["independent", "local"])
        }
    }

    /// Invalidating a send right (not the port) fires that right's watch once.
    @Test func watchFiresWhenTheRightItselfIsInvalidated() throws {
        try onPortLoopThread { loop in
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            let right = try rightsByMessage(to: port, count: 1, on: loop)[0]
            var fired = 0
            try right.watchInvalidation(on: loop) { fired += 1 }
            right.invalidate()
            try runLoop(loop, "the watch") { fired > 0 }
            runLoop(loop, for: .milliseconds(20))
            #expect(fired == 1)
            port.invalidate()
        }
    }

    /// A watch on an in-process right cancelled after the right (or its port) became invalid
    /// but before the loop ran the report: the handler is not called, as `cancel()` promises.
    /// (The report, already queued on the loop, called it: a handler that reached its owner
    /// `unowned`, cancelled in the owner's deinit, trapped.)
    @Test func aWatchCancelledWhileItsReportIsQueuedDoesNotFire() throws {
        try onPortLoopThread { loop in
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            var fired: [String] = []
            // A right of its own (as one received in a message), whose invalidation is reported
            // to its watch; and the port's shared one, whose watch the port's death reports.
            let right = PKSendPort(localRight: LocalRight(port: port))
            let other = port.makeSendRight()
            let watch = try right.watchInvalidation(on: loop) { fired.append("right") }
            let portWatch = try other.watchInvalidation(on: loop) { fired.append("port") }
            right.invalidate()
            watch.cancel()
            port.invalidate()
            portWatch.cancel()
            runLoop(loop, for: .milliseconds(20))
            #expect(fired.isEmpty)
        }
    }

    // MARK: - No SIGPIPE

    /// Sending to a port whose receive side was invalidated fails with `.invalidPort`, in this
    /// process (a SIGPIPE would end the whole test run).
    @Test func sendingToADeadPortIsAnErrorNotASignal() throws {
        let server = try PortServer { _, _ in }
        let rights = [server.right, try independentRight(to: server.port)]
        try server.stop()
        for right in rights {
            for size in [0, 1 << 20] {
                #expect { try right.send(PKPortMessage(msgid: 1, data: bytes(size)), timeout: .seconds(1)) } throws: {
                    ($0 as? PKError)?.code == .invalidPort
                }
            }
        }
    }

    /// The same in a child process whose SIGPIPE disposition is the default (terminate): the
    /// send reports `.invalidPort` and the process exits normally.
    @Test func sendingToADeadPortRaisesNoSIGPIPE() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                _ = signal(SIGPIPE, SIG_DFL)
                let port = PKReceivePort()
                guard let right = try? independentRight(to: port) else { exit(2) }
                port.invalidate()
                for size in [0, 1 << 20] {
                    do {
                        try right.send(PKPortMessage(msgid: 1, data: bytes(size)), timeout: .seconds(1))
                        exit(3)
                    } catch {
                        if (error as? PKError)?.code != .invalidPort { exit(4) }
                    }
                }
                exit(0)
            }
        }
    }
}
