// The values the codec reads and writes: a greeting, a frame and its components, and the events
// a decoder hands to its driver. They hold no descriptors: a port component stands for "the next
// descriptor attached to this frame", and the decoder hands the descriptors over beside them.

/// One component of a message.
enum WireComponent: Equatable, Sendable {
    /// Payload bytes.
    case data([UInt8])
    /// A port: the next descriptor attached to the frame (after the reply port, if any).
    case port
}

/// One frame: a message, or a control request to the receive port (`isControl`).
struct WireFrame: Equatable, Sendable {
    /// The message id, or the control code when `isControl`.
    var msgid: UInt32
    /// `msgid` is a `WireControlCode`, not a message id.
    var isControl: Bool
    /// The first descriptor attached to the frame is the message's reply port.
    var hasReplyPort: Bool
    /// The message's reply port is the connection's reply channel (REPLY_BACK).
    var repliesBack: Bool
    /// The request a REPLY_BACK frame makes, or a reply-channel frame answers; 0 when none.
    var replyToken: UInt16
    /// The components, in order.
    var components: [WireComponent]

    init(msgid: UInt32, isControl: Bool = false, hasReplyPort: Bool = false,
         repliesBack: Bool = false, replyToken: UInt16 = 0, components: [WireComponent] = []) {
        self.msgid = msgid
        self.isControl = isControl
        self.hasReplyPort = hasReplyPort
        self.repliesBack = repliesBack
        self.replyToken = replyToken
        self.components = components
    }

    /// The control frame that hands the receive port a new sender connection: its one port
    /// component is that connection's descriptor.
    static func attachSender(replyToken: UInt16 = 0) -> WireFrame {
        WireFrame(msgid: WireControlCode.attachSender.rawValue, isControl: true, replyToken: replyToken, components: [.port])
    }

    /// A control frame without components (REPLY_CANCELLED, NO_REPLY) for request `token`.
    static func control(_ code: WireControlCode, replyToken token: UInt16) -> WireFrame {
        WireFrame(msgid: code.rawValue, isControl: true, replyToken: token)
    }

    /// The control code, when this is a control frame with a code this version defines.
    var controlCode: WireControlCode? {
        isControl ? WireControlCode(rawValue: msgid) : nil
    }

    /// How many port components the frame has.
    var portCount: Int {
        var count = 0
        for case .port in components { count += 1 }
        return count
    }

    /// How many descriptors travel with the frame: its ports plus its reply port.
    var descriptorCount: Int { portCount + (hasReplyPort ? 1 : 0) }

    /// The sum of the data payload lengths: what `WireLimits.maxMessageBytes` bounds.
    var dataByteCount: Int {
        var total = 0
        for case .data(let bytes) in components { total += bytes.count }
        return total
    }
}

/// The first 16 bytes a sender writes on every connection.
struct WireGreeting: Equatable, Sendable {
    /// The protocol version the sender speaks.
    var version: UInt16
    /// The sender's process id, as the sender claims it.
    var pid: UInt32
    /// The sender's user id, as the sender claims it.
    var uid: UInt32

    /// The greeting this build sends, for a process with these ids (`getpid()`, `getuid()`).
    static func current(pid: UInt32, uid: UInt32) -> WireGreeting {
        WireGreeting(version: WireFormat.version, pid: pid, uid: uid)
    }
}

/// What a `WireDecoder` found next on its connection.
enum WireEvent: Equatable, Sendable {
    /// The connection's greeting: from now on it carries frames.
    case greeting(WireGreeting)
    /// A complete, valid frame and its descriptors, in wire order: the reply port first (when
    /// `hasReplyPort`), then one per port component. The receiver owns them from now on.
    case frame(WireFrame, descriptors: [Int32])
}
