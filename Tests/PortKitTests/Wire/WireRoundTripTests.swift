// Encode -> decode round trips for every shape of frame, the exact bytes of the format, and the
// size limit at its edge.

import Testing
@testable import PortKit

/// Frames of every shape the protocol allows.
let sampleFrames: [WireFrame] = [
    WireFrame(msgid: 0),
    WireFrame(msgid: 100, components: [.data(Array("hello".utf8))]),
    WireFrame(msgid: 1, components: [.data([])]),
    WireFrame(msgid: 2, components: (0..<40).map { .data([UInt8](repeating: UInt8($0), count: $0)) }),
    WireFrame(msgid: 3, components: [.port]),
    WireFrame(msgid: 4, components: [.port, .port, .port]),
    WireFrame(msgid: 5, hasReplyPort: true),
    WireFrame(msgid: 6, hasReplyPort: true, components: [.data([1, 2, 3]), .port, .data([4]), .port]),
    WireFrame(msgid: UInt32.max, components: [.data([UInt8](repeating: 0xAB, count: 64))]),
    WireFrame.attachSender(),
]

@Suite("Wire round trip")
struct WireRoundTripTests {
    @Test("a frame decodes to itself with its descriptors", arguments: sampleFrames)
    func roundTrip(frame: WireFrame) throws {
        let bytes = encodeStream([frame])
        #expect(bytes.count == WireFormat.greetingByteCount + WireEncoder.encodedSize(of: frame))
        try WireEncoder.check(frame, limits: .default)

        let outcome = decode(bytes, descriptors: fakeDescriptors(frame.descriptorCount))
        #expect(outcome.error == nil)
        #expect(outcome.events == expectedEvents([frame]))
    }

    @Test("all sample frames in one stream, descriptors numbered in wire order")
    func allInOneStream() {
        let total = sampleFrames.reduce(0) { $0 + $1.descriptorCount }
        let outcome = decode(encodeStream(sampleFrames), descriptors: fakeDescriptors(total))
        #expect(outcome.error == nil)
        #expect(outcome.events == expectedEvents(sampleFrames))
    }

    @Test("frames decoded in place are next()'s frames, and the usual one's bytes move out")
    func framesDecodedInPlace() throws {
        let total = sampleFrames.reduce(0) { $0 + $1.descriptorCount }
        var decoder = WireDecoder()
        encodeStream(sampleFrames).withUnsafeBytes { decoder.append(bytes: $0) }
        decoder.append(descriptors: fakeDescriptors(total))
        // What it leaves alone when it finds no frame, it must leave alone.
        let untouched = WireFrame(msgid: 77, components: [.data([7])])
        var frame = untouched
        var descriptors: [Int32] = [77]
        var events: [WireEvent] = []
        var moved: [[UInt8]?] = []
        while let found = try decoder.next(frame: &frame, descriptors: &descriptors) {
            switch found {
            case .greeting(let greeting):
                events.append(.greeting(greeting))
                #expect(frame == untouched && descriptors == [77])
            case .frame:
                events.append(.frame(frame, descriptors: descriptors))
                moved.append(frame.components.takeOnlyData())
                if moved.last! != nil { #expect(frame.components.isEmpty && frame.dataByteCount == 0) }
                frame = untouched
                descriptors = [77]
            }
        }
        #expect(frame == untouched && descriptors == [77])
        #expect(events == expectedEvents(sampleFrames))
        // Only a frame of one data component gives its bytes up.
        #expect(moved == sampleFrames.map { frame -> [UInt8]? in
            if frame.components.count == 1, case .data(let bytes) = frame.components[0] { return bytes }
            return nil
        })
    }

    @Test("the reply port is the first descriptor, then one per port component")
    func replyPortComesFirst() throws {
        let frame = WireFrame(msgid: 9, hasReplyPort: true, components: [.port, .data([7]), .port])
        let outcome = decode(encodeStream([frame]), descriptors: [500, 501, 502])
        #expect(outcome.events.last == .frame(frame, descriptors: [500, 501, 502]))
    }

    @Test("the greeting's bytes are exactly as protocol.md specifies")
    func greetingBytes() {
        var bytes: [UInt8] = []
        WireEncoder.appendGreeting(.current(pid: 0x0102_0304, uid: 0x0A0B_0C0D), to: &bytes)
        #expect(bytes == [0x50, 0x4B, 0x49, 0x54, 1, 0, 0, 0, 4, 3, 2, 1, 0x0D, 0x0C, 0x0B, 0x0A])
    }

    @Test("a frame's bytes are exactly as protocol.md specifies")
    func frameBytes() {
        let frame = WireFrame(msgid: 0x11223344, hasReplyPort: true, components: [.data([0xEE, 0xFF]), .port])
        var bytes: [UInt8] = []
        WireEncoder.append(frame, to: &bytes)
        let expected: [UInt8] = [
            34, 0, 0, 0,             // length = 16 + 8 + 2 + 8
            0x44, 0x33, 0x22, 0x11,  // msgid
            2, 0,                    // componentCount
            1, 0,                    // flags: REPLY_PORT
            2, 0,                    // descriptorCount: reply port + 1 port
            0, 0,                    // reserved
            1, 0, 0, 0, 2, 0, 0, 0, 0xEE, 0xFF,  // data component
            2, 0, 0, 0, 0, 0, 0, 0,              // port component
        ]
        #expect(bytes == expected)
        #expect(WireEncoder.encodedSize(of: frame) == 34)
    }

    @Test("the control flag is bit 1 and ATTACH_SENDER is control code 1")
    func attachSenderBytes() {
        var bytes: [UInt8] = []
        WireEncoder.append(.attachSender(), to: &bytes)
        #expect(bytes == [24, 0, 0, 0, 1, 0, 0, 0, 1, 0, 2, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0])
        #expect(WireFrame.attachSender().controlCode == .attachSender)
        #expect(WireFrame(msgid: 1).controlCode == nil)
    }

    @Test("appending to a non-empty buffer keeps what was there")
    func appendsAfterExistingBytes() {
        var bytes: [UInt8] = [9, 9, 9]
        WireEncoder.append(WireFrame(msgid: 1), to: &bytes)
        #expect(bytes.count == 3 + 16)
        #expect(bytes.prefix(3) == [9, 9, 9])
    }

    @Test("a message of exactly maxMessageBytes passes; one byte more is refused")
    func payloadAtTheLimit() throws {
        let limit = WireLimits.default.maxMessageBytes
        let atLimit = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 0x5A, count: limit))])
        try WireEncoder.check(atLimit, limits: .default)
        let bytes = encodeStream([atLimit])
        let outcome = decode(bytes, chunks: Array(repeating: 65536, count: bytes.count / 65536))
        #expect(outcome.error == nil)
        #expect(outcome.events == expectedEvents([atLimit]))

        let over = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 0x5A, count: limit + 1))])
        let checkError = #expect(throws: WireError.self) { try WireEncoder.check(over, limits: .default) }
        #expect(checkError?.kind == .frameTooLong)
        let refused = decode(encodeStream([over]))
        #expect(refused.events == [.greeting(testGreeting)])
        #expect(refused.error?.kind == .frameTooLong)
    }

    /// Received bytes go into a spare array's storage when it has the room (no allocation),
    /// and a spare that something else still holds is left as it was.
    @Test("received bytes reuse a spare array, and leave one still held elsewhere as it was")
    func receivedBytesReuseASpareArray() {
        let source: [UInt8] = [1, 2, 3, 4]
        var spare = [UInt8](repeating: 9, count: 4)
        spare.reserveCapacity(16)
        let storage = spare.withUnsafeBufferPointer { $0.baseAddress }
        let reused = source.withUnsafeBytes { SpareBytes.copy($0, reusing: &spare) }
        #expect(reused == source)
        #expect(reused.withUnsafeBufferPointer { $0.baseAddress } == storage)
        #expect(spare.isEmpty)

        var shorter = reused  // another size: emptied, then filled
        let three = [UInt8]([7, 7, 7]).withUnsafeBytes { SpareBytes.copy($0, reusing: &shorter) }
        #expect(three == [7, 7, 7])
        #expect(reused == source, "the array the spare was shared with changed")

        var small = [UInt8](repeating: 0, count: 2)  // too small: a new array, the spare kept
        let large = [UInt8](repeating: 5, count: 4096)
        let fresh = large.withUnsafeBytes { SpareBytes.copy($0, reusing: &small) }
        #expect(fresh == large)
        #expect(small == [0, 0])
    }

    @Test("the usual message (one data component) at a small limit: the sender and the reader agree")
    func plainMessageAtASmallLimit() throws {
        // Both sides check this shape with a shortcut; at the limit and one byte over, and in
        // the direction where it is not allowed at all, they must decide as the full checks do.
        let limits = WireLimits(maxMessageBytes: 100, maxComponents: 4)
        let atLimit = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 7, count: 100))])
        try WireEncoder.check(atLimit, limits: limits)
        #expect(decode(encodeStream([atLimit]), limits: limits).events == expectedEvents([atLimit]))

        let over = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 7, count: 101))])
        let checkError = #expect(throws: WireError.self) { try WireEncoder.check(over, limits: limits) }
        #expect(checkError?.kind == .frameTooLong)
        #expect(decode(encodeStream([over]), limits: limits).error?.kind == .frameTooLong)

        // On a reply channel every frame must name its request.
        let unanswered = #expect(throws: WireError.self) {
            try WireEncoder.check(atLimit, limits: limits, direction: .toRequester)
        }
        #expect(unanswered?.kind == .replyTokenMissing)
    }

    @Test("the limit is on data bytes: split over many components it still holds")
    func payloadLimitOverManyComponents() {
        let limits = WireLimits(maxMessageBytes: 100, maxComponents: 10)
        let atLimit = WireFrame(msgid: 1, components: (0..<10).map { _ in .data([UInt8](repeating: 1, count: 10)) })
        #expect(decode(encodeStream([atLimit]), limits: limits).events == expectedEvents([atLimit]))
        var over = atLimit
        over.components[9] = .data([UInt8](repeating: 1, count: 11))
        #expect(decode(encodeStream([over]), limits: limits).error?.kind == .frameTooLong)
    }

    @Test("maxComponents components pass; one more is refused")
    func componentsAtTheLimit() {
        let limits = WireLimits.default
        let atLimit = WireFrame(msgid: 1, components: Array(repeating: .data([1]), count: limits.maxComponents))
        #expect(decode(encodeStream([atLimit])).events == expectedEvents([atLimit]))
        let over = WireFrame(msgid: 1, components: Array(repeating: .data([1]), count: limits.maxComponents + 1))
        #expect(decode(encodeStream([over])).error?.kind == .tooManyComponents)
        #expect(throws: WireError.self) { try WireEncoder.check(over, limits: limits) }
    }

    @Test("maxDescriptors descriptors pass, counting the reply port; one more is refused")
    func descriptorsAtTheLimit() {
        let max = WireLimits.default.maxDescriptors
        let atLimit = WireFrame(msgid: 1, hasReplyPort: true, components: Array(repeating: .port, count: max - 1))
        #expect(decode(encodeStream([atLimit]), descriptors: fakeDescriptors(max)).events == expectedEvents([atLimit]))
        let over = WireFrame(msgid: 1, hasReplyPort: true, components: Array(repeating: .port, count: max))
        let error = #expect(throws: WireError.self) { try WireEncoder.check(over, limits: .default) }
        #expect(error?.kind == .tooManyDescriptors)
        #expect(decode(encodeStream([over]), descriptors: fakeDescriptors(max + 1)).error?.kind == .tooManyDescriptors)
    }

    @Test("the default limits and the frame ceiling they imply")
    func defaultLimits() {
        let limits = WireLimits.default
        #expect(limits.maxMessageBytes == 16 << 20)
        #expect(limits.maxDescriptors == 16)
        #expect(limits.maxComponents == 1024)
        #expect(limits.maxFrameBytes == 16 + 8 * 1024 + (16 << 20))
    }

    @Test("the encoder's check refuses malformed control frames")
    func checkRefusesBadControlFrames() {
        let unknown = WireFrame(msgid: 4, isControl: true, components: [.port])
        #expect((#expect(throws: WireError.self) { try WireEncoder.check(unknown, limits: .default) })?.kind
            == .unknownControlCode)
        let withReply = WireFrame(msgid: 1, isControl: true, hasReplyPort: true, components: [.port])
        #expect((#expect(throws: WireError.self) { try WireEncoder.check(withReply, limits: .default) })?.kind
            == .malformedControlFrame)
        let withData = WireFrame(msgid: 1, isControl: true, components: [.data([])])
        #expect(throws: WireError.self) { try WireEncoder.check(withData, limits: .default) }
    }
}
