/// The one error type PortKit throws.
///
/// A `PKError` says what went wrong (`code`), in words (`description`), where PortKit made it
/// (`file`, `line`) and, for a failed system call, which call and its `errno`.
/// Compare errors by `code`:
///
/// ```swift
/// do { try port.send(message, timeout: .seconds(1)) }
/// catch where error.code == .sendTimedOut { ... }
/// ```
public struct PKError: Error, CustomStringConvertible, Sendable {
    /// The kind of failure. New codes may be added; switch with a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case system, sendTimedOut, receiveTimedOut, invalidPort, portInvalidated
            case transport, protocolViolation, limitExceeded, badName, nameInUse
            case nameNotFound, unsafeDirectory, permissionDenied, checkInTimedOut
            case checkInFailed, interrupted, cancelled
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }
        public var description: String { base.rawValue }

        /// A system call failed for a reason of the environment (see `errno` and `call`).
        public static let system = Code(.system)
        /// The message could not be queued before the send deadline (the receiver's queue is full).
        public static let sendTimedOut = Code(.sendTimedOut)
        /// No reply arrived before the receive deadline.
        public static let receiveTimedOut = Code(.receiveTimedOut)
        /// The port or the send right was invalid when the operation started, or became invalid
        /// during a send (while it waited for room, or as it wrote: the receive port is gone).
        /// Also: a port that must be scheduled on a run loop first was not (`register`).
        public static let invalidPort = Code(.invalidPort)
        /// A request's remote port became invalid while the request waited for its reply (for
        /// example the peer died), or its owner released the reply port without answering.
        public static let portInvalidated = Code(.portInvalidated)
        /// The connection failed while sending or receiving.
        public static let transport = Code(.transport)
        /// A peer broke the wire protocol. A ZeroMQ receive port drops the message and passes
        /// this to its `onProtocolViolation`; a ZeroMQ name service client throws it for a reply
        /// it cannot read. (A Unix-socket port closes the offending connection and logs it: no
        /// error reaches its code.)
        public static let protocolViolation = Code(.protocolViolation)
        /// A message, a queue or a count is over one of PortKit's limits.
        public static let limitExceeded = Code(.limitExceeded)
        /// A port name is not valid.
        public static let badName = Code(.badName)
        /// The name is already registered by a live owner.
        public static let nameInUse = Code(.nameInUse)
        /// No port is registered under that name.
        public static let nameNotFound = Code(.nameNotFound)
        /// The socket directory is not safe to use (a link, someone else's, or open to others).
        public static let unsafeDirectory = Code(.unsafeDirectory)
        /// The peer is not allowed to connect (another user).
        public static let permissionDenied = Code(.permissionDenied)
        /// A worker did not check in before the deadline.
        public static let checkInTimedOut = Code(.checkInTimedOut)
        /// A worker ended, or sent something else, before checking in.
        public static let checkInFailed = Code(.checkInFailed)
        /// The wait ended early: the run loop it ran was stopped (`PKRunLoop.stop()`). The stop
        /// then reaches the run the wait was made in.
        public static let interrupted = Code(.interrupted)
        /// The task that awaited the operation was cancelled (an `async` request).
        public static let cancelled = Code(.cancelled)
    }

    /// What kind of failure this is.
    public let code: Code
    /// A sentence saying what failed.
    public let message: String
    /// The system call that failed, when `code == .system` (or a transport error came from one).
    public let call: String?
    /// The `errno` of the failed system call, if any.
    public let errno: Int32?
    /// Where PortKit made the error.
    public let file: String
    /// Where PortKit made the error.
    public let line: Int

    /// Makes an error. PortKit's own code calls this; users rarely need to.
    public init(
        _ code: Code, _ message: String, call: String? = nil, errno: Int32? = nil,
        file: String = #fileID, line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.call = call
        self.errno = errno
        self.file = file
        self.line = line
    }

    public var description: String {
        var text = "PKError.\(code): \(message)"
        if let call, let errno { text += " (\(call): \(SystemCall.describe(errno: errno)))" }
        return text
    }

    static func system(_ call: StaticString, errno: Int32, file: String = #fileID, line: Int = #line) -> PKError {
        PKError(.system, "\(call) failed", call: "\(call)", errno: errno, file: file, line: line)
    }
}
