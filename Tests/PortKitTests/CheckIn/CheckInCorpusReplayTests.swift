// Replays the check-in fuzzer's seed corpus (Fuzz/Corpus/checkin) through the same property the
// fuzzer checks, `CheckInFuzzing.exercise`, on every `swift test`. A broken property traps, so a
// regression fails the run at the input that shows it (Support/FuzzCorpus.swift).

import Testing
@testable import PortKit

@Suite struct CheckInCorpusReplayTests {
    static let corpus = FuzzCorpus("checkin")

    @Test func corpusIsThere() throws {
        // Guards against replaying nothing when the directory moves.
        #expect(try Self.corpus.inputs().count >= 18)
    }

    @Test func replaysEveryInput() throws {
        try Self.corpus.replay { CheckInFuzzing.exercise($0) }
    }

    @Test func workerEnvironmentRoundTrips() {
        for (name, hasMainPort) in [("w", false), ("a:b", true), ("", true), ("x:1", false)] {
            let value = PKWorkerProcess.environmentValue(name: name, hasMainPort: hasMainPort)
            let parsed = PKWorkerProcess.parseEnvironmentValue(value)
            #expect(parsed?.name == name && parsed?.hasMainPort == hasMainPort, "\(value)")
        }
        for refused in ["", "name", "name:", "name:2", "name:01", "name:1 "] {
            #expect(PKWorkerProcess.parseEnvironmentValue(refused) == nil, "\(refused)")
        }
    }
}
