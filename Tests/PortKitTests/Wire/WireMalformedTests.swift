// Every way a peer can break the wire protocol, each built byte by byte, each a protocol error
// of the right kind, and none of them a trap or an allocation the limits did not allow.

import Testing
@testable import PortKit

@Suite("Wire malformed input")
struct WireMalformedTests {
    // MARK: Greeting

    @Test("bad magic is refused at the first wrong byte")
    func badMagic() {
        var writer = ByteWriter()
        writer.greeting(magic: Array("PKIX".utf8))
        #expect(decodeError(writer.bytes, prependGreeting: false)?.kind == .badMagic)
        // A stranger (an HTTP client, say) is refused before 16 bytes arrive.
        #expect(decodeError(Array("GET".utf8), prependGreeting: false)?.kind == .badMagic)
        #expect(decodeError([0x50, 0x4B, 0x49], prependGreeting: false) == nil)
    }

    @Test("unsupported version", arguments: [0, 2, 0xFFFF] as [UInt16])
    func badVersion(version: UInt16) {
        var writer = ByteWriter()
        writer.greeting(version: version)
        #expect(decodeError(writer.bytes, prependGreeting: false)?.kind == .unsupportedVersion)
    }

    @Test("non-zero greeting flags", arguments: [1, 0x8000] as [UInt16])
    func greetingFlags(flags: UInt16) {
        var writer = ByteWriter()
        writer.greeting(flags: flags)
        #expect(decodeError(writer.bytes, prependGreeting: false)?.kind == .greetingFlagsNotZero)
    }

    // MARK: Frame header

    @Test("a frame length below the header", arguments: [0, 1, 15] as [UInt32])
    func lengthBelowHeader(length: UInt32) {
        var writer = ByteWriter()
        writer.frameHeader(length: length)
        #expect(decodeError(writer.bytes)?.kind == .frameTooShort)
    }

    @Test("a length of 0xFFFFFFFF is refused from the header alone, without allocating")
    func hugeLength() {
        var writer = ByteWriter()
        writer.frameHeader(length: 0xFFFF_FFFF, componentCount: 1)
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.feed(encodeStream([]) + writer.bytes, into: &outcome)
        #expect(outcome.error?.kind == .frameTooLong)
        #expect(outcome.error?.message.contains("4294967295") == true)
        #expect(decoder.bufferCapacity <= 4096)
    }

    @Test("a valid large length reserves nothing until its bytes arrive")
    func largeClaimAllocatesNothing() {
        var writer = ByteWriter()
        writer.frameHeader(length: 16 + 8 + (16 << 20), componentCount: 1)
        writer.componentHeader(type: 1, length: 16 << 20)
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.feed(encodeStream([]) + writer.bytes, into: &outcome)
        #expect(outcome.error == nil)
        #expect(outcome.events == [.greeting(testGreeting)])
        #expect(decoder.bufferCapacity <= 4096)
        #expect(!decoder.isAtFrameBoundary)
    }

    @Test("a length over the limit for the frame's component count")
    func lengthOverLimit() {
        let limits = WireLimits(maxMessageBytes: 100, maxComponents: 4)
        var writer = ByteWriter()
        writer.frameHeader(length: 16 + 8 * 2 + 101, componentCount: 2)
        #expect(decodeError(writer.bytes, limits: limits)?.kind == .frameTooLong)
    }

    @Test("undefined frame flag bits", arguments: [1 << 3, 1 << 15, 0xFFFF] as [UInt16])
    func unknownFlags(flags: UInt16) {
        var writer = ByteWriter()
        writer.frameHeader(length: 16, flags: flags)
        #expect(decodeError(writer.bytes)?.kind == .unknownFrameFlags)
    }

    @Test("a non-zero reserved header field")
    func reservedHeaderField() {
        var writer = ByteWriter()
        writer.frameHeader(length: 16, reserved: 1)
        #expect(decodeError(writer.bytes)?.kind == .reservedFieldNotZero)
    }

    @Test("too many components")
    func tooManyComponents() {
        var writer = ByteWriter()
        writer.frameHeader(length: 16 + 8 * 1025, componentCount: 1025)
        #expect(decodeError(writer.bytes)?.kind == .tooManyComponents)
        var small = ByteWriter()
        small.frameHeader(length: 16 + 8 * 5, componentCount: 5)
        #expect(decodeError(small.bytes, limits: WireLimits(maxComponents: 4))?.kind == .tooManyComponents)
    }

    @Test("too many descriptors claimed")
    func tooManyDescriptors() {
        var writer = ByteWriter()
        writer.frameHeader(length: 16 + 8 * 17, componentCount: 17, descriptorCount: 17)
        for _ in 0..<17 { writer.componentHeader(type: 2, length: 0) }
        #expect(decodeError(writer.bytes, descriptors: fakeDescriptors(17))?.kind == .tooManyDescriptors)
    }

    // MARK: Components

    @Test("an unknown component type", arguments: [0, 3, 0xFF] as [UInt8])
    func unknownComponentType(type: UInt8) {
        var writer = ByteWriter()
        writer.frameHeader(length: 24, componentCount: 1)
        writer.componentHeader(type: type, length: 0)
        #expect(decodeError(writer.bytes)?.kind == .unknownComponentType)
    }

    @Test("non-zero reserved bytes in a component header", arguments: [[1, 0, 0], [0, 0, 0x80]] as [[UInt8]])
    func reservedComponentBytes(reserved: [UInt8]) {
        var writer = ByteWriter()
        writer.frameHeader(length: 24, componentCount: 1)
        writer.componentHeader(type: 1, reserved: reserved, length: 0)
        #expect(decodeError(writer.bytes)?.kind == .reservedFieldNotZero)
    }

    @Test("a port component with a length")
    func portWithLength() {
        var writer = ByteWriter()
        writer.frameHeader(length: 28, componentCount: 1, descriptorCount: 1)
        writer.componentHeader(type: 2, length: 4)
        writer.raw([0, 0, 0, 0])
        #expect(decodeError(writer.bytes, descriptors: [1000])?.kind == .portComponentHasLength)
    }

    @Test("a data component running past the end of the frame")
    func componentsOverrun() {
        var writer = ByteWriter()
        writer.frameHeader(length: 24 + 3, componentCount: 1)
        writer.componentHeader(type: 1, length: 4)
        writer.raw([1, 2, 3])
        #expect(decodeError(writer.bytes)?.kind == .componentsExceedFrame)

        // The second component header itself lies past the end.
        var second = ByteWriter()
        second.frameHeader(length: 16 + 8 + 8 + 4, componentCount: 2)
        second.componentHeader(type: 1, length: 8)
        second.raw([UInt8](repeating: 0, count: 8))
        second.raw([1, 0, 0, 0])
        #expect(decodeError(second.bytes)?.kind == .componentsExceedFrame)
    }

    @Test("one component with no flags but a length short of its component header",
          arguments: [16, 17, 23] as [UInt32])
    func oneComponentShortOfItsHeader(length: UInt32) {
        // The shape the header's checks take a shortcut for (one component, no flags,
        // descriptors or token): the shortcut must not admit a length the full checks refuse.
        // Checked on the header alone, since the body's decoding would refuse it later too.
        var writer = ByteWriter()
        writer.frameHeader(length: length, componentCount: 1)
        let header = writer.bytes.withUnsafeBytes { WireFrameHeader(loadingFrom: $0) }
        let error = #expect(throws: WireError.self) { try header.validate(limits: .default) }
        #expect(error?.kind == .componentsExceedFrame)
        writer.raw([UInt8](repeating: 0, count: Int(length) - 16))
        #expect(decodeError(writer.bytes)?.kind == .componentsExceedFrame)
    }

    @Test("a frame length too small for its component headers")
    func lengthBelowComponentHeaders() {
        var writer = ByteWriter()
        writer.frameHeader(length: 16 + 8, componentCount: 2)
        writer.componentHeader(type: 2, length: 0)
        #expect(decodeError(writer.bytes)?.kind == .componentsExceedFrame)
    }

    @Test("bytes left after the last component")
    func componentsUnderrun() {
        var writer = ByteWriter()
        writer.frameHeader(length: 24 + 5, componentCount: 1)
        writer.componentHeader(type: 1, length: 4)
        writer.raw([1, 2, 3, 4, 5])
        #expect(decodeError(writer.bytes)?.kind == .componentsShortOfFrame)

        var empty = ByteWriter()
        empty.frameHeader(length: 20)
        empty.raw([0, 0, 0, 0])
        #expect(decodeError(empty.bytes)?.kind == .componentsShortOfFrame)
    }

    @Test("descriptorCount disagreeing with the port components and reply port",
          arguments: [(0, false, 1), (2, false, 1), (1, true, 1), (3, true, 1), (0, true, 0)] as [(UInt16, Bool, Int)])
    func descriptorCountMismatch(claimed: UInt16, reply: Bool, ports: Int) {
        var writer = ByteWriter()
        writer.frameHeader(length: UInt32(16 + 8 * (ports + 1)), componentCount: UInt16(ports + 1),
                           flags: reply ? 1 : 0, descriptorCount: claimed)
        for _ in 0..<ports { writer.componentHeader(type: 2, length: 0) }
        writer.componentHeader(type: 1, length: 0)
        let error = decodeError(writer.bytes, descriptors: fakeDescriptors(Int(claimed)))
        #expect(error?.kind == .descriptorCountMismatch)
    }

    // MARK: Descriptors

    @Test("a complete frame whose descriptors have not arrived")
    func descriptorsMissing() {
        let frame = WireFrame(msgid: 1, hasReplyPort: true, components: [.port])
        var bytes: [UInt8] = []
        WireEncoder.append(frame, to: &bytes)
        #expect(decodeError(bytes)?.kind == .descriptorsMissing)
        #expect(decodeError(bytes, descriptors: [1000])?.kind == .descriptorsMissing)
        #expect(decodeError(bytes, descriptors: [1000, 1001]) == nil)
    }

    @Test("descriptors beyond what any frame can claim")
    func descriptorsAhead() {
        let max = WireLimits.default.maxDescriptors
        // At a frame boundary, one write's worth may be ahead of its frames; one more may not.
        #expect(decodeError([], descriptors: fakeDescriptors(max)) == nil)
        #expect(decodeError([], descriptors: fakeDescriptors(max + 1))?.kind == .descriptorsAhead)
        #expect(decodeError([], prependGreeting: false, descriptors: fakeDescriptors(max + 1))?.kind
            == .descriptorsAhead)
        // With a partial frame that claims 2, two more are allowed.
        var writer = ByteWriter()
        writer.frameHeader(length: 32, componentCount: 2, descriptorCount: 2)
        #expect(decodeError(writer.bytes, descriptors: fakeDescriptors(max + 2)) == nil)
        #expect(decodeError(writer.bytes, descriptors: fakeDescriptors(max + 3))?.kind == .descriptorsAhead)
    }

    // MARK: Control frames

    @Test("a control frame with an unknown code", arguments: [0, 4, UInt32.max] as [UInt32])
    func unknownControlCode(code: UInt32) {
        var writer = ByteWriter()
        writer.frameHeader(length: 24, msgid: code, componentCount: 1, flags: 2, descriptorCount: 1)
        writer.componentHeader(type: 2, length: 0)
        #expect(decodeError(writer.bytes, descriptors: [1000])?.kind == .unknownControlCode)
    }

    @Test("ATTACH_SENDER of the wrong shape")
    func malformedAttachSender() {
        // With the reply-port flag.
        var reply = ByteWriter()
        reply.frameHeader(length: 24, msgid: 1, componentCount: 1, flags: 3, descriptorCount: 2)
        reply.componentHeader(type: 2, length: 0)
        #expect(decodeError(reply.bytes, descriptors: [1000, 1001])?.kind == .malformedControlFrame)

        // A data component instead of the port.
        var data = ByteWriter()
        data.frameHeader(length: 24, msgid: 1, componentCount: 1, flags: 2, descriptorCount: 1)
        data.componentHeader(type: 1, length: 0)
        #expect(decodeError(data.bytes, descriptors: [1000])?.kind == .malformedControlFrame)

        // Two ports.
        var two = ByteWriter()
        two.frameHeader(length: 32, msgid: 1, componentCount: 2, flags: 2, descriptorCount: 2)
        two.componentHeader(type: 2, length: 0)
        two.componentHeader(type: 2, length: 0)
        #expect(decodeError(two.bytes, descriptors: [1000, 1001])?.kind == .malformedControlFrame)

        // No components at all.
        var none = ByteWriter()
        none.frameHeader(length: 16, msgid: 1, flags: 2)
        #expect(decodeError(none.bytes)?.kind == .malformedControlFrame)

        // A port and data.
        var extra = ByteWriter()
        extra.frameHeader(length: 33, msgid: 1, componentCount: 2, flags: 2, descriptorCount: 1)
        extra.componentHeader(type: 2, length: 0)
        extra.componentHeader(type: 1, length: 1)
        extra.raw([9])
        #expect(decodeError(extra.bytes, descriptors: [1000])?.kind == .malformedControlFrame)
    }

    // MARK: Errors are readable

    @Test("errors say what was wrong, with the numbers")
    func errorMessages() {
        var writer = ByteWriter()
        writer.frameHeader(length: 0xFFFF_FFFF, componentCount: 1)
        let error = decodeError(writer.bytes)
        #expect(error?.description
            == "wire protocol error (frameTooLong): frame length 4294967295 exceeds the limit 16777240 "
            + "for a frame of 1 component(s) (16777216 data bytes)")
    }
}
