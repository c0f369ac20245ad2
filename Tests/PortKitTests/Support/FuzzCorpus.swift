// A fuzzer's seed corpus (Fuzz/Corpus/NAME), replayed on every `swift test` through the same
// property the fuzzer checks. The corpus is found from `#filePath` rather than as a SwiftPM
// resource (it lives outside the test target, which would warn about unhandled files); its seeds
// are written by Fuzz/make-corpus.swift, and crash inputs the fuzzer finds (Fuzz/run.sh) are
// added as crash-* once fixed.

import Foundation

struct FuzzCorpus {
    /// Fuzz/Corpus/`name`, from Tests/PortKitTests/Support/ (this file's folder).
    let directory: URL

    init(_ name: String) {
        directory = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fuzz/Corpus/\(name)", isDirectory: true)
    }

    /// Every input, by name.
    func inputs() throws -> [URL] {
        try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)
            .filter { !$0.lastPathComponent.hasPrefix(".") }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    /// The bytes of the input called `name`.
    func bytes(of name: String) throws -> [UInt8] {
        try [UInt8](Data(contentsOf: directory.appendingPathComponent(name)))
    }

    /// Runs `exercise` (the fuzzer's property, which traps when broken) on every input.
    func replay(_ exercise: (UnsafeRawBufferPointer) -> Void) throws {
        for url in try inputs() {
            try Data(contentsOf: url).withUnsafeBytes { exercise($0) }
        }
    }
}
