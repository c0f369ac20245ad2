// Writes the fuzzers' seed corpora (Fuzz/Corpus/<fuzzer>), the frames made with WireEncoder.
// Input formats: see `WireFuzzing.exercise`, `CheckInFuzzing.exercise`, `NameFuzzing.exercise` and
// `ZMQFuzzing.exercise`. Regenerate from Fuzz/ with
//   swiftc -parse-as-library -package-name PortKit ../Sources/PortKit/Wire/*.swift \
//     make-corpus.swift -o /tmp/make-corpus && /tmp/make-corpus Corpus
// Crash inputs the fuzzers found are added to their directories by hand, named crash-*.

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
        let root = URL(fileURLWithPath: CommandLine.arguments[1])
        try write(wireSeeds(), to: root.appendingPathComponent("wire"))
        try write(checkInSeeds(), to: root.appendingPathComponent("checkin"))
        try write(nameSeeds(), to: root.appendingPathComponent("names"))
        try write(zmqSeeds(), to: root.appendingPathComponent("zmq"))
    }

    static func write(_ seeds: [(String, [UInt8])], to directory: URL) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        for (name, bytes) in seeds {
            try Data(bytes).write(to: directory.appendingPathComponent(name))
        }
        print("wrote \(seeds.count) seeds to \(directory.path)")
    }

    /// WireFuzzing's seeds.
    static func wireSeeds() -> [(String, [UInt8])] {
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
            // Reply channels (protocol.md 6.1): requests towards a port, answers back.
            ("reply-back-requests", input(stream([WireFrame(msgid: 6, repliesBack: true, replyToken: 1, components: [.data([1])]),
                                                  .control(.replyCancelled, replyToken: 1),
                                                  WireFrame(msgid: 6, repliesBack: true, replyToken: 2)]))),
            ("reply-channel-answers", input(stream([WireFrame(msgid: 6, hasReplyPort: true, replyToken: 1, components: [.port]),
                                                    .control(.noReply, replyToken: 2), .attachSender(replyToken: 3)]),
                                            script: [read(20, descriptors: 2), read(nil, descriptors: 1)])),
        ]
        return seeds
    }

    /// CheckInFuzzing's seeds: what a worker writes on its check-in connection, and PORTKIT_WORKER values.
    static func checkInSeeds() -> [(String, [UInt8])] {
        let checkIn = WireFrame(msgid: 100, hasReplyPort: true, components: [.data(Array("worker-1".utf8))])
        let noReply = WireFrame(msgid: 100, components: [.data(Array("worker-2".utf8))])
        let other = WireFrame(msgid: 7, hasReplyPort: true, components: [.data([1, 2])])
        let count = WireFrame(msgid: 200, components: [.data([0, 0, 0, 0]), .data(Array("text".utf8))])
        func environment(_ bytes: [UInt8]) -> [UInt8] { [0x80] + bytes }
        /// A generated-mode byte: operation `op` with operand `operand`.
        func op(_ op: UInt8, _ operand: Int) -> UInt8 { op | UInt8(operand) << 2 }
        return [
            ("checkin", input(stream([checkIn]), script: [read(nil, descriptors: 1)])),
            ("checkin-then-more", input(stream([checkIn, count]), script: [read(nil, descriptors: 1)])),
            ("checkin-without-reply-port", input(stream([noReply]))),
            ("other-message-first", input(stream([other]), script: [read(nil, descriptors: 1)])),
            ("attach-sender-then-silence", input(stream([.attachSender()]), script: [read(nil, descriptors: 1)])),
            ("greeting-then-deadline", [0x40] + stream([])),
            ("garbage", input(Array("GET / HTTP/1.1\r\n\r\n".utf8))),
            ("truncated-checkin", input(Array(stream([checkIn]).dropLast(2)), script: [read(nil, descriptors: 1)])),
            ("empty", input([])),
            ("gen-checkin-in-pieces", input([op(0, 5)] + Array("hello".utf8) + [op(2, 3)], script: [read(3), read(17), read(nil)],
                                            generated: true)),
            ("gen-byte-by-byte", input([op(1, 2), 9, 9, op(0, 7)] + Array("abcdefg".utf8), script: [read(1)], generated: true)),
            ("gen-attach-then-checkin", input([op(3, 0), op(0, 1), 0x41], generated: true)),
            ("env-worker", environment(Array("worker-1:1".utf8))),
            ("env-name-with-colons", environment(Array("a:b:c:0".utf8))),
            ("env-bad-flag", environment(Array("name:2".utf8))),
            ("env-no-colon", environment(Array("name".utf8))),
            ("env-empty", environment([])),
            ("env-invalid-utf8", environment([0xFF, 0x3A, 0x31])),
        ]
    }

    /// NameFuzzing's seeds: byte 0 picks the directory (bits 0-2) and two names (bit 3).
    static func nameSeeds() -> [(String, [UInt8])] {
        func name(_ text: String, directory: UInt8 = 0) -> [UInt8] { [directory] + Array(text.utf8) }
        func two(_ first: String, _ second: String, directory: UInt8 = 0) -> [UInt8] {
            [directory | 0x08, UInt8(first.utf8.count)] + Array(first.utf8) + Array(second.utf8)
        }
        return [
            ("usual", name("checkin-main")),
            ("runtime-directory", name("worker_1.2", directory: 1)),
            ("root-directory", name("x", directory: 2)),
            ("relative-directory", name("x", directory: 3)),
            ("trailing-slash", name("x", directory: 4)),
            ("dotdot-directory", name("x", directory: 5)),
            ("longest", name(String(repeating: "a", count: 64))),
            ("too-long", name(String(repeating: "a", count: 65))),
            ("long-directory-fits", name(String(repeating: "b", count: 57), directory: 6)),
            ("long-directory-too-long", name(String(repeating: "b", count: 58), directory: 6)),
            ("no-room", name("c", directory: 7)),
            ("dot", name(".")),
            ("dotdot", name("..")),
            ("leading-dot", name(".hidden")),
            ("slash", name("a/b")),
            ("escape", name("../../etc/passwd")),
            ("nul", [0] + Array("a".utf8) + [0] + Array("b".utf8)),
            ("empty", [0]),
            ("non-ascii", name("caf\u{E9}")),
            ("combining-dot", name(".\u{301}x")),
            ("invalid-utf8", [0, 0xC3, 0x28]),
            ("two-names", two("alpha", "beta")),
            ("two-equal-names", two("same", "same")),
            ("two-lookalikes", two("a", "a.sock")),
            ("two-lookalikes-lock", two("a.lock", "a", directory: 1)),
        ]
    }

    /// ZMQFuzzing's seeds: frames, each a length byte (bit 7: the last of its message) and its
    /// bytes. A PortKit message (protocol.md 10.2, version 2) is one frame, or a part of a
    /// batch's frame; the multipart seeds are what a confused or hostile peer sends.
    static func zmqSeeds() -> [(String, [UInt8])] {
        func le64(_ value: UInt64) -> [UInt8] { withUnsafeBytes(of: value.littleEndian) { Array($0) } }
        func header(msgid: UInt32, count: UInt16, reply: Bool = false, destination: UInt64 = 0,
                    magic: [UInt8] = Array("PKZM".utf8), version: UInt16 = 2, followed: Bool = false) -> [UInt8] {
            let flags = UInt16(reply ? 1 : 0) | UInt16(followed ? 2 : 0)
            return magic + le(version) + le(flags) + le(msgid) + le(count) + le(UInt16(0)) + le64(destination)
        }
        func port(_ id: UInt64, _ endpoint: String) -> [UInt8] {
            [2] + le64(id) + le(UInt16(endpoint.utf8.count)) + Array(endpoint.utf8)
        }
        func data(_ bytes: [UInt8]) -> [UInt8] { [1] + le(UInt32(bytes.count)) + bytes }
        /// One message of several frames, the last one marked as the end.
        func message(_ frames: [[UInt8]]) -> [UInt8] {
            var bytes: [UInt8] = []
            for (index, frame) in frames.enumerated() {
                let last: UInt8 = index == frames.count - 1 ? 0x80 : 0
                if frame.count < 127 {
                    bytes += [UInt8(frame.count) | last]
                } else {
                    bytes += [0x7F | last] + le(UInt16(frame.count))
                }
                bytes += frame
            }
            return bytes
        }
        /// One message as PortKit sends it: its parts in one frame.
        func one(_ parts: [[UInt8]]) -> [UInt8] { message([parts.flatMap { $0 }]) }
        let me = port(42, "tcp://127.0.0.1:6000")
        func op(_ op: UInt8, _ operand: Int) -> UInt8 { op | UInt8(operand) << 2 }
        return [
            ("protocol-example", [0] + one([header(msgid: 7, count: 1, reply: true), data(Array("hi".utf8)),
                                            port(9, "tcp://127.0.0.1:5556")])),
            ("empty-message", [0] + one([header(msgid: 1, count: 0)])),
            ("ports-and-data", [0] + one([header(msgid: 3, count: 3, destination: 5), data([]), port(1, "ipc://@x"),
                                          data(Array(repeating: 0xAB, count: 200))])),
            ("name-register", [0] + one([header(msgid: 1, count: 3, reply: true), data(Array("svc".utf8)),
                                         port(0, "tcp://127.0.0.1:5556"), data([1, 2, 3, 4, 5, 6, 7, 8]), me])),
            ("name-lookup", [0] + one([header(msgid: 2, count: 1, reply: true), data(Array("svc".utf8)), me])),
            ("name-unregister", [0] + one([header(msgid: 3, count: 3, reply: true), data(Array("svc".utf8)),
                                           port(0, "ipc:///tmp/portkit-1000/svc"), data([1, 2, 3, 4, 5, 6, 7, 8]), me])),
            ("name-unregister-without-key", [0] + one([header(msgid: 3, count: 2, reply: true), data(Array("svc".utf8)),
                                                       port(0, "ipc:///tmp/portkit-1000/svc"), me])),
            ("name-reply-ok-with-port", [0] + one([header(msgid: 2, count: 2, destination: 42), data([0]),
                                                   port(0, "tcp://127.0.0.1:5556")])),
            ("name-reply-in-use", [0] + one([header(msgid: 1, count: 1, destination: 42), data([1])])),
            ("name-reply-bad-request", [0] + one([header(msgid: 9, count: 1, destination: 42), data([5])])),
            ("name-reply-long-status", [0] + one([header(msgid: 2, count: 1, destination: 42), data([0, 0])])),
            ("bad-magic", [0] + one([header(msgid: 1, count: 0, magic: Array("PKZX".utf8))])),
            ("bad-version", [0] + one([header(msgid: 1, count: 0, version: 1)])),
            ("short-header", [0] + one([Array(header(msgid: 1, count: 0).dropLast())])),
            ("too-few-components", [0] + one([header(msgid: 1, count: 2), data([1])])),
            ("trailing-bytes", [0] + one([header(msgid: 1, count: 1), data([1]), data([2])])),
            ("data-longer-than-frame", [0] + one([header(msgid: 1, count: 1), [1] + le(UInt32.max) + [1, 2]])),
            ("cut-data-prefix", [0] + one([header(msgid: 1, count: 1), [1, 0, 0]])),
            ("cut-port-prefix", [0] + one([header(msgid: 1, count: 1), [2] + le64(1)])),
            ("endpoint-longer-than-frame", [0] + one([header(msgid: 1, count: 1), [2] + le64(1) + le(UInt16(300)) + [0x74]])),
            ("reply-not-a-port", [0] + one([header(msgid: 1, count: 0, reply: true), data([1])])),
            ("reply-missing", [0] + one([header(msgid: 1, count: 0, reply: true)])),
            ("bad-endpoint", [0] + one([header(msgid: 1, count: 1), port(1, "udp://h:1")])),
            ("port-without-endpoint", [0] + one([header(msgid: 1, count: 1), [2] + le64(1) + le(UInt16(0))])),
            ("unknown-type", [0] + one([header(msgid: 1, count: 1), [3, 0]])),
            ("multipart", [0] + message([header(msgid: 1, count: 1), data([1])])),
            ("version-1-multipart", [0] + message([header(msgid: 7, count: 1, version: 1), [1, 0x68, 0x69]])),
            ("small-limits-over", [1] + one([header(msgid: 1, count: 1), data(Array(repeating: 7, count: 65))])),
            ("small-limits-too-many-ports", [1] + one([header(msgid: 1, count: 4, reply: true)]
                                                      + Array(repeating: port(1, "ipc://@p"), count: 5))),
            ("violation-then-message", [0] + message([header(msgid: 1, count: 1), data([1]), data([1])])
                                        + one([header(msgid: 2, count: 1), data([2])])),
            ("batch-of-three", [0] + one([header(msgid: 1, count: 1, followed: true), data([1]),
                                          header(msgid: 2, count: 0, reply: true, followed: true), me,
                                          header(msgid: 3, count: 1, destination: 7), data(Array(repeating: 3, count: 40))])),
            ("batch-followed-at-end", [0] + one([header(msgid: 1, count: 1, followed: true), data([1])])),
            ("batch-broken-middle", [0] + one([header(msgid: 1, count: 1, followed: true), data([1]),
                                               header(msgid: 2, count: 1, version: 3, followed: true), data([2]),
                                               header(msgid: 3, count: 0)])),
            ("name-usual", [4] + Array("checkin-main".utf8)),
            ("name-sock-suffix", [4] + Array("x.sock".utf8)),
            ("name-sock-new-suffix", [4] + Array("x.sock.new".utf8)),
            ("name-lock-suffix", [4] + Array("x.lock".utf8)),
            ("name-dotdot", [4] + Array("..".utf8)),
            ("gen-mixed", [2, op(0, 1), 7, 9, op(1, 3), 1, 2, 3, op(2, 1), op(0, 0), 1, 0, op(2, 8), op(3, 1)]),
            ("gen-unconnectable-ports", [2, op(0, 0), 1, 0, op(2, 5), op(0, 0), 2, 0, op(2, 6), op(0, 0), 3, 0, op(2, 7),
                                         op(0, 0), 4, 0, op(2, 8), op(0, 0), 5, 0, op(2, 4)]),
            ("gen-small-limits", [3, op(0, 0), 1, 0, op(3, 1), op(1, 1), 1, op(0, 3), 2, 0, op(2, 0), op(2, 2), op(2, 3),
                                  op(2, 4)]),
        ]
    }
}
