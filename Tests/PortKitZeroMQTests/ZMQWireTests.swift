#if ZeroMQ
// protocol.md section 10 frame by frame, with no sockets: the encoder's bytes and the decoder's
// answer to every valid and invalid frame sequence.

import Testing
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQWireTests {
    static let limits = ZMQWireLimits(.default)

    /// Feeds `frames` to a decoder, "more" on all but the last; returns each output, in order.
    func decode(_ frames: [[UInt8]], decoder: inout ZMQMessageDecoder) -> [ZMQMessageDecoder.Output] {
        frames.enumerated().flatMap { index, frame in
            frame.withUnsafeBytes { decoder.consume($0, more: index < frames.count - 1) }
        }
    }

    func decodeOne(_ frame: [UInt8]) -> ZMQMessageDecoder.Output {
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        return decode([frame], decoder: &decoder).last!
    }

    func encode(_ msgid: UInt32, destination: UInt64 = 0, _ components: [ZMQWireComponent], reply: ZMQPortAddress? = nil,
                limits: ZMQWireLimits = Self.limits) throws -> [UInt8] {
        try ZMQMessageEncoder.frame(msgid: msgid, destination: destination, components: components, reply: reply, limits: limits)
    }

    @Test func encoderWritesTheExampleOfProtocolMD() throws {
        let bytes = try encode(7, [.data(Array("hi".utf8))], reply: ZMQPortAddress(endpoint: "tcp://127.0.0.1:5556", portID: 9))
        let header: [UInt8] = [0x50, 0x4B, 0x5A, 0x4D, 0x02, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00,
                               0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]
        let data: [UInt8] = [0x01, 0x02, 0x00, 0x00, 0x00, 0x68, 0x69]
        let reply: [UInt8] = [0x02, 0x09, 0, 0, 0, 0, 0, 0, 0, 0x14, 0x00] + Array("tcp://127.0.0.1:5556".utf8)
        #expect(bytes == header + data + reply)
        #expect(bytes.count == 62)
        // The hand-written messages of the tests say the same.
        #expect(handMadeMessage(msgid: 7, data: [Array("hi".utf8)], reply: ("tcp://127.0.0.1:5556", 9)) == bytes)
    }

    @Test func roundTrip() throws {
        let components: [ZMQWireComponent] = [
            .data([]), .port(ZMQPortAddress(endpoint: "ipc://@x", portID: .max)), .data([1, 2, 3]),
        ]
        let reply = ZMQPortAddress(endpoint: "tcp://[::1]:7", portID: 12)
        guard case .message(let message) = decodeOne(try encode(.max, destination: 77, components, reply: reply)) else {
            Issue.record("not decoded")
            return
        }
        #expect(message.msgid == .max && message.destination == 77 && message.reply == reply)
        #expect(message.components == [.data([]), .port(ZMQPortAddress(endpoint: "ipc://@x", portID: .max)), .data([1, 2, 3])])
    }

    /// A message of one data component decodes to its bytes alone (no array of components),
    /// and reads back as the one-component message it is; one port alone keeps its array.
    @Test func oneDataComponentDecodesToItsBytesAlone() throws {
        for payload: [UInt8] in [[], [1, 2, 3]] {
            guard case .message(let message) = decodeOne(try encode(5, [.data(payload)])) else {
                Issue.record("not decoded")
                continue
            }
            guard case .bytes(let bytes) = message.body else {
                Issue.record("one data component decoded into an array")
                continue
            }
            #expect(bytes == payload && message.components == [.data(payload)])
            #expect(message == ZMQDecodedMessage(msgid: 5, destination: 0, components: [.data(payload)], reply: nil))
        }
        let port = ZMQPortAddress(endpoint: "ipc://@x", portID: 3)
        guard case .message(let message) = decodeOne(try encode(6, [.port(port)])) else { Issue.record("not decoded"); return }
        #expect(message.components == [.port(port)])
    }

    /// A sender's shortcut for one data component and no reply port (`measureData`,
    /// `writeData`) makes the same frame as the general encoder, and checks the same limit.
    @Test func theOneDataComponentShortcutWritesWhatTheEncoderWrites() throws {
        for count in [0, 1, 64, 1000] {
            let payload = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let size = try ZMQMessageEncoder.measureData(byteCount: count, limits: Self.limits)
            let shortcut = [UInt8](unsafeUninitializedCapacity: size) { buffer, written in
                payload.withUnsafeBytes { data in
                    ZMQMessageEncoder.writeData(msgid: 9, destination: 4, data, into: UnsafeMutableRawBufferPointer(buffer))
                }
                written = size
            }
            #expect(shortcut == (try ZMQMessageEncoder.frame(msgid: 9, destination: 4, components: [.data(payload)], reply: nil)))
        }
        var small = PKPortLimits()
        small.maxMessageBytes = 10
        #expect(throws: PKError.self) { try ZMQMessageEncoder.measureData(byteCount: 11, limits: ZMQWireLimits(small)) }
        #expect((try? ZMQMessageEncoder.measureData(byteCount: 10, limits: ZMQWireLimits(small))) == 24 + 5 + 10)
    }

    @Test func emptyMessageIsTheHeaderAlone() throws {
        let bytes = try encode(1, [])
        #expect(bytes.count == 24)
        guard case .message(let message) = decodeOne(bytes) else { Issue.record("not decoded"); return }
        #expect(message.msgid == 1 && message.components.isEmpty && message.reply == nil)
    }

    static let invalid: [(String, [[UInt8]])] = {
        let header = Array(handMadeMessage(msgid: 1, data: []).prefix(24))
        let oneComponent = Array(handMadeMessage(msgid: 1, data: [[5]]).prefix(24))
        let withReply = Array(handMadeMessage(msgid: 1, data: [], reply: ("ipc://@r", 1)).prefix(24))
        func with(_ offset: Int, _ value: UInt8, in bytes: [UInt8] = header) -> [UInt8] {
            var copy = bytes
            copy[offset] = value
            return copy
        }
        func u16(_ value: UInt16) -> [UInt8] { [UInt8(value & 0xFF), UInt8(value >> 8)] }
        let portID: [UInt8] = [1, 0, 0, 0, 0, 0, 0, 0]
        func port(_ endpoint: String) -> [[UInt8]] {
            [oneComponent + [2] + portID + u16(UInt16(endpoint.utf8.count)) + Array(endpoint.utf8)]
        }
        return [
            ("short header", [Array(header.prefix(23))]),
            ("bad magic", [with(3, 0x58)]),
            ("version 1", [with(4, 1)]),
            ("unknown flag", [with(6, 4)]),
            ("FOLLOWED on the frame's last message", [with(6, 2)]),
            ("reserved field", [with(14, 1)]),
            ("too many components for the limits", [with(12, 0xFF, in: with(13, 0xFF))]),
            ("component missing", [oneComponent]),
            ("data prefix cut", [oneComponent + [1, 1, 0]]),
            ("data longer than the message", [oneComponent + [1, 9, 0, 0, 0, 5]]),
            ("data length near 2^32", [oneComponent + [1, 0xFF, 0xFF, 0xFF, 0xFF, 5]]),
            ("unknown component type", [oneComponent + [3, 5]]),
            ("port prefix cut", [oneComponent + [2] + portID]),
            ("port without endpoint", [oneComponent + [2] + portID + u16(0)]),
            ("endpoint longer than the message", [oneComponent + [2] + portID + u16(40) + Array("ipc://@x".utf8)]),
            ("port with a bad endpoint", [oneComponent + [2] + portID + u16(12) + Array("tcp://nohost".utf8)]),
            ("port at a wildcard host", port("tcp://*:5555")),
            ("port at the any-address", port("tcp://0.0.0.0:5555")),
            ("port at a wildcard port", port("tcp://127.0.0.1:*")),
            ("port at port 0", port("tcp://127.0.0.1:0")),
            ("port at a host starting with a dash", port("tcp://-x:1")),
            ("port at a host with a space", port("tcp://a b:1")),
            ("reply port at a host libzmq refuses", [Array(handMadeMessage(msgid: 1, data: [], reply: ("tcp://-x:1", 1)))]),
            ("port endpoint not UTF-8", [oneComponent + [2] + portID + u16(2) + [0xFF, 0xFE]]),
            ("reply port missing", [withReply]),
            ("reply port that is data", [withReply + [1, 1, 0, 0, 0, 5]]),
            ("bytes after the last component", [oneComponent + [1, 1, 0, 0, 0, 5, 0]]),
            ("two frames", [header, [1, 1, 0, 0, 0, 5]]),
            ("three frames of version 1", [with(4, 1, in: oneComponent), [1, 5], [2] + portID]),
        ]
    }()

    @Test(arguments: invalid.indices) func invalidMessagesAreViolations(index: Int) {
        let (name, frames) = Self.invalid[index]
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        let outputs = decode(frames, decoder: &decoder)
        #expect(outputs.contains { if case .violation = $0 { true } else { false } }, "\(name)")
        #expect(!outputs.contains { if case .message = $0 { true } else { false } }, "\(name)")
        #expect(decoder.isIdle, "\(name): the decoder must be ready for the next message")
        // The next message decodes.
        guard case .message(let message) = decode([handMadeMessage(msgid: 9, data: [[1]])], decoder: &decoder).last! else {
            Issue.record("\(name): the next message was not decoded")
            return
        }
        #expect(message.msgid == 9)
    }

    /// Messages one after another in one frame, each but the last flagged FOLLOWED.
    func batch(_ messages: [[UInt8]]) -> [UInt8] {
        var frame: [UInt8] = []
        for (index, message) in messages.enumerated() {
            var message = message
            if index < messages.count - 1 { ZMQMessageEncoder.setFollowed(&message, headerAt: 0) }
            frame += message
        }
        return frame
    }

    @Test func aBatchDecodesToItsMessagesInOrder() throws {
        let reply = ZMQPortAddress(endpoint: "ipc://@batch-reply", portID: 4)
        let messages = [
            try encode(1, [.data(Array("one".utf8))]),
            try encode(2, [], reply: reply),
            try encode(3, destination: 9, [.data([7]), .port(ZMQPortAddress(endpoint: "tcp://127.0.0.1:5", portID: 0))]),
        ]
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        let outputs = decode([batch(messages)], decoder: &decoder)
        let decoded = outputs.compactMap { output -> ZMQDecodedMessage? in if case .message(let m) = output { m } else { nil } }
        #expect(decoded.count == 3 && outputs.count == 3)
        #expect(decoded.map(\.msgid) == [1, 2, 3])
        #expect(decoded.first?.components == [.data(Array("one".utf8))])
        #expect(decoded.dropFirst().first?.reply == reply)
        #expect(decoded.last?.destination == 9)
        #expect(decoded.last?.components.count == 2)
        // The first message's bytes, FOLLOWED aside, are what it is alone.
        var first = Array(batch(messages).prefix(messages[0].count))
        #expect(first != messages[0])
        ZMQMessageEncoder.clearFollowed(&first)
        #expect(first == messages[0])
    }

    @Test func aBrokenMessageInABatchDropsItAndTheRestOfTheFrameOnly() throws {
        let good = try encode(1, [.data([1])])
        var broken = try encode(2, [.data([2])])
        broken[0] = 0x58  // bad magic
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        let outputs = decode([batch([good, broken, good])], decoder: &decoder)
        #expect(outputs.count == 2)
        if case .message(let message) = outputs.first { #expect(message.msgid == 1) } else { Issue.record("the first message was dropped") }
        if case .violation = outputs.last {} else { Issue.record("no violation for the broken message") }
        #expect(decoder.isIdle)
        // The next frame is read afresh.
        #expect(decode([good], decoder: &decoder).count == 1)
        // A message not flagged FOLLOWED ends its frame: bytes after it break it.
        let unflagged = decode([good + good], decoder: &decoder)
        #expect(unflagged.count == 1)
        if case .violation = unflagged.first {} else { Issue.record("bytes after an unflagged message were accepted") }
    }

    @Test func multipartMessageIsOneViolation() {
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        let message = handMadeMessage(msgid: 1, data: [[1]])
        // A valid message sent as the first of three frames: one violation, the rest skipped.
        let outputs = decode([message, message, message], decoder: &decoder)
        #expect(outputs.filter { if case .violation = $0 { true } else { false } }.count == 1)
        #expect(outputs.filter { if case .needMore = $0 { true } else { false } }.count == 2)
        #expect(decoder.isIdle)
    }

    @Test func limitsAreEnforced() throws {
        var small = PKPortLimits()
        small.maxMessageBytes = 10
        small.maxComponents = 3
        small.maxDescriptors = 1
        let limits = ZMQWireLimits(small)
        func outcome(_ frame: [UInt8]) -> Bool {
            var decoder = ZMQMessageDecoder(limits: limits)
            if case .message = decode([frame], decoder: &decoder).last! { return true }
            return false
        }
        #expect(outcome(handMadeMessage(msgid: 1, data: [[UInt8](repeating: 0, count: 10)])))
        #expect(!outcome(handMadeMessage(msgid: 1, data: [[UInt8](repeating: 0, count: 6), [UInt8](repeating: 0, count: 5)])))
        #expect(outcome(handMadeMessage(msgid: 1, data: [[], [], []])))
        #expect(!outcome(handMadeMessage(msgid: 1, data: [[], [], [], []])))
        #expect(outcome(handMadeMessage(msgid: 1, data: [], reply: ("ipc://@r", 1))))
        let twoPorts = try encode(
            1, [.port(ZMQPortAddress(endpoint: "ipc://@p", portID: 0))], reply: ZMQPortAddress(endpoint: "ipc://@r", portID: 1))
        #expect(!outcome(twoPorts))
        // The sender refuses what the receiver would drop.
        #expect(throws: PKError.self) {
            try encode(1, [.port(ZMQPortAddress(endpoint: "ipc://@p", portID: 0))],
                       reply: ZMQPortAddress(endpoint: "ipc://@r", portID: 1), limits: limits)
        }
        #expect(throws: PKError.self) { try encode(1, [.data([UInt8](repeating: 0, count: 11))], limits: limits) }
        #expect(throws: PKError.self) { try encode(1, [.data([]), .data([]), .data([]), .data([])], limits: limits) }
        // ZMQ_MAXMSGSIZE: header, every data byte, a data prefix per component, the longest port per port.
        #expect(limits.largestFrame == 24 + 10 + 5 * 3 + 266 * 1)
        #expect(ZMQWireLimits(.default).largestFrame == 24 + 16 * 1024 * 1024 + 5 * 1024 + 266 * 16)
        // A port takes a batch's frame whatever its limits.
        #expect(limits.largestAcceptedFrame == 16 * 1024)
        #expect(ZMQWireLimits(.default).largestAcceptedFrame == ZMQWireLimits(.default).largestFrame)
        // Limits too large to add up mean no limit, not an overflow.
        var unbounded = PKPortLimits()
        unbounded.maxDescriptors = .max
        #expect(ZMQWireLimits(unbounded).largestFrame == .max)
        unbounded = PKPortLimits()
        unbounded.maxMessageBytes = .max
        #expect(ZMQWireLimits(unbounded).largestFrame == .max)
    }

    /// A frame libzmq cannot allocate is an error, and the half-made frame is closed safely.
    @Test func aFrameThatCannotBeAllocatedIsAnError() {
        #expect(throws: PKError.self) {
            _ = try ZMQOutgoingFrame(byteCount: 1 << 62) { _ in Issue.record("wrote into a frame that was not made") }
        }
    }

    @Test func senderRefusesAnEndpointTheWireCannotCarry() {
        let long = ZMQPortAddress(endpoint: "ipc://@" + String(repeating: "e", count: 249), portID: 1)
        #expect(long.endpoint.utf8.count == 256)
        #expect(throws: PKError.self) { try encode(1, [.port(long)]) }
        #expect(throws: PKError.self) { try encode(1, [], reply: long) }
    }

    @Test func endpointsAreChecked() {
        for good in ["tcp://127.0.0.1:5555", "tcp://*:*", "tcp://host.example:1", "ipc:///tmp/x", "ipc://@abstract"] {
            #expect(PKZMQEndpoint.isValid(good), "\(good)")
        }
        // Hosts libzmq refuses (zmq_connect fails with EINVAL) are refused first.
        for bad in ["tcp://-x:1", "tcp://a b:1", "tcp://_x:1", "tcp://.x:1", "tcp://a*b:1", "tcp://a\tb:1", "tcp://é:1"] {
            #expect(!PKZMQEndpoint.isValid(bad), "\(bad)")
        }
        for bad in ["tcp://127.0.0.1", "tcp://:5", "tcp://h:99999", "tcp://h:x", "ipc://relative", "ipc://@", "inproc://x",
                    "ipc:///" + String(repeating: "a", count: 120), ""] {
            #expect(!PKZMQEndpoint.isValid(bad), "\(bad)")
        }
    }
}
#endif
