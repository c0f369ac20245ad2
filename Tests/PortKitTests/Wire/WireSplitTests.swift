// The decoder must not care how reads cut the stream: byte by byte, at every offset, in random
// chunks, or many frames in one read; and descriptors may arrive any time up to the frame's
// first byte.

import Testing
@testable import PortKit

@Suite("Wire splitting")
struct WireSplitTests {
    /// A short stream with every kind of frame; 9 descriptors in all.
    let frames: [WireFrame] = [
        WireFrame(msgid: 100, hasReplyPort: true, components: [.port]),
        WireFrame(msgid: 1, components: [.data(Array("first".utf8)), .data([])]),
        WireFrame(msgid: 0),
        WireFrame(msgid: 2, hasReplyPort: true, components: [.data([1, 2, 3]), .port, .port, .data([4, 5])]),
        WireFrame.attachSender(),
        WireFrame(msgid: 3, components: [.port, .port, .port]),
    ]

    var descriptorTotal: Int { frames.reduce(0) { $0 + $1.descriptorCount } }

    @Test("one byte at a time")
    func byteByByte() {
        let outcome = decodeStream(frames, chunks: Array(repeating: 1, count: encodeStream(frames).count))
        #expect(outcome.error == nil)
        expectSameEvents(outcome.events, expectedEvents(frames))
    }

    @Test("cut in two at every offset")
    func everyOffset() {
        let bytes = encodeStream(frames)
        for cut in 0...bytes.count {
            let outcome = decodeStream(frames, chunks: [cut])
            #expect(outcome.error == nil, "cut at \(cut)")
            expectSameEvents(outcome.events, expectedEvents(frames), "cut at \(cut)")
        }
    }

    @Test("cut in three at every pair of offsets in the first frames")
    func everyPairOfOffsets() {
        let firstFrames = Array(frames.prefix(4))
        let bytes = encodeStream(firstFrames)
        for first in 0...bytes.count {
            for second in 0...(bytes.count - first) {
                let outcome = decodeStream(firstFrames, chunks: [first, second])
                #expect(outcome.error == nil)
                expectSameEvents(outcome.events, expectedEvents(firstFrames), "cuts \(first), \(second)")
            }
        }
    }

    @Test("random chunks", arguments: [1, 2, 3, 42, 1234] as [UInt64])
    func randomChunks(seed: UInt64) {
        var generator = SplitMix64(seed: seed)
        let repeated = Array((0..<20).map { _ in frames }.joined())
        let bytes = encodeStream(repeated)
        var chunks: [Int] = []
        var covered = 0
        while covered < bytes.count {
            let size = Int.random(in: 1...64, using: &generator)
            chunks.append(size)
            covered += size
        }
        let outcome = decodeStream(repeated, chunks: chunks)
        #expect(outcome.error == nil)
        expectSameEvents(outcome.events, expectedEvents(repeated))
    }

    @Test("many frames in one chunk")
    func manyFramesInOneChunk() {
        let many = (0..<1000).map {
            WireFrame(msgid: UInt32($0), components: [.data([UInt8](repeating: 7, count: 64))])
        }
        let outcome = decode(encodeStream(many))
        #expect(outcome.error == nil)
        expectSameEvents(outcome.events, expectedEvents(many))
    }

    @Test("descriptors arriving with the first byte of their frame, byte by byte")
    func descriptorsWithTheFirstByte() {
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.feed(encodeStream([]), into: &outcome)
        var next: Int32 = 1000
        for frame in frames {
            var bytes: [UInt8] = []
            WireEncoder.append(frame, to: &bytes)
            for (index, byte) in bytes.enumerated() {
                if index == 0 {
                    decoder.append(descriptors: fakeDescriptors(frame.descriptorCount, base: next))
                    next += Int32(frame.descriptorCount)
                }
                decoder.feed([byte], into: &outcome)
            }
        }
        #expect(outcome.error == nil)
        #expect(outcome.events == expectedEvents(frames))
        #expect(decoder.pendingDescriptorCount == 0)
        #expect(decoder.isAtFrameBoundary)
    }

    @Test("descriptors of a coalesced write arrive before the bytes of its later frames")
    func descriptorsOfACoalescedWrite() {
        // One write carried three frames and all their descriptors; the reader got only the
        // first bytes of it with the descriptors, then the rest.
        let batch = [WireFrame(msgid: 1, components: [.port]), WireFrame(msgid: 2, components: [.port, .port]),
                     WireFrame(msgid: 3, hasReplyPort: true)]
        let bytes = encodeStream(batch)
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.append(descriptors: fakeDescriptors(4))
        decoder.feed(bytes.prefix(20), into: &outcome)
        decoder.feed(bytes.dropFirst(20), into: &outcome)
        #expect(outcome.error == nil)
        #expect(outcome.events == expectedEvents(batch))
    }

    @Test("reading straight into the decoder's buffer")
    func appendBytesUpTo() {
        let bytes = encodeStream(frames)
        var decoder = WireDecoder()
        decoder.append(descriptors: fakeDescriptors(descriptorTotal))
        var outcome = DecodeOutcome()
        var offset = 0
        while offset < bytes.count {
            let written = decoder.appendBytes(upTo: 5) { room in
                let count = min(room.count, bytes.count - offset)
                room.copyBytes(from: bytes[offset..<offset + count])
                return count
            }
            offset += written
            decoder.drain(into: &outcome)
        }
        #expect(outcome.error == nil)
        #expect(outcome.events == expectedEvents(frames))
    }

    @Test("a failing read appends nothing")
    func appendBytesThatThrows() {
        struct ReadFailed: Error {}
        var decoder = WireDecoder()
        #expect(throws: ReadFailed.self) {
            _ = try decoder.appendBytes(upTo: 100) { (_: UnsafeMutableRawBufferPointer) throws(ReadFailed) -> Int in
                throw ReadFailed()
            }
        }
        #expect(decoder.bufferedByteCount == 0)
    }

    @Test("a long stream through a small window keeps the buffer small")
    func bufferStaysSmall() {
        let frame = WireFrame(msgid: 1, components: [.data([UInt8](repeating: 1, count: 100))])
        var decoder = WireDecoder()
        var outcome = DecodeOutcome()
        decoder.feed(encodeStream([]), into: &outcome)
        var chunk: [UInt8] = []
        for _ in 0..<7 { WireEncoder.append(frame, to: &chunk) }  // 7 frames of 124 bytes
        var frameCount = 0
        for round in 0..<10_000 {
            // Cut so that a partial frame stays buffered after most rounds.
            decoder.feed(chunk[..<(round % 2 == 0 ? 500 : chunk.count)], into: &outcome)
            if round % 2 == 0 { decoder.feed(chunk[500...], into: &outcome) }
            frameCount = outcome.events.count - 1
        }
        #expect(outcome.error == nil)
        #expect(frameCount == 70_000)
        #expect(decoder.bufferCapacity <= 8192)
    }
}
