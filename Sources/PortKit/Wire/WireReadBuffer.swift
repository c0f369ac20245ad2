// The byte buffer behind a `WireDecoder`: bytes are appended at the end (or read straight into
// its spare room) and consumed from the front by moving a read index, so consuming a frame never
// shifts the rest. Unconsumed bytes move to the front only when that is cheaper than growing.
// Memory follows the bytes actually received, never the length a header claims.

/// A growable byte buffer with a read index.
struct WireReadBuffer {
    /// Allocated bytes; `storage.count` is the capacity. Live bytes are `start..<end`.
    private var storage: [UInt8] = []
    private var start = 0
    private var end = 0
    /// Whether `storage` is lent by `borrow(_:)`: it goes back to its owner, never away.
    private var isBorrowed = false

    /// The smallest allocation the buffer makes.
    private static let minimumCapacity = 4096
    /// When the buffer is empty and holds more than this, it gives the memory back.
    private static let retainedCapacity = 256 << 10

    /// The number of unconsumed bytes.
    var count: Int { end - start }
    /// The bytes allocated (for tests and diagnostics).
    var capacity: Int { storage.count }

    /// Appends a copy of `bytes`.
    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        makeRoom(for: bytes.count)
        storage.withUnsafeMutableBytes { raw in
            UnsafeMutableRawBufferPointer(rebasing: raw[end..<end + bytes.count]).copyMemory(from: bytes)
        }
        end += bytes.count
    }

    /// Lets `fill` write up to `maxCount` bytes into the buffer's spare room (for example as the
    /// `iovec` of a `recvmsg`) and keeps the number of bytes it returns.
    ///
    /// - Returns: what `fill` returned, which must be in `0...maxCount` (a programmer error
    ///   otherwise, and it traps).
    mutating func append<E: Error>(
        upTo maxCount: Int, _ fill: (UnsafeMutableRawBufferPointer) throws(E) -> Int
    ) throws(E) -> Int {
        precondition(maxCount >= 0, "WireReadBuffer: negative byte count \(maxCount)")
        makeRoom(for: maxCount)
        let from = end
        // `withUnsafeMutableBufferPointer` throws typed errors (see `withUnsafeBytes(_:)`).
        let written = try storage.withUnsafeMutableBufferPointer { (bytes) throws(E) -> Int in
            try fill(UnsafeMutableRawBufferPointer(rebasing: UnsafeMutableRawBufferPointer(bytes)[from..<from + maxCount]))
        }
        precondition(written >= 0 && written <= maxCount,
                     "WireReadBuffer: fill reported \(written) bytes for a room of \(maxCount)")
        end += written
        return written
    }

    /// Drops the first `byteCount` unconsumed bytes.
    @inline(__always)
    mutating func consume(_ byteCount: Int) {
        precondition(byteCount >= 0 && byteCount <= count, "WireReadBuffer: consume(\(byteCount)) of \(count)")
        start += byteCount
    }

    /// Lends the buffer `scratch`'s storage while the buffer holds no bytes: a reader with
    /// many idle connections reads each one into one shared area instead of a large buffer of
    /// its own. `reclaim(_:)` hands it back. `scratch` must be uniquely referenced.
    mutating func borrow(_ scratch: inout [UInt8]) {
        precondition(count == 0, "WireReadBuffer: borrowing scratch storage while holding \(count) bytes")
        swap(&storage, &scratch)
        start = 0
        end = 0
        isBorrowed = true
    }

    /// Hands back storage lent by `borrow(_:)`, keeping only the unconsumed bytes, in storage of
    /// the buffer's own that fits them.
    mutating func reclaim(_ scratch: inout [UInt8]) {
        precondition(isBorrowed, "WireReadBuffer: reclaiming storage that was not borrowed")
        isBorrowed = false
        swap(&storage, &scratch)
        let live = end - start
        let from = start
        start = 0
        end = 0
        if storage.count > Self.retainedIdleCapacity { storage = [] }
        guard live > 0 else { return }
        scratch.withUnsafeBytes { source in
            append(UnsafeRawBufferPointer(rebasing: source[from..<from + live]))
        }
    }

    /// What an idle buffer keeps when it hands back borrowed storage.
    private static let retainedIdleCapacity = 4096

    /// Drops everything and gives the memory back; borrowed storage is only emptied, and goes
    /// back to its owner with `reclaim(_:)` (a stream that ends must not take its loop's shared
    /// area with it: the next read would allocate and clear 64 KiB again).
    mutating func removeAll() {
        if !isBorrowed { storage = [] }
        start = 0
        end = 0
    }

    /// Calls `body` with the unconsumed bytes.
    @inline(__always)
    func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        // `withUnsafeBufferPointer` throws typed errors; `withUnsafeBytes` only rethrows
        // untyped ones, so a caller that throws had to wrap its result (a `Result` made and
        // destroyed per frame).
        try storage.withUnsafeBufferPointer { (bytes) throws(E) -> R in
            try body(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(bytes)[start..<end]))
        }
    }

    /// Ensures `byteCount` bytes of spare room after `end`.
    private mutating func makeRoom(for byteCount: Int) {
        let live = end - start
        if live == 0 {
            start = 0
            end = 0
            if storage.count > Self.retainedCapacity && byteCount <= Self.retainedCapacity && !isBorrowed {
                storage = []
            }
        }
        if storage.count - end >= byteCount { return }
        // Moving the live bytes to the front is worth it when it frees at least as many bytes
        // as it copies, and suffices. (`start >= live` also means the two ranges do not overlap.)
        if start >= live && live + byteCount <= storage.count {
            storage.withUnsafeMutableBytes { raw in
                guard let base = raw.baseAddress else { return }
                base.copyMemory(from: base + start, byteCount: live)
            }
            start = 0
            end = live
            return
        }
        let capacity = Swift.max(storage.count * 2, live + byteCount, Self.minimumCapacity)
        // Uninitialized: only bytes written (copied here, or received) are ever read, and
        // clearing 64 KiB cost more than the read that needed the room.
        let grown = [UInt8](unsafeUninitializedCapacity: capacity) { destination, initialized in
            if live > 0 {
                storage.withUnsafeBytes { source in
                    UnsafeMutableRawBufferPointer(rebasing: UnsafeMutableRawBufferPointer(destination)[0..<live])
                        .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[start..<end]))
                }
            }
            initialized = capacity
        }
        storage = grown
        start = 0
        end = live
    }
}

/// The descriptors received on a connection and not yet handed out with a frame, oldest first.
struct WireDescriptorQueue {
    private var storage: [Int32] = []
    private var head = 0

    /// The number of descriptors held.
    var count: Int { storage.count - head }

    /// Appends `descriptors` at the back.
    mutating func append(_ descriptors: [Int32]) {
        guard !descriptors.isEmpty else { return }
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        }
        storage.append(contentsOf: descriptors)
    }

    /// Removes and returns the `n` oldest descriptors; there must be that many.
    mutating func take(_ n: Int) -> [Int32] {
        precondition(n <= count, "WireDescriptorQueue: take(\(n)) of \(count)")
        if n == 0 { return [] }
        let taken = Array(storage[head..<head + n])
        head += n
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 64 && head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return taken
    }

    /// Removes and returns every descriptor held.
    mutating func takeAll() -> [Int32] {
        let all = Array(storage[head...])
        storage = []
        head = 0
        return all
    }
}
