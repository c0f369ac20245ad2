// Writes greetings and frames as bytes (`protocol.md`), appending to a caller's buffer so many
// frames can be coalesced into one write. Descriptors are not the encoder's business: the caller
// attaches `frame.descriptorCount` of them, reply port first, to the write that carries the
// frame's first byte.

/// Encodes greetings and frames.
enum WireEncoder {
    /// Appends the 16-byte greeting `greeting` to `buffer`.
    static func appendGreeting(_ greeting: WireGreeting, to buffer: inout [UInt8]) {
        reserve(WireFormat.greetingByteCount, in: &buffer)
        appendLittleEndian(UInt64(WireFormat.magic) | UInt64(greeting.version) << 32, to: &buffer)
        appendLittleEndian(UInt64(greeting.pid) | UInt64(greeting.uid) << 32, to: &buffer)
    }

    /// Appends `frame` (header and components) to `buffer`.
    ///
    /// The encoder does not apply `WireLimits`: call `check(_:limits:)` first for a frame built
    /// from user input. A frame the wire cannot express at all (more than 65 535 components or
    /// descriptors, a length over 4 GiB) is a programmer error and traps.
    static func append(_ frame: WireFrame, to buffer: inout [UInt8]) {
        appendEncoded(frame, to: &buffer)
    }

    /// Appends `frame`, a `WireFrame` or a `WirePlainFrame`, to `buffer`, as `append(_:to:)` does.
    static func appendEncoded(_ frame: some WireEncodable, to buffer: inout [UInt8]) {
        // Grow once by the frame's size, then write the words and payloads in place: appending
        // word by word went through the generic sequence path for every 8 bytes.
        let size = frame.encodedSize
        let start = buffer.count
        reserve(size, in: &buffer)
        grow(&buffer, by: size)
        buffer.withUnsafeMutableBytes { raw in
            frame.encode(size: size, into: UnsafeMutableRawBufferPointer(rebasing: raw[start...]))
        }
    }

    /// Writes the usual message's frame, `frame`, whose `encodedSize` is `size`, at the start of
    /// `raw` (which must have room for it): the bytes `encode(_:size:into:)` writes for a
    /// `WireFrame` of one data component holding the same payload, with the same REPLY_BACK
    /// flag and reply token, and nothing else.
    static func encode(_ frame: WirePlainFrame, size: Int, into raw: UnsafeMutableRawBufferPointer) {
        let headers = WireFormat.frameHeaderByteCount + WireFormat.componentHeaderByteCount
        let payload = frame.payload.count
        precondition(size == headers + payload && raw.count >= size, "WireEncoder: no room for the frame")
        precondition(size <= Int(UInt32.max), "WireEncoder: a frame of \(size) bytes does not fit a u32 length")
        raw.storeBytes(of: (UInt64(size) | UInt64(frame.msgid) << 32).littleEndian, toByteOffset: 0, as: UInt64.self)
        raw.storeBytes(of: frame.countsAndToken.littleEndian, toByteOffset: 8, as: UInt64.self)
        raw.storeBytes(of: (UInt64(WireFormat.dataComponentType) | UInt64(payload) << 32).littleEndian,
                       toByteOffset: WireFormat.frameHeaderByteCount, as: UInt64.self)
        if let source = frame.payload.baseAddress, payload > 0 {
            (raw.baseAddress! + headers).copyMemory(from: source, byteCount: payload)
        }
    }

    /// Writes `frame`, whose `encodedSize(of:)` is `size`, at the start of `raw` (which must
    /// have room for it), as `append(_:to:)` does: for a writer that encodes into memory of its
    /// own. Traps as `append(_:to:)` does.
    static func encode(_ frame: WireFrame, size: Int, into raw: UnsafeMutableRawBufferPointer) {
        precondition(size == encodedSize(of: frame) && raw.count >= size, "WireEncoder: no room for the frame")
        precondition(size <= Int(UInt32.max), "WireEncoder: a frame of \(size) bytes does not fit a u32 length")
        precondition(frame.components.count <= Int(UInt16.max),
                     "WireEncoder: \(frame.components.count) components do not fit a u16 count")
        let descriptorCount = frame.descriptorCount
        precondition(descriptorCount <= Int(UInt16.max),
                     "WireEncoder: \(descriptorCount) descriptors do not fit a u16 count")
        let flags = (frame.hasReplyPort ? WireFormat.replyPortFlag : 0)
            | (frame.isControl ? WireFormat.controlFlag : 0)
            | (frame.repliesBack ? WireFormat.replyBackFlag : 0)
        // `offset` lives in the closure: captured across two closures it would be boxed and
        // its accesses checked at run time.
        frame.components.withUnsafeBufferPointer { components in
            var offset = 0
            // `size` came from the components' kept counts: every write is checked against
            // it, so a count gone wrong traps instead of writing past the frame.
            func put(_ word: UInt64) {
                precondition(size - offset >= 8, "WireEncoder: the frame outgrew its measured size")
                raw.storeBytes(of: word.littleEndian, toByteOffset: offset, as: UInt64.self)
                offset += 8
            }
            put(UInt64(size) | UInt64(frame.msgid) << 32)
            put(UInt64(components.count) | UInt64(flags) << 16 | UInt64(descriptorCount) << 32
                | UInt64(frame.replyToken) << 48)
            for index in components.indices {
                switch components[index] {
                case .data(let bytes):
                    put(UInt64(WireFormat.dataComponentType) | UInt64(bytes.count) << 32)
                    precondition(size - offset >= bytes.count, "WireEncoder: the frame outgrew its measured size")
                    bytes.withUnsafeBytes { payload in
                        guard let source = payload.baseAddress, !payload.isEmpty else { return }
                        (raw.baseAddress! + offset).copyMemory(from: source, byteCount: payload.count)
                    }
                    offset += bytes.count
                case .port:
                    put(UInt64(WireFormat.portComponentType))
                }
            }
            precondition(offset == size, "WireEncoder: the frame fell short of its measured size")
        }
    }

    /// The number of bytes `append(_:to:)` writes for `frame`: its `length` field.
    static func encodedSize(of frame: WireFrame) -> Int {
        WireFormat.frameHeaderByteCount + WireFormat.componentHeaderByteCount * frame.components.count
            + frame.dataByteCount
    }

    /// Checks `frame` against the rules a reader with `limits` applies, so that a message over a
    /// limit fails at the sender instead of invalidating its connection at the receiver.
    ///
    /// - Throws: the `WireError` a reader would raise (`.frameTooLong`, `.tooManyComponents`,
    ///   `.tooManyDescriptors`, `.unknownControlCode`, `.malformedControlFrame`).
    static func check(_ frame: WireFrame, limits: WireLimits, direction: WireDirection = .toPort) throws(WireError) {
        try check(dataByteCount: frame.dataByteCount, limits: limits)
        // The usual message, one data component and nothing else towards a port, breaks no
        // other rule (`limits` admits at least one component, and its frame is then no longer
        // than `maxFrameBytes(componentCount: 1)`): the header's checks, about 200
        // instructions a send, are skipped.
        if direction == .toPort, frame.isPlainData { return }
        let header = WireFrameHeader(for: frame)
        try header.validate(limits: limits, direction: direction)
        try header.validate(components: frame.components)
    }

    /// Checks a message's data bytes against `limits`: all `check(_:limits:direction:)` asks of
    /// the usual message (see there), and so all a `WirePlainFrame` needs, given a reply token
    /// that is not 0 when it has one (`PKSendPort`'s writer passes only such tokens).
    ///
    /// - Throws: `.frameTooLong` when the bytes are over `maxMessageBytes`.
    @inline(__always)
    static func check(dataByteCount: Int, limits: WireLimits) throws(WireError) {
        if dataByteCount > limits.maxMessageBytes {
            throw WireError(.frameTooLong, "message of \(dataByteCount) data bytes exceeds the limit \(limits.maxMessageBytes)")
        }
    }

    /// Grows `buffer` geometrically when it lacks room for `count` more bytes (an exact
    /// `reserveCapacity` per frame would reallocate on every append).
    @inline(__always)
    private static func reserve(_ count: Int, in buffer: inout [UInt8]) {
        let needed = buffer.count + count
        if needed > buffer.capacity {
            buffer.reserveCapacity(Swift.max(needed, buffer.capacity * 2))
        }
    }

    /// Zeros to grow a buffer with: appending them is one `memcpy`, in debug builds too
    /// (appending a `repeatElement` goes byte by byte there). Raw memory that is never freed,
    /// not an array: reading a global array retains and releases it, two locked instructions.
    private nonisolated(unsafe) static let zeros = UnsafeRawBufferPointer(
        UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 16).initializeMemory(as: UInt8.self, repeating: 0))

    /// Appends `count` zero bytes to `buffer` (room to write a frame in place).
    private static func grow(_ buffer: inout [UInt8], by count: Int) {
        var remaining = count
        while remaining > 0 {
            let chunk = Swift.min(remaining, zeros.count)
            buffer.append(contentsOf: UnsafeRawBufferPointer(rebasing: zeros[..<chunk]))
            remaining -= chunk
        }
    }

    @inline(__always)
    private static func appendLittleEndian(_ value: UInt64, to buffer: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { buffer.append(contentsOf: $0) }
    }
}

/// A frame a writer can encode: a `WireFrame`, or the usual message's `WirePlainFrame`.
/// Sendable: a connection encodes it under its lock.
protocol WireEncodable: Sendable {
    /// The number of bytes the frame takes on the wire: its `length` field.
    var encodedSize: Int { get }
    /// Writes the frame, whose `encodedSize` is `size`, at the start of `raw` (which must have
    /// room for it).
    func encode(size: Int, into raw: UnsafeMutableRawBufferPointer)
}

extension WireFrame: WireEncodable {
    var encodedSize: Int { WireEncoder.encodedSize(of: self) }
    func encode(size: Int, into raw: UnsafeMutableRawBufferPointer) { WireEncoder.encode(self, size: size, into: raw) }
}

/// The usual message's frame: one data component, `payload`, and nothing else (no reply port,
/// control code or descriptor). Towards a port, either no reply token, or a REPLY_BACK request
/// with its token; on a reply channel, an answer with its token. A sender encodes it from the
/// message's bytes where they are: it makes no `WireFrame` (no components value, whose making
/// and destruction retain and release the bytes) and skips the general encoder's walk over
/// components. The payload must stay valid while the frame is encoded: a sender makes one for
/// the length of a write, on its own thread (so it is Sendable though it points at memory it
/// does not own).
struct WirePlainFrame: WireEncodable, @unchecked Sendable {
    /// The message identifier.
    let msgid: UInt32
    /// The one data component's bytes.
    let payload: UnsafeRawBufferPointer
    /// The header's second word: one component and no descriptor; the flags and the reply
    /// token (made once, so that the usual message's encoding only stores it).
    let countsAndToken: UInt64

    /// The usual message's frame: no flag, no reply token.
    init(msgid: UInt32, payload: UnsafeRawBufferPointer) {
        self.msgid = msgid
        self.payload = payload
        countsAndToken = 1
    }

    /// A request with the REPLY_BACK flag (`repliesBack`), towards a port, or an answer on a
    /// reply channel; `replyToken` names the request.
    init(msgid: UInt32, payload: UnsafeRawBufferPointer, repliesBack: Bool, replyToken: UInt16) {
        self.msgid = msgid
        self.payload = payload
        assert(replyToken != 0, "WirePlainFrame: a request's or an answer's token is never 0")
        countsAndToken = 1 | (repliesBack ? UInt64(WireFormat.replyBackFlag) << 16 : 0) | UInt64(replyToken) << 48
    }

    var encodedSize: Int { WireFormat.frameHeaderByteCount + WireFormat.componentHeaderByteCount + payload.count }
    func encode(size: Int, into raw: UnsafeMutableRawBufferPointer) { WireEncoder.encode(self, size: size, into: raw) }
}
