// Replays the names fuzzer's seed corpus (Fuzz/Corpus/names) through the same property the
// fuzzer checks, `NameFuzzing.exercise`, on every `swift test`. A broken property traps, so a
// regression fails the run at the input that shows it (Support/FuzzCorpus.swift).

import Testing
@testable import PortKit

@Suite struct NameCorpusReplayTests {
    static let corpus = FuzzCorpus("names")

    @Test func corpusIsThere() throws {
        // Guards against replaying nothing when the directory moves.
        #expect(try Self.corpus.inputs().count >= 25)
    }

    @Test func replaysEveryInput() throws {
        try Self.corpus.replay { NameFuzzing.exercise($0) }
    }

    @Test func seedsReachTheirOutcome() throws {
        // The valid seeds must hold valid names and the others not, or the corpus no longer
        // starts the fuzzer where it is meant to.
        let valid: Set = ["usual", "runtime-directory", "root-directory", "relative-directory", "trailing-slash",
                          "dotdot-directory", "longest", "long-directory-fits", "long-directory-too-long", "no-room"]
        for name in try Self.corpus.inputs().map(\.lastPathComponent) where !name.hasPrefix("crash-") && !name.hasPrefix("two-") {
            let bytes = try Self.corpus.bytes(of: name)
            #expect(NameFuzzing.followsRule(Array(bytes.dropFirst())) == valid.contains(name), "\(name)")
        }
    }
}
