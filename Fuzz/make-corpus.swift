// Writes the wire fuzzer's seed corpus (Fuzz/Corpus/wire), made with WireEncoder.
// Input format: see `WireFuzzing.exercise`. Regenerate from Fuzz/ with
//   swiftc -parse-as-library ../Sources/PortKit/Wire/*.swift make-corpus.swift -o /tmp/make-corpus \
//     && /tmp/make-corpus Corpus/wire
// Crash inputs the fuzzer found are added to that directory by hand, named crash-*.

import Foundation

/// A script byte: a read of `size` bytes (1...62, or nil for the rest) after `descriptors` fds.
func read(_ size: Int?, descriptors: Int = 0) -> UInt8 {
    UInt8(descriptors << 6) | UInt8(size.map { $0 - 1 } ?? 0x3F)
}

func input(_ stream: [UInt8], script: [UInt8] = [], smallLimits: Bool = false, inPlace: Bool = false,
           generated: Bool = false) -> [UInt8] {
    precondition(script.count < 32)
    return [UInt8(script.count) | (generated ? 0x20 : 0) | (smallLimits ? 0x40 : 0) | (inPlace ? 0x80 : 0)]
        + script + stream
}

func stream(_ frames: [WireFrame], greeting: Bool = true) -> [UInt8] {
    var bytes: [UInt8] = []
    if greeting { WireEncoder.appendGreeting(.current(pid: 4242, uid: 1000), to: &bytes) }
    for frame in frames { WireEncoder.append(frame, to: &bytes) }
    return bytes
}

func le(_ value: UInt32) -> [UInt8] { withUnsafeBytes(of: value.littleEndian) { Array($0) } }
func le(_ value: UInt16) -> [UInt8] { withUnsafeBytes(of: value.littleEndian) { Array($0) } }

/// A raw frame header.
func header(length: UInt32, msgid: UInt32 = 7, components: UInt16 = 0, flags: UInt16 = 0,
            descriptors: UInt16 = 0, reserved: UInt16 = 0) -> [UInt8] {
    le(length) + le(msgid) + le(components) + le(flags) + le(descriptors) + le(reserved)
}

@main
struct MakeCorpus {
    static func main() throws {
        let directory = URL(fileURLWithPath: CommandLine.arguments[1])
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let hello = WireFrame(msgid: 1, components: [.data(Array("hello".utf8))])
        let ports = WireFrame(msgid: 2, hasReplyPort: true, components: [.port, .data([1, 2, 3]), .port])
        let seeds: [(String, [UInt8])] = [
            ("greeting-only", input(stream([]))),
            ("empty-and-data-frames", input(stream([WireFrame(msgid: 0), hello]))),
            ("ports-and-reply-port", input(stream([ports]), script: [read(20, descriptors: 3), read(nil)])),
            ("attach-sender", input(stream([.attachSender()]), script: [read(nil, descriptors: 1)])),
            ("byte-by-byte", input(stream([hello, WireFrame(msgid: 9, components: [.data([]), .data([0xFF])])]),
                                   script: [read(1)])),
            ("split-in-place", input(stream([hello, ports, hello]),
                                     script: [read(7), read(30, descriptors: 3), read(nil)], inPlace: true)),
            ("small-limits-at-limit", input(stream([WireFrame(msgid: 3, components: [.data(Array(repeating: 0xAB, count: 64))])]),
                                            smallLimits: true)),
            ("bad-magic", input(Array("GET / HTTP/1.1\r\n\r\n".utf8))),
            ("bad-version", input(Array("PKIT".utf8) + le(UInt16(2)) + [0, 0] + le(UInt32(1)) + le(UInt32(2)))),
            ("frame-too-short", input(stream([]) + header(length: 8))),
            ("unknown-component-type", input(stream([]) + header(length: 24, components: 1) + [3, 0, 0, 0] + le(UInt32(0)))),
            ("descriptors-missing", input(stream([WireFrame(msgid: 4, components: [.port])]))),
            ("truncated-frame", input(Array(stream([hello]).dropLast(2)))),
            ("frame-too-long-small-limits", input(stream([WireFrame(msgid: 5, components: [.data(Array(repeating: 1, count: 65))])]),
                                                  smallLimits: true)),
            ("descriptors-ahead", input(stream([]), script: [read(1, descriptors: 3)], smallLimits: true)),
            // Generated mode: frame descriptions (see `WireFuzzing.frames(describedBy:)`).
            ("gen-shapes", input([0x10, 0x01 | 3 << 2, 1, 2, 3, 0x02, 0x24, 0x02, 0x05, 9, 0x02, 0x08 | 0x10, 0x02,
                                  0xF0, 0x78, 0x56, 0x34, 0x12, 0x03, 0x00, 0x01, 0x00],
                                 script: [read(3), read(17), read(nil)], generated: true)),
            ("gen-refused-small-limits", input([0x20, 0x03, 65, 0x00, 0x30, 0x02, 0x02, 0x02, 0x02, 0x02,
                                                0x08 | 0x10, 0x01],
                                               smallLimits: true, inPlace: true, generated: true)),
            ("control-with-data", input(stream([]) + header(length: 24, msgid: 1, components: 1, flags: 2)
                                            + [1, 0, 0, 0] + le(UInt32(0)))),
        ]
        for (name, bytes) in seeds {
            try Data(bytes).write(to: directory.appendingPathComponent(name))
        }
        print("wrote \(seeds.count) seeds to \(directory.path)")
    }
}
