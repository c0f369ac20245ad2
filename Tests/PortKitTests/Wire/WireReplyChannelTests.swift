// The frames of a reply channel (protocol.md, "Replies on the request's connection"): REPLY_BACK
// requests and REPLY_CANCELLED towards a port, answers and NO_REPLY back to the requester, each
// direction refusing the other's frames and any frame without the token it needs.

import Testing
@testable import PortKit

@Suite("Wire: reply channels") struct WireReplyChannelTests {
    /// A frame's bytes after the test greeting, decoded in `direction`.
    static func outcome(_ frames: [WireFrame], descriptors: [Int32] = [], _ direction: WireDirection) -> DecodeOutcome {
        var bytes: [UInt8] = []
        for frame in frames { WireEncoder.append(frame, to: &bytes) }
        return decode(encodeStream([]) + bytes, descriptors: descriptors, direction: direction)
    }

    @Test("a REPLY_BACK request carries its token in the header's last two bytes")
    func requestBytes() throws {
        var bytes: [UInt8] = []
        WireEncoder.append(WireFrame(msgid: 9, repliesBack: true, replyToken: 0x0102), to: &bytes)
        #expect(bytes == [16, 0, 0, 0, 9, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0x02, 0x01])
        let events = Self.outcome([WireFrame(msgid: 9, repliesBack: true, replyToken: 0x0102, components: [.data([1])])], .toPort)
        #expect(events.error == nil)
        guard case .frame(let frame, let descriptors)? = events.events.last else {
            Issue.record("no frame: \(events.events)")
            return
        }
        #expect(frame.repliesBack && frame.replyToken == 0x0102 && !frame.hasReplyPort && descriptors.isEmpty)
    }

    @Test("towards a port: REPLY_BACK needs a token and excludes REPLY_PORT and CONTROL")
    func requestRules() {
        var writer = ByteWriter()
        writer.frameHeader(length: 16, flags: 4)  // REPLY_BACK, token 0
        #expect(decodeError(writer.bytes)?.kind == .replyTokenMissing)
        writer = ByteWriter()
        writer.frameHeader(length: 16, flags: 5, descriptorCount: 1, reserved: 3)  // with REPLY_PORT
        #expect(decodeError(writer.bytes, descriptors: [1000])?.kind == .replyBackMisused)
        writer = ByteWriter()
        writer.frameHeader(length: 16, msgid: 2, flags: 6, reserved: 3)  // with CONTROL
        #expect(decodeError(writer.bytes)?.kind == .replyBackMisused)
        // A token on a plain message is refused, as the reserved field was.
        writer = ByteWriter()
        writer.frameHeader(length: 16, reserved: 3)
        #expect(decodeError(writer.bytes)?.kind == .reservedFieldNotZero)
    }

    @Test("REPLY_CANCELLED travels towards a port only, as a bare header with a token")
    func cancelRules() {
        let cancel = WireFrame.control(.replyCancelled, replyToken: 5)
        #expect(Self.outcome([cancel], .toPort).error == nil)
        #expect(Self.outcome([cancel], .toRequester).error?.kind == .unknownControlCode)
        #expect(Self.outcome([WireFrame.control(.replyCancelled, replyToken: 0)], .toPort).error?.kind == .replyTokenMissing)
        var writer = ByteWriter()
        writer.frameHeader(length: 24, msgid: 2, componentCount: 1, flags: 2, reserved: 5)
        writer.componentHeader(type: 1, length: 0)
        #expect(decodeError(writer.bytes)?.kind == .malformedControlFrame)
        #expect((#expect(throws: WireError.self) {
            try WireEncoder.check(WireFrame.control(.replyCancelled, replyToken: 5), limits: .default, direction: .toRequester)
        })?.kind == .unknownControlCode)
    }

    @Test("on a reply channel every frame names its request; NO_REPLY and ATTACH_SENDER travel there")
    func channelRules() {
        let answer = WireFrame(msgid: 3, hasReplyPort: true, replyToken: 7, components: [.data([1, 2]), .port])
        let good = Self.outcome([answer, WireFrame.control(.noReply, replyToken: 8), WireFrame.attachSender(replyToken: 9)],
                                descriptors: [1000, 1001, 1002], .toRequester)
        #expect(good.error == nil)
        #expect(good.events.compactMap { event -> UInt16? in
            if case .frame(let frame, _) = event { frame.replyToken } else { nil }
        } == [7, 8, 9])
        #expect(Self.outcome([WireFrame(msgid: 3)], .toRequester).error?.kind == .replyTokenMissing)
        #expect(Self.outcome([WireFrame(msgid: 3, repliesBack: true, replyToken: 1)], .toRequester).error?.kind == .replyBackMisused)
        // NO_REPLY is not said towards a port.
        #expect(Self.outcome([WireFrame.control(.noReply, replyToken: 8)], .toPort).error?.kind == .unknownControlCode)
        // Nor is ATTACH_SENDER with a token.
        #expect(Self.outcome([WireFrame.attachSender(replyToken: 9)], descriptors: [1000], .toPort).error?.kind == .reservedFieldNotZero)
    }
}
