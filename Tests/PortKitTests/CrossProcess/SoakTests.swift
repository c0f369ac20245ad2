// Row 17 of the reliability issue: a soak. Its length is PORTKIT_SOAK_SECONDS (3 s by default,
// so `swift test` stays quick; CI runs it once more for 60 s).

import Testing
import Foundation
@testable import PortKit

@Suite struct SoakTests {
    static let seconds = ProcessInfo.processInfo.environment["PORTKIT_SOAK_SECONDS"].flatMap(Double.init) ?? 3

    /// What one soak thread did.
    struct Tally: Sendable {
        var sent = 0
        var requests = 0
        var outOfOrder = 0
        var problems: [String] = []
    }

    /// Eight threads, each with a port on its own loop, in a ring: each sends numbered
    /// messages to the next, each carrying a send right to its own port on which the next
    /// thread acknowledges it (at most 32 unacknowledged), and between those sends a request
    /// to one of two echo processes carrying that right too (it travels there and back). At
    /// the end each thread has every message of its predecessor once, in order, and every
    /// acknowledgement; resident memory and the descriptor count stay level after a warm-up
    /// quarter, and the descriptor count is back to the start once the threads are gone.
    ///
    /// Run in a child process (an exit test): no other test's descriptors or memory blur the
    /// counts, so they are checked exactly. The child prints the figures and every failed check.
    @Test func eightThreadsAndTwoProcessesExchangeMessagesWithoutLossOrGrowth() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                let dir = TemporaryNameDirectory()
                do {
                    let (report, failures) = try await Self.soak(dir)
                    // exit() runs no deinit: remove the name directory here.
                    try? FileManager.default.removeItem(atPath: dir.path)
                    endExitTest(report, failures: failures)
                } catch {
                    try? FileManager.default.removeItem(atPath: dir.path)
                    endExitTest("soak failed: \(error)", failures: ["\(error)"])
                }
            }
        }
    }

    /// The soak itself: returns its figures and the checks that failed.
    static func soak(_ dir: TemporaryNameDirectory) async throws -> (String, [String]) {
        // On a thread of its own, with a deadline: a hang fails the child instead of holding it.
        try await awaitLoopThread(timeout: patience(.seconds(Int(seconds) + 120))) { loop in
            warmUpLoopDescriptors(loop)
            let peers = try (0..<2).map { try PeerProcess(["echo", dir.path, "soak-\($0)"]) }
            for peer in peers { try peer.expectLine("ready") }
            let startDescriptors = openDescriptorCount()
            let threadCount = 8
            let duration = Duration.milliseconds(Int(seconds * 1000))
            let began = PKDeadline.now
            let ends = PKDeadline.after(duration)
            let rights = Locked<[Int: PKSendPort]>([:])
            let tallies = Locked<[Int: Tally]>([:])
            let threads = (0..<threadCount).map { index in
                TestThread(name: "soak-\(index)") {
                    var tally = Tally()
                    do { try soakThread(index, of: threadCount, dir: dir, ends: ends, rights: rights, tally: &tally) } catch {
                        tally.problems.append("\(error)")
                    }
                    tallies.withLock { $0[index] = tally }
                }
            }
            // Sample memory and descriptors while the threads run.
            var samples: [(at: Duration, rss: Int, descriptors: Int)] = []
            while !ends.hasPassed {
                samples.append((.now - began, residentBytes(), openDescriptorCount()))
                sleepFor(.milliseconds(250))
            }
            for thread in threads { try thread.join(timeout: patience(.seconds(60))) }
            var failures: [String] = []
            for (index, peer) in peers.enumerated() {
                try dir.server.lookUp("soak-\(index)").send(PKPortMessage(msgid: 99), timeout: .seconds(5))
                let status = try peer.waitForExit()
                if status != 0 { failures.append("echo process \(index) exited with \(status)") }
            }
            rights.value = [:]  // they hold the threads' ports, and so their loops
            do {
                try waitUntil("descriptors to settle", timeout: patience(.seconds(10))) { openDescriptorCount() <= startDescriptors }
            } catch {
                failures.append("descriptors: \(openDescriptorCount()) at the end, \(startDescriptors) at the start")
            }

            let all = tallies.value.values
            let warmUp = max(1, samples.count / 4)
            let warm = samples.prefix(warmUp)
            let steady = samples.dropFirst(warmUp)
            let rssAtWarm = warm.map(\.rss).max() ?? 0
            let fdsAtWarm = warm.map(\.descriptors).max() ?? 0
            let sent = all.reduce(0) { $0 + $1.sent }
            let requests = all.reduce(0) { $0 + $1.requests }
            let report = "soak \(seconds) s, \(threadCount) threads and 2 processes: \(sent) ring messages with a port each, \(requests) requests to processes with a port each, \(all.reduce(0) { $0 + $1.outOfOrder }) lost or out of order; resident memory \(rssAtWarm >> 20) MiB after warm-up, \((steady.map(\.rss).max() ?? 0) >> 20) MiB at most after, \((samples.last?.rss ?? 0) >> 20) MiB at the end; descriptors \(startDescriptors) at the start, \(fdsAtWarm) at most in warm-up, \(steady.map(\.descriptors).max() ?? 0) at most after, \(openDescriptorCount()) at the end"
            if all.count != threadCount { failures.append("\(all.count) of \(threadCount) threads reported") }
            for (index, tally) in tallies.value.sorted(by: { $0.key < $1.key }) {
                if !tally.problems.isEmpty { failures.append("thread \(index): \(tally.problems)") }
                if tally.outOfOrder != 0 { failures.append("thread \(index): \(tally.outOfOrder) lost or out of order") }
                if tally.sent == 0 || tally.requests == 0 { failures.append("thread \(index): \(tally.sent) sent, \(tally.requests) requests") }
            }
            // A leak of 88 bytes per request (a port's recvmsg buffer) grew a 60 s soak by 6 MiB.
            // A short soak's warm-up quarter is under a second, too short to reach the plateau.
            let allowedGrowth = seconds >= 30 ? 4 << 20 : 32 << 20
            if residentMemoryIsMeaningful && (steady.map(\.rss).max() ?? 0) >= rssAtWarm + allowedGrowth {
                failures.append("resident memory kept growing")
            }
            // Connections come and go with the requests' rights, so the count moves (60 s: 110 at
            // most in warm-up, 115 after); a leak of one per request would add thousands.
            if (steady.map(\.descriptors).max() ?? 0) > fdsAtWarm + 64 { failures.append("descriptors kept growing") }
            return (report, failures)
        }
    }
}

private let acknowledgement: UInt32 = 0x8000_0000
private let lastMessage: UInt32 = 0x7FFF_FFFF

/// The payload of message `sequence`: 64 to 1,023 bytes, each the sequence number's low byte.
private func soakPayload(_ sequence: Int) -> [UInt8] {
    [UInt8](repeating: UInt8(truncatingIfNeeded: sequence), count: 64 + sequence % 960)
}

/// One soak thread: its port, its share of the ring and of the requests, then the drain.
private func soakThread(
    _ index: Int, of count: Int, dir: TemporaryNameDirectory, ends: PKDeadline,
    rights: Locked<[Int: PKSendPort]>, tally: inout SoakTests.Tally
) throws {
    let loop = PKRunLoop.current
    var expected = 0
    var outOfOrder = 0
    var acknowledged = 0
    var predecessorSent: Int?
    let port = PKReceivePort { message in
        if message.msgid & acknowledgement != 0 {
            acknowledged += 1
        } else if message.msgid == lastMessage {
            predecessorSent = Int(message.text)
        } else {
            if message.msgid != UInt32(expected) || message.data != soakPayload(expected) { outOfOrder += 1 }
            expected = Int(message.msgid) + 1
            try? message.ports.first?.send(PKPortMessage(msgid: acknowledgement | message.msgid), timeout: .seconds(10))
        }
    }
    try loop.add(port, forMode: .default)
    defer { port.invalidate() }
    rights.withLock { $0[index] = port.makeSendRight() }
    try waitUntil("every soak thread's port", timeout: .seconds(30)) { rights.value.count == count }
    let next = rights.value[(index + 1) % count]!
    let process = try dir.server.lookUp("soak-\(index % 2)", timeout: .seconds(10))
    while !ends.hasPassed {
        // A request to a process, carrying our port there and back.
        let data = soakPayload(tally.requests)
        let reply = try process.sendRequest(
            PKPortMessage(msgid: 5, components: [.data(data), .port(port.makeSendRight())]),
            sendTimeout: .seconds(10), receiveTimeout: patience(.seconds(10)))
        if reply?.data != data || reply?.ports.count != 1 { tally.problems.append("request \(tally.requests): a wrong reply") }
        for carried in reply?.ports ?? [] { carried.invalidate() }
        tally.requests += 1
        // Messages to the next thread, each with a port for its acknowledgement.
        while tally.sent - acknowledged < 32 {
            try next.send(PKPortMessage(msgid: UInt32(tally.sent), components: [.data(soakPayload(tally.sent)), .port(port.makeSendRight())]), timeout: .seconds(10))
            tally.sent += 1
        }
        loop.run(in: .default, until: .after(.milliseconds(1)))
    }
    try next.send(PKPortMessage(msgid: lastMessage, data: Array("\(tally.sent)".utf8)), timeout: .seconds(10))
    let deadline = PKDeadline.after(patience(.seconds(30)))
    while (acknowledged < tally.sent || predecessorSent == nil) && !deadline.hasPassed {
        loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
    }
    if acknowledged != tally.sent { tally.problems.append("\(acknowledged) of \(tally.sent) messages acknowledged") }
    if predecessorSent != expected { tally.problems.append("received \(expected) messages, the predecessor sent \(predecessorSent ?? -1)") }
    tally.outOfOrder = outOfOrder
}
