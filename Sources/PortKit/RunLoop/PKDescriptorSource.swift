// A descriptor source: the run-loop source every port is built on (epoll interest on one fd).

/// The readiness a descriptor source watches and reports.
public struct PKIOEvents: OptionSet, Hashable, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// Data can be read, or the peer closed (a read returns 0).
    public static let readable = PKIOEvents(rawValue: 1 << 0)
    /// A write would not block.
    public static let writable = PKIOEvents(rawValue: 1 << 1)
    /// The peer hung up. Watched whenever a source is registered, even with no other event, so
    /// a paused reader still learns that its peer died; always reported, never masked.
    public static let hangUp = PKIOEvents(rawValue: 1 << 2)
    /// An error is pending on the descriptor. Always reported.
    public static let error = PKIOEvents(rawValue: 1 << 3)
}

/// A run-loop source that watches one file descriptor (the Linux counterpart of a
/// `CFFileDescriptor` or a version-1 `CFRunLoopSource`).
///
/// While its loop runs one of the source's modes, the handler is called on the loop's thread
/// with the events that are ready. Readiness is level-triggered: a handler that leaves data
/// unread is called again on the next pass. `hangUp` and `error` are always reported; a handler
/// that gets them and does not close the descriptor must change `events` to `[]`, which stops
/// watching the descriptor altogether.
///
/// The source does not own the descriptor: remove or invalidate the source before closing it.
/// Everything here is loop-only once the source is added to a loop.
public final class PKDescriptorSource: @unchecked Sendable {
    /// The watched descriptor.
    public let descriptor: Int32
    /// The events watched. `[]` stops watching (not even hang-up) until set again. (Loop-only,
    /// as the source is: its loop reads it for each event, unchecked.)
    @exclusivity(unchecked) public var events: PKIOEvents {
        didSet { if events != oldValue { loop?.descriptorEventsChanged(self) } }
    }
    /// Whether the source is still on a loop or can be added to one.
    public private(set) var isValid = true

    /// The handler, given the loop that runs it (PortKit's own sources use it: a loop, having
    /// weak references, is costly to retain, and the weak `loop` below costs a load as well).
    let handler: (PKIOEvents, PKRunLoop) -> Void
    let cancelHandler: (() -> Void)?
    weak var loop: PKRunLoop?
    @exclusivity(unchecked) var token: UInt64 = 0
    /// The modes the source is in (a few at most: an array, compared without hashing).
    @exclusivity(unchecked) var modes: [PKRunLoopMode] = []
    /// The events epoll is watching for this source, or nil when it is not registered.
    @exclusivity(unchecked) var registeredEvents: UInt32?

    /// Calls the handler. A method, so that the call borrows the handler from the source its
    /// caller holds (the caller keeps the source alive for the call); a call through the
    /// property copied the closure, retaining and releasing its context each time. Out of
    /// line: inlined, the borrow holds as well, but a process round trip ran 8 more lines of
    /// code (callgrind).
    @inline(never)
    func callHandler(_ events: PKIOEvents, _ loop: PKRunLoop) {
        handler(events, loop)
    }

    /// A source for `descriptor`.
    ///
    /// - Parameters:
    ///   - descriptor: the descriptor to watch; not owned by the source.
    ///   - events: what to watch (`hangUp` and `error` are reported regardless).
    ///   - handler: called on the loop's thread with the ready events.
    ///   - cancel: called once on the loop's thread when the source leaves its loop for good
    ///     (invalidated, or the loop's thread ended).
    public convenience init(
        descriptor: Int32, events: PKIOEvents = .readable,
        handler: @escaping (PKIOEvents) -> Void, cancel: (() -> Void)? = nil
    ) {
        self.init(descriptor: descriptor, events: events, handlerOnLoop: { events, _ in handler(events) }, cancel: cancel)
    }

    /// A source whose handler is given the loop that runs it.
    init(
        descriptor: Int32, events: PKIOEvents = .readable,
        handlerOnLoop handler: @escaping (PKIOEvents, PKRunLoop) -> Void, cancel: (() -> Void)? = nil
    ) {
        self.descriptor = descriptor
        self.events = events
        self.handler = handler
        self.cancelHandler = cancel
    }

    /// Removes the source from every mode of its loop, for good. Loop-only.
    public func invalidate() {
        guard isValid else { return }
        if let loop { loop.removeDescriptorSourceEverywhere(self) } else { markInvalid() }
    }

    func markInvalid() {
        guard isValid else { return }
        isValid = false
        cancelHandler?()
    }

    /// The epoll event mask for `events`, or nil when nothing is to be watched.
    @inline(__always)
    func isIn(_ mode: PKRunLoopMode) -> Bool { modes.contains(mode) }

    var epollMask: UInt32? {
        if events.isEmpty { return nil }
        var mask = Epoll.readHangUp
        if events.contains(.readable) { mask |= Epoll.readable }
        if events.contains(.writable) { mask |= Epoll.writable }
        return mask
    }

    static func events(fromEpoll mask: UInt32) -> PKIOEvents {
        var result: PKIOEvents = []
        if mask & Epoll.readable != 0 { result.insert(.readable) }
        if mask & Epoll.writable != 0 { result.insert(.writable) }
        if mask & (Epoll.hangUp | Epoll.readHangUp) != 0 { result.insert(.hangUp) }
        if mask & Epoll.error != 0 { result.insert(.error) }
        return result
    }
}
