#if ZeroMQ
// A ZeroMQ receive port: a bound PULL socket that is a run-loop input source, delivering port
// messages to a handler on its loop's thread.

import Logging
import PortKit

/// A receive port reachable over ZeroMQ (`PKReceivePort`'s model, for processes on other hosts).
///
/// It binds a `tcp://` or `ipc://` endpoint when made. Schedule it on a run loop with
/// `PKRunLoop.add(_:forMode:)`; while the loop runs one of its modes, each message that arrives
/// is passed to `handler` on the loop's thread. Any number of processes may send to it: hand
/// them `endpoint`, or put `makeSendRight()` in a message.
///
/// An `ipc://` path is claimed under the name server's lock scheme before binding, so a second
/// binder of a live endpoint fails with `.nameInUse` instead of silently taking it over (as
/// plain libzmq would). What it accepts is bounded by `limits` (protocol.md, "ZeroMQ
/// mapping"): a frame over `ZMQ_MAXMSGSIZE` makes libzmq drop that sender's connection; a
/// message that breaks another rule is dropped and reported to `onProtocolViolation`. Either
/// way the port and its other senders are unaffected.
///
/// The port becomes invalid when `invalidate()` is called or its loop's thread ends: the socket
/// closes (every connected send right sees its connection die) and `onInvalidation` runs once
/// on the loop's thread. A scheduled port is kept alive by its loop until then.
///
/// - Warning: The handlers, scheduling and the settable properties are loop-only;
///   `makeSendRight()`, `endpoint`, `isValid` and `invalidate()` are safe from any thread.
public final class PKZMQReceivePort: @unchecked Sendable, CustomStringConvertible {
    /// The endpoint the port is bound to, as libzmq resolved it (`tcp://127.0.0.1:*` becomes
    /// `tcp://127.0.0.1:PORT`).
    public let endpoint: String
    /// The limits the port enforces on what it receives.
    public let limits: PKPortLimits

    /// Called on the loop's thread with each message. Loop-only, like every handler here, so
    /// it skips the run-time exclusivity check.
    @exclusivity(unchecked) public var handler: (PKZMQMessage) -> Void {
        didSet { handlerChanges &+= 1 }
    }
    /// Counts changes of `handler`: a wake-up's delivery loads the handler once (a retain and
    /// a release) and again only when user code it called changed it.
    @exclusivity(unchecked) private var handlerChanges: UInt64 = 0
    /// Called once on the loop's thread when the port becomes invalid.
    public var onInvalidation: (() -> Void)?
    /// Called on the loop's thread for each message dropped for breaking protocol.md's rules
    /// (`.protocolViolation`, saying how). Optional: such messages are logged regardless.
    public var onProtocolViolation: ((PKError) -> Void)?

    /// The loop the port is scheduled on, once it is.
    public var runLoop: PKRunLoop? { shared.withLock { $0.loop } }
    /// Whether the port can still receive. Safe from any thread.
    public var isValid: Bool { shared.withLock { $0.isValid } }

    private struct Shared {
        var isValid = true
        var loop: PKRunLoop?
        /// The modes the port is in (changed on the loop's thread; read by `invalidate()`).
        var modes: Set<PKRunLoopMode> = []
    }
    private let shared = ZMQMutex<Shared>(Shared())
    let inbox: ZMQInbox
    private let parsedEndpoint: ZMQEndpoint

    // Loop-only state.
    /// The loop keeps a scheduled port alive, as `-[NSRunLoop addPort:forMode:]` retains its
    /// port; released when the port leaves its last mode or is invalidated.
    private var keptByLoop: PKZMQReceivePort?
    private var invalidationDelivered = false
    private let logger = Logger(label: "PortKitZeroMQ.PKZMQReceivePort")

    /// A receive port bound to `endpoint`.
    ///
    /// - Parameters:
    ///   - endpoint: `tcp://HOST:PORT` (`PORT` may be `*` for an ephemeral port), `ipc:///PATH`
    ///     or `ipc://@NAME` (see `PKZMQEndpoint`).
    ///   - limits: what the port accepts.
    ///   - handler: called on the loop's thread with each message.
    /// - Throws: `.nameInUse` if a live owner holds the endpoint; `.badName` for an endpoint
    ///   PortKit does not accept or cannot bind; `.unsafeDirectory`; `.system`.
    public init(
        bindingTo endpoint: String, limits: PKPortLimits = .default,
        handler: @escaping (PKZMQMessage) -> Void = { _ in }
    ) throws(PKError) {
        let parsed = try ZMQEndpoint(parsing: endpoint)
        let inbox = try ZMQInbox(limits: limits)
        let resolved: String
        do throws(PKError) { resolved = try inbox.bind(parsed) } catch {
            inbox.close()
            throw error
        }
        self.inbox = inbox
        self.endpoint = resolved
        self.parsedEndpoint = (try? ZMQEndpoint(parsing: resolved)) ?? parsed
        self.limits = limits
        self.handler = handler
    }

    deinit { inbox.close() }

    public var description: String { "PKZMQReceivePort(\(endpoint)\(isValid ? "" : ", invalid"))" }

    /// A send right to this port, for any thread of this process or to put in a message. Safe
    /// from any thread. Within this process too it goes through ZeroMQ (a connection to
    /// `endpoint`); for threads of one process, `PKReceivePort` is the faster choice.
    public func makeSendRight() -> PKZMQSendPort {
        PKZMQSendPort(address: ZMQPortAddress(endpoint: endpoint, portID: 0))
    }

    // MARK: - Scheduling

    func schedule(on loop: PKRunLoop, forMode mode: PKRunLoopMode) throws(PKError) {
        precondition(loop.isOwnedByCurrentThread, "PKRunLoop.add(_:forMode:) is loop-only: call it on the loop's own thread")
        try shared.withLock { state throws(PKError) in
            guard state.isValid else { throw PKError(.invalidPort, "cannot schedule an invalidated port") }
            precondition(state.loop == nil || state.loop === loop, "PortKitZeroMQ: a ZeroMQ receive port belongs to one run loop")
            state.loop = loop
        }
        if shared.withLock({ $0.modes.isEmpty }) {
            inbox.onMessages = { [unowned self] in self.deliver($0) }
            inbox.onViolation = { [unowned self] in self.violation($0) }
            inbox.onCancel = { [unowned self] in self.invalidateOnLoop() }
        }
        try inbox.schedule(on: loop, forMode: mode)
        shared.withLock { _ = $0.modes.insert(mode) }
        keptByLoop = self
    }

    func unschedule(from loop: PKRunLoop, mode: PKRunLoopMode) {
        precondition(loop.isOwnedByCurrentThread, "PKRunLoop.remove(_:forMode:) is loop-only: call it on the loop's own thread")
        guard runLoop === loop, let remaining = shared.withLock({ $0.modes.remove(mode) == nil ? nil : $0.modes }) else { return }
        inbox.unschedule(from: mode)
        guard remaining.isEmpty else { return }
        // Invalidated by another thread, and now in no mode that would finish it.
        if !isValid { invalidateOnLoop() }
        keptByLoop = nil
    }

    /// Hands a wake-up's messages to the handler, loading it again only when it changed: user
    /// code between two messages (a handler, `onProtocolViolation`) may have replaced it.
    private func deliver(_ next: () -> ZMQDecoded<PKZMQComponent>?) {
        var handler = self.handler
        var changes = handlerChanges
        while let decoded = next() {
            guard decoded.destination == 0 else {
                violation("the message is for port id \(decoded.destination), and a receive port is port id 0 at its endpoint")
                continue
            }
            if handlerChanges != changes { (handler, changes) = (self.handler, handlerChanges) }
            let message = PKZMQMessage(decoded)
            handler(message)
            // Its bytes take the next message's; a handler that kept the message or its bytes
            // shares the array, and the reuse then copies it first. (Consumed from a `let`: a
            // `var` message was copied for the handler's call.)
            var delivered = consume message
            if var bytes = delivered.takeBytes() { inbox.recycle(&bytes) }
        }
    }

    /// Reports a dropped message: to `onProtocolViolation` each time, to the log at most once a
    /// second (a peer's frame of many bad messages wrote a warning line for each: hundreds of
    /// thousands for one 16 MiB frame). Loop-only.
    private func violation(_ reason: String) {
        let now = PKDeadline.now.uptimeNanoseconds
        if lastViolationLogged == 0 || now &- lastViolationLogged >= 1_000_000_000 {
            let more = violationsNotLogged > 0 ? " (and \(violationsNotLogged) more dropped since the last report)" : ""
            logger.warning("dropped a message at \(endpoint): \(reason)\(more)")
            lastViolationLogged = now
            violationsNotLogged = 0
        } else {
            violationsNotLogged += 1
        }
        onProtocolViolation?(PKError(.protocolViolation, "a message at \(endpoint) was dropped: \(reason)"))
    }
    private var lastViolationLogged: UInt64 = 0
    private var violationsNotLogged = 0

    // MARK: - Invalidation

    /// Invalidates the port: the socket closes, every connected sender's right dies, and
    /// `onInvalidation` runs once on the loop's thread (at once, on the calling thread, for a
    /// port that was never scheduled). Safe from any thread; idempotent.
    public func invalidate() {
        let (first, loop, modes) = shared.withLock { state -> (Bool, PKRunLoop?, Set<PKRunLoopMode>) in
            guard state.isValid else { return (false, state.loop, []) }
            state.isValid = false
            return (true, state.loop, state.modes)
        }
        guard first else {
            // Another thread asked first (the invalidation is its, or queued on the loop): on
            // the loop's own thread, finish now rather than leave it to a later pass.
            if let loop, loop.isOwnedByCurrentThread { invalidateOnLoop() }
            return
        }
        guard let loop else { return finishInvalidation() }
        if loop.isOwnedByCurrentThread {
            invalidateOnLoop()
        } else if modes.isEmpty {
            // In no mode: at the loop's next pass, whatever mode it runs (or its thread's end).
            loop.performHousekeeping { self.invalidateOnLoop() }
        } else {
            // In the common modes and the port's own: whichever the loop runs next (or the
            // port's removal from its last mode, below).
            loop.perform(inModes: [.common] + Array(modes)) { self.invalidateOnLoop() }
        }
    }

    private func invalidateOnLoop() {
        shared.withLock { $0.isValid = false }
        guard !invalidationDelivered else { return }
        finishInvalidation()
    }

    private func finishInvalidation() {
        invalidationDelivered = true
        inbox.close()
        shared.withLock { $0.modes = [] }
        let callback = onInvalidation
        onInvalidation = nil
        callback?()
        keptByLoop = nil
    }
}

extension PKRunLoop {
    /// Adds a ZeroMQ receive port to `mode` (`-[NSRunLoop addPort:forMode:]`). Loop-only.
    ///
    /// - Throws: `.invalidPort` if the port was invalidated.
    public func add(_ port: PKZMQReceivePort, forMode mode: PKRunLoopMode) throws(PKError) {
        try port.schedule(on: self, forMode: mode)
    }

    /// Removes a ZeroMQ receive port from `mode`; it stays valid. Loop-only.
    public func remove(_ port: PKZMQReceivePort, forMode mode: PKRunLoopMode) {
        port.unschedule(from: self, mode: mode)
    }
}

extension PKZMQMessage {
    /// A message off the wire, its components made by the decoder: its reply port's address
    /// becomes a send right (connected on first use).
    init(_ decoded: consuming ZMQDecoded<PKZMQComponent>) {
        self.msgid = decoded.msgid
        self.replyPort = decoded.reply.map { PKZMQSendPort(address: $0) }
        body = decoded.body
    }

    /// A message decoded with its ports as addresses (the fuzzer's), as a receive port would
    /// have delivered it.
    init(_ decoded: ZMQDecodedMessage) {
        self.init(
            msgid: decoded.msgid,
            components: decoded.components.map { component in
                switch component {
                case .data(let bytes): .data(bytes)
                case .port(let address): .port(PKZMQSendPort(address: address))
                }
            },
            replyPort: decoded.reply.map { PKZMQSendPort(address: $0) })
    }
}

/// A receive port decodes straight into the components it delivers; a port's address becomes a
/// send right (connected on first use).
extension PKZMQComponent: ZMQDecodableComponent {
    static func decoded(port: ZMQPortAddress) -> Self { .port(PKZMQSendPort(address: port)) }
}
#endif
