// The reading side of one connection as a pure state machine (`protocol.md`, "Connection
// states"): awaiting-greeting -> open -> closed, or failed from either. The I/O driver feeds it
// the bytes and descriptors each read returns and asks for events; the decoder never reads,
// never closes a descriptor and never allocates for a length it has not checked.

/// Turns the byte stream and the descriptors of one connection into greetings and frames.
///
/// Feed it what each read returned, bytes and descriptors, in any split (several frames at once,
/// or a frame cut anywhere, even inside a header), then call `next()` until it returns `nil`:
///
/// ```swift
/// let n = try decoder.appendBytes(upTo: 65536) { room in /* recvmsg into room */ }
/// decoder.append(descriptors: received)        // before the next call to next()
/// while let event = try decoder.next() { ... }
/// ```
///
/// After a protocol error the decoder stays failed: every later `next()` throws the same error,
/// bytes are discarded, and `takeAllDescriptors()` hands back every descriptor it holds so the
/// caller can close them.
struct WireDecoder {
    /// Where the connection is in `protocol.md`'s state table.
    enum Phase: Hashable, Sendable {
        /// No complete greeting yet.
        case awaitingGreeting
        /// Greeted: the connection carries frames.
        case open
        /// A protocol error was found; the connection must be closed.
        case failed
        /// The stream ended cleanly (`finish()`).
        case closed
    }

    private enum State {
        case awaitingGreeting
        case open
        case failed(WireError)
        case closed
    }

    /// The limits every frame is checked against.
    let limits: WireLimits
    /// Which way the connection's bytes flow: a reply channel carries other frames.
    let direction: WireDirection
    private var state = State.awaitingGreeting
    private var buffer = WireReadBuffer()
    private var descriptors = WireDescriptorQueue()
    /// The connection's greeting, once it has arrived.
    private(set) var greeting: WireGreeting?

    /// Makes a decoder for a new connection, awaiting its greeting.
    init(limits: WireLimits = .default, direction: WireDirection = .toPort) {
        self.limits = limits
        self.direction = direction
    }

    /// Where the connection is.
    var phase: Phase {
        switch state {
        case .awaitingGreeting: .awaitingGreeting
        case .open: .open
        case .failed: .failed
        case .closed: .closed
        }
    }

    /// The protocol error, once the decoder has failed.
    var error: WireError? {
        if case .failed(let error) = state { error } else { nil }
    }

    /// Bytes received and not yet consumed by a greeting or a frame.
    var bufferedByteCount: Int { buffer.count }
    /// Descriptors received and not yet handed out with a frame.
    var pendingDescriptorCount: Int { descriptors.count }
    /// Bytes the buffer holds allocated (for tests and diagnostics).
    var bufferCapacity: Int { buffer.capacity }

    // MARK: Input

    /// Appends bytes read from the connection.
    ///
    /// Bytes arriving after a protocol error are discarded. Bytes after `finish()` are a
    /// programmer error and trap (the stream has ended).
    mutating func append(bytes: UnsafeRawBufferPointer) {
        switch state {
        case .awaitingGreeting, .open: buffer.append(bytes)
        case .failed: break
        case .closed: preconditionFailure("WireDecoder: bytes appended after finish()")
        }
    }

    /// Lets `fill` read up to `maxCount` bytes straight into the decoder's buffer (for example as
    /// the `iovec` of `recvmsg`), so bytes are not copied twice.
    ///
    /// - Parameters:
    ///   - maxCount: the room to offer.
    ///   - fill: writes into the room and returns how many bytes it wrote (`0...maxCount`;
    ///     anything else is a programmer error and traps).
    /// - Returns: what `fill` returned.
    /// - Throws: what `fill` throws; nothing is appended then.
    mutating func appendBytes<E: Error>(
        upTo maxCount: Int, _ fill: (UnsafeMutableRawBufferPointer) throws(E) -> Int
    ) throws(E) -> Int {
        if case .closed = state { preconditionFailure("WireDecoder: bytes appended after finish()") }
        let count = try buffer.append(upTo: maxCount, fill)
        if case .failed = state { buffer.removeAll() }
        return count
    }

    /// Lends `scratch`'s storage to the decoder's buffer if the buffer is empty (see
    /// `WireReadBuffer.borrow(_:)`), so reading and decoding happen in shared memory; returns
    /// whether it did. Hand it back with `reclaimStorage(_:)` before anyone else borrows it:
    /// only an incomplete frame's bytes then stay with the decoder.
    mutating func borrowStorage(_ scratch: inout [UInt8]) -> Bool {
        guard buffer.count == 0 else { return false }
        buffer.borrow(&scratch)
        return true
    }

    /// Hands back storage lent by `borrowStorage(_:)`.
    mutating func reclaimStorage(_ scratch: inout [UInt8]) {
        buffer.reclaim(&scratch)
    }

    /// Appends descriptors received with `SCM_RIGHTS`, in the order they arrived.
    ///
    /// Append a read's descriptors before the next call to `next()`: the decoder assumes that a
    /// frame's descriptors arrive no later than its bytes. They are kept in every state, so that
    /// `takeAllDescriptors()` can hand them back.
    mutating func append(descriptors received: [Int32]) {
        descriptors.append(received)
    }

    /// Removes and returns every descriptor the decoder holds, for the caller to close (after a
    /// protocol error, at the end of the stream, or when the connection is dropped).
    mutating func takeAllDescriptors() -> [Int32] {
        descriptors.takeAll()
    }

    // MARK: Events

    /// The next greeting or frame, or `nil` when more bytes are needed.
    ///
    /// A frame's descriptors are taken from the head of the descriptor queue: the reply port
    /// first, then one per port component.
    ///
    /// - Throws: `WireError` when the connection broke the protocol; the decoder is failed from
    ///   then on and throws the same error on every call.
    mutating func next() throws(WireError) -> WireEvent? {
        var frame = WireFrame(msgid: 0)
        var descriptors: [Int32] = []
        switch try next(frame: &frame, descriptors: &descriptors) {
        case nil: return nil
        case .greeting(let greeting): return .greeting(greeting)
        case .frame: return .frame(frame, descriptors: descriptors)
        }
    }

    /// What `next(frame:descriptors:)` found.
    enum Found {
        /// The connection's greeting.
        case greeting(WireGreeting)
        /// A frame, now in `frame`, and its descriptors, now in `descriptors`.
        case frame
    }

    /// `next()` for a reader that takes the frame apart: a frame is decoded into `frame` and
    /// its descriptors into `descriptors` (both overwritten; left as they were when it returns
    /// `nil` or a greeting), so the reader can move the payload out of them (see
    /// `WireComponents.takeOnlyData()`). An event returned by value is copied out of its enum
    /// by the reader, a retain and a release of its payload and more per frame.
    ///
    /// - Throws: as `next()`.
    mutating func next(frame: inout WireFrame, descriptors: inout [Int32]) throws(WireError) -> Found? {
        var none: [UInt8] = []
        return try next(frame: &frame, descriptors: &descriptors, reusing: &none)
    }

    /// `next(frame:descriptors:)`, a frame of one data component getting its bytes in
    /// `spare`'s storage when it has the room (see `SpareBytes.copy(_:reusing:)`).
    ///
    /// - Throws: as `next()`.
    mutating func next(frame: inout WireFrame, descriptors: inout [Int32], reusing spare: inout [UInt8]) throws(WireError) -> Found? {
        do throws(WireError) {
            switch state {
            case .failed(let error): throw error
            case .closed: return nil
            case .awaitingGreeting: return try nextGreeting().map { .greeting($0) }
            case .open: return try nextFrame(into: &frame, descriptors: &descriptors, reusing: &spare) ? .frame : nil
            }
        } catch {
            fail(error)
            throw error
        }
    }

    /// The next frame if it is the usual one, complete in the buffer: one data component and
    /// nothing else (no control code, reply port or descriptor), with, towards a port, no reply
    /// token or a REPLY_BACK request's, and on a reply channel an answer's token. Returns its
    /// msgid, its reply token (0 for none) and its bytes, made as
    /// `next(frame:descriptors:reusing:)` makes them, and consumes it.
    ///
    /// `nil`, with nothing consumed, for anything else: a decoder not open, a partial frame,
    /// another shape, a broken rule. `next(frame:descriptors:reusing:)` then decodes that frame,
    /// or finds what is wrong with it. What this lets through obeys every rule
    /// `WireFrameHeader.validate(limits:direction:)` checks (REPLY_BACK with a token that is not
    /// 0, towards a port only; a token, and no flag, on a reply channel), with its one component
    /// obeying every rule the general decoding checks and filling the frame exactly; so a stream
    /// decodes to the same frames, in the same order, with the same descriptors left queued,
    /// whether or not its reader asks here first (the wire fuzzer checks this on every input,
    /// both ways). It skips the general decoding's frame value (its components, their counts,
    /// their destruction) and its checks of shapes the usual frame does not have: about 315
    /// instructions a message (docs/performance-history.md); a request and its answer skip the
    /// same (docs/decisions.md, "A request and its answer are usual messages too").
    mutating func nextUsualFrame(reusing spare: inout [UInt8]) -> (msgid: UInt32, replyToken: UInt16, bytes: [UInt8])? {
        guard case .open = state else { return nil }
        let headers = WireFormat.frameHeaderByteCount + WireFormat.componentHeaderByteCount
        guard buffer.count >= headers else { return nil }
        let ceiling = limits.maxFrameBytes(componentCount: 1)
        let towardsPort = direction == .toPort
        let found = buffer.withUnsafeBytes { raw -> (msgid: UInt32, token: UInt16, length: Int, bytes: [UInt8])? in
            let first = raw.loadLittleEndian(UInt64.self, at: 0)
            let length = Int(truncatingIfNeeded: first & 0xFFFF_FFFF)
            // One component, and no flag, descriptor or reply token: the second word is 1 (the
            // usual message, towards a port). Otherwise one component and no descriptor, and a
            // token that is not 0: towards a port with REPLY_BACK, on a reply channel with no flag.
            let second = raw.loadLittleEndian(UInt64.self, at: 8)
            var token: UInt16 = 0
            if second != 1 || !towardsPort {
                token = UInt16(truncatingIfNeeded: second >> 48)
                let shape: UInt64 = towardsPort ? 1 | UInt64(WireFormat.replyBackFlag) << 16 : 1
                guard token != 0, second & 0xFFFF_FFFF_FFFF == shape else { return nil }
            }
            guard length >= headers, length <= ceiling, length <= raw.count else { return nil }
            // A data component, reserved bytes zero, whose length is the rest of the frame.
            let component = raw.loadLittleEndian(UInt64.self, at: WireFormat.frameHeaderByteCount)
            guard component == UInt64(WireFormat.dataComponentType) | UInt64(length - headers) << 32 else { return nil }
            let bytes = SpareBytes.copy(UnsafeRawBufferPointer(rebasing: raw[headers..<length]), reusing: &spare)
            return (UInt32(truncatingIfNeeded: first >> 32), token, length, bytes)
        }
        guard let found else { return nil }
        buffer.consume(found.length)
        return (found.msgid, found.token, found.bytes)
    }

    /// Nothing to decode and nothing to check: open, with no byte buffered and no descriptor
    /// queued. `next()` would return `nil` (with an empty buffer its one check counts the
    /// descriptors that arrived ahead of their frames, and there are none), so a reader that
    /// has taken its usual frames can stop without asking it.
    var isDrained: Bool {
        if case .open = state { buffer.count == 0 && descriptors.count == 0 } else { false }
    }

    /// Tells the decoder the stream ended (EOF); call it once `next()` has returned `nil`.
    ///
    /// Ending before the first byte, or right after a frame, is a clean close: the decoder is
    /// `closed`. Ending inside a greeting or a frame, or with descriptors no frame claimed, is a
    /// protocol error.
    ///
    /// - Throws: `WireError` with `.truncated` (or the earlier error if already failed).
    mutating func finish() throws(WireError) {
        switch state {
        case .failed(let error):
            throw error
        case .closed:
            return
        case .awaitingGreeting, .open:
            let what = if case .awaitingGreeting = state { "greeting" } else { "frame" }
            if buffer.count > 0 {
                let error = WireError(.truncated, "the stream ended inside a \(what) (\(buffer.count) bytes buffered)")
                fail(error)
                throw error
            }
            if descriptors.count > 0 {
                let error = WireError(.truncated,
                                      "the stream ended with \(descriptors.count) descriptors no frame claimed")
                fail(error)
                throw error
            }
            buffer.removeAll()
            state = .closed
        }
    }

    /// True when the buffered bytes end exactly at a frame boundary: nothing, or only complete
    /// frames (and, before the greeting, nothing or a complete greeting followed by complete
    /// frames). At EOF it tells a clean close from a truncated frame. False once failed.
    var isAtFrameBoundary: Bool {
        switch state {
        case .failed: return false
        case .closed: return true
        case .awaitingGreeting:
            if buffer.count == 0 { return true }
            if buffer.count < WireFormat.greetingByteCount { return false }
            return Self.endsAtFrameBoundary(buffer, from: WireFormat.greetingByteCount)
        case .open:
            return Self.endsAtFrameBoundary(buffer, from: 0)
        }
    }

    // MARK: Private

    private mutating func nextGreeting() throws(WireError) -> WireGreeting? {
        let found = try buffer.withUnsafeBytes { (raw) throws(WireError) -> WireGreeting? in
            if raw.count < WireFormat.greetingByteCount {
                try WireGreeting.checkMagic(raw)
                return nil
            }
            return try WireGreeting.decode(from: raw)
        }
        guard let greeting = found else {
            try checkDescriptorsAhead(partialFrameClaim: 0)
            return nil
        }
        buffer.consume(WireFormat.greetingByteCount)
        self.greeting = greeting
        state = .open
        return greeting
    }

    /// Decodes the next frame into `frame` and `descriptors`; false when more bytes are needed.
    private mutating func nextFrame(
        into frame: inout WireFrame, descriptors taken: inout [Int32], reusing spare: inout [UInt8]
    ) throws(WireError) -> Bool {
        let available = buffer.count
        if available < WireFormat.frameHeaderByteCount {
            // A partial header: its frame may claim up to the limit.
            try checkDescriptorsAhead(partialFrameClaim: available == 0 ? 0 : limits.maxDescriptors)
            return false
        }
        let header = buffer.withUnsafeBytes { WireFrameHeader(loadingFrom: $0) }
        try header.validate(limits: limits, direction: direction)
        if available < header.length {
            try checkDescriptorsAhead(partialFrameClaim: header.descriptorCount)
            return false
        }
        frame = try buffer.withUnsafeBytes { (raw) throws(WireError) in try Self.decodeBody(of: header, from: raw, reusing: &spare) }
        if descriptors.count < header.descriptorCount {
            throw WireError(.descriptorsMissing,
                            "frame \(header.msgid) is complete but only \(descriptors.count) of its "
                                + "\(header.descriptorCount) descriptors have arrived")
        }
        buffer.consume(header.length)
        if header.descriptorCount > 0 || !taken.isEmpty { taken = descriptors.take(header.descriptorCount) }
        return true
    }

    /// Decodes the components of a frame whose `header` has been validated and whose bytes are
    /// all in `raw` (from offset 0).
    private static func decodeBody(
        of header: WireFrameHeader, from raw: UnsafeRawBufferPointer, reusing spare: inout [UInt8]
    ) throws(WireError) -> WireFrame {
        var offset = WireFormat.frameHeaderByteCount
        let end = header.length
        let components: WireComponents
        switch header.componentCount {
        case 0: components = []
        // One component (the usual message) is held inline: no array.
        case 1: components = WireComponents(try component(0, of: header, from: raw, offset: &offset, reusing: &spare))
        default:
            var all: [WireComponent] = []
            all.reserveCapacity(header.componentCount)
            var none: [UInt8] = []
            for index in 0..<header.componentCount {
                all.append(try component(index, of: header, from: raw, offset: &offset, reusing: &none))
            }
            components = WireComponents(all)
        }
        if offset != end {
            throw WireError(.componentsShortOfFrame,
                            "frame \(header.msgid) has \(end - offset) bytes after its last component")
        }
        try header.validate(components: components)
        return WireFrame(msgid: header.msgid, isControl: header.isControl, hasReplyPort: header.hasReplyPort,
                         repliesBack: header.repliesBack, replyToken: header.replyToken, components: components)
    }

    /// Decodes component `index` of a frame at `offset` (moved past it). Its own function with
    /// an `inout` parameter: a nested function capturing it would have its accesses checked at
    /// run time.
    @inline(__always)
    private static func component(
        _ index: Int, of header: WireFrameHeader, from raw: UnsafeRawBufferPointer, offset: inout Int,
        reusing spare: inout [UInt8]
    ) throws(WireError) -> WireComponent {
        let end = header.length
        if end - offset < WireFormat.componentHeaderByteCount {
            throw WireError(.componentsExceedFrame,
                            "component \(index) of frame \(header.msgid) starts past the frame's end")
        }
        let word = raw.loadLittleEndian(UInt64.self, at: offset)
        let type = UInt8(truncatingIfNeeded: word)
        let reserved = (word >> 8) & 0xFF_FFFF
        let length = Int(truncatingIfNeeded: word >> 32)
        offset += WireFormat.componentHeaderByteCount
        if reserved != 0 {
            throw WireError(.reservedFieldNotZero,
                            "component \(index) of frame \(header.msgid) has reserved bytes "
                                + "0x\(String(reserved, radix: 16))")
        }
        switch type {
        case WireFormat.dataComponentType:
            if length > end - offset {
                throw WireError(.componentsExceedFrame,
                                "data component \(index) of \(length) bytes runs \(length - (end - offset)) "
                                    + "bytes past the end of frame \(header.msgid)")
            }
            // Into the spare's storage when it fits, else a new array (see `SpareBytes.copy`).
            defer { offset += length }
            return .data(SpareBytes.copy(UnsafeRawBufferPointer(rebasing: raw[offset..<offset + length]), reusing: &spare))
        case WireFormat.portComponentType:
            if length != 0 {
                throw WireError(.portComponentHasLength,
                                "port component \(index) of frame \(header.msgid) has length \(length), not 0")
            }
            return .port
        default:
            throw WireError(.unknownComponentType,
                            "component \(index) of frame \(header.msgid) has unknown type \(type)")
        }
    }

    /// Refuses descriptors that no frame can claim. A write carries at most `maxDescriptors`
    /// descriptors (those of the frames whose first byte it carries), so when no complete frame
    /// is buffered the queue may hold the partial frame's claim plus one write's worth.
    private func checkDescriptorsAhead(partialFrameClaim: Int) throws(WireError) {
        let allowed = partialFrameClaim + limits.maxDescriptors
        if descriptors.count > allowed {
            throw WireError(.descriptorsAhead,
                            "\(descriptors.count) descriptors arrived ahead of their frames "
                                + "(at most \(allowed) can be)")
        }
    }

    private mutating func fail(_ error: WireError) {
        if case .failed = state { return }
        state = .failed(error)
        buffer.removeAll()
    }

    private static func endsAtFrameBoundary(_ buffer: WireReadBuffer, from start: Int) -> Bool {
        buffer.withUnsafeBytes { raw in
            var offset = start
            while raw.count - offset >= WireFormat.frameHeaderByteCount {
                let length = Int(raw.loadLittleEndian(UInt32.self, at: offset))
                if length < WireFormat.frameHeaderByteCount { return false }
                offset += length
            }
            return offset == raw.count
        }
    }
}

extension WireFrame {
    /// The frame the general decoding gives for `usual`, a frame `nextUsualFrame(reusing:)` took
    /// travelling in `direction` (for the wire fuzzer and the tests, which compare the two).
    init(usual: (msgid: UInt32, replyToken: UInt16, bytes: [UInt8]), direction: WireDirection) {
        self.init(msgid: usual.msgid, repliesBack: usual.replyToken != 0 && direction == .toPort,
                  replyToken: usual.replyToken, components: [.data(usual.bytes)])
    }
}
