// Replays the check-in fuzzer's seed corpus (Fuzz/Corpus/checkin) through the same property the
// fuzzer checks, `CheckInFuzzing.exercise`, on every `swift test`. A broken property traps, so a
// regression fails the run at the input that shows it. The seeds are written by
// Fuzz/make-corpus.swift; crash inputs the fuzzer finds (Fuzz/run.sh checkin) are added as
// crash-* once fixed.

import Foundation
import Testing
@testable import PortKit

@Suite struct CheckInCorpusReplayTests {
    /// The corpus directory: Fuzz/Corpus/checkin, from Tests/PortKitTests/CheckIn/ (this file's folder).
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/Corpus/checkin", isDirectory: true)

    static func inputs() throws -> [URL] {
        try FileManager.default.contentsOfDirectory(at: corpus, includingPropertiesForKeys: nil)
            .filter { !$0.lastPathComponent.hasPrefix(".") }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    @Test func corpusIsThere() throws {
        // Guards against replaying nothing when the directory moves.
        #expect(try Self.inputs().count >= 18)
    }

    @Test func replaysEveryInput() throws {
        for url in try Self.inputs() {
            let bytes = try Data(contentsOf: url)
            bytes.withUnsafeBytes { CheckInFuzzing.exercise($0) }
        }
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
