// Coalesced writes (docs/decisions.md): frames that wait in a connection's pending bytes when
// its socket is full, or that a handler streams within one pass, all arrive, whole and in order,
// whoever sends them: a thread that runs no loop (PortKit's flusher loop flushes), a thread
// that sends from a handler (its own loop flushes), several threads on one right.

import Foundation
import Glibc
import Testing
@testable import PortKit

@Suite struct PortCoalescingTests {
    /// Streams `count` numbered frames of `size` bytes through `send`, to a port whose loop
    /// pauses now and then, and checks that every frame arrived once, whole, in order per sender.
    /// Runs on a thread of its own (`awaitLoopThread`): it takes seconds, and must not hold one
    /// of Swift concurrency's threads meanwhile.
    private func stream(senders: Int, count: Int, size: Int, _ send: @escaping @Sendable (PKSendPort, Int, UInt32) throws -> Void) async throws {
        let result = try await awaitLoopThread(timeout: patience(.seconds(300))) { _ -> String? in
        let published = TestLatch<PKSendPort>()
        let outcome = Locked<String?>(nil)
        let receiver = TestThread(name: "slow-receiver") {
            let loop = PKRunLoop.current
            var next = [UInt32](repeating: 0, count: senders)
            var received = 0
            var problem: String?
            let port = PKReceivePort { message in
                let sender = Int(message.msgid >> 24)
                let seq = message.msgid & 0xFF_FFFF
                if sender >= senders || seq != next[sender] { problem = problem ?? "sender \(sender): frame \(seq), expected \(next[sender])" }
                if message.data.count != size || message.data.contains(where: { $0 != UInt8(truncatingIfNeeded: seq) }) { problem = problem ?? "frame \(seq) torn" }
                if sender < senders { next[sender] = seq + 1 }
                received += 1
                if received % 997 == 0 { sleepFor(.milliseconds(2)) }  // fall behind now and then
            }
            try? loop.add(port, forMode: .default)
            if let right = try? independentRight(to: port) { published.set(right) }
            let deadline = PKDeadline.after(patience(.seconds(60)))
            while received < senders * count && problem == nil && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            outcome.value = problem ?? (received == senders * count ? "ok" : "received \(received) of \(senders * count)")
            port.invalidate()
        }
        let right = try published.waitPatiently()
        let threads = (0..<senders).map { sender in
            TestThread(name: "sender-\(sender)") {
                for seq in UInt32(0)..<UInt32(count) {
                    do { try send(right, sender, seq) } catch {
                        outcome.value = outcome.value ?? "sender \(sender), frame \(seq): \(error)"
                        return
                    }
                }
            }
        }
        for thread in threads { try thread.joinPatiently(timeout: .seconds(120)) }
        try receiver.joinPatiently(timeout: .seconds(120))
        return outcome.value
        }
        #expect(result == "ok")
    }

    /// A socket pair whose writing end is full: what a right on it sends waits in its pending
    /// bytes. Returns the ends and how many bytes fill it.
    static func fullSocket() throws -> (readEnd: Int32, writeEnd: Int32, junkBytes: Int) {
        let (readEnd, writeEnd) = try Socket.pair()
        var junkBytes = 0
        let junk = [UInt8](repeating: 0, count: 4096)
        while true {
            let sent = junk.withUnsafeBytes { Glibc.send(writeEnd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            guard sent > 0 else { break }
            junkBytes += sent
        }
        return (readEnd, writeEnd, junkBytes)
    }

    /// Reads `readEnd` until the end of the stream; returns how many bytes came before it.
    private static func readToTheEnd(_ readEnd: Int32) throws -> Int {
        var received = 0
        var ended = false
        var buffer = [UInt8](repeating: 0, count: 65536)
        try waitPatiently("the end of the stream", timeout: .seconds(20)) {
            let got = buffer.withUnsafeMutableBytes { Glibc.recv(readEnd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if got > 0 { received += got }
            ended = got == 0
            return ended
        }
        return received
    }

    /// A right whose receiver reads nothing is invalidated with a frame pending: the
    /// invalidation returns at once, the right is invalid at once, and the frame, accepted
    /// before, still goes out when the receiver reads, before the end of the stream. (The
    /// invalidation waited for room, up to the frame's send deadline, 20 s here, and then
    /// dropped it; before that, it waited holding the connection's lock, which held up every
    /// other use of the right and the flusher.)
    @Test func anInvalidationWithBytesPendingReturnsAtOnceAndTheyStillGoFirst() throws {
        let (readEnd, writeEnd, junkBytes) = try Self.fullSocket()
        defer { Descriptor.close(readEnd) }
        let connection = SendConnection(takingOwnershipOf: writeEnd)
        let right = PKSendPort(connection: connection)
        let message = PKPortMessage(msgid: 1, data: [1, 2, 3])
        try right.send(message, timeout: .seconds(20))
        right.invalidate()
        // Returned with the frame still waiting: it waited for room before.
        #expect(connection.isLingering)
        #expect(!right.isValid)
        #expect(throws: PKError.self) { try right.send(PKPortMessage(msgid: 2), timeout: .seconds(1)) }
        // The receiver reads: the junk, the whole frame (as long as the same message sent on
        // an empty socket), then the end.
        let received = try Self.readToTheEnd(readEnd)
        #expect(received == junkBytes + (try Self.frameSize(of: message)), "the frame sent before the invalidation was lost, or cut")
    }

    /// A process that exits with a frame pending toward each of three receivers that read
    /// nothing waits `finalFlushPatience` (5 s) at most for them all, not that long for each.
    /// (Each connection's flush counted its 5 s from its own start: 15 s here.) The child
    /// times its own exit, from its last send to an exit handler that runs after the flush:
    /// timed by the parent, the exit also counted how long the parent took to notice it, which
    /// with the suite's tests holding Swift concurrency's threads took 17 s once.
    @Test func anExitWaitsForAllItsReceiversTogether() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                var rights: [PKSendPort] = []
                for _ in 0..<3 {
                    let (_, writeEnd, _) = try! PortCoalescingTests.fullSocket()  // the readers stay open, unread
                    let right = PKSendPort(connection: SendConnection(takingOwnershipOf: writeEnd))
                    try! right.send(PKPortMessage(msgid: 1, data: [1, 2, 3]), timeout: .seconds(20))
                    rights.append(right)
                }
                // Registered after the flush's handler (at the first pending frame), so it runs
                // after it. An exit handler may not call `exit`: it ends the process with `_exit`.
                let start = PKDeadline.now
                ProcessExit.register {
                    let elapsed = Double(PKDeadline.now.uptimeNanoseconds - start.uptimeNanoseconds) / 1e9
                    let report = "the exit's flush took \(elapsed) s"
                    _ = FileManager.default.createFile(atPath: exitReportPath(parent: getppid()), contents: Data((report + "\n").utf8))
                    _exit(elapsed < 12 ? 0 : 1)
                }
                withExtendedLifetime(rights) { exit(0) }
            }
        }
    }

    /// How many bytes `message` takes on a connection.
    private static func frameSize(of message: PKPortMessage) throws -> Int {
        let (readEnd, writeEnd) = try Socket.pair()
        defer { Descriptor.close(readEnd) }
        let right = PKSendPort(connection: SendConnection(takingOwnershipOf: writeEnd))
        try right.send(message, timeout: .seconds(20))
        right.invalidate()
        return try readToTheEnd(readEnd)
    }

    /// A right invalidated with a frame pending, whose receiver never reads: the frame lingers
    /// for `SendConnection.finalFlushPatience`, then is dropped and the connection ends (a
    /// receiver that never reads holds none of our descriptors for long).
    @Test func bytesLingeringAfterAnInvalidationAreDroppedInTime() throws {
        let (readEnd, writeEnd, junkBytes) = try Self.fullSocket()
        defer { Descriptor.close(readEnd) }
        let connection = SendConnection(takingOwnershipOf: writeEnd)
        let right = PKSendPort(connection: connection)
        try right.send(PKPortMessage(msgid: 1, data: [1, 2, 3]), timeout: .seconds(20))
        right.invalidate()
        #expect(connection.isLingering)
        try waitPatiently("the end of the linger", timeout: .seconds(30)) { !connection.isLingering }
        #expect(try Self.readToTheEnd(readEnd) == junkBytes)
    }

    /// A loop's run leaves a frame waiting for room on a connection whose receiver is behind,
    /// then its thread stops running the loop (it waits on something else); another thread sends
    /// on the same right. Once the receiver reads, both frames arrive. (The waiting connection
    /// stayed with the loop that no longer ran, and the other thread's frame joined its pending
    /// bytes, counting on that loop: neither went out until the loop ran again.)
    @Test func framesLeftByALoopThatStopsRunningStillGoOut() throws {
        let (readEnd, writeEnd, junkBytes) = try Self.fullSocket()
        defer { Descriptor.close(readEnd) }
        let right = PKSendPort(connection: SendConnection(takingOwnershipOf: writeEnd))
        let payload = 1000
        let sentInRun = Locked(false)
        let release = Locked(false)
        let owner = Self.loopThreadRunningOnce("stops-running", until: release) {
            sentInRun.value = (try? right.send(PKPortMessage(msgid: 1, data: [UInt8](repeating: 1, count: payload)), timeout: .seconds(30))) != nil
        }
        defer {
            release.value = true
            try? owner.joinPatiently()
        }
        try waitPatiently("the send in the loop's run") { sentInRun.value }
        try right.send(PKPortMessage(msgid: 2, data: [UInt8](repeating: 2, count: payload)), timeout: .seconds(30))
        // The receiver reads: the junk, then both frames (their payloads at least).
        var received = 0
        var buffer = [UInt8](repeating: 0, count: 65536)
        try waitPatiently("both frames", timeout: .seconds(20)) {
            let got = buffer.withUnsafeMutableBytes { Glibc.recv(readEnd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if got > 0 { received += got }
            return received >= junkBytes + 2 * payload
        }
    }

    /// A handler invalidates a right it has just sent a frame through, which waits for room,
    /// then stays busy: the frame still goes out whole when the receiver reads, then the end of
    /// the stream. (Its loop had the duty to write it, and did not run: the flusher only ended
    /// the linger, after 5 s, and dropped the frame though the receiver was reading.)
    @Test func aFrameLeftByABusyHandlerThatInvalidatedItsRightStillGoesOut() throws {
        let (readEnd, writeEnd, junkBytes) = try Self.fullSocket()
        defer { Descriptor.close(readEnd) }
        let right = PKSendPort(connection: SendConnection(takingOwnershipOf: writeEnd))
        let message = PKPortMessage(msgid: 1, data: [UInt8](repeating: 7, count: 1000))
        let invalidated = Locked(false)
        let release = Locked(false)
        let owner = Self.loopThreadRunningOnce("busy-handler", until: release) {
            _ = try? right.send(message, timeout: .seconds(30))
            right.invalidate()
            invalidated.value = true
            // Busy in the handler until the test is over.
            try? waitPatiently("the test", timeout: .seconds(60)) { release.value }
        }
        defer {
            release.value = true
            try? owner.joinPatiently()
        }
        try waitPatiently("the invalidation in the handler") { invalidated.value }
        let received = try Self.readToTheEnd(readEnd)
        #expect(received == junkBytes + (try Self.frameSize(of: message)), "the frame was dropped, or cut")
    }

    /// A thread whose loop runs once, performing `block` in that run, and then runs no more
    /// until `release` is set (the test's end).
    private static func loopThreadRunningOnce(_ name: String, until release: Locked<Bool>, _ block: @escaping @Sendable () -> Void) -> TestThread {
        TestThread(name: name) {
            let loop = PKRunLoop.current
            let keeper = PKCustomSource {}
            loop.add(keeper, forMode: .default)
            loop.perform(block)
            loop.runOnce(in: .default, before: .after(patience(.seconds(10))))
            try? waitPatiently("the test", timeout: .seconds(60)) { release.value }
            keeper.invalidate()
        }
    }

    private static func frame(_ sender: Int, _ seq: UInt32, size: Int) -> PKPortMessage {
        PKPortMessage(msgid: UInt32(sender) << 24 | seq, data: [UInt8](repeating: UInt8(truncatingIfNeeded: seq), count: size))
    }

    @Test(arguments: [64, 3000])
    func framesFromAThreadWithoutALoopAllArrive(size: Int) async throws {
        try await stream(senders: 1, count: 20_000, size: size) { right, sender, seq in
            try right.send(Self.frame(sender, seq, size: size), timeout: patience(.seconds(30)))
        }
    }

    @Test func framesFromSeveralThreadsOnOneRightAllArrive() async throws {
        try await stream(senders: 4, count: 5_000, size: 200) { right, sender, seq in
            try right.send(Self.frame(sender, seq, size: 200), timeout: patience(.seconds(30)))
        }
    }

    /// The loop that writes the pending bytes of threads without a loop runs on a throughput
    /// thread (SCHED_BATCH), so that asking it to write never preempts the sender in the middle
    /// of its batch; the public background loop, which serves async requests and sequences, is
    /// an ordinary thread, whose wake-ups may preempt.
    @Test func theFlusherIsAThroughputThreadAndTheBackgroundLoopIsNot() throws {
        let flusher = try #require(PKRunLoop.flusher)
        #expect(flusher.performAndWait { ThreadScheduling.prefersThroughput })
        #expect(!PKRunLoop.background.performAndWait { ThreadScheduling.prefersThroughput })
        #expect(flusher !== PKRunLoop.background)
    }

    /// A process that cannot start the flusher still gets every frame a thread without a loop
    /// sends, in order: that thread writes its pending bytes itself. Run in a child process,
    /// which refuses itself the flusher (`PKRunLoop.refuseFlusher()`) as a process out of
    /// threads, memory or descriptors could not start it.
    @Test func framesStillArriveWhenTheFlusherCannotStart() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                PKRunLoop.refuseFlusher()
                let count = 20_000
                let published = TestLatch<PKSendPort>()
                let outcome = Locked<String?>(nil)
                let receiver = TestThread(name: "slow-receiver") {
                    let loop = PKRunLoop.current
                    var next: UInt32 = 0
                    var greeted = false
                    var problem: String?
                    let port = PKReceivePort { message in
                        if message.msgid == .max { greeted = true; return }
                        if message.msgid != next { problem = problem ?? "frame \(message.msgid), expected \(next)" }
                        next = message.msgid + 1
                        if next % 997 == 0 { sleepFor(.milliseconds(2)) }  // fall behind: the socket fills
                    }
                    try? loop.add(port, forMode: .default)
                    // The right's connection is adopted (watched by the loop, which has its epoll
                    // descriptor) before it is published: streaming then needs no new descriptor.
                    guard let right = try? independentRight(to: port),
                          (try? right.send(PKPortMessage(msgid: .max), timeout: patience(.seconds(10)))) != nil,
                          (try? runLoop(loop, "the greeting frame") { greeted }) != nil else {
                        outcome.value = "could not set up the connection"
                        return
                    }
                    published.set(right)
                    let deadline = PKDeadline.after(patience(.seconds(60)))
                    while Int(next) < count && problem == nil && !deadline.hasPassed {
                        loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
                    }
                    outcome.value = problem ?? (Int(next) == count ? "ok" : "received \(next) of \(count)")
                    port.invalidate()
                }
                let sender = TestThread(name: "sender") {
                    guard let right = try? published.wait(timeout: patience(.seconds(10))) else { return }
                    let payload = [UInt8](repeating: 7, count: 64)
                    for seq in UInt32(0)..<UInt32(count) {
                        do { try right.send(PKPortMessage(msgid: seq, data: payload), timeout: patience(.seconds(30))) } catch {
                            outcome.value = outcome.value ?? "frame \(seq): \(error)"
                            return
                        }
                    }
                }
                var failures: [String] = []
                do {
                    try sender.joinPatiently(timeout: .seconds(120))
                    try receiver.joinPatiently(timeout: .seconds(120))
                } catch { failures.append("\(error)") }
                let flusherStarted = PKRunLoop.flusher != nil
                if flusherStarted { failures.append("the flusher started although the process refused it") }
                let value = outcome.value ?? "no outcome"
                if value != "ok" { failures.append(value) }
                endExitTest("\(value); flusher started: \(flusherStarted)", failures: failures)
            }
        }
    }

    /// A process that sends frames from a thread without a loop and exits at once loses none:
    /// the frames still pending when it calls `exit` go out then. Fifty trials, each 3,000
    /// frames to a receiver that falls behind now and then, so the flusher loop's flushes
    /// and the sender's new pending bytes interleave up to the end. (A flush ending on the
    /// flusher loop once unlisted bytes the sender had just made pending, and an exiting
    /// process then dropped its last frames: seen as a stalled-consumer test that never ended.)
    @Test func aProcessThatSendsAndExitsAtOnceLosesNothing() async throws {
        let trials = 50
        let count = 3_000
        let size = 200
        let dir = TemporaryNameDirectory()
        let problems = try await awaitLoopThread(timeout: patience(.seconds(300))) { loop -> [String] in
            var received = 0
            var problems: [String] = []
            let port = PKReceivePort { message in
                if message.msgid != UInt32(received) || message.data.count != size
                    || message.data.contains(where: { $0 != UInt8(truncatingIfNeeded: message.msgid) }) {
                    problems.append("frame \(message.msgid) where \(received) was due, \(message.data.count) bytes")
                }
                received += 1
                if received % 500 == 0 { sleepFor(.milliseconds(1)) }  // fall behind now and then
            }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            try dir.server.register(port, name: "sink")
            for trial in 0..<trials where problems.isEmpty {
                received = 0
                let peer = try PeerProcess(["burst", dir.path, "sink", "\(count)", "\(size)"])
                let exited = Locked<Int32?>(nil)
                let reaper = TestThread(name: "burst-reaper") { exited.value = (try? peer.waitForExit()) ?? -1 }
                do {
                    try runLoop(loop, "trial \(trial): \(count) frames") { received >= count }
                } catch {
                    problems.append("trial \(trial): \(received) of \(count) frames")
                }
                try reaper.joinPatiently(timeout: .seconds(30))
                if exited.value != 0 { problems.append("trial \(trial): the sender exited with \(exited.value ?? -1)") }
            }
            return problems
        }
        #expect(problems.isEmpty, "\(problems.prefix(5))")
    }

    /// A handler streams frames within one pass (they join the pending bytes at once); the loop
    /// writes them before it waits, and at its thread's end.
    @Test(arguments: [64, 3000])
    func framesStreamedFromAHandlerAllArrive(size: Int) async throws {
        try await stream(senders: 1, count: 20_000, size: size) { right, sender, seq in
            // Batches of 500 frames, each batch sent from inside one handler of this thread's loop.
            guard seq % 500 == 0 else { return }
            let loop = PKRunLoop.current
            var failure: Error?
            let trigger = PKReceivePort { _ in
                for each in seq..<min(seq + 500, 20_000) {
                    do { try right.send(Self.frame(sender, each, size: size), timeout: patience(.seconds(30))) } catch {
                        failure = error
                        return
                    }
                }
            }
            try loop.add(trigger, forMode: .default)
            defer { trigger.invalidate() }
            try trigger.makeSendRight().send(PKPortMessage(msgid: 0), timeout: .seconds(5))
            loop.run(in: .default, until: .after(patience(.seconds(30))), returnAfterSourceHandled: true)
            if let failure { throw failure }
        }
    }
}
