// A protocol error: bytes or descriptors from a peer that break `protocol.md`. It is never a
// trap. The connection that produced it is invalidated and its descriptors closed; nothing else
// is affected. The I/O driver turns it into `PKError(.protocolViolation, ...)` for logs.

/// What a peer did wrong on one connection, and a sentence saying so.
///
/// Compare by `kind`; `message` carries the numbers, for example
/// "frame length 4294967295 exceeds the limit 16777240 for a frame of 1 component(s)".
struct WireError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The rule of `protocol.md` that was broken.
    enum Kind: Hashable, Sendable {
        // Greeting.
        /// The first four bytes are not "PKIT".
        case badMagic
        /// The greeting names a version this build does not speak.
        case unsupportedVersion
        /// The greeting's reserved flags are not 0.
        case greetingFlagsNotZero
        /// The greeting's pid or uid disagrees with `SO_PEERCRED` (checked by the I/O driver).
        case credentialsMismatch

        // Frame header.
        /// The frame length is below the 16-byte header.
        case frameTooShort
        /// The frame is longer than the limits allow for its component count.
        case frameTooLong
        /// A frame flag bit this version does not define is set.
        case unknownFrameFlags
        /// A reserved field of a component header is not 0, or a frame header's reply token is
        /// set on a frame that takes none.
        case reservedFieldNotZero
        /// A frame that needs a reply token (a REPLY_BACK request, REPLY_CANCELLED, anything on
        /// a reply channel) has none.
        case replyTokenMissing
        /// REPLY_BACK with REPLY_PORT or CONTROL, or on a reply channel.
        case replyBackMisused
        /// The frame has more components than `maxComponents`.
        case tooManyComponents
        /// The frame claims more descriptors than `maxDescriptors`.
        case tooManyDescriptors

        // Components.
        /// A component type other than data (1) or port (2).
        case unknownComponentType
        /// A port component with a non-zero length.
        case portComponentHasLength
        /// The components need more bytes than the frame length leaves them.
        case componentsExceedFrame
        /// Bytes are left in the frame after its last component.
        case componentsShortOfFrame
        /// `descriptorCount` differs from the port components plus the reply port.
        case descriptorCountMismatch

        // Control frames.
        /// A control frame with a code this version does not define.
        case unknownControlCode
        /// A control frame whose shape is wrong for its code.
        case malformedControlFrame

        // Descriptors and the end of the stream.
        /// A frame is complete but not all of its descriptors have arrived.
        case descriptorsMissing
        /// More descriptors arrived than the frames buffered or in flight can claim.
        case descriptorsAhead
        /// A `recvmsg` reported `MSG_CTRUNC`: descriptors were lost (reported by the I/O driver).
        case controlDataTruncated
        /// The stream ended inside a greeting or a frame, or left descriptors unclaimed.
        case truncated
    }

    /// The rule that was broken.
    let kind: Kind
    /// What exactly was wrong, with the numbers.
    let message: String

    /// Makes a protocol error. The I/O driver makes its own for `.credentialsMismatch` and
    /// `.controlDataTruncated`; the codec makes every other kind.
    ///
    /// Out of line, the message made only here: the codec's checks run for every frame and
    /// almost never fail, and the string interpolations of their messages, inlined, would sit
    /// among the codec's own code and spread it over more lines of the instruction cache.
    @inline(never)
    init(_ kind: Kind, _ message: @autoclosure () -> String) {
        self.kind = kind
        self.message = message()
    }

    var description: String { "wire protocol error (\(kind)): \(message)" }
}
