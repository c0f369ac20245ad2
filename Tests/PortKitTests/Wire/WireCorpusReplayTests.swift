// Replays the wire fuzzer's seed corpus (Fuzz/Corpus/wire) through the same property the fuzzer
// checks, `WireFuzzing.exercise`, on every `swift test`. A broken property traps, so a
// regression fails the run at the input that shows it (Support/FuzzCorpus.swift).

import Testing
@testable import PortKit

@Suite struct WireCorpusReplayTests {
    static let corpus = FuzzCorpus("wire")

    @Test func corpusIsThere() throws {
        // Guards against replaying nothing when the directory moves.
        #expect(try Self.corpus.inputs().count >= 18)
    }

    @Test func replaysEveryInput() throws {
        try Self.corpus.replay { WireFuzzing.exercise($0) }
    }

    @Test func seedsReachTheirOutcome() throws {
        // The valid seeds must decode and the malformed ones must fail, or the corpus no
        // longer starts the fuzzer where it is meant to.
        let valid = ["attach-sender", "byte-by-byte", "empty-and-data-frames", "greeting-only",
                     "ports-and-reply-port", "reply-back-requests", "small-limits-at-limit", "split-in-place"]
        for name in try Self.corpus.inputs().map(\.lastPathComponent)
        where !name.hasPrefix("crash-") && !name.hasPrefix("gen-") {
            let bytes = try Self.corpus.bytes(of: name)
            let failed = Self.fails(bytes)
            #expect(failed == !valid.contains(name), "\(name): decoder \(failed ? "failed" : "succeeded")")
        }
        // Answers are valid on a reply channel only.
        let answers = try Self.corpus.bytes(of: "reply-channel-answers")
        #expect(!Self.fails(answers, direction: .toRequester))
    }

    /// Whether the stream of a raw-mode corpus input (all at once) ends in a protocol error;
    /// descriptors are supplied as its frames claim them, ahead of the bytes.
    static func fails(_ input: [UInt8], direction: WireDirection = .toPort) -> Bool {
        guard let header = input.first else { return false }
        let stream = input.dropFirst(1 + Int(header & 0x1F))
        let limits = header & 0x40 != 0
            ? WireLimits(maxMessageBytes: 64, maxDescriptors: 4, maxComponents: 8) : WireLimits.default
        let descriptors = Int(input.dropFirst().prefix(Int(header & 0x1F)).reduce(0) { $0 + Int($1 >> 6) })
        var decoder = WireDecoder(limits: limits, direction: direction)
        decoder.append(descriptors: fakeDescriptors(descriptors))
        var outcome = DecodeOutcome()
        decoder.feed(stream, into: &outcome)
        if outcome.error != nil { return true }
        return (try? decoder.finish()) == nil
    }
}
