// The limits a reader enforces on every frame, and a writer checks before it sends.
// Each is checked against the numbers in a header before the reader buffers or allocates
// anything for the frame, so a peer cannot make a reader reserve memory by claiming a size.

/// The per-message limits of the wire protocol (`protocol.md`, "Limits").
///
/// `maxMessageBytes` bounds the sum of a message's data payloads; the frame carrying it may add
/// a 16-byte header and 8 bytes per component, so the largest valid frame is `maxFrameBytes`.
struct WireLimits: Sendable, Equatable {
    /// The most data payload bytes one message may carry (the sum over its data components).
    let maxMessageBytes: Int
    /// The most descriptors one message may carry: its port components plus its reply port.
    let maxDescriptors: Int
    /// The most components one message may carry.
    let maxComponents: Int

    /// The most descriptors one `sendmsg` can carry (Linux's `SCM_MAX_FD`), so the most one
    /// `recvmsg` can return.
    static let kernelMaxDescriptors = 253

    /// 16 MiB of data, 16 descriptors, 1024 components.
    static let `default` = WireLimits()

    /// Makes a set of limits; each one left out takes its default.
    ///
    /// Limits the wire cannot express are a programmer error and trap: a frame length must fit
    /// a `u32`, and the counts a `u16`; `maxDescriptors` must also fit one `sendmsg` (Linux
    /// passes at most 253 descriptors per call, `SCM_MAX_FD`).
    init(maxMessageBytes: Int = 16 << 20, maxDescriptors: Int = 16, maxComponents: Int = 1024) {
        precondition(maxComponents >= 1 && maxComponents <= Int(UInt16.max),
                     "WireLimits.maxComponents must be in 1...65535, not \(maxComponents)")
        precondition(maxDescriptors >= 1 && maxDescriptors <= Self.kernelMaxDescriptors,
                     "WireLimits.maxDescriptors must be in 1...253 (SCM_MAX_FD), not \(maxDescriptors)")
        precondition(maxMessageBytes >= 0, "WireLimits.maxMessageBytes must not be negative")
        let frameCeiling = WireFormat.frameHeaderByteCount
            + WireFormat.componentHeaderByteCount * maxComponents + maxMessageBytes
        precondition(frameCeiling <= Int(UInt32.max),
                     "WireLimits: the largest frame (\(frameCeiling) bytes) must fit a u32 length")
        self.maxMessageBytes = maxMessageBytes
        self.maxDescriptors = maxDescriptors
        self.maxComponents = maxComponents
    }

    /// The largest frame a valid message can need: header, `maxComponents` component headers
    /// and `maxMessageBytes` of data (16 785 424 bytes with the defaults).
    var maxFrameBytes: Int { maxFrameBytes(componentCount: maxComponents) }

    /// The largest valid frame with `componentCount` components.
    @inline(__always)
    func maxFrameBytes(componentCount: Int) -> Int {
        WireFormat.frameHeaderByteCount
            + WireFormat.componentHeaderByteCount * componentCount + maxMessageBytes
    }
}
