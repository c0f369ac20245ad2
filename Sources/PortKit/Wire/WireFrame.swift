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

/// A frame's components: a collection that holds one component inline, so that the usual
/// message (one data component) costs no array of its own on either side of the wire (an array
/// costs an allocation and a release per frame, about 350 instructions), and that keeps its
/// port count and data byte count, which the encoder, the limits check and the header need.
struct WireComponents: RandomAccessCollection, MutableCollection, ExpressibleByArrayLiteral, Equatable, Sendable {
    private enum Storage: Sendable {
        case none
        case one(WireComponent)
        /// Two or more.
        case many([WireComponent])
    }

    private var storage: Storage
    /// How many of the components are ports.
    private(set) var portCount = 0
    /// The sum of the data components' lengths.
    private(set) var dataByteCount = 0

    /// One component.
    init(_ component: WireComponent) {
        storage = .one(component)
        count(component, as: 1)
    }

    /// `components`, in order.
    init(_ components: [WireComponent]) {
        switch components.count {
        case 0: storage = .none
        case 1: storage = .one(components[0])
        default: storage = .many(components)
        }
        for component in components { count(component, as: 1) }
    }

    init(arrayLiteral elements: WireComponent...) { self.init(elements) }

    var startIndex: Int { 0 }
    var endIndex: Int { count }
    var count: Int {
        switch storage {
        case .none: 0
        case .one: 1
        case .many(let all): all.count
        }
    }

    subscript(position: Int) -> WireComponent {
        get {
            switch storage {
            case .one(let component):
                precondition(position == 0, "WireComponents: index \(position) out of range")
                return component
            case .many(let all): return all[position]
            case .none: preconditionFailure("WireComponents: index \(position) out of range")
            }
        }
        set {
            count(self[position], as: -1)
            count(newValue, as: 1)
            switch storage {
            case .one: storage = .one(newValue)
            case .many(var all):
                storage = .none  // so `all` is the array's only reference: no copy
                all[position] = newValue
                storage = .many(all)
            case .none: preconditionFailure("unreachable: the getter checked the index")
            }
        }
    }

    /// Appends `component`.
    mutating func append(_ component: WireComponent) {
        count(component, as: 1)
        switch storage {
        case .none: storage = .one(component)
        case .one(let first): storage = .many([first, component])
        case .many(var all):
            storage = .none
            all.append(component)
            storage = .many(all)
        }
    }

    /// Calls `body` with the components in contiguous memory: iterating a buffer copies no
    /// component (iterating the collection copies each, with a retain and a release). The
    /// buffer is valid only inside `body` (for one inline component it points at a copy on the
    /// stack): it must not escape.
    func withUnsafeBufferPointer<R>(_ body: (UnsafeBufferPointer<WireComponent>) throws -> R) rethrows -> R {
        switch storage {
        case .none: return try body(UnsafeBufferPointer(start: nil, count: 0))
        case .one(let component):
            return try withUnsafePointer(to: component) { try body(UnsafeBufferPointer(start: $0, count: 1)) }
        case .many(let all): return try all.withUnsafeBufferPointer(body)
        }
    }

    /// One component, a data component.
    var isOneData: Bool {
        if case .one(.data) = storage { true } else { false }
    }

    /// Moves out the bytes of the one component when it is a data component (the usual
    /// frame), leaving no components; `nil`, and nothing changed, for any other shape. Moved,
    /// not copied: no retain of the bytes, and no release when the frame goes.
    mutating func takeOnlyData() -> [UInt8]? {
        guard case .one(.data) = storage else { return nil }
        var taken = Storage.none
        swap(&taken, &storage)
        dataByteCount = 0
        guard case .one(.data(let bytes)) = consume taken else { preconditionFailure("unreachable: checked above") }
        return bytes
    }

    private mutating func count(_ component: WireComponent, as sign: Int) {
        switch component {
        case .data(let bytes): dataByteCount += sign * bytes.count
        case .port: portCount += sign
        }
    }

    static func == (lhs: WireComponents, rhs: WireComponents) -> Bool {
        lhs.elementsEqual(rhs)
    }
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
    var components: WireComponents

    init(msgid: UInt32, isControl: Bool = false, hasReplyPort: Bool = false,
         repliesBack: Bool = false, replyToken: UInt16 = 0, components: [WireComponent] = []) {
        self.init(msgid: msgid, isControl: isControl, hasReplyPort: hasReplyPort, repliesBack: repliesBack,
                  replyToken: replyToken, components: WireComponents(components))
    }

    init(msgid: UInt32, isControl: Bool = false, hasReplyPort: Bool = false,
         repliesBack: Bool = false, replyToken: UInt16 = 0, components: WireComponents) {
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

    /// One data component, and no reply port, control code or reply token: the usual message.
    var isPlainData: Bool {
        !isControl && !hasReplyPort && !repliesBack && replyToken == 0 && components.isOneData
    }

    /// How many port components the frame has.
    var portCount: Int { components.portCount }

    /// How many descriptors travel with the frame: its ports plus its reply port.
    var descriptorCount: Int { portCount + (hasReplyPort ? 1 : 0) }

    /// The sum of the data payload lengths: what `WireLimits.maxMessageBytes` bounds.
    var dataByteCount: Int { components.dataByteCount }
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
