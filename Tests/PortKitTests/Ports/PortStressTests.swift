// Rows 7 and 9 of the reliability issue: a stalled consumer (the sender is held by the queue
// limit, memory plateaus, nothing is lost) and signal storms with tiny socket buffers (nothing
// corrupted, lost or duplicated; deadlines still hold). Each test prints its figures.

import Testing
import Foundation
@testable import PortKit

@Suite(.serialized) struct PortStressTests {
    enum Sender: String, Sendable, Codable, CaseIterable { case thread, process }

    /// Row 7: a consumer whose handler does not return (it runs its loop nested, waiting for
    /// something else, as a handler making a request does) still runs the port's sources, so
    /// without a limit its queue would grow for as long as the sender pushes. With a queue
    /// limit of 256 messages and 4 MiB, a sender of 1,000 messages of 1 byte to 64 KiB is held:
    /// a thread (through `makeSendRight()`, in memory) gets `.sendTimedOut` from its sends with
    /// a 50 ms deadline, a process (through the name, a socket) blocks in a send with a 60 s
    /// deadline once the socket and its connection's 64 KiB of pending bytes are full.
    /// While it is held for a second it makes no progress and our resident memory stays flat.
    /// Once the consumer returns, every message arrives once, in order, intact.
    ///
    /// Run in a child process (an exit test), so that resident memory is this test's alone.
    @Test(arguments: Sender.allCases)
    func stalledConsumerHoldsTheSenderAndLosesNothing(_ sender: Sender) async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) { [sender] in
                let dir = TemporaryNameDirectory()
                do {
                    let (report, failures) = try await Self.stalledConsumer(sender, dir)
                    try? FileManager.default.removeItem(atPath: dir.path)  // exit() runs no deinit
                    endExitTest(report, failures: failures)
                } catch {
                    try? FileManager.default.removeItem(atPath: dir.path)
                    endExitTest("failed: \(error)", failures: ["\(error)"])
                }
            }
        }
    }

    /// The body of `stalledConsumerHoldsTheSenderAndLosesNothing`: its figures and failed checks.
    static func stalledConsumer(_ sender: Sender, _ dir: TemporaryNameDirectory) async throws -> (String, [String]) {
        let count: UInt32 = 1000
        let maxSize = 64 * 1024
        var limits = PKPortLimits()
        limits.maxQueuedMessages = 256
        limits.maxQueuedBytes = 4 << 20
        return try await awaitLoopThread(timeout: patience(.seconds(120))) { [limits] loop in
            var received: [UInt32] = []
            var receivedBytes = 0
            var torn = 0
            var stall: (() -> Void)?
            let port = PKReceivePort(limits: limits) { message in
                received.append(message.msgid)
                receivedBytes += message.data.count
                let fill = UInt8(truncatingIfNeeded: message.msgid)
                if message.data.isEmpty || message.data.contains(where: { $0 != fill }) { torn += 1 }
                if let stalling = stall {
                    stall = nil
                    stalling()
                }
            }
            try loop.add(port, forMode: .default)
            try dir.server.register(port, name: "stalled")

            // The sender's progress (messages sent, and when the count last moved), its
            // timeouts, and at the end the bytes it sent.
            let progress = Locked<(sent: UInt32, at: PKDeadline)>((0, .now))
            let timeouts = Locked(0)
            let sentBytes = Locked<Int?>(nil)
            let worker: TestThread
            var peer: PeerProcess?
            switch sender {
            case .thread:
                let right = port.makeSendRight()
                worker = TestThread(name: "stall-sender") {
                    var bytes = 0
                    for sequence in UInt32(1)...count {
                        let data = [UInt8](repeating: UInt8(truncatingIfNeeded: sequence), count: Int.random(in: 1...maxSize))
                        while true {
                            do {
                                try right.send(PKPortMessage(msgid: sequence, data: data), timeout: .milliseconds(50))
                                break
                            } catch let error as PKError where error.code == .sendTimedOut {
                                timeouts.withLock { $0 += 1 }
                            } catch {
                                return
                            }
                        }
                        bytes += data.count
                        progress.value = (sequence, .now)
                    }
                    sentBytes.value = bytes
                }
            case .process:
                let process = try PeerProcess(["stall-send", dir.path, "stalled", "\(count)", "\(maxSize)"])
                peer = process
                worker = TestThread(name: "stall-reader") {
                    while let line = try? process.readLine(timeout: patience(.seconds(60))) {
                        let words = line.split(separator: " ")
                        if words.first == "sent" { progress.value = (UInt32(words[1])!, .now) }
                        if words.first == "done" { sentBytes.value = Int(words[2])!; return }
                    }
                }
            }

            // The first message stalls the consumer: running its loop, it waits until the
            // sender has made no progress for 300 ms (held), then a second more, sampling
            // memory and the sender's progress at both ends.
            var held: (sent: UInt32, rss: Int, sentLater: UInt32, rssLater: Int)?
            stall = {
                let deadline = PKDeadline.after(patience(.seconds(30)))
                while !deadline.hasPassed {
                    let now = progress.value
                    if now.sent > 0 && PKDeadline.now - now.at > .milliseconds(300) { break }
                    loop.run(in: .default, until: .after(.milliseconds(10)))
                }
                let atHeld = (progress.value.sent, residentBytes())
                let heldFor = PKDeadline.after(.seconds(1))
                while !heldFor.hasPassed { loop.run(in: .default, until: heldFor) }
                held = (atHeld.0, atHeld.1, progress.value.sent, residentBytes())
            }
            try runLoop(loop, timeout: .seconds(60), "every message after the stall") { received.count >= Int(count) && sentBytes.value != nil }
            try worker.joinPatiently()
            guard let stalled = held else { throw PeerError(description: "the consumer never stalled") }
            let report = "stalled consumer, \(sender.rawValue) sender: held after \(stalled.sent) of \(count) messages (queue limit 256 messages / 4 MiB), still \(stalled.sentLater) a second later; resident memory \(stalled.rss >> 20) MiB when held, \(stalled.rssLater >> 20) MiB a second later; \(timeouts.value) sends timed out; received \(received.count) messages, \(receivedBytes) bytes, \(torn) torn"
            var failures: [String] = []
            if stalled.sent >= count { failures.append("the sender was never held") }
            if stalled.sentLater != stalled.sent { failures.append("the sender made progress while the consumer stalled") }
            if residentMemoryIsMeaningful && stalled.rssLater - stalled.rss >= 16 << 20 { failures.append("memory grew while the sender was held") }
            if sender == .thread && timeouts.value == 0 { failures.append("no send timed out") }
            if received != Array(1...count) { failures.append("\(received.count) messages received, or out of order") }
            if receivedBytes != sentBytes.value { failures.append("\(receivedBytes) bytes received of \(sentBytes.value ?? -1) sent") }
            if torn != 0 { failures.append("\(torn) torn messages") }
            port.invalidate()
            if let peer, try peer.waitForExit() != 0 { failures.append("the sending process failed") }
            return (report, failures)
        }
    }

    /// Row 9: four threads send 250 messages each (60 under ThreadSanitizer) of sizes
    /// spread evenly over the orders of magnitude from 1 byte to the port's 1 MiB limit,
    /// through connections whose socket send buffers are the kernel's minimum (so nearly
    /// every message is written and read in many parts), while every 200 µs SIGUSR1 (a no-op
    /// handler without `SA_RESTART`) interrupts the senders and the receiving loop's thread.
    /// Every message arrives once, in order per sender, byte for byte. Meanwhile a send with a
    /// 100 ms deadline to a port whose queue is full still times out on time.
    @Test func signalStormsAndTinySocketBuffersCorruptNothing() async throws {
        let storm = SignalStorm()
        let senders = 4
        let perSender = runsUnderThreadSanitizer ? 60 : 250
        let limit = 1 << 20
        let started = PKDeadline.now
        let (received, corrupt, timedOutAfter, chunks) = try await awaitLoopThread(timeout: patience(.seconds(300))) { loop in
            storm.join()
            defer { storm.leave() }
            var limits = PKPortLimits()
            limits.maxMessageBytes = limit
            var received = [[UInt32]](repeating: [], count: senders)
            var corrupt = 0
            let port = PKReceivePort(limits: limits) { message in
                let sender = Int(message.msgid >> 24)
                let sequence = message.msgid & 0xFF_FFFF
                guard sender < senders else { corrupt += 1; return }
                received[sender].append(sequence)
                if !matchesPattern(message.data, seed: message.msgid) { corrupt += 1 }
            }
            try loop.add(port, forMode: .default)
            let rights = try (0..<senders).map { _ in try independentRight(to: port) }
            let sendBuffer = rights.map { shrinkSendBuffer($0) }
            let threads = (0..<senders).map { sender in
                TestThread(name: "storm-sender-\(sender)") { [rights] in
                    storm.join()
                    defer { storm.leave() }
                    for sequence in 0..<perSender {
                        let size = sequence == 0 ? 1 : sequence == 1 ? limit : logUniformSize(upTo: limit)
                        let msgid = UInt32(sender) << 24 | UInt32(sequence)
                        do {
                            try rights[sender].send(PKPortMessage(msgid: msgid, data: patterned(size, seed: msgid)), timeout: patience(.seconds(60)))
                        } catch {
                            Issue.record("sender \(sender), message \(sequence): \(error)")
                            return
                        }
                    }
                }
            }
            try runLoop(loop, timeout: .seconds(240), "every message through the storm") {
                received.reduce(0) { $0 + $1.count } >= senders * perSender || corrupt > 0
            }
            for thread in threads { try thread.joinPatiently(timeout: .seconds(60)) }

            // Deadlines hold through the storm: a port whose queue is full (scheduled in a mode
            // nobody runs) makes a send from another thread time out after its 100 ms, not
            // never, through a socket and through the in-memory mailbox alike.
            let stalled = PKReceivePort()
            try loop.add(stalled, forMode: "unread")
            let stalledRights: [PKSendPort] = [try independentRight(to: stalled), stalled.makeSendRight()]
            let timedOutAfter = try stalledRights.map { right -> Duration? in
                let waited = Locked<Duration?>(nil)
                let thread = TestThread(name: "storm-deadline") {
                    storm.join()
                    defer { storm.leave() }
                    for _ in 0..<100_000 {
                        let start = PKDeadline.now
                        do { try right.send(PKPortMessage(msgid: 1, data: bytes(1024)), timeout: .milliseconds(100)) } catch {
                            if (error as? PKError)?.code == .sendTimedOut { waited.value = .now - start }
                            return
                        }
                    }
                }
                try thread.join(timeout: patience(.seconds(30)))
                return waited.value
            }
            stalled.invalidate()
            port.invalidate()
            return (received, corrupt, timedOutAfter, sendBuffer)
        }
        try storm.stop()
        let total = received.reduce(0) { $0 + $1.count }
        print("signal storm (\(storm.rounds) rounds of SIGUSR1 every 200 µs) with send buffers of \(chunks.first ?? 0) bytes: \(total) of \(senders * perSender) messages of 1 B to 1 MiB in \(milliseconds(.now - started)), \(corrupt) corrupt; a 100 ms send deadline timed out after \(timedOutAfter[0].map(milliseconds) ?? "never") (socket), \(timedOutAfter[1].map(milliseconds) ?? "never") (in memory)")
        #expect(corrupt == 0)
        for sender in 0..<senders { #expect(received[sender] == (0..<UInt32(perSender)).map { $0 }, "sender \(sender)") }
        for waited in timedOutAfter { #expect(waited != nil && waited! < .seconds(2)) }
    }
}

/// Sets a send right's socket send buffer to the kernel's minimum; returns the size it got.
private func shrinkSendBuffer(_ right: PKSendPort) -> Int32 {
    let fd = right.watchableConnection!.fd
    var size: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    var length = socklen_t(MemoryLayout<Int32>.size)
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &length)
    return size
}

/// A size from 1 to `limit`, uniform over its logarithm: as many messages of 1-10 bytes as
/// of 100 KiB-1 MiB.
private func logUniformSize(upTo limit: Int) -> Int {
    min(limit, max(1, Int(exp(Double.random(in: 0...log(Double(limit)))))))
}

/// `count` bytes whose every 4-byte word depends on its position and `seed`: a part written
/// twice, skipped or taken from another message shows.
private func patterned(_ count: Int, seed: UInt32) -> [UInt8] {
    var data = [UInt8](repeating: 0, count: count)
    data.withUnsafeMutableBytes { raw in
        let words = count / 4
        for word in 0..<words {
            raw.storeBytes(of: UInt32(truncatingIfNeeded: word) &* 2_654_435_761 ^ seed, toByteOffset: word * 4, as: UInt32.self)
        }
        for index in (words * 4)..<count { raw[index] = UInt8(truncatingIfNeeded: seed &+ UInt32(index)) }
    }
    return data
}

private func matchesPattern(_ data: [UInt8], seed: UInt32) -> Bool {
    let expected = patterned(data.count, seed: seed)
    return data.withUnsafeBytes { a in expected.withUnsafeBytes { b in memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0 } }
}
