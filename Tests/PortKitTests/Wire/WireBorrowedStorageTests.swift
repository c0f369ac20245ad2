// A connection reads into its loop's shared area while it holds no partial frame, and keeps only
// an incomplete frame's bytes afterwards: an idle connection costs no 64 KiB read buffer.

import Testing
@testable import PortKit

@Suite("Wire decoder: borrowed read storage")
struct WireBorrowedStorageTests {
    private func frame(_ msgid: UInt32, bytes: Int) -> WireFrame {
        WireFrame(msgid: msgid, hasReplyPort: false, components: [.data([UInt8](repeating: UInt8(msgid & 0xFF), count: bytes))])
    }

    /// Reads `bytes` the way a connection does: into the decoder's room, borrowed when possible.
    private func read(_ bytes: ArraySlice<UInt8>, into decoder: inout WireDecoder, scratch: inout [UInt8]) -> (borrowed: Bool, events: [WireEvent]) {
        let borrowed = decoder.borrowStorage(&scratch)
        let written = decoder.appendBytes(upTo: 64 << 10) { room -> Int in
            room.copyBytes(from: bytes)
            return bytes.count
        }
        #expect(written == bytes.count)
        var outcome = DecodeOutcome()
        decoder.drain(into: &outcome)
        #expect(outcome.error == nil)
        if borrowed { decoder.reclaimStorage(&scratch) }
        return (borrowed, outcome.events)
    }

    @Test("whole frames decode in the shared area and leave the decoder nothing to keep")
    func wholeFrames() {
        var scratch: [UInt8] = []
        var decoder = WireDecoder()
        let stream = encodeStream((1...20).map { frame($0, bytes: 64) })
        let result = read(stream[...], into: &decoder, scratch: &scratch)
        #expect(result.borrowed)
        #expect(result.events.count == 21)  // the greeting and 20 frames
        #expect(decoder.bufferedByteCount == 0)
        #expect(decoder.bufferCapacity == 0)
        #expect(scratch.count >= 64 << 10, "the shared area comes back to its owner")
    }

    @Test("an incomplete frame's bytes stay with the decoder, in storage that fits them")
    func partialFrameIsKept() {
        var scratch: [UInt8] = []
        var decoder = WireDecoder()
        let stream = encodeStream([frame(1, bytes: 64), frame(2, bytes: 1000)])
        let cut = stream.count - 500
        let first = read(stream[..<cut], into: &decoder, scratch: &scratch)
        #expect(first.borrowed)
        #expect(first.events.count == 2)  // the greeting and frame 1
        #expect(decoder.bufferedByteCount > 0)
        #expect(decoder.bufferCapacity <= 4096)
        // With bytes of its own, the next read goes to the decoder's own buffer.
        let second = read(stream[cut...], into: &decoder, scratch: &scratch)
        #expect(!second.borrowed)
        #expect(second.events == [.frame(frame(2, bytes: 1000), descriptors: [])])
        #expect(decoder.bufferedByteCount == 0)
        // Idle again: the next read borrows, and the decoder's large buffer is let go.
        let third = read(encodeStream([frame(3, bytes: 8)], greeting: false)[...], into: &decoder, scratch: &scratch)
        #expect(third.borrowed)
        #expect(third.events == [.frame(frame(3, bytes: 8), descriptors: [])])
        #expect(decoder.bufferCapacity <= 4096)
    }

    @Test("a stream that ends in the shared area leaves the area with its owner")
    func endOfStreamKeepsTheSharedArea() throws {
        var scratch: [UInt8] = []
        var decoder = WireDecoder()
        let stream = encodeStream([frame(1, bytes: 64)])
        _ = read(stream[...], into: &decoder, scratch: &scratch)
        let area = scratch.count
        #expect(area >= 64 << 10)
        // The end of the stream is read (0 bytes) and finished while the area is lent, as a
        // connection does when its peer closes.
        let lent = decoder.borrowStorage(&scratch)
        #expect(lent)
        let got = decoder.appendBytes(upTo: 64 << 10) { _ in 0 }
        #expect(got == 0)
        try decoder.finish()
        decoder.reclaimStorage(&scratch)
        #expect(scratch.count == area, "the next connection's read must not allocate and clear the area again")
    }

    @Test("a stream that fails in the shared area leaves the area with its owner")
    func failureKeepsTheSharedArea() {
        var scratch = [UInt8](repeating: 0, count: 64 << 10)
        var decoder = WireDecoder()
        let lent = decoder.borrowStorage(&scratch)
        #expect(lent)
        let garbage = [UInt8](repeating: 0xEE, count: 64)
        _ = decoder.appendBytes(upTo: 64 << 10) { room -> Int in
            room.copyBytes(from: garbage)
            return garbage.count
        }
        var outcome = DecodeOutcome()
        decoder.drain(into: &outcome)
        #expect(outcome.error != nil)
        decoder.reclaimStorage(&scratch)
        #expect(scratch.count == 64 << 10)
        #expect(decoder.bufferCapacity == 0)
    }
}
