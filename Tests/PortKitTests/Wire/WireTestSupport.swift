// Helpers for the wire codec tests: a seeded random generator, builders for hand-made (and
// deliberately broken) bytes, and a driver that feeds a decoder in chunks and collects events.
// Descriptor numbers are fake (1000, 1001, ...) and are never closed.

import Testing
@testable import PortKit

/// A small seeded generator, so that "random" chunkings are the same on every run.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Builds bytes by hand, field by field, little-endian.
struct ByteWriter {
    var bytes: [UInt8] = []

    mutating func u8(_ value: UInt8) { bytes.append(value) }
    mutating func u16(_ value: UInt16) { withUnsafeBytes(of: value.littleEndian) { bytes += $0 } }
    mutating func u32(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { bytes += $0 } }
    mutating func raw(_ more: [UInt8]) { bytes += more }

    /// A greeting with every field chosen by the caller.
    mutating func greeting(magic: [UInt8] = Array("PKIT".utf8), version: UInt16 = 1, flags: UInt16 = 0,
                           pid: UInt32 = 4242, uid: UInt32 = 1000) {
        raw(magic)
        u16(version)
        u16(flags)
        u32(pid)
        u32(uid)
    }

    /// A frame header with every field chosen by the caller.
    mutating func frameHeader(length: UInt32, msgid: UInt32 = 7, componentCount: UInt16 = 0,
                              flags: UInt16 = 0, descriptorCount: UInt16 = 0, reserved: UInt16 = 0) {
        u32(length)
        u32(msgid)
        u16(componentCount)
        u16(flags)
        u16(descriptorCount)
        u16(reserved)
    }

    /// A component header with every field chosen by the caller.
    mutating func componentHeader(type: UInt8, reserved: [UInt8] = [0, 0, 0], length: UInt32) {
        u8(type)
        raw(reserved)
        u32(length)
    }
}

/// The encoded greeting of the tests' sender.
let testGreeting = WireGreeting.current(pid: 4242, uid: 1000)

/// Encodes the test greeting followed by `frames`.
func encodeStream(_ frames: [WireFrame], greeting: Bool = true) -> [UInt8] {
    var bytes: [UInt8] = []
    if greeting { WireEncoder.appendGreeting(testGreeting, to: &bytes) }
    for frame in frames { WireEncoder.append(frame, to: &bytes) }
    return bytes
}

/// Fake descriptor numbers for `count` descriptors, starting at `base`.
func fakeDescriptors(_ count: Int, base: Int32 = 1000) -> [Int32] {
    (0..<Int32(count)).map { base + $0 }
}

/// What a fed decoder produced: its events, and the error that stopped it, if any.
struct DecodeOutcome {
    var events: [WireEvent] = []
    var error: WireError?
}

extension WireDecoder {
    /// Appends `bytes`, then collects events until more bytes are needed or an error.
    mutating func feed(_ bytes: some Collection<UInt8>, into outcome: inout DecodeOutcome) {
        Array(bytes).withUnsafeBytes { append(bytes: $0) }
        drain(into: &outcome)
    }

    /// Collects events until more bytes are needed or an error.
    mutating func drain(into outcome: inout DecodeOutcome) {
        do {
            while let event = try next() { outcome.events.append(event) }
        } catch {
            outcome.error = error
        }
    }
}

/// Feeds `bytes` to a fresh decoder in the given chunk sizes (the rest in one chunk), with all
/// `descriptors` appended before the first byte.
func decode(_ bytes: [UInt8], chunks: [Int] = [], descriptors: [Int32] = [],
            limits: WireLimits = .default, direction: WireDirection = .toPort) -> DecodeOutcome {
    var decoder = WireDecoder(limits: limits, direction: direction)
    decoder.append(descriptors: descriptors)
    var outcome = DecodeOutcome()
    var offset = 0
    for size in chunks where offset < bytes.count {
        let end = min(bytes.count, offset + size)
        decoder.feed(bytes[offset..<end], into: &outcome)
        offset = end
        if outcome.error != nil { return outcome }
    }
    decoder.feed(bytes[offset...], into: &outcome)  // possibly nothing: still drains
    return outcome
}

/// Feeds the test greeting and `frames` to a fresh decoder in the given chunk sizes, appending
/// the descriptors of every frame whose first byte is in a chunk just before that chunk, as the
/// kernel delivers them when each frame is sent with its own `sendmsg`.
func decodeStream(_ frames: [WireFrame], chunks: [Int], limits: WireLimits = .default) -> DecodeOutcome {
    var bytes: [UInt8] = []
    WireEncoder.appendGreeting(testGreeting, to: &bytes)
    var starts: [(offset: Int, descriptors: [Int32])] = []
    var next: Int32 = 1000
    for frame in frames {
        starts.append((bytes.count, fakeDescriptors(frame.descriptorCount, base: next)))
        next += Int32(frame.descriptorCount)
        WireEncoder.append(frame, to: &bytes)
    }
    var decoder = WireDecoder(limits: limits)
    var outcome = DecodeOutcome()
    var offset = 0
    var startIndex = 0
    var sizes = chunks[...]
    while offset < bytes.count && outcome.error == nil {
        let end = min(bytes.count, offset + (sizes.popFirst() ?? bytes.count))
        while startIndex < starts.count && starts[startIndex].offset < end {
            decoder.append(descriptors: starts[startIndex].descriptors)
            startIndex += 1
        }
        decoder.feed(bytes[offset..<end], into: &outcome)
        offset = end
    }
    return outcome
}

/// Records an issue at the first event that differs, instead of printing both lists whole.
func expectSameEvents(_ actual: [WireEvent], _ expected: [WireEvent], _ note: String = "",
                      sourceLocation: SourceLocation = #_sourceLocation) {
    if let index = zip(actual, expected).enumerated().first(where: { $0.element.0 != $0.element.1 })?.offset {
        Issue.record("event \(index) differs: \(actual[index]) != \(expected[index]) \(note)",
                     sourceLocation: sourceLocation)
    } else if actual.count != expected.count {
        Issue.record("\(actual.count) events instead of \(expected.count) \(note)", sourceLocation: sourceLocation)
    }
}

/// The error a fresh decoder raises on `bytes` (with a valid greeting prepended when asked).
func decodeError(_ bytes: [UInt8], prependGreeting: Bool = true, descriptors: [Int32] = [],
                 limits: WireLimits = .default, direction: WireDirection = .toPort) -> WireError? {
    decode((prependGreeting ? encodeStream([]) : []) + bytes, descriptors: descriptors, limits: limits,
           direction: direction).error
}

/// The events expected for `frames` after the test greeting, with descriptors numbered from
/// `base` in wire order.
func expectedEvents(_ frames: [WireFrame], base: Int32 = 1000) -> [WireEvent] {
    var events = [WireEvent.greeting(testGreeting)]
    var next = base
    for frame in frames {
        let descriptors = fakeDescriptors(frame.descriptorCount, base: next)
        next += Int32(frame.descriptorCount)
        events.append(.frame(frame, descriptors: descriptors))
    }
    return events
}
