// The property the wire fuzzer checks, in the module so that the libFuzzer target (`Fuzz/`,
// which compiles this folder into its own module) and the corpus replay test
// (`WireCorpusReplayTests`) run exactly the same code. Nothing else calls it.

/// Drives a `WireDecoder` with bytes a fuzzer chose and traps when a property of the codec breaks.
///
/// The input is a small script followed by the stream a peer would send:
///
/// ```
/// byte 0        bits 0-4: N, the number of script bytes that follow
///               bit 5:    generated mode: the rest describes frames to encode (see below)
///               bit 6:    small limits (64 data bytes, 4 descriptors, 8 components), so that
///                         the limit checks are reachable with short inputs
///               bit 7:    read through `appendBytes(upTo:_:)` instead of `append(bytes:)`
/// bytes 1...N   the script, used cyclically, one byte per read:
///               bits 0-5: the read's size minus 1 (1...63), or 63: the whole rest
///               bits 6-7: fake descriptors appended just before the read (0...3)
/// the rest      the stream: greeting and frames, or anything else
/// ```
///
/// In generated mode the rest is not sent as it is: it describes frames (`frames(describedBy:)`),
/// which are encoded after a greeting and read in the script's chunk sizes, each frame's
/// descriptors arriving with its first byte (the script's descriptor bits are ignored). This
/// reaches valid frames of every shape, which mutating raw bytes rarely does, and checks
/// decode(encode(m)) == m for them directly; a frame `WireEncoder.check` refuses must be refused
/// by a decoder too.
///
/// Raw streams are read twice, as a connection's first direction and as a reply channel;
/// generated frames three times: as described, each made a REPLY_BACK request, and each an answer
/// on a reply channel (with tokens).
///
/// With no script the stream is one read without descriptors. After each read the decoder is
/// drained with `next()`; at the end of the stream it is told `finish()`. A protocol error is
/// fine (that is what a decoder must report for bad bytes); a trap or a broken property is not.
///
/// The properties, each checked with `precondition` (a crash is what a fuzzer finds):
/// - Every frame is valid by the sender's rules (`WireEncoder.check` accepts it) and comes with
///   exactly `descriptorCount` descriptors.
/// - Encoding is canonical: re-encoding a greeting or a frame gives back the very bytes it was
///   decoded from.
/// - Round trip: a fresh decoder fed the decoded greeting and frame, re-encoded, yields the
///   same greeting, the same frame and the same descriptors, then needs more bytes, then
///   finishes cleanly.
/// - Descriptors are conserved and never reordered: those handed out with frames, followed by
///   those `takeAllDescriptors()` returns at the end, are exactly those appended, in order.
/// - A failed decoder stays failed: `next()` and `finish()` rethrow the first error.
/// - After a clean `finish()` the decoder is `closed` and nothing was left in it.
/// - The usual frame's shortcut changes nothing: every stream is also read with its decoder
///   asked `nextUsualFrame(reusing:)` before each `next()` (as a port's connection and a reply
///   channel's reader read), and gives the same events, the same error and the same
///   descriptors as with `next()` alone.
enum WireFuzzing {
    /// Runs one fuzz input through the decoder and checks every property; traps on a violation.
    static func exercise(_ input: UnsafeRawBufferPointer) {
        guard let header = input.first else { return }
        let scriptCount = min(Int(header & 0x1F), input.count - 1)
        let script = UnsafeRawBufferPointer(rebasing: input[1..<1 + scriptCount])
        let stream = UnsafeRawBufferPointer(rebasing: input[(1 + scriptCount)...])
        let limits = header & 0x40 != 0
            ? WireLimits(maxMessageBytes: 64, maxDescriptors: 4, maxComponents: 8)
            : WireLimits.default
        let readInPlace = header & 0x80 != 0
        if header & 0x20 != 0 {
            let described = frames(describedBy: stream)
            // As described, towards a port; each as a REPLY_BACK request; each as an answer on a
            // reply channel (tokens from the msgid: one of them 0, which both sides refuse).
            func token(_ frame: WireFrame) -> UInt16 { UInt16(truncatingIfNeeded: frame.msgid &+ 1) }
            let variants: [(WireDirection, [WireFrame])] = [
                (.toPort, described),
                (.toPort, described.map { var frame = $0; frame.repliesBack = true; frame.replyToken = token(frame); return frame }),
                (.toRequester, described.map { var frame = $0; frame.replyToken = token(frame); return frame }),
            ]
            for (direction, frames) in variants {
                for usualFirst in [false, true] {
                    exerciseEncoded(frames, direction: direction, script: script, limits: limits, readInPlace: readInPlace,
                                    usualFirst: usualFirst)
                }
            }
            return
        }
        // The same bytes, read as a connection's first direction and as a reply channel, each
        // with and without the usual frame's shortcut.
        for direction in [WireDirection.toPort, .toRequester] {
            let general = exerciseRaw(stream, direction: direction, script: script, limits: limits,
                                      readInPlace: readInPlace, usualFirst: false)
            let shortcut = exerciseRaw(stream, direction: direction, script: script, limits: limits,
                                       readInPlace: readInPlace, usualFirst: true)
            precondition(general == shortcut,
                         "WireFuzzing: the usual frame's shortcut read \(shortcut), the general decoding \(general)")
        }
    }

    /// What a raw stream decoded to: the events, the first error, the descriptors left over.
    private struct RawOutcome: Equatable {
        var events: [WireEvent] = []
        var error: WireError?
        var returned: [Int32] = []
    }

    /// The decoder's next event, asking for the usual frame first when `usualFirst` (as a
    /// port's connection reads; its spare array is reused the way a connection reuses it).
    private static func nextEvent(_ decoder: inout WireDecoder, usualFirst: Bool, spare: inout [UInt8]) throws(WireError) -> WireEvent? {
        if usualFirst {
            if let usual = decoder.nextUsualFrame(reusing: &spare) {
                return .frame(WireFrame(usual: usual, direction: decoder.direction), descriptors: [])
            }
            if decoder.isDrained {
                // What a connection then skips must be nothing: no event, no error.
                precondition((try? decoder.next()) == .some(nil), "WireFuzzing: a drained decoder had more to say")
                return nil
            }
        }
        return try decoder.next()
    }

    /// The raw mode: `stream` read in the script's chunks, with its fake descriptors.
    private static func exerciseRaw(_ stream: UnsafeRawBufferPointer, direction: WireDirection, script: UnsafeRawBufferPointer,
                                    limits: WireLimits, readInPlace: Bool, usualFirst: Bool) -> RawOutcome {
        var decoder = WireDecoder(limits: limits, direction: direction)
        var outcome = RawOutcome()
        var spare: [UInt8] = []
        var appended: [Int32] = []
        var handedOut: [Int32] = []
        var firstError: WireError?
        var offset = 0
        var step = 0
        repeat {
            var size = stream.count - offset
            var descriptorCount = 0
            if !script.isEmpty {
                let byte = script[step % script.count]
                step += 1
                if byte & 0x3F != 0x3F { size = min(size, Int(byte & 0x3F) + 1) }
                descriptorCount = Int(byte >> 6)
            }
            if descriptorCount > 0 {
                let fresh = (0..<Int32(descriptorCount)).map { 1000 + Int32(appended.count) + $0 }
                appended += fresh
                decoder.append(descriptors: fresh)
            }
            feed(&decoder, UnsafeRawBufferPointer(rebasing: stream[offset..<offset + size]), inPlace: readInPlace)
            offset += size
            let streamEnd = offset
            do {
                while let event = try nextEvent(&decoder, usualFirst: usualFirst, spare: &spare) {
                    precondition(firstError == nil, "WireFuzzing: a failed decoder produced \(event)")
                    let frameEnd = streamEnd - decoder.bufferedByteCount
                    check(event, endingAt: frameEnd, in: stream, limits: limits, direction: direction)
                    if case .frame(_, let descriptors) = event { handedOut += descriptors }
                    outcome.events.append(event)
                    // A handler hands the bytes back (the shortcut then reuses their storage).
                    if case .frame(var frame, _) = event, var bytes = frame.components.takeOnlyData() {
                        SpareBytes.keep(&bytes, in: &spare)
                    }
                }
            } catch {
                precondition(firstError == nil || firstError == error,
                             "WireFuzzing: a failed decoder changed its error from \(firstError!) to \(error)")
                precondition(decoder.phase == .failed && decoder.error == error,
                             "WireFuzzing: the decoder threw \(error) but is \(decoder.phase)")
                firstError = error
            }
        } while offset < stream.count

        do {
            try decoder.finish()
            precondition(firstError == nil, "WireFuzzing: finish() succeeded after \(firstError!)")
            precondition(decoder.phase == .closed, "WireFuzzing: finish() left the decoder \(decoder.phase)")
            precondition(decoder.bufferedByteCount == 0 && decoder.pendingDescriptorCount == 0,
                         "WireFuzzing: a cleanly finished decoder still holds bytes or descriptors")
            precondition((try? decoder.next()) == .some(nil), "WireFuzzing: a closed decoder produced an event")
        } catch {
            precondition(firstError == nil || firstError == error,
                         "WireFuzzing: finish() threw \(error) after \(firstError!)")
            precondition(decoder.phase == .failed, "WireFuzzing: finish() threw but the decoder is \(decoder.phase)")
        }
        let returned = decoder.takeAllDescriptors()
        precondition(handedOut + returned == appended,
                     "WireFuzzing: descriptors \(appended) came out as \(handedOut) + \(returned)")
        outcome.error = firstError
        outcome.returned = returned
        return outcome
    }

    /// Appends `chunk` as one read, copied in or read in place.
    private static func feed(_ decoder: inout WireDecoder, _ chunk: UnsafeRawBufferPointer, inPlace: Bool) {
        if inPlace {
            let read = decoder.appendBytes(upTo: chunk.count) { room in
                room.copyMemory(from: chunk)
                return chunk.count
            }
            precondition(read == chunk.count, "WireFuzzing: appendBytes reported \(read) of \(chunk.count) bytes")
        } else {
            decoder.append(bytes: chunk)
        }
    }

    /// The generated mode: builds frames from `description`, and checks that every frame
    /// `WireEncoder.check` refuses is refused by a decoder too, and that the others, encoded
    /// after a greeting and read in the script's chunk sizes with each frame's descriptors
    /// arriving with its first byte, decode to exactly themselves: decode(encode(m)) == m.
    private static func exerciseEncoded(_ frames: [WireFrame], direction: WireDirection, script: UnsafeRawBufferPointer,
                                        limits: WireLimits, readInPlace: Bool, usualFirst: Bool) {
        var bytes: [UInt8] = []
        WireEncoder.appendGreeting(.current(pid: 7, uid: 8), to: &bytes)
        var expected: [WireEvent] = [.greeting(.current(pid: 7, uid: 8))]
        var starts: [(offset: Int, descriptors: [Int32])] = []
        var nextDescriptor: Int32 = 1000
        for frame in frames {
            do {
                try WireEncoder.check(frame, limits: limits, direction: direction)
            } catch {
                var refused = WireDecoder(limits: limits, direction: direction)
                refused.append(descriptors: (0..<Int32(frame.descriptorCount)).map { 1000 + $0 })
                var single = bytes.prefix(WireFormat.greetingByteCount).map { $0 }
                WireEncoder.append(frame, to: &single)
                single.withUnsafeBytes { refused.append(bytes: $0) }
                var decoded: [WireEvent] = []
                let refusal: WireError? = {
                    do throws(WireError) {
                        while let event = try refused.next() { decoded.append(event) }
                        try refused.finish()
                        return nil
                    } catch { return error }
                }()
                precondition(refusal != nil, "WireFuzzing: the decoder accepts \(decoded), which the encoder "
                                 + "refuses: \(error)")
                continue
            }
            let descriptors = (0..<Int32(frame.descriptorCount)).map { nextDescriptor + $0 }
            nextDescriptor += Int32(frame.descriptorCount)
            starts.append((bytes.count, descriptors))
            expected.append(.frame(frame, descriptors: descriptors))
            WireEncoder.append(frame, to: &bytes)
        }

        var decoder = WireDecoder(limits: limits, direction: direction)
        var events: [WireEvent] = []
        var spare: [UInt8] = []
        var offset = 0
        var step = 0
        var startIndex = 0
        bytes.withUnsafeBytes { stream in
            while offset < stream.count {
                var size = stream.count - offset
                if !script.isEmpty {
                    let byte = script[step % script.count]
                    step += 1
                    if byte & 0x3F != 0x3F { size = min(size, Int(byte & 0x3F) + 1) }
                }
                while startIndex < starts.count && starts[startIndex].offset < offset + size {
                    decoder.append(descriptors: starts[startIndex].descriptors)
                    startIndex += 1
                }
                feed(&decoder, UnsafeRawBufferPointer(rebasing: stream[offset..<offset + size]), inPlace: readInPlace)
                offset += size
                do {
                    while let event = try nextEvent(&decoder, usualFirst: usualFirst, spare: &spare) {
                        check(event, endingAt: offset - decoder.bufferedByteCount, in: stream, limits: limits,
                              direction: direction)
                        events.append(event)
                    }
                } catch {
                    preconditionFailure("WireFuzzing: encoded frames fail to decode: \(error) after \(events)")
                }
            }
        }
        do {
            try decoder.finish()
        } catch {
            preconditionFailure("WireFuzzing: encoded frames end in \(error)")
        }
        precondition(events == expected, "WireFuzzing: \(expected) decode as \(events)")
    }

    /// Frames described by `bytes`, one operation per byte (its low 2 bits), the rest its operand:
    /// 0: a new frame (bit 2: reply port, bit 3: control, msgid: the bits above, or the next
    ///    4 bytes when those bits are all set); 1: a data component of 0...63 bytes (bits 2-7)
    ///    taken from the bytes that follow; 2: a port component; 3: a data component whose
    ///    length is the low 12 bits of the next 2 bytes, filled with the operation byte.
    /// Missing operand bytes at the end read as zeros. The data of all the frames is capped at
    /// 64 KiB (the limits are reached through the small ones), to keep the fuzzer fast.
    /// A component before any frame starts one with msgid 0.
    private static func frames(describedBy bytes: UnsafeRawBufferPointer) -> [WireFrame] {
        var frames: [WireFrame] = []
        var index = 0
        var budget = 64 << 10
        func take(_ count: Int) -> [UInt8] {
            let available = min(count, bytes.count - index)
            let taken = Array(bytes[index..<index + available])
            index += available
            return taken + [UInt8](repeating: 0, count: count - available)
        }
        while index < bytes.count {
            let op = bytes[index]
            index += 1
            if op & 3 == 0 {
                var msgid = UInt32(op >> 4)
                if msgid == 0xF {
                    msgid = take(4).reversed().reduce(0) { $0 << 8 | UInt32($1) }
                }
                frames.append(WireFrame(msgid: msgid, isControl: op & 8 != 0, hasReplyPort: op & 4 != 0))
                continue
            }
            if frames.isEmpty { frames.append(WireFrame(msgid: 0)) }
            switch op & 3 {
            case 1:
                let length = min(Int(op >> 2), budget)
                budget -= length
                frames[frames.count - 1].components.append(.data(take(length)))
            case 2: frames[frames.count - 1].components.append(.port)
            default:
                let length = min(take(2).reversed().reduce(0) { $0 << 8 | Int($1) } & 0xFFF, budget)
                budget -= length
                frames[frames.count - 1].components.append(.data([UInt8](repeating: op, count: length)))
            }
        }
        return frames
    }

    /// Checks one event the decoder produced from the bytes of `stream` that end at `end`.
    private static func check(_ event: WireEvent, endingAt end: Int,
                              in stream: UnsafeRawBufferPointer, limits: WireLimits, direction: WireDirection) {
        var encoded: [UInt8] = []
        var expectedDescriptors: [Int32] = []
        var expected: [WireEvent] = []
        switch event {
        case .greeting(let greeting):
            precondition(greeting.version == WireFormat.version,
                         "WireFuzzing: accepted a greeting of version \(greeting.version)")
            WireEncoder.appendGreeting(greeting, to: &encoded)
            expected = [event]
        case .frame(let frame, let descriptors):
            precondition(descriptors.count == frame.descriptorCount,
                         "WireFuzzing: frame \(frame.msgid) came with \(descriptors.count) descriptors, "
                             + "not \(frame.descriptorCount)")
            do {
                try WireEncoder.check(frame, limits: limits, direction: direction)
            } catch {
                preconditionFailure("WireFuzzing: the decoder accepted a frame the encoder refuses: \(error)")
            }
            WireEncoder.append(frame, to: &encoded)
            expectedDescriptors = descriptors
            var greetingBytes: [UInt8] = []
            WireEncoder.appendGreeting(.current(pid: 1, uid: 2), to: &greetingBytes)
            expected = [.greeting(.current(pid: 1, uid: 2)), event]
            encoded = greetingBytes + encoded
        }

        // Canonical: the event's encoding is the bytes it came from.
        let own = event.isGreeting ? encoded : Array(encoded[WireFormat.greetingByteCount...])
        precondition(end >= own.count, "WireFuzzing: an event of \(own.count) bytes ended at \(end)")
        precondition(own.elementsEqual(UnsafeRawBufferPointer(rebasing: stream[(end - own.count)..<end])),
                     "WireFuzzing: \(event) re-encodes to other bytes than it was decoded from")

        // Round trip through a fresh decoder.
        var fresh = WireDecoder(limits: limits, direction: direction)
        fresh.append(descriptors: expectedDescriptors)
        encoded.withUnsafeBytes { fresh.append(bytes: $0) }
        var events: [WireEvent] = []
        do {
            while let next = try fresh.next() { events.append(next) }
            try fresh.finish()
        } catch {
            preconditionFailure("WireFuzzing: re-encoded \(event) fails to decode: \(error)")
        }
        precondition(events == expected, "WireFuzzing: \(event) round-trips to \(events)")
        precondition(fresh.takeAllDescriptors().isEmpty, "WireFuzzing: round trip left descriptors over")
    }
}

extension WireEvent {
    fileprivate var isGreeting: Bool {
        if case .greeting = self { true } else { false }
    }
}
