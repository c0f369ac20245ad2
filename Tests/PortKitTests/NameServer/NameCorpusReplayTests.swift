// Replays the names fuzzer's seed corpus (Fuzz/Corpus/names) through the same property the
// fuzzer checks, `NameFuzzing.exercise`, on every `swift test`. A broken property traps, so a
// regression fails the run at the input that shows it. The seeds are written by
// Fuzz/make-corpus.swift; crash inputs the fuzzer finds (Fuzz/run.sh names) are added as
// crash-* once fixed.

import Foundation
import Testing
@testable import PortKit

@Suite struct NameCorpusReplayTests {
    /// The corpus directory: Fuzz/Corpus/names, from Tests/PortKitTests/NameServer/ (this file's folder).
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/Corpus/names", isDirectory: true)

    static func inputs() throws -> [URL] {
        try FileManager.default.contentsOfDirectory(at: corpus, includingPropertiesForKeys: nil)
            .filter { !$0.lastPathComponent.hasPrefix(".") }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    @Test func corpusIsThere() throws {
        // Guards against replaying nothing when the directory moves.
        #expect(try Self.inputs().count >= 25)
    }

    @Test func replaysEveryInput() throws {
        for url in try Self.inputs() {
            let bytes = try Data(contentsOf: url)
            bytes.withUnsafeBytes { NameFuzzing.exercise($0) }
        }
    }

    @Test func seedsReachTheirOutcome() throws {
        // The valid seeds must hold valid names and the others not, or the corpus no longer
        // starts the fuzzer where it is meant to.
        let valid: Set = ["usual", "runtime-directory", "root-directory", "relative-directory", "trailing-slash",
                          "dotdot-directory", "longest", "long-directory-fits", "long-directory-too-long", "no-room"]
        for name in try Self.inputs().map(\.lastPathComponent) where !name.hasPrefix("crash-") && !name.hasPrefix("two-") {
            let bytes = try [UInt8](Data(contentsOf: Self.corpus.appendingPathComponent(name)))
            #expect(NameFuzzing.followsRule(Array(bytes.dropFirst())) == valid.contains(name), "\(name)")
        }
    }
}
