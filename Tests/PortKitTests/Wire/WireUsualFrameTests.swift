// The usual message's shortcuts on both sides of the wire: `WirePlainFrame` encodes exactly the
// bytes of a `WireFrame` of one data component (a REPLY_BACK request's, or an answer's on a reply
// channel, with its token), and `WireDecoder.nextUsualFrame(reusing:)` takes exactly the frames
// the general decoding would give as that message, leaving every other frame (and every broken
// one) to `next()`, which then decodes it or refuses it as it always did.

import Testing
@testable import PortKit

@Suite("Wire: the usual message's shortcuts")
struct WireUsualFrameTests {
    /// The bytes of `frame` encoded by the general encoder.
    private func general(_ frame: WireFrame) -> [UInt8] {
        var bytes: [UInt8] = []
        WireEncoder.append(frame, to: &bytes)
        return bytes
    }

    @Test("a plain frame encodes to the general frame's bytes, at every size, with and without a token")
    func plainFrameBytes() {
        // No token; a REPLY_BACK request's token; an answer's token (on a reply channel).
        let requests: [(repliesBack: Bool, token: UInt16)] = [(false, 0), (true, 1), (true, .max), (false, 513)]
        for size in [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4096, 70_000] {
            let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 5) }
            let msgid: UInt32 = size == 64 ? .max : UInt32(size) &+ 100
            for (repliesBack, token) in requests {
                let expected = general(WireFrame(msgid: msgid, repliesBack: repliesBack, replyToken: token,
                                                 components: [.data(payload)]))
                payload.withUnsafeBytes { raw in
                    let plain = token == 0 ? WirePlainFrame(msgid: msgid, payload: raw)
                        : WirePlainFrame(msgid: msgid, payload: raw, repliesBack: repliesBack, replyToken: token)
                    #expect(plain.encodedSize == expected.count)
                    var appended: [UInt8] = [0xEE]  // after bytes already there, as pending bytes are
                    WireEncoder.appendEncoded(plain, to: &appended)
                    #expect(appended == [0xEE] + expected, "size \(size), token \(token)")
                }
            }
        }
    }

    @Test("the sender's limit check of a plain frame is the general one's")
    func plainFrameLimit() {
        let limits = WireLimits(maxMessageBytes: 64)
        for size in [0, 64, 65, 1000] {
            let frame = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 1, count: size))])
            let generalError: WireError? = { do throws(WireError) { try WireEncoder.check(frame, limits: limits); return nil } catch { return error } }()
            let plainError: WireError? = { do throws(WireError) { try WireEncoder.check(dataByteCount: size, limits: limits); return nil } catch { return error } }()
            #expect(plainError == generalError, "size \(size)")
            #expect((generalError == nil) == (size <= 64))
        }
    }

    @Test("the shortcut takes usual frames, in order, and reuses the spare's storage")
    func takesUsualFrames() throws {
        let payloads: [[UInt8]] = [[], [1], Array(repeating: 2, count: 64), Array(repeating: 3, count: 64)]
        var decoder = WireDecoder()
        encodeStream(payloads.enumerated().map { WireFrame(msgid: UInt32($0.offset), components: [.data($0.element)]) })
            .withUnsafeBytes { decoder.append(bytes: $0) }
        var spare: [UInt8] = []
        #expect(decoder.nextUsualFrame(reusing: &spare) == nil, "no greeting read yet")
        #expect(try decoder.next() == .greeting(testGreeting))
        var taken: [(UInt32, [UInt8])] = []
        while var usual = decoder.nextUsualFrame(reusing: &spare) {
            taken.append((usual.msgid, usual.bytes.map { $0 }))  // a copy: the bytes stay unshared
            if usual.msgid == 2 {
                // Handed back as a port hands back a delivered message's bytes.
                var bytes: [UInt8] = []
                swap(&bytes, &usual.bytes)
                let storage = bytes.withUnsafeBytes { $0.baseAddress }
                SpareBytes.keep(&bytes, in: &spare)
                let found = decoder.nextUsualFrame(reusing: &spare)
                let next = try #require(found)
                #expect(next.bytes.withUnsafeBytes { $0.baseAddress } == storage, "the spare's storage is reused")
                taken.append((next.msgid, next.bytes))
            }
        }
        #expect(taken.map(\.0) == [0, 1, 2, 3])
        #expect(taken.map(\.1) == payloads)
        #expect(decoder.bufferedByteCount == 0)
        #expect(try decoder.next() == nil)
        try decoder.finish()
    }

    /// Frames the shortcut must leave to `next()`, each with what `next()` then gives.
    private static func otherFrames() -> [(String, [UInt8])] {
        func bytes(_ build: (inout ByteWriter) -> Void) -> [UInt8] {
            var writer = ByteWriter()
            build(&writer)
            return writer.bytes
        }
        let data = [UInt8](repeating: 9, count: 8)
        var cases: [(String, [UInt8])] = []
        for frame in [
            WireFrame(msgid: 1),
            WireFrame(msgid: 2, components: [.data(data), .data(data)]),
            WireFrame(msgid: 3, hasReplyPort: true, components: [.data(data)]),
            WireFrame(msgid: 4, components: [.port]),
            WireFrame(msgid: 5, repliesBack: true, replyToken: 3, components: [.data(data), .data(data)]),
            WireFrame.attachSender(),
            WireFrame.control(.replyCancelled, replyToken: 3),
        ] {
            var encoded: [UInt8] = []
            WireEncoder.append(frame, to: &encoded)
            cases.append(("valid frame \(frame.msgid)", encoded))
        }
        cases.append(("component shorter than the frame", bytes {
            $0.frameHeader(length: 16 + 8 + 9, componentCount: 1)
            $0.componentHeader(type: 1, length: 8)
            $0.raw(data + [0])
        }))
        cases.append(("component longer than the frame", bytes {
            $0.frameHeader(length: 16 + 8 + 8, componentCount: 1)
            $0.componentHeader(type: 1, length: 9)
            $0.raw(data)
        }))
        cases.append(("reserved bytes in the component", bytes {
            $0.frameHeader(length: 16 + 8 + 8, componentCount: 1)
            $0.componentHeader(type: 1, reserved: [0, 1, 0], length: 8)
            $0.raw(data)
        }))
        cases.append(("unknown component type", bytes {
            $0.frameHeader(length: 16 + 8 + 8, componentCount: 1)
            $0.componentHeader(type: 7, length: 8)
            $0.raw(data)
        }))
        cases.append(("reply token on a plain frame", bytes {
            $0.frameHeader(length: 16 + 8 + 8, componentCount: 1, reserved: 5)
            $0.componentHeader(type: 1, length: 8)
            $0.raw(data)
        }))
        cases.append(("REPLY_BACK with the reply token 0", bytes {
            $0.frameHeader(length: 16 + 8 + 8, componentCount: 1, flags: WireFormat.replyBackFlag)
            $0.componentHeader(type: 1, length: 8)
            $0.raw(data)
        }))
        cases.append(("REPLY_BACK with a reply port", bytes {
            $0.frameHeader(length: 16 + 8 + 8, componentCount: 1, flags: WireFormat.replyBackFlag | WireFormat.replyPortFlag,
                           descriptorCount: 1, reserved: 3)
            $0.componentHeader(type: 1, length: 8)
            $0.raw(data)
        }))
        cases.append(("REPLY_BACK on a control frame", bytes {
            $0.frameHeader(length: 16 + 8 + 8, msgid: 2, componentCount: 1, flags: WireFormat.replyBackFlag | WireFormat.controlFlag,
                           reserved: 3)
            $0.componentHeader(type: 1, length: 8)
            $0.raw(data)
        }))
        cases.append(("unknown flag", bytes {
            $0.frameHeader(length: 16 + 8 + 8, componentCount: 1, flags: 0x8000)
            $0.componentHeader(type: 1, length: 8)
            $0.raw(data)
        }))
        cases.append(("frame shorter than its headers", bytes {
            $0.frameHeader(length: 16 + 4, componentCount: 1)
            $0.componentHeader(type: 1, length: 0)
        }))
        cases.append(("frame over the limit", bytes {
            $0.frameHeader(length: UInt32(16 + 8 + (16 << 20) + 1), componentCount: 1)
            $0.componentHeader(type: 1, length: UInt32((16 << 20) + 1))
        }))
        return cases
    }

    @Test("every other frame, valid or broken, is left whole to next(), which decodes it as before")
    func leavesOtherFrames() throws {
        for (name, frame) in Self.otherFrames() {
            // After a usual frame, so the shortcut is asked in the middle of a stream.
            var stream = encodeStream([WireFrame(msgid: 77, components: [.data([1, 2, 3])])])
            stream += frame
            let descriptors = fakeDescriptors(2)
            // The usual frame is taken; the other one is left whole.
            try expectShortcutThenGeneral(stream, descriptors: descriptors, direction: .toPort, taken: [true, false], name)
        }
    }

    @Test("a partial usual frame waits")
    func partialFrame() throws {
        let frame = general(WireFrame(msgid: 5, components: [.data([1, 2, 3, 4])]))
        var spare: [UInt8] = []
        for end in [1, 16, 24, frame.count - 1] {
            var partial = WireDecoder()
            (encodeStream([]) + frame.prefix(end)).withUnsafeBytes { partial.append(bytes: $0) }
            _ = try partial.next()
            #expect(partial.nextUsualFrame(reusing: &spare) == nil, "\(end) bytes")
            #expect(partial.bufferedByteCount == end)
        }
    }

    /// A REPLY_BACK request towards a port, and an answer on a reply channel, are usual frames
    /// with their tokens. A token where none belongs, none where one must be, REPLY_BACK on a
    /// reply channel, or a token beside a descriptor, a control code or an unknown flag, is
    /// broken, and left to `next()`, which refuses it as before.
    @Test("requests and answers take the shortcut with their tokens; broken ones are left to next()")
    func requestsAndAnswers() throws {
        let data: [UInt8] = [1, 2, 3, 4]
        func frame(_ frame: WireFrame) -> [UInt8] { general(frame) }
        /// One data component of `data` under a header with these fields.
        func raw(flags: UInt16, descriptors: UInt16 = 0, token: UInt16) -> [UInt8] {
            var writer = ByteWriter()
            writer.frameHeader(length: 16 + 8 + 4, msgid: 2, componentCount: 1, flags: flags, descriptorCount: descriptors,
                               reserved: token)
            writer.componentHeader(type: 1, length: 4)
            writer.raw(data)
            return writer.bytes
        }
        let back = WireFormat.replyBackFlag
        // Taken by the shortcut; left to `next()`, which decodes it; left to `next()`, which refuses it.
        enum Outcome { case taken, left, refused }
        let cases: [(String, WireDirection, [UInt8], Outcome)] = [
            ("a request", .toPort, frame(WireFrame(msgid: 5, repliesBack: true, replyToken: 9, components: [.data(data)])), .taken),
            ("an empty request, the largest token", .toPort,
             frame(WireFrame(msgid: 6, repliesBack: true, replyToken: .max, components: [.data([])])), .taken),
            ("an answer", .toRequester, frame(WireFrame(msgid: 7, replyToken: 9, components: [.data(data)])), .taken),
            ("an answer with a reply port", .toRequester, raw(flags: WireFormat.replyPortFlag, descriptors: 1, token: 9), .left),
            ("an answer with no token", .toRequester, frame(WireFrame(msgid: 8, components: [.data(data)])), .refused),
            ("REPLY_BACK on a reply channel", .toRequester, raw(flags: back, token: 9), .refused),
            ("a token with no REPLY_BACK", .toPort, raw(flags: 0, token: 9), .refused),
            ("REPLY_BACK with the token 0", .toPort, raw(flags: back, token: 0), .refused),
            ("a request claiming a descriptor", .toPort, raw(flags: back, descriptors: 1, token: 9), .refused),
            ("an answer claiming a descriptor", .toRequester, raw(flags: 0, descriptors: 1, token: 9), .refused),
            ("a request with the CONTROL flag", .toPort, raw(flags: back | WireFormat.controlFlag, token: 9), .refused),
            ("an answer with the CONTROL flag", .toRequester, raw(flags: WireFormat.controlFlag, token: 9), .refused),
            ("a request with an unknown flag", .toPort, raw(flags: back | 0x8000, token: 9), .refused),
            ("an answer with an unknown flag", .toRequester, raw(flags: 0x8000, token: 9), .refused),
        ]
        for (name, direction, bytes, outcomeExpected) in cases {
            let taken = outcomeExpected == .taken
            let stream = encodeStream([]) + bytes
            let expected = try expectShortcutThenGeneral(stream, descriptors: fakeDescriptors(1), direction: direction,
                                                         taken: [taken], name)
            #expect((expected.error != nil) == (outcomeExpected == .refused), "\(name): refused by the general decoding")
        }
    }

    /// Reads `stream` (the test greeting first) asking the shortcut once per entry of `taken`,
    /// each time expecting it to take the next frame or to leave it whole (nothing consumed),
    /// then the rest with `next()`; expects the events and the error the general decoding
    /// gives alone, which it returns.
    @discardableResult
    private func expectShortcutThenGeneral(
        _ stream: [UInt8], descriptors: [Int32], direction: WireDirection, taken: [Bool], _ name: String
    ) throws -> DecodeOutcome {
        let expected = decode(stream, descriptors: descriptors, direction: direction)
        var decoder = WireDecoder(direction: direction)
        decoder.append(descriptors: descriptors)
        stream.withUnsafeBytes { decoder.append(bytes: $0) }
        var outcome = DecodeOutcome()
        var spare: [UInt8] = []
        do {
            outcome.events.append(try #require(try decoder.next(), "\(name): the greeting"))
            for (ask, shouldTake) in taken.enumerated() {
                let before = decoder.bufferedByteCount
                if let usual = decoder.nextUsualFrame(reusing: &spare) {
                    #expect(shouldTake, "\(name): ask \(ask) took a frame")
                    outcome.events.append(.frame(WireFrame(usual: usual, direction: direction), descriptors: []))
                } else {
                    #expect(!shouldTake, "\(name): ask \(ask) took nothing")
                    #expect(decoder.bufferedByteCount == before, "\(name): nothing consumed")
                }
            }
            while let event = try decoder.next() { outcome.events.append(event) }
        } catch let error as WireError {
            outcome.error = error
        }
        expectSameEvents(outcome.events, expected.events, name)
        #expect(outcome.error == expected.error, "\(name)")
        return expected
    }

    @Test("random streams decode the same with the shortcut as without", arguments: 0..<4)
    func randomStreams(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        for _ in 0..<200 {
            var stream = encodeStream([])
            for _ in 0..<Int.random(in: 1...6, using: &random) {
                let payload = (0..<Int.random(in: 0...80, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                // Now and then a REPLY_BACK request.
                let token: UInt16 = Int.random(in: 0..<3, using: &random) == 0 ? UInt16.random(in: 1...UInt16.max, using: &random) : 0
                stream += general(WireFrame(msgid: UInt32.random(in: 0...9, using: &random), repliesBack: token != 0, replyToken: token,
                                            components: [.data(payload)]))
            }
            // Now and then a byte of it broken.
            if Bool.random(using: &random) {
                let at = Int.random(in: 16..<stream.count, using: &random)
                stream[at] ^= UInt8(1) << UInt8.random(in: 0...7, using: &random)
            }
            var chunks: [Int] = []
            for _ in 0..<8 { chunks.append(Int.random(in: 1...40, using: &random)) }
            let expected = decode(stream, chunks: chunks)
            var decoder = WireDecoder()
            var outcome = DecodeOutcome()
            var spare: [UInt8] = []
            var offset = 0
            for size in chunks + [stream.count] where offset < stream.count && outcome.error == nil {
                let end = min(stream.count, offset + size)
                Array(stream[offset..<end]).withUnsafeBytes { decoder.append(bytes: $0) }
                offset = end
                do throws(WireError) {
                    while true {
                        if let usual = decoder.nextUsualFrame(reusing: &spare) {
                            outcome.events.append(.frame(WireFrame(usual: usual, direction: .toPort), descriptors: []))
                        } else if let event = try decoder.next() {
                            outcome.events.append(event)
                        } else {
                            break
                        }
                    }
                } catch {
                    outcome.error = error
                }
            }
            expectSameEvents(outcome.events, expected.events)
            #expect(outcome.error == expected.error)
        }
    }
}

@Suite("Wire: a drained decoder")
struct WireDrainedDecoderTests {
    @Test("drained only when open with no byte and no descriptor left, and then next() has nothing")
    func drained() throws {
        var decoder = WireDecoder()
        #expect(!decoder.isDrained, "awaiting its greeting")
        let frame = encodeStream([WireFrame(msgid: 1, components: [.data([1, 2])])], greeting: false)
        encodeStream([]).withUnsafeBytes { decoder.append(bytes: $0) }
        #expect(!decoder.isDrained, "a greeting buffered")
        #expect(try decoder.next() == .greeting(testGreeting))
        #expect(decoder.isDrained)
        #expect(try decoder.next() == nil)
        frame.prefix(5).withUnsafeBytes { decoder.append(bytes: $0) }
        #expect(!decoder.isDrained, "part of a frame buffered")
        frame.dropFirst(5).withUnsafeBytes { decoder.append(bytes: $0) }
        var spare: [UInt8] = []
        #expect(decoder.nextUsualFrame(reusing: &spare)?.msgid == 1)
        #expect(decoder.isDrained)
        decoder.append(descriptors: [1000])
        #expect(!decoder.isDrained, "a descriptor ahead of its frame")
        #expect(try decoder.next() == nil)
        _ = decoder.takeAllDescriptors()
        #expect(decoder.isDrained)
        try decoder.finish()
        #expect(!decoder.isDrained, "closed")

        var failed = WireDecoder()
        [0, 1, 2, 3].withUnsafeBytes { failed.append(bytes: $0) }
        #expect(throws: WireError.self) { try failed.next() }
        #expect(!failed.isDrained, "failed")
    }
}
