#if ZeroMQ
// Replays the ZeroMQ fuzzer's seed corpus (Fuzz/Corpus/zmq) through the same property the fuzzer
// checks, `ZMQFuzzing.exercise`, on every `swift test --traits ZeroMQ`. A broken property traps,
// so a regression fails the run at the input that shows it. The seeds are written by
// Fuzz/make-corpus.swift; crash inputs the fuzzer finds (Fuzz/run.sh 60 zmq) are added as crash-*
// once fixed.

import Foundation
import Testing
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQCorpusReplayTests {
    /// The corpus directory: Fuzz/Corpus/zmq, from Tests/PortKitZeroMQTests/ (this file's folder).
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/Corpus/zmq", isDirectory: true)

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
            bytes.withUnsafeBytes { ZMQFuzzing.exercise($0) }
        }
    }

    @Test func nameServiceRepliesOfAnotherShapeAreRefused() {
        let port = PKZMQSendPort(address: ZMQPortAddress(endpoint: "tcp://127.0.0.1:5556", portID: 0))
        let refused: [PKZMQMessage] = [
            PKZMQMessage(msgid: 2, components: [.data([0, 0])]),
            PKZMQMessage(msgid: 2, components: [.data([1]), .port(port)]),
            PKZMQMessage(msgid: 2, components: [.data([0]), .data([])]),
            PKZMQMessage(msgid: 2, components: [.data([0]), .port(port), .port(port)]),
            PKZMQMessage(msgid: 2, components: [.data([9])]),
        ]
        for reply in refused {
            #expect(throws: PKError.self) { _ = try ZMQNameProtocol.check(reply, name: "n", service: "s") }
        }
        #expect((try? ZMQNameProtocol.check(PKZMQMessage(msgid: 2, components: [.data([0]), .port(port)]),
                                            name: "n", service: "s")) == port)
    }
}
#endif
