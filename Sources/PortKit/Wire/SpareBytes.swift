// Received bytes reused: a delivered message's array takes the next message's bytes. In Wire/
// because the decoder makes the arrays (and the wire fuzzer builds Wire/ alone); the ports of
// both transports hand the arrays back (`MessageBody.takeBytes()`).

/// Received bytes as the owned array a message hands its handler, made in the storage of a
/// delivered message's array when it has the room: a receiver that gets each delivered
/// message's bytes back (`takeBytes()`) allocates nothing for the next one.
package enum SpareBytes {
    /// The largest array a receiver keeps to reuse.
    package static let limit = 4 << 10

    /// `source` as an array: in `spare`'s storage (taken, leaving `spare` empty) when it has
    /// the capacity and not much more (a small message kept by its handler must not hold a
    /// large one's storage), otherwise a new one. A spare still shared with a message its
    /// handler kept is copied on write, so reusing it never changes what the handler holds:
    /// the cost is then one allocation, as for a new array, of at most about twice the size
    /// (and, for a spare of the same size, a copy of its old bytes before they are overwritten).
    package static func copy(_ source: UnsafeRawBufferPointer, reusing spare: inout [UInt8]) -> [UInt8] {
        guard !source.isEmpty, spare.capacity >= source.count, spare.capacity <= 2 * source.count + 64 else {
            // `Array(_:)` allocates in code specialized here and copies with one `memcpy` (in
            // debug builds too); the `unsafeUninitializedCapacity` initializer goes through the
            // standard library's unspecialized allocation, which looks the storage type up at
            // run time (about 700 instructions a message).
            return Array(source)
        }
        var bytes: [UInt8] = []
        swap(&bytes, &spare)
        if bytes.count == source.count {
            // A stream's messages are often of one size: overwritten in place.
            bytes.withUnsafeMutableBytes { $0.copyMemory(from: source) }
        } else {
            bytes.removeAll(keepingCapacity: true)
            bytes.append(contentsOf: source)
        }
        return bytes
    }

    /// Keeps `bytes` in `spare` for the next message, if they are small enough to be worth it.
    package static func keep(_ bytes: inout [UInt8], in spare: inout [UInt8]) {
        guard bytes.capacity <= limit else { return }
        swap(&spare, &bytes)
    }
}
