// Rows 4, 6, 12, 14 and 15 of the reliability issue: peers killed mid-send, children that must
// inherit nothing, descriptor exhaustion, long name races and lookups racing an owner's death.
// Each test prints the figure docs/reliability.md reports. Every peer is PortKitTestPeer.

import Testing
import Foundation
@testable import PortKit

@Suite(.serialized) struct ProcessReliabilityTests {
    /// Row 4: 1,000 trials, each a fresh peer process flooding a port of ours with 64 KiB
    /// messages (so most kills land inside a message) while we read, killed with SIGKILL once
    /// we have received from it. From the kill we time our watch on the peer's own port firing
    /// and its connection to our port ending (after every whole message it sent was delivered;
    /// the partial one is dropped). Every delivered message is whole, and the descriptor count
    /// after the last trial is back to what it was after the first.
    ///
    /// Run in a child process (an exit test), so that no other test's descriptors blur the
    /// count; the child prints the figures and exits 0 only if every check held.
    @Test func peerKilledMidSendIsNoticedPromptlyOverAThousandTrials() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                let dir = TemporaryNameDirectory()
                let trials = 1000
                let size = 64 * 1024
                let started = PKDeadline.now
                let outcome = Result { () throws -> ([Duration], [Duration], Int, (Int, Int)) in
                    try onLoopThread(timeout: patience(.seconds(600))) { loop in
                        var delivered = 0
                        var torn = 0
                        var endedAt: PKDeadline?
                        let sink = PKReceivePort { message in
                            delivered += 1
                            // Cheap, so that the latency measured is PortKit's, not this check's.
                            if message.data.count != size || message.data.first != 7 || message.data.last != 7 { torn += 1 }
                        }
                        sink.onNoSenders = { endedAt = .now }
                        try loop.add(sink, forMode: .default)
                        try dir.server.register(sink, name: "sink")
                        var watchLatencies: [Duration] = []
                        var endLatencies: [Duration] = []
                        var baseline = 0
                        for trial in 0..<trials {
                            if trial == 1 { baseline = openDescriptorCount() }
                            let peer = try PeerProcess(["flood", dir.path, "sink", "flooder", "\(size)"])
                            try peer.expectLine("ready")
                            let right = try dir.server.lookUp("flooder")
                            var diedAt: PKDeadline?
                            let watch = try right.watchInvalidation(on: loop, forMode: .default) { diedAt = .now }
                            delivered = 0
                            endedAt = nil
                            try runLoop(loop, "trial \(trial): messages from the peer") { delivered >= 2 }
                            let killedAt = PKDeadline.now
                            peer.kill(SIGKILL)
                            try runLoop(loop, "trial \(trial): the peer's death") { diedAt != nil && endedAt != nil }
                            watch.cancel()
                            try peer.waitForExit()
                            watchLatencies.append(diedAt! - killedAt)
                            endLatencies.append(endedAt! - killedAt)
                        }
                        sink.invalidate()
                        loop.run(in: .default, until: .after(.milliseconds(20)))
                        try waitUntil("descriptors to settle", timeout: .seconds(10)) { openDescriptorCount() <= baseline }
                        return (watchLatencies, endLatencies, torn, (baseline, openDescriptorCount()))
                    }
                }
                // exit() runs no deinit: remove the name directory here.
                try? FileManager.default.removeItem(atPath: dir.path)
                switch outcome {
                case .failure(let error):
                    endExitTest("failed: \(error)", failures: ["\(error)"])
                case .success(let (watchLatencies, endLatencies, torn, counts)):
                    var failures: [String] = []
                    if torn != 0 { failures.append("\(torn) torn messages") }
                    if watchLatencies.max()! >= peerDeathBound || endLatencies.max()! >= peerDeathBound { failures.append("a death noticed after the bound, \(peerDeathBound)") }
                    if counts.1 > counts.0 { failures.append("descriptors grew") }
                    endExitTest("kill -9 mid-send, \(trials) trials in \(milliseconds(.now - started)): watch fired after \(latencySummary(watchLatencies)); connection ended after \(latencySummary(endLatencies)); torn messages \(torn); descriptors \(counts.0) after the first trial, \(counts.1) after the last", failures: failures)
                }
            }
        }
    }

    /// Row 6: a program started while ports, connections, a name and a worker thread's loop
    /// are open inherits none of their descriptors (every one is close-on-exec): its
    /// `/proc/PID/fd` lists only 0, 1 and 2. While it lives, a dead peer's invalidation still
    /// arrives, and a name given up is free at once (the child holds no copy of its lock).
    /// The spawning is done by a peer process: this test process holds descriptors that
    /// Foundation's `Process` and the test harness leave inheritable, which are not PortKit's.
    @Test func childSpawnedWhilePortsAreOpenInheritsNothing() throws {
        let dir = TemporaryNameDirectory()
        let peer = try PeerProcess(["hold", dir.path, "held"])
        try peer.expectLine("ready")
        let spawner = try PeerProcess(["inherit", dir.path, "held", "kept"])
        let childLine = try spawner.readLine()
        let child = try #require(childLine.hasPrefix("child ") ? pid_t(childLine.dropFirst(6)) : nil, "the spawner said \(childLine)")
        // posix_spawn returns once the child's exec has begun, before the kernel closes its
        // close-on-exec descriptors: look once it sleeps in /bin/sleep.
        try waitUntil("the child to sleep in /bin/sleep") {
            processState(child) == "S" && (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(child)/exe"))?.hasSuffix("/sleep") == true
        }
        let inherited = descriptorNumbers(ofProcess: child)
        let spawnerHolds = descriptorNumbers(ofProcess: spawner.pid).count
        let described = inherited.map { "\($0) → \(descriptorTarget(ofProcess: child, $0))" }
        let killedAt = PKDeadline.now
        peer.kill(SIGKILL)
        try spawner.expectLine("noticed", timeout: patience(.seconds(20)))
        let noticed = PKDeadline.now - killedAt
        try spawner.expectLine("name free")
        print("a child spawned by a process holding \(spawnerHolds) descriptors (PortKit's among them) holds \(described.joined(separator: ", ")); a peer's death was noticed while it lived, \(milliseconds(noticed)) after the kill (through a pipe); the name was free at once")
        #expect(inherited == [0, 1, 2], "inherited: \(described)")
        #expect(noticed < peerDeathBound)
        #expect(try spawner.waitForExit() == 0)
        try peer.waitForExit()
    }

    /// Row 12: a peer with `RLIMIT_NOFILE` at 64 makes named ports and connections until
    /// descriptors run out. Every failure is a `PKError` it prints (no crash, no hang); while
    /// connections wait that it cannot accept, its loop does not spin; after it releases half
    /// of what it made, the connections that waited are accepted, and a new port is
    /// registered, looked up and used.
    @Test func descriptorExhaustionFailsCleanlyAndRecovers() throws {
        let dir = TemporaryNameDirectory()
        let peer = try PeerProcess(["exhaust", dir.path, "64"])
        var lines: [String] = []
        while lines.last != "recovered" && lines.last != "not recovered" {
            lines.append(try peer.readLine(timeout: patience(.seconds(30))))
        }
        print("descriptor exhaustion under RLIMIT_NOFILE 64:\n  " + lines.joined(separator: "\n  "))
        #expect(try peer.waitForExit(timeout: patience(.seconds(20))) == 0)
        let failures = lines.filter { $0.hasPrefix("failed ") }
        #expect(!failures.isEmpty, "descriptors never ran out")
        #expect(failures.first?.contains("EMFILE") == true || failures.first?.contains("Too many open files") == true)
        #expect(lines.last == "recovered")
        // At the limit the loop waits to accept again instead of retrying on every pass.
        let words = lines.first { $0.hasPrefix("made ") }?.split(separator: " ") ?? []
        let cpu = words.firstIndex(of: "used").flatMap { $0 + 1 < words.count ? Int(words[$0 + 1]) : nil }
        #expect(cpu != nil && cpu! < 30, "the loop burned \(cpu ?? -1) ms of CPU in 200 ms at the limit")
        // Once descriptors are free again, the connections that waited are accepted.
        let accepted = lines.first { $0.hasPrefix("accepted after the limit: ") }?.split(separator: " ")
        #expect(accepted != nil && accepted![4] == accepted![6], "\(accepted?.joined(separator: " ") ?? "no report")")
    }

    /// Row 14: eight long-lived peer processes race for one name, round after round: each
    /// round every racer is told "go" (in a rotating order) and tries to register the name;
    /// exactly one wins, and once the winner releases it no socket, staging socket or lock
    /// file is left behind.
    @Test func eightProcessesRaceForOneNameOverAThousandRounds() async throws {
        let dir = TemporaryNameDirectory()
        let rounds = 1000
        let started = PKDeadline.now
        let (failedRounds, wins) = try await awaitLoopThread(timeout: patience(.seconds(300))) { _ in
            let racers = try (0..<8).map { _ in try PeerProcess(["racer", dir.path, "prize"]) }
            var wins = [Int](repeating: 0, count: racers.count)
            var failedRounds = 0
            for round in 0..<rounds {
                let order = (0..<racers.count).map { (round + $0) % racers.count }
                for index in order { try racers[index].writeLine("go") }
                let results = try racers.map { try $0.readLine() }
                let winners = results.indices.filter { results[$0] == "won" }
                for winner in winners { wins[winner] += 1 }
                for racer in racers { try racer.writeLine("release") }
                for racer in racers { try racer.expectLine("released") }
                let leftovers = try FileManager.default.contentsOfDirectory(atPath: dir.path)
                    .filter { $0.hasSuffix(".sock") || $0.hasSuffix(".new") || $0.hasSuffix(".lock") }
                let good = winners.count == 1 && results.allSatisfy { $0 == "won" || $0 == "lost" } && leftovers.isEmpty
                if !good {
                    failedRounds += 1
                    Issue.record("round \(round): \(results), left behind \(leftovers)")
                    if failedRounds == 5 { break }
                }
            }
            for racer in racers { racer.endInput() }
            for racer in racers { #expect(try racer.waitForExit() == 0) }
            return (failedRounds, wins)
        }
        print("8 processes racing for one name, \(rounds) rounds in \(milliseconds(.now - started)): \(failedRounds) bad rounds; wins per racer \(wins)")
        #expect(failedRounds == 0)
    }

    /// Row 15: the owner of a name is killed at a random moment (0-3 ms after we start) while
    /// this thread looks the name up and sends a request on each right it gets, as fast as it
    /// can. A lookup either fails cleanly (`.nameNotFound`), or its request is answered by the
    /// owner (the reply carries its pid: never another process's), or fails with the port
    /// invalidated, promptly. 200 trials.
    @Test func lookingUpANameAsItsOwnerDiesNeverReachesAnotherProcess() async throws {
        let dir = TemporaryNameDirectory()
        let trials = 200
        let (outcomes, latencies) = try await awaitLoopThread(timeout: patience(.seconds(300))) { loop in
            var outcomes: [String: Int] = [:]
            var latencies: [Duration] = []
            for trial in 0..<trials {
                let owner = try PeerProcess(["whoami", dir.path, "dying"])
                try owner.expectLine("ready")
                let ownerPID = "\(owner.pid)"
                let killedAt = Locked<PKDeadline?>(nil)
                let delay = Duration.microseconds(Int.random(in: 0...3000))
                let killer = TestThread(name: "killer") {
                    sleepFor(delay)
                    killedAt.value = .now
                    owner.kill(SIGKILL)
                }
                let deadline = PKDeadline.after(patience(.seconds(20)))
                var answered = 0
                lookups: while true {
                    if deadline.hasPassed { throw TestTimeout(what: "trial \(trial): the name to go") }
                    let right: PKSendPort
                    do {
                        right = try dir.server.lookUp("dying")
                    } catch let error as PKError where error.code == .nameNotFound {
                        outcomes["lookup failed cleanly", default: 0] += 1
                        break lookups
                    }
                    do {
                        let reply = try right.sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
                        #expect(reply?.text == ownerPID, "trial \(trial): a reply from \(reply?.text ?? "nobody"), the owner was \(ownerPID)")
                        answered += 1
                    } catch let error as PKError where error.code == .portInvalidated || error.code == .invalidPort || error.code == .transport {
                        try killer.join()
                        latencies.append(.now - killedAt.value!)
                        outcomes["request failed: the port was invalidated", default: 0] += 1
                        break lookups
                    }
                }
                outcomes["answered by the owner", default: 0] += answered
                try killer.join()
                try owner.waitForExit()
            }
            return (outcomes, latencies)
        }
        print("lookups racing the owner's kill -9, \(trials) trials: \(outcomes.sorted { $0.key < $1.key }); a looked-up right's request failed after the kill by \(latencySummary(latencies))")
        #expect(latencies.allSatisfy { $0 < peerDeathBound })
    }
}
