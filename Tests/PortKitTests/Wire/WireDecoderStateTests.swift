// The decoder as a state machine: awaiting-greeting -> open -> closed, or failed; a failed
// decoder stays failed and hands back every descriptor; frame boundaries and the end of the
// stream.

import Testing
@testable import PortKit

@Suite("Wire decoder states")
struct WireDecoderStateTests {
    @Test("awaiting greeting, then open, then closed at a clean end")
    func phases() throws {
        var decoder = WireDecoder()
        #expect(decoder.phase == .awaitingGreeting)
        #expect(decoder.greeting == nil)
        var outcome = DecodeOutcome()
        decoder.feed(encodeStream([]).prefix(15), into: &outcome)
        #expect(decoder.phase == .awaitingGreeting)
        #expect(outcome.events.isEmpty)
        decoder.feed(encodeStream([]).suffix(1), into: &outcome)
        #expect(decoder.phase == .open)
        #expect(decoder.greeting == testGreeting)
        #expect(outcome.events == [.greeting(testGreeting)])
        try decoder.finish()
        #expect(decoder.phase == .closed)
        #expect(try decoder.next() == nil)
    }

    @Test("a connection closed before its first byte ends cleanly")
    func closedBeforeGreeting() throws {
        var decoder = WireDecoder()
        #expect(decoder.isAtFrameBoundary)
        try decoder.finish()
        #expect(decoder.phase == .closed)
    }

    @Test("after an error every call throws the same error and all descriptors come back")
    func failedStaysFailed() throws {
        var decoder = WireDecoder()
        decoder.append(descriptors: [1000, 1001])
        var outcome = DecodeOutcome()
        var writer = ByteWriter()
        writer.frameHeader(length: 24, componentCount: 1, descriptorCount: 1)
        writer.componentHeader(type: 9, length: 0)
        decoder.feed(encodeStream([]) + writer.bytes, into: &outcome)
        let error = try #require(outcome.error)
        #expect(error.kind == .unknownComponentType)
        #expect(decoder.phase == .failed)
        #expect(decoder.error == error)
        #expect(decoder.bufferedByteCount == 0)

        // Later bytes are discarded, later descriptors kept for the caller to close.
        decoder.feed(encodeStream([WireFrame(msgid: 1)], greeting: false), into: &outcome)
        decoder.append(descriptors: [1002])
        #expect(decoder.bufferedByteCount == 0)
        let readInto = decoder.appendBytes(upTo: 8) { room in room.count }
        #expect(readInto == 8)
        #expect(decoder.bufferedByteCount == 0)
        for _ in 0..<3 {
            #expect(throws: error) { _ = try decoder.next() }
        }
        #expect(throws: error) { try decoder.finish() }
        #expect(!decoder.isAtFrameBoundary)
        #expect(decoder.pendingDescriptorCount == 3)
        #expect(decoder.takeAllDescriptors() == [1000, 1001, 1002])
        #expect(decoder.pendingDescriptorCount == 0)
        #expect(decoder.takeAllDescriptors() == [])
    }

    @Test("descriptors of frames already delivered are not handed back twice")
    func deliveredDescriptorsAreGone() {
        var decoder = WireDecoder()
        decoder.append(descriptors: [1000, 1001, 1002])
        var outcome = DecodeOutcome()
        let good = WireFrame(msgid: 1, components: [.port])
        decoder.feed(encodeStream([good]), into: &outcome)
        #expect(outcome.events.last == .frame(good, descriptors: [1000]))
        var writer = ByteWriter()
        writer.frameHeader(length: 16, flags: 0x10)
        decoder.feed(writer.bytes, into: &outcome)
        #expect(outcome.error?.kind == .unknownFrameFlags)
        #expect(decoder.takeAllDescriptors() == [1001, 1002])
    }

    @Test("a greeting error fails the decoder too")
    func greetingErrorFails() {
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.feed(Array("HTTP/1.1 200 OK\r\n".utf8), into: &outcome)
        #expect(outcome.error?.kind == .badMagic)
        #expect(decoder.phase == .failed)
    }

    @Test("isAtFrameBoundary follows the buffered bytes")
    func frameBoundary() {
        let frame = WireFrame(msgid: 5, components: [.data([1, 2, 3, 4])])
        let bytes = encodeStream([frame, frame])
        let greetingEnd = WireFormat.greetingByteCount
        let frameSize = WireEncoder.encodedSize(of: frame)

        var decoder = WireDecoder()
        var boundaries: [Int] = []
        for (index, byte) in bytes.enumerated() {
            [byte].withUnsafeBytes { decoder.append(bytes: $0) }
            if decoder.isAtFrameBoundary { boundaries.append(index + 1) }
        }
        // Before any event is taken: after the greeting, and after each complete frame.
        #expect(boundaries == [greetingEnd, greetingEnd + frameSize, greetingEnd + 2 * frameSize])
        #expect(decoder.bufferedByteCount == bytes.count)

        // Taking the events empties the buffer, still at a boundary.
        var outcome = DecodeOutcome()
        decoder.drain(into: &outcome)
        #expect(outcome.events.count == 3)
        #expect(decoder.isAtFrameBoundary)
        #expect(decoder.bufferedByteCount == 0)

        // Half a frame: not at a boundary, and the end of the stream there is a truncation.
        decoder.feed(bytes[greetingEnd..<(greetingEnd + 10)], into: &outcome)
        #expect(!decoder.isAtFrameBoundary)
        #expect(decoder.bufferedByteCount == 10)
        let error = #expect(throws: WireError.self) { try decoder.finish() }
        #expect(error?.kind == .truncated)
        #expect(decoder.phase == .failed)
    }

    @Test("the end of the stream inside the greeting is a truncation")
    func truncatedGreeting() {
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.feed(encodeStream([]).prefix(6), into: &outcome)
        #expect(!decoder.isAtFrameBoundary)
        #expect((#expect(throws: WireError.self) { try decoder.finish() })?.kind == .truncated)
    }

    @Test("the end of the stream with descriptors no frame claimed is a truncation")
    func strayDescriptorsAtTheEnd() {
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.append(descriptors: [1000])
        decoder.feed(encodeStream([]), into: &outcome)
        #expect(outcome.error == nil)
        #expect(decoder.isAtFrameBoundary)
        #expect((#expect(throws: WireError.self) { try decoder.finish() })?.kind == .truncated)
        #expect(decoder.takeAllDescriptors() == [1000])
    }

    @Test("the decoder checks against its own limits")
    func customLimits() {
        let limits = WireLimits(maxMessageBytes: 8, maxDescriptors: 2, maxComponents: 2)
        let decoder = WireDecoder(limits: limits)
        #expect(decoder.limits == limits)
        let fits = WireFrame(msgid: 1, hasReplyPort: true, components: [.data([1, 2, 3, 4, 5, 6, 7, 8]), .port])
        let outcome = decode(encodeStream([fits]), descriptors: [1, 2], limits: limits)
        #expect(outcome.events == expectedEvents([fits], base: 1))
        let tooBig = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 0, count: 9))])
        #expect(decode(encodeStream([tooBig]), limits: limits).error?.kind == .frameTooLong)
    }

    @Test("a big frame arriving in pieces, then small ones: memory is given back")
    func memoryIsGivenBack() {
        let big = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 3, count: 1 << 20))])
        let small = WireFrame(msgid: 2)
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        let bytes = encodeStream([big])
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + 65536)
            decoder.feed(bytes[offset..<end], into: &outcome)
            offset = end
        }
        #expect(decoder.bufferCapacity >= 1 << 20)
        decoder.feed(encodeStream([small], greeting: false), into: &outcome)
        #expect(outcome.error == nil)
        #expect(outcome.events == expectedEvents([big, small]))
        #expect(decoder.bufferCapacity <= 4096)
    }
}
