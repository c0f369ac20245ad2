#if ZeroMQ
// protocol.md section 10 frame by frame, with no sockets: the encoder's bytes and the decoder's
// answer to every valid and invalid frame sequence.

import Testing
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQWireTests {
    static let limits = ZMQWireLimits(.default)

    /// Feeds `frames` to a decoder, "more" on all but the last; returns each output.
    func decode(_ frames: [[UInt8]], decoder: inout ZMQMessageDecoder) -> [ZMQMessageDecoder.Output] {
        frames.enumerated().map { index, frame in
            frame.withUnsafeBytes { decoder.consume($0, more: index < frames.count - 1) }
        }
    }

    func decodeOne(_ frames: [[UInt8]]) -> ZMQMessageDecoder.Output {
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        return decode(frames, decoder: &decoder).last!
    }

    @Test func encoderWritesTheExampleOfProtocolMD() {
        let frames = ZMQMessageEncoder.frames(
            msgid: 7, destination: 0, components: [.data(Array("hi".utf8))],
            reply: ZMQPortAddress(endpoint: "tcp://127.0.0.1:5556", portID: 9))
        let bytes = frames.map { $0.prefix + $0.payload }
        #expect(bytes[0] == [0x50, 0x4B, 0x5A, 0x4D, 0x01, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00,
                             0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00])
        #expect(bytes[1] == [0x01, 0x68, 0x69])
        #expect(bytes[2] == [0x02, 0x09, 0, 0, 0, 0, 0, 0, 0] + Array("tcp://127.0.0.1:5556".utf8))
        #expect(bytes.count == 3)
        // The hand-written frames of the tests say the same.
        #expect(handMadeFrames(msgid: 7, data: [Array("hi".utf8)], reply: ("tcp://127.0.0.1:5556", 9)) == bytes)
    }

    @Test func roundTrip() throws {
        let components: [ZMQWireComponent] = [
            .data([]), .port(ZMQPortAddress(endpoint: "ipc://@x", portID: .max)), .data([1, 2, 3]),
        ]
        let frames = ZMQMessageEncoder.frames(msgid: .max, destination: 77, components: components, reply: nil)
        guard case .message(let message) = decodeOne(frames.map { $0.prefix + $0.payload }) else {
            Issue.record("not decoded")
            return
        }
        #expect(message.msgid == .max && message.destination == 77 && message.reply == nil)
        #expect(message.components.count == 3)
        if case .port(let address) = message.components[1] { #expect(address == ZMQPortAddress(endpoint: "ipc://@x", portID: .max)) }
        if case .data(let data) = message.components[2] { #expect(data == [1, 2, 3]) }
    }

    @Test func emptyMessageIsOneFrame() {
        let frames = ZMQMessageEncoder.frames(msgid: 1, destination: 0, components: [], reply: nil)
        #expect(frames.count == 1 && frames[0].count == 24)
        guard case .message = decodeOne([frames[0].prefix]) else { Issue.record("not decoded"); return }
    }

    static let invalid: [(String, [[UInt8]])] = {
        var header = handMadeFrames(msgid: 1, data: [])[0]
        func with(_ offset: Int, _ value: UInt8) -> [UInt8] { var copy = header; copy[offset] = value; return copy }
        header = handMadeFrames(msgid: 1, data: [[5]])[0]
        return [
            ("short header", [Array(header.prefix(23)), [1, 5]]),
            ("bad magic", [with(3, 0x58), [1, 5]]),
            ("version 2", [with(4, 2), [1, 5]]),
            ("unknown flag", [with(6, 2), [1, 5]]),
            ("reserved field", [with(14, 1), [1, 5]]),
            ("empty component frame", [header, []]),
            ("unknown component type", [header, [3, 5]]),
            ("port frame without endpoint", [header, [2, 0, 0, 0, 0, 0, 0, 0, 0]]),
            ("port frame with a bad endpoint", [header, [2, 0, 0, 0, 0, 0, 0, 0, 0] + Array("tcp://nohost".utf8)]),
            ("port frame not UTF-8", [header, [2, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFE]]),
            ("reply frame that is data", [with(6, 1), [1, 5], [1, 5]]),
            ("extra frame", [header, [1, 5], [1, 6]]),
        ]
    }()

    @Test(arguments: invalid.indices) func invalidMessagesAreViolations(index: Int) {
        let (name, frames) = Self.invalid[index]
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        let outputs = decode(frames, decoder: &decoder)
        #expect(outputs.contains { if case .violation = $0 { true } else { false } }, "\(name)")
        #expect(decoder.isIdle, "\(name): the decoder must be ready for the next message")
        // The next message decodes.
        let next = handMadeFrames(msgid: 9, data: [[1]])
        guard case .message(let message) = decode(next, decoder: &decoder).last! else {
            Issue.record("\(name): the next message was not decoded")
            return
        }
        #expect(message.msgid == 9)
    }

    @Test func messageEndingEarlyIsAViolation() {
        var decoder = ZMQMessageDecoder(limits: Self.limits)
        let frames = handMadeFrames(msgid: 1, data: [[1], [2]])
        // Two frames, the second without "more", where three were announced.
        let outputs = decode(Array(frames.prefix(2)), decoder: &decoder)
        guard case .violation = outputs.last! else { Issue.record("accepted a truncated message"); return }
        #expect(decoder.isIdle)
    }

    @Test func limitsAreEnforced() {
        var small = PKPortLimits()
        small.maxMessageBytes = 10
        small.maxComponents = 3
        small.maxDescriptors = 1
        let limits = ZMQWireLimits(small)
        func outcome(_ frames: [[UInt8]]) -> Bool {
            var decoder = ZMQMessageDecoder(limits: limits)
            if case .message = decode(frames, decoder: &decoder).last! { return true }
            return false
        }
        #expect(outcome(handMadeFrames(msgid: 1, data: [[UInt8](repeating: 0, count: 10)])))
        #expect(!outcome(handMadeFrames(msgid: 1, data: [[UInt8](repeating: 0, count: 6), [UInt8](repeating: 0, count: 5)])))
        #expect(outcome(handMadeFrames(msgid: 1, data: [[], [], []])))
        #expect(!outcome(handMadeFrames(msgid: 1, data: [[], [], [], []])))
        #expect(outcome(handMadeFrames(msgid: 1, data: [], reply: ("ipc://@r", 1))))
        let twoPorts = ZMQMessageEncoder.frames(
            msgid: 1, destination: 0, components: [.port(ZMQPortAddress(endpoint: "ipc://@p", portID: 0))],
            reply: ZMQPortAddress(endpoint: "ipc://@r", portID: 1))
        #expect(!outcome(twoPorts.map { $0.prefix + $0.payload }))
        #expect(limits.largestFrame == 264)
        #expect(ZMQWireLimits(.default).largestFrame == 16_777_217)
    }

    @Test func endpointsAreChecked() {
        for good in ["tcp://127.0.0.1:5555", "tcp://*:*", "tcp://host.example:1", "ipc:///tmp/x", "ipc://@abstract"] {
            #expect(PKZMQEndpoint.isValid(good), "\(good)")
        }
        for bad in ["tcp://127.0.0.1", "tcp://:5", "tcp://h:99999", "tcp://h:x", "ipc://relative", "ipc://@", "inproc://x",
                    "ipc:///" + String(repeating: "a", count: 120), ""] {
            #expect(!PKZMQEndpoint.isValid(bad), "\(bad)")
        }
    }
}
#endif
