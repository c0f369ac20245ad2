// A receive port: a run-loop input source that delivers port messages to a handler on its
// loop's thread. Any number of connections (senders) feed it; each is read by a descriptor
// source in the port's modes and decoded by its own `WireDecoder`.

import Logging
import Synchronization

/// A receive port (`NSMachPort`/`NSMessagePort` as a local port, a local `CFMessagePort`).
///
/// Schedule it on a run loop with `PKRunLoop.add(_:forMode:)` (`-[NSRunLoop addPort:forMode:]`);
/// while the loop runs one of its modes, each message that arrives is passed to `handler` on
/// the loop's thread (the delegate's `handlePortMessage:`). Hand out send rights with
/// `makeSendRight()` or by putting them in messages; any number of senders may feed one port.
///
/// The port becomes invalid when `invalidate()` is called or its loop's thread ends while the
/// port is in one of the loop's modes; then every connection is closed, every sender sees its
/// send right become invalid, and `onInvalidation` runs once on the loop's thread. (A port out
/// of every mode when its loop's thread ends is not reached by the loop, which holds no
/// reference to it then: it stays valid, and what is sent to it waits, undelivered. Invalidate
/// such a port before its thread ends.) When the last sender leaves, `onNoSenders` runs (as
/// Mach's no-senders notification; the port stays valid).
///
/// - Warning: A port belongs to the loop it is first scheduled on. The handlers, scheduling and
///   the settable properties are loop-only; `makeSendRight()`, `isValid` and `invalidate()` are
///   safe from any thread.
public final class PKReceivePort: @unchecked Sendable, CustomStringConvertible {
    /// The limits the port enforces on what it receives.
    public let limits: PKPortLimits
    /// `limits` as the wire applies them (each capped at what the wire can carry), for socket
    /// connections and the in-memory mailbox alike.
    let wireLimits: WireLimits

    /// Called on the loop's thread with each message (`handlePortMessage:`). Released when the
    /// port is invalidated (with `onInvalidation` and `onNoSenders`), so a handler may capture
    /// its own port.
    @exclusivity(unchecked) public var handler: (PKPortMessage) -> Void {
        didSet { handlerChanges &+= 1 }
    }
    /// Counts changes of `handler`, and holds of delivery: a delivery loads the handler once
    /// (a retain and a release), and looks again, before the next message, only when a handler
    /// it called changed it or held delivery back (so a delivery that is never held tests
    /// nothing more per message).
    @exclusivity(unchecked) private var handlerChanges: UInt64 = 0

    /// Called once on the loop's thread when the port becomes invalid.
    @exclusivity(unchecked) public var onInvalidation: (() -> Void)?

    /// Called on the loop's thread each time the number of connected senders drops to zero,
    /// once every message they sent was delivered, if no sender arrived meanwhile.
    @exclusivity(unchecked) public var onNoSenders: (() -> Void)?

    /// The loop the port is scheduled on, once it is.
    public var runLoop: PKRunLoop? { shared.withLock { $0.loop } }

    /// Whether the port can still receive. Safe from any thread.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    /// `shared.isValid`, readable without the lock (set false under it, never true again).
    private let valid = Atomic<Bool>(true)
    /// A consumer beyond the loop asked for a hold of delivery to end (`requestDeliveryRelease()`).
    private let releaseRequested = Atomic<Bool>(false)

    /// State shared with other threads.
    struct Shared {
        var isValid = true
        var loop: PKRunLoop?
        /// Read ends handed over by other threads, adopted on the loop's thread.
        var pendingAdoptions: [Int32] = []
        /// Read ends a peer handed over on a reply channel (ATTACH_SENDER), adopted on the
        /// loop's thread as those of a port's own connections are (`adoptHandedOver`).
        var pendingHandedOver: [Int32] = []
        /// Messages sent through local send rights, waiting for the loop (the in-process path).
        var mailbox: [PKPortMessage] = []
        var mailboxBytes = 0
        /// Senders waiting for room in a full mailbox, and the eventfd that wakes them.
        var waitingSenders = 0
        var roomSignal: Int32 = -1
        /// In-process rights of their own (`LocalRight`) alive, and whether the last one left
        /// since the loop last looked.
        var localSenders = 0
        var localSendersGone = false
        /// Advanced by `revokeSenders()`: in-process rights of an earlier epoch are invalid.
        var senderEpoch: UInt64 = 0
        var invalidationRequested = false
        /// Watches on local send rights: told when the port is invalidated.
        var watchers: [Int: Watcher] = [:]
        var nextWatcher = 0
    }

    /// A watch on a local send right; the handler runs on `loop`'s thread.
    struct Watcher: @unchecked Sendable {
        let loop: PKRunLoop
        let mode: PKRunLoopMode
        let handler: () -> Void
        /// The in-process right whose own invalidation also fires the watch.
        var right: ObjectIdentifier?
    }
    let shared = PKMutex<Shared>(Shared())

    // Loop-only state.
    @exclusivity(unchecked) private var modes: [PKRunLoopMode] = []
    @exclusivity(unchecked) private var connections: [ObjectIdentifier: ReceiveConnection] = [:]
    /// Tests: how many connections the port reads. Loop-only.
    var connectionCountForTests: Int { connections.count }

    /// Connections with messages to deliver, in the order they had them: a delivery visits these
    /// rather than every connection (a port may have thousands of idle senders).
    @exclusivity(unchecked) private var ready: [ReceiveConnection] = []
    @exclusivity(unchecked) private(set) var adopter: PKCustomSource!
    /// Messages taken from the mailbox, not yet delivered.
    @exclusivity(unchecked) private var localQueue: [PKPortMessage] = []
    @exclusivity(unchecked) private var localQueueHead = 0
    /// The mailbox was left full while the local queue was being delivered: absorb it once that ends.
    @exclusivity(unchecked) private var mailboxDeferred = false
    /// Sources that live and die with the port and follow its modes (a name's listener).
    @exclusivity(unchecked) private var companions: [PKDescriptorSource] = []
    /// Drops accepted connections that did not greet in time.
    @exclusivity(unchecked) private var greetingTimer: PKTimer?
    /// The accepted connections that have not greeted yet, at most `limits.maxPendingGreetings`,
    /// oldest first (so earliest deadline first: the timeout is the port's): what an accept and
    /// the greeting timer look at, never the port's other connections (a port with thousands
    /// of senders and one silent peer scanned all of them at every event).
    @exclusivity(unchecked) private var awaitingGreeting: [ReceiveConnection] = []
    @exclusivity(unchecked) private var isDelivering = false
    /// A sender left during a delivery: look for no-senders once it ends.
    @exclusivity(unchecked) private var noSendersCheckPending = false
    /// Delivery is held back (`holdDelivery()`): messages wait in the port's queues.
    @exclusivity(unchecked) private var deliveryHeld = false
    /// Where in `ready` the delivery round that a hold stopped resumes (-1: none stopped there).
    @exclusivity(unchecked) private var readyResumesAt = -1
    /// Counts `onNoSenders` reports (see `performDeferredWork`).
    @exclusivity(unchecked) private var noSendersReports: UInt64 = 0
    @exclusivity(unchecked) private var invalidationDelivered = false
    /// A scheduled port is kept alive by its loop, as `-[NSRunLoop addPort:forMode:]` retains
    /// its port: the guide's ports live in no variable but the run loop. The anchor holds the
    /// port from its scheduling until it leaves its last mode or is invalidated, and is how the
    /// port's own routines on the loop (the adopter's, the greeting timer's, a name's listener)
    /// reach it: no weak reference to a port exists, which would move its reference counts to
    /// a side table and slow every retain and release of it (about 1,000 instructions of a
    /// thread round trip).
    let anchor = PortAnchor()
    @exclusivity(unchecked) private var readBuffer: ReadScratch
    /// One logger for every port: a logger per port cost four allocations at each port's
    /// making (a worker's spawn makes two ports) and memory for every idle port.
    static let logger = Logger(label: "PortKit.PKReceivePort")

    /// A receive port.
    ///
    /// - Parameters:
    ///   - limits: what the port accepts from senders.
    ///   - handler: called on the loop's thread with each message.
    public init(limits: PKPortLimits = .default, handler: @escaping (PKPortMessage) -> Void = { _ in }) {
        self.limits = limits
        // Checked here, so a bad limit traps at its cause.
        limits.checkQueueAndGreetingLimits()
        self.wireLimits = limits.wire
        self.handler = handler
        self.readBuffer = ReadScratch(maxDescriptors: wireLimits.maxDescriptors)
        self.adopter = PKCustomSource(
            cancel: { [anchor] _, _ in anchor.port?.adopterCancelled() },
            perform: { [anchor] in anchor.port?.performDeferredWork() }
        )
    }

    deinit {
        readBuffer.deallocate()
        let (pending, room) = shared.withLock { ($0.pendingAdoptions + $0.pendingHandedOver, $0.roomSignal) }
        for fd in pending { Descriptor.close(fd) }
        if room >= 0 { Descriptor.close(room) }
        // The last reference may go on any thread (a port removed from its modes and then
        // released elsewhere), but the connections' sources are loop-only: hand them over, to
        // a pass in whatever mode the loop runs next (or its thread's end).
        let closing = UncheckedBox(Array(connections.values) as [ReceiveConnection])
        let others = UncheckedBox(companions)
        // (A name's hook comes with its listener, among the companions.)
        guard !closing.value.isEmpty || !others.value.isEmpty else { return }
        // Its names go too (the hooks run on the loop: who added them may remove them there).
        let hooks = UncheckedBox(anchor)
        let close: @Sendable () -> Void = {
            for entry in hooks.value.takeInvalidationHooks() { entry.hook() }
            for connection in closing.value { connection.close() }
            for companion in others.value { companion.invalidate() }
        }
        if let loop = shared.withLock({ $0.loop }), !loop.isOwnedByCurrentThread {
            loop.performHousekeeping(close)
        } else {
            close()
        }
    }

    public var description: String { "PKReceivePort(\(ObjectIdentifier(self))\(isValid ? "" : ", invalid"))" }

    // MARK: - Send rights

    /// A send right to this port, for this process's threads or to put in a message
    /// (`+[NSMachPort port]` used as a remote port). Safe from any thread.
    ///
    /// The right lives as long as the port. Messages sent through it are handed over in memory
    /// (the port's mailbox, no socket); put in a message, it reaches the receiver as a right of
    /// its own (in-process, or a new connection across processes).
    public func makeSendRight() -> PKSendPort { PKSendPort(local: self) }

    /// A new connection to this port, as a descriptor to attach to a message; for a right of
    /// `epoch`, only while that epoch is current (see `revokeSenders()`).
    func makeTransferDescriptor(epoch: UInt64? = nil) throws(PKError) -> Int32 {
        let (readEnd, writeEnd) = try Socket.pair()
        do throws(PKError) { try ConnectionSetup.writeGreeting(writeEnd) } catch {
            Descriptor.close(readEnd)
            Descriptor.close(writeEnd)
            throw error
        }
        guard adoptFromAnyThread(readEnd, epoch: epoch) else {
            Descriptor.close(writeEnd)
            throw PKError(.invalidPort, "cannot send a port: the send right was invalidated")
        }
        return writeEnd
    }

    /// Takes ownership of `fd`, the read end of a new connection, from any thread. Returns
    /// whether the port took it (it is closed otherwise).
    @discardableResult
    func adoptFromAnyThread(_ fd: Int32, epoch: UInt64? = nil) -> Bool {
        let accepted = shared.withLock { state in
            guard state.isValid, epoch == nil || epoch == state.senderEpoch else { return false }
            state.pendingAdoptions.append(fd)
            return true
        }
        if accepted { adoptionQueued() } else { Descriptor.close(fd) }
        return accepted
    }

    /// Takes ownership of `fd`, a read end a peer handed over on a reply channel
    /// (ATTACH_SENDER), from any thread: adopted as a port's own connection adopts one
    /// (`adoptHandedOver`: admitted, then held to the greeting timeout), or closed if the port
    /// is invalid.
    func adoptHandedOverFromAnyThread(_ fd: Int32) {
        let accepted = shared.withLock { state in
            guard state.isValid else { return false }
            state.pendingHandedOver.append(fd)
            return true
        }
        if accepted { adoptionQueued() } else { Descriptor.close(fd) }
    }

    private func adoptionQueued() {
        guard let loop = runLoop else { return }  // adopted when first scheduled
        if loop.isOwnedByCurrentThread { adoptPending() } else { adopter.signal(waking: loop) }
    }

    /// Whether the calling thread runs this port's loop.
    var isOwnedByCurrentThread: Bool { runLoop?.isOwnedByCurrentThread ?? false }

    func addInvalidationWatcher(
        loop: PKRunLoop, mode: PKRunLoopMode, _ handler: @escaping () -> Void, right: LocalRight? = nil
    ) -> Int {
        if let right, !right.isValid {
            Self.notify(Watcher(loop: loop, mode: mode, handler: handler))
            return 0
        }
        let watcher = Watcher(loop: loop, mode: mode, handler: handler, right: right.map(ObjectIdentifier.init))
        let token: Int? = shared.withLock { state in
            guard state.isValid else { return nil }
            state.nextWatcher += 1
            state.watchers[state.nextWatcher] = watcher
            return state.nextWatcher
        }
        guard let token else {
            Self.notify(watcher)
            return 0
        }
        return token
    }

    func removeInvalidationWatcher(_ token: Int) {
        _ = shared.withLock { $0.watchers.removeValue(forKey: token) }
    }

    /// The sender epoch in-process rights made now belong to. Safe from any thread.
    var currentSenderEpoch: UInt64 { shared.withLock { $0.senderEpoch } }

    /// Whether the port is valid and rights of `epoch` still reach it. Safe from any thread.
    func acceptsSenders(ofEpoch epoch: UInt64) -> Bool {
        shared.withLock { $0.isValid && $0.senderEpoch == epoch }
    }

    /// A `LocalRight` of `epoch` to this port was made; returns whether that epoch is current
    /// (if not, the right does not count as a sender and is invalid). Safe from any thread.
    func localSenderArrived(epoch: UInt64) -> Bool {
        shared.withLock { state in
            guard state.senderEpoch == epoch else { return false }
            state.localSenders += 1
            return true
        }
    }

    /// A `LocalRight` of `epoch` to this port was invalidated (`right`) or released. Safe from
    /// any thread.
    func localSenderLeft(_ right: LocalRight? = nil, epoch: UInt64) {
        let id = right.map(ObjectIdentifier.init)
        let (loop, last, fired) = shared.withLock { state -> (PKRunLoop?, Bool, [Watcher]) in
            // A right of an epoch that `revokeSenders()` ended was already counted out.
            guard state.senderEpoch == epoch else { return (nil, false, []) }
            state.localSenders -= 1
            var fired: [Watcher] = []
            if let id {
                for (token, watcher) in state.watchers where watcher.right == id {
                    fired.append(watcher)
                    state.watchers[token] = nil
                }
            }
            let last = state.localSenders == 0 && state.isValid
            if last { state.localSendersGone = true }
            return (state.loop, last, fired)
        }
        for watcher in fired { Self.notify(watcher) }
        if last, let loop { adopter.signal(waking: loop) }
    }

    /// Ends every sender of the port and drops whatever they sent that was not delivered, so
    /// the port can be handed out afresh: in-process rights of the current epoch become
    /// invalid (and their watchers are told), connections close, the mailbox empties. The
    /// port stays valid and scheduled; `onNoSenders` is not called. Loop-only. A reply port
    /// reused from one request to the next (`sendRequest`) is revoked between them, so that a
    /// late answer to one request can never be taken for the answer to the next.
    func revokeSenders() {
        // Each part is looked at before it is touched: a reply port is revoked after every
        // request, and usually holds nothing (its answer was taken, its one right released).
        // The undelivered messages are released after the lock: a message may hold a right to
        // this very port, whose release takes the lock again.
        var dropped: [PKPortMessage] = []
        var pending: [Int32] = []
        var fired: [Watcher] = []
        shared.withLock { state in
            state.senderEpoch += 1
            state.localSenders = 0
            state.localSendersGone = false
            if !state.mailbox.isEmpty {
                swap(&dropped, &state.mailbox)
                state.mailboxBytes = 0
            }
            if state.waitingSenders > 0 { EventFD.signal(state.roomSignal) }
            if !state.pendingAdoptions.isEmpty { swap(&pending, &state.pendingAdoptions) }
            if !state.pendingHandedOver.isEmpty {
                pending += state.pendingHandedOver
                state.pendingHandedOver = []
            }
            if !state.watchers.isEmpty {
                for (token, watcher) in state.watchers where watcher.right != nil {
                    fired.append(watcher)
                    state.watchers[token] = nil
                }
            }
        }
        dropped = []
        for watcher in fired { Self.notify(watcher) }
        for fd in pending { Descriptor.close(fd) }
        if !localQueue.isEmpty {
            localQueue.removeAllKeepingStorage()
            localQueueHead = 0
        }
        mailboxDeferred = false
        // Nor does a no-senders check put off by a delivery or a hold report the revoked ones.
        noSendersCheckPending = false
        if !awaitingGreeting.isEmpty { unlistAllAwaitingGreeting() }
        if !ready.isEmpty {
            for connection in ready { connection.isListedReady = false }
            ready.removeAll()
        }
        readyResumesAt = -1
        guard !connections.isEmpty else { return }
        let closing = connections.values
        connections = [:]
        for connection in closing { connection.close() }
    }

    private static func notify(_ watcher: Watcher) {
        let box = watcher
        watcher.loop.perform(inModes: [watcher.mode]) { box.handler() }
    }

    // MARK: - Scheduling

    func schedule(on loop: PKRunLoop, mode: PKRunLoopMode) throws(PKError) {
        let bound: PKRunLoop? = shared.withLock { state in
            if state.loop == nil, state.isValid { state.loop = loop }
            return state.loop
        }
        guard isValid else { throw PKError(.invalidPort, "cannot schedule an invalidated port") }
        precondition(bound === loop, "PKRunLoop.add(_:forMode:): a receive port belongs to the run loop it was first scheduled on")
        if !modes.contains(mode) { modes.append(mode) }
        anchor.port = self
        loop.add(adopter, forMode: mode)
        for connection in connections.values { try loop.add(connection.source, forMode: mode) }
        // A companion whose owner ended while the port was unscheduled (a name unregistered
        // then) was invalidated without being detached: it goes now.
        companions.removeAll { !$0.isValid }
        for companion in companions { try loop.add(companion, forMode: mode) }
        if let greetingTimer { loop.add(greetingTimer, forMode: mode) }
        adoptPending()
        // Messages sent in memory before the port had a loop are waiting for it.
        if shared.withLock({ !$0.mailbox.isEmpty }) { adopter.signal(waking: loop) }
    }

    func unschedule(from loop: PKRunLoop, mode: PKRunLoopMode) {
        guard runLoop === loop else { return }
        modes.removeAll { $0 == mode }
        let kept = anchor.port
        if modes.isEmpty { anchor.port = nil }
        defer { withExtendedLifetime(kept) {} }
        loop.remove(adopter, forMode: mode)
        for connection in connections.values { connection.leave(loop, mode: mode) }
        for companion in companions { loop.remove(companion, forMode: mode) }
        if let greetingTimer { loop.remove(greetingTimer, forMode: mode) }
        // Invalidated by another thread, and its adopter has left the modes it would have
        // finished that in.
        if modes.isEmpty && !isValid { finishInvalidation() }
    }

    // MARK: - Companions (named sockets)

    /// Adds a source that follows the port's modes and is invalidated with it. Loop-only; the
    /// port must be bound to a loop.
    func attachCompanion(_ source: PKDescriptorSource) throws(PKError) {
        guard let loop = runLoop, isValid else { throw PKError(.invalidPort, "the port is not valid") }
        loop.assertOwner("PKReceivePort companion")
        // Those ended while the port was out of every mode (a name unregistered then, which
        // cannot reach the port to detach its listener).
        companions.removeAll { !$0.isValid }
        for mode in modes { try loop.add(source, forMode: mode) }
        companions.append(source)
    }

    /// Removes and invalidates a companion source. Loop-only.
    func detachCompanion(_ source: PKDescriptorSource) {
        companions.removeAll { $0 === source }
        source.invalidate()
    }

    /// Takes a connection accepted from a named socket. Loop-only. The peer must be the same
    /// user and greet within `limits.greetingTimeout`; the port keeps at most
    /// `limits.maxPendingGreetings` accepted connections waiting for their greeting, dropping
    /// the one that has waited longest to make room.
    func adoptAccepted(_ fd: Int32) {
        guard let loop = runLoop, isValid else { Descriptor.close(fd); return }
        let waiting = awaitingGreeting.count { $0.accepted }
        if waiting >= limits.maxPendingGreetings, let oldest = awaitingGreeting.first(where: { $0.accepted }) {
            // Evict the connection that has waited longest without greeting: a real client
            // greets at once (its greeting is already in the socket), a silent one never does.
            Self.logger.notice("dropping a connection that has not greeted: \(waiting) are waiting, the limit is \(limits.maxPendingGreetings)")
            drop(oldest)
        }
        guard let connection = adopt(fd, on: loop, accepted: true) else { return }
        if let reason = connection.checkPeer() {
            Self.logger.notice("refusing a connection: \(reason)")
            drop(connection)
            return
        }
        connection.greetingDeadline = .after(limits.greetingTimeout)
        connection.isListedAwaitingGreeting = true
        awaitingGreeting.append(connection)
        // A real client wrote its greeting before we accepted: read it now, so that a burst of
        // connections accepted in one pass never counts real clients as silent ones.
        handle(.readable, on: connection, loop: loop)
        if connection.isListedAwaitingGreeting { armGreetingTimer(loop) }
    }

    /// Takes `connection` off `awaitingGreeting` (it greeted, or it goes). Loop-only.
    private func unlistAwaitingGreeting(_ connection: ReceiveConnection) {
        connection.isListedAwaitingGreeting = false
        awaitingGreeting.removeAll { $0 === connection }
    }

    /// Empties `awaitingGreeting` (every connection goes). Loop-only.
    private func unlistAllAwaitingGreeting() {
        for connection in awaitingGreeting { connection.isListedAwaitingGreeting = false }
        awaitingGreeting = []
    }

    private func armGreetingTimer(_ loop: PKRunLoop) {
        let earliest = awaitingGreeting.first?.greetingDeadline
        guard let earliest else {
            greetingTimer?.invalidate()
            greetingTimer = nil
            return
        }
        if let timer = greetingTimer, timer.isValid {
            if timer.fireDate != earliest { timer.fireDate = earliest }
            return
        }
        let timer = PKTimer(fireDate: earliest) { [anchor] _ in anchor.port?.dropSilentConnections() }
        greetingTimer = timer
        for mode in modes { loop.add(timer, forMode: mode) }
    }

    private func dropSilentConnections() {
        greetingTimer = nil
        guard let loop = runLoop else { return }
        for connection in awaitingGreeting {
            guard let deadline = connection.greetingDeadline, deadline.hasPassed else { continue }
            // Its greeting may be in the socket, unread: the loop, held up (a long handler, a
            // nested run in another mode), fires due timers before it reads ready descriptors.
            // A sender handed over in ATTACH_SENDER, not read when adopted, would be dropped so.
            handle(.readable, on: connection, loop: loop)
            guard !connection.isClosed, connection.greetingDeadline != nil else { continue }
            Self.logger.notice("dropping a connection that did not greet within \(limits.greetingTimeout)")
            drop(connection)
        }
        armGreetingTimer(loop)
    }

    // MARK: - Invalidation

    /// Invalidates the port (`-[NSPort invalidate]`, `CFMessagePortInvalidate`): every connection
    /// closes, senders see their rights become invalid, and `onInvalidation` runs once on the
    /// loop's thread. Messages not yet delivered are dropped. Safe from any thread.
    public func invalidate() {
        let (loop, wasValid) = shared.withLock { state in
            let wasValid = state.isValid
            state.isValid = false
            valid.store(false, ordering: .releasing)
            state.invalidationRequested = true
            // Senders waiting for room learn it now, not when the loop next runs (its handler
            // may be what holds the queue full) or at their deadline.
            if wasValid && state.waitingSenders > 0 { EventFD.signal(state.roomSignal) }
            return (state.loop, wasValid)
        }
        guard wasValid else {
            // Another thread asked first: on the loop's own thread, finish now rather than
            // leave `onInvalidation` to a pass that may never come (the loop may stop first).
            if let loop, loop.isOwnedByCurrentThread { finishInvalidation() }
            return
        }
        if let loop, !loop.isOwnedByCurrentThread {
            // The adopter finishes it in the port's modes; a port in none (or a loop that never
            // runs them again before the port leaves them) is finished at the loop's next pass.
            adopter.signal(waking: loop)
            loop.performHousekeeping { [self] in if modes.isEmpty { finishInvalidation() } }
        } else {
            finishInvalidation()
        }
    }

    private func adopterCancelled() {
        // The adopter leaves a mode when the port is unscheduled (nothing to do) or for good
        // when the loop's thread ends (the port dies with it). An invalidation another thread
        // requested that the loop never ran is finished here too, on the loop's thread.
        guard !adopter.isValid else { return }
        invalidate()
        if isOwnedByCurrentThread { finishInvalidation() }
    }

    /// What the adopter finds to do, taken under one lock.
    private struct DeferredWork {
        var invalidationRequested = false
        var adoptions: [Int32] = []
        var handedOver: [Int32] = []
        var lastLocalSenderLeft = false
    }

    private func performDeferredWork() {
        // One look under the lock: an invalidation, read ends to adopt, the mailbox (swapped
        // with the delivered local queue's empty buffer, so neither side allocates), and
        // whether the last in-process right left.
        let queueIsEmpty = localQueueHead == localQueue.count
        if queueIsEmpty {
            localQueue.removeAllKeepingStorage()
            localQueueHead = 0
        }
        // The closure returns what it found (a variable it captured and changed would have
        // its accesses checked at run time).
        let work = shared.withLock { state -> DeferredWork in
            var work = DeferredWork()
            if state.invalidationRequested {
                work.invalidationRequested = true
                return work
            }
            if !state.pendingAdoptions.isEmpty { swap(&work.adoptions, &state.pendingAdoptions) }
            if !state.pendingHandedOver.isEmpty { swap(&work.handedOver, &state.pendingHandedOver) }
            // While the local queue still holds undelivered messages (a handler runs the loop
            // nested), the mailbox stays full, so its limit holds the senders as a full socket
            // does; the delivery that empties the local queue looks again.
            if !state.mailbox.isEmpty {
                if queueIsEmpty {
                    swap(&localQueue, &state.mailbox)
                    state.mailboxBytes = 0
                    if state.waitingSenders > 0 { EventFD.signal(state.roomSignal) }
                } else {
                    mailboxDeferred = true
                }
            }
            work.lastLocalSenderLeft = state.localSendersGone && state.localSenders == 0
            state.localSendersGone = false
            return work
        }
        if work.invalidationRequested { finishInvalidation(); return }
        // A release asked for before this look (and after the hold it ends) is taken now.
        if releaseRequested.load(ordering: .relaxed) && releaseRequested.exchange(false, ordering: .acquiring) {
            deliveryHeld = false
        }
        if !work.adoptions.isEmpty, let loop = runLoop {
            for fd in work.adoptions {
                if isValid { adopt(fd, on: loop) } else { Descriptor.close(fd) }
            }
        }
        if !work.handedOver.isEmpty {
            if isValid, let loop = runLoop {
                adoptHandedOver(work.handedOver, on: loop)
            } else {
                for fd in work.handedOver { Descriptor.close(fd) }
            }
        }
        // The last in-process right left, after every message it sent was delivered (and
        // none arrived meanwhile: a handler may have sent the port in a message), unless the
        // delivery's own check (one a hold or a delivery put off) has just reported it.
        let reportsBefore = work.lastLocalSenderLeft ? noSendersReports : 0
        deliverQueuedMessages()
        if work.lastLocalSenderLeft && noSendersReports == reportsBefore { checkNoSenders() }
    }

    /// Moves what the mailbox holds into the local queue, to be delivered in order. While the
    /// local queue still holds undelivered messages (a handler runs the loop nested), the
    /// mailbox stays full, so its limit holds the senders as a full socket does; the delivery
    /// that empties the local queue looks again.
    private func absorbMailbox() {
        guard localQueueHead == localQueue.count else {
            mailboxDeferred = true
            return
        }
        let arrived = takeMailbox()
        guard !arrived.isEmpty else { return }
        localQueue = arrived
        localQueueHead = 0
    }

    private func finishInvalidation() {
        guard !invalidationDelivered else { return }
        invalidationDelivered = true
        let kept = anchor.port
        anchor.port = nil
        defer { withExtendedLifetime(kept) {} }
        // Released after the lock: an undelivered message may hold a right to this very port,
        // whose release takes the lock again.
        var dropped: [PKPortMessage] = []
        let (pending, _, watchers) = shared.withLock { state in
            defer {
                state.pendingAdoptions = []
                state.pendingHandedOver = []
                state.watchers = [:]
                swap(&dropped, &state.mailbox)
                state.mailboxBytes = 0
                // Senders waiting for room wake and find the port invalid.
                if state.waitingSenders > 0 { EventFD.signal(state.roomSignal) }
            }
            return (state.pendingAdoptions + state.pendingHandedOver, (), Array(state.watchers.values))
        }
        dropped = []
        for watcher in watchers { Self.notify(watcher) }
        for fd in pending { Descriptor.close(fd) }
        localQueue = []
        localQueueHead = 0
        for entry in anchor.takeInvalidationHooks() { entry.hook() }
        for companion in companions { companion.invalidate() }
        companions = []
        greetingTimer?.invalidate()
        greetingTimer = nil
        let closing = connections.values
        connections = [:]
        unlistAllAwaitingGreeting()
        for connection in ready { connection.isListedReady = false }
        ready.removeAll()
        readyResumesAt = -1
        for connection in closing { connection.close() }
        if let loop = runLoop, loop.isOwnedByCurrentThread {
            for mode in modes { loop.remove(adopter, forMode: mode) }
        }
        adopter.invalidate()
        modes = []
        let callback = onInvalidation
        onInvalidation = nil
        onNoSenders = nil
        // The handler goes too, so that one that captures its own port (the guide's handlers
        // often do) does not keep the port alive once it is invalid. A handler running now (it
        // invalidated its port) is held by its caller until it returns.
        handler = { _ in }
        callback?()
    }

    // MARK: - Connections

    /// Copies of the descriptors of the port's connections (close-on-exec), which keep them
    /// open for their senders after the port is invalidated: the caller closes them, from any
    /// thread. Loop-only.
    func duplicateConnectionDescriptors() throws(PKError) -> [Int32] {
        var copies: [Int32] = []
        for connection in connections.values {
            do throws(PKError) { copies.append(try Descriptor.duplicate(connection.fd)) } catch {
                for fd in copies { Descriptor.close(fd) }
                throw error
            }
        }
        return copies
    }

    private func adoptPending() {
        guard let loop = runLoop, isValid else { return }
        let (fds, handedOver) = shared.withLock { state in
            defer {
                state.pendingAdoptions = []
                state.pendingHandedOver = []
            }
            return (state.pendingAdoptions, state.pendingHandedOver)
        }
        for fd in fds { adopt(fd, on: loop) }
        if !handedOver.isEmpty { adoptHandedOver(handedOver, on: loop) }
    }

    @discardableResult
    private func adopt(_ fd: Int32, on loop: PKRunLoop, accepted: Bool = false) -> ReceiveConnection? {
        let connection = ReceiveConnection(takingOwnershipOf: fd, limits: wireLimits, accepted: accepted,
                                           maxQueuedMessages: limits.maxQueuedMessages, maxQueuedBytes: limits.maxQueuedBytes)
        connection.source = PKDescriptorSource(descriptor: fd, events: .readable, handlerOnLoop: { [unowned self, unowned connection] events, loop in
            self.handle(events, on: connection, loop: loop)
        })
        do throws(PKError) {
            for mode in modes { try loop.add(connection.source, forMode: mode) }
        } catch {
            Self.logger.warning("dropping a new connection: \(error)")
            connection.close()
            return nil
        }
        connections[ObjectIdentifier(connection)] = connection
        return connection
    }

    private func handle(_ events: PKIOEvents, on connection: ReceiveConnection, loop: PKRunLoop) {
        guard !connection.isClosed else { return }  // dropped (every dropped connection is closed)
        if connection.readingPaused {
            // Back-pressure: the queue is full. A hang-up is remembered by no longer watching;
            // reading resumes (and finds the end of the stream) once the queue drains.
            if events.contains(.hangUp) || events.contains(.error) { connection.source.events = [] }
            deliverQueuedMessages()
            return
        }
        let outcome = connection.read(into: &readBuffer, on: loop)
        switch outcome {
        case .more, .idle, .paused:
            break
        case .endOfStream:
            break
        case .failed(let error):
            // Frames that arrived before the error are still delivered, then the connection goes.
            Self.logger.notice("closing a connection that broke the protocol: \(error)")
        }
        // A connection that has just greeted leaves the list, and the timer follows the others.
        // `loop` is the port's loop (`runLoop` takes the port's lock and retains the loop,
        // whose weak references make that retain and its release slow ones).
        if connection.isListedAwaitingGreeting, connection.greetingDeadline == nil {
            unlistAwaitingGreeting(connection)
            armGreetingTimer(loop)
        }
        // Senders handed over before an error are adopted, as messages before it are delivered.
        adoptAttachedSenders(connection)
        if connection.hasQueuedMessages && !connection.isListedReady {
            connection.isListedReady = true
            ready.append(connection)
        }
        deliverQueuedMessages()
        if connection.finished || connection.failed {
            if !connection.hasQueuedMessages {
                drop(connection)
            } else {
                // Ended with messages still queued (a handler runs a nested loop): nothing more
                // to read, so stop watching the end of the stream, which stays readable and
                // would wake every pass; the delivery under way drains the queue and drops it.
                connection.source.events = []
            }
        }
    }

    /// Adopts the new senders a connection handed over (ATTACH_SENDER). Each must greet within
    /// `limits.greetingTimeout`, as an accepted connection must: a peer could otherwise leave
    /// sockets that never greet in the port, each holding a descriptor, for as long as it
    /// lives. A real sender's greeting is in the socket before the socket is sent, so the next
    /// pass reads it. They do not count towards `maxPendingGreetings`, which bounds what
    /// strangers may connect (each of these costs its peer a descriptor too), and which a
    /// burst of ports in messages would overflow, dropping real senders.
    private func adoptAttachedSenders(_ connection: ReceiveConnection) {
        guard !connection.attached.isEmpty, let loop = runLoop else { return }
        let fds = connection.attached
        connection.attached = []
        adoptHandedOver(fds, on: loop)
    }

    /// Adopts read ends a peer handed over in ATTACH_SENDER (to this port's connection, or on
    /// a reply channel to this reply port): each admitted by `AttachedSockets` first, then
    /// given the greeting timeout.
    private func adoptHandedOver(_ fds: [Int32], on loop: PKRunLoop) {
        for fd in fds {
            let inode: UInt64
            switch AttachedSockets.admit(fd) {
            case .success(let admitted): inode = admitted
            case .failure(let refusal):
                Self.logger.notice("closing a sender handed over in ATTACH_SENDER: \(refusal)")
                Descriptor.close(fd)
                continue
            }
            guard let adopted = adopt(fd, on: loop) else {
                AttachedSockets.release(inode)
                continue
            }
            adopted.attachedInode = inode
            adopted.greetingDeadline = .after(limits.greetingTimeout)
            adopted.isListedAwaitingGreeting = true
            awaitingGreeting.append(adopted)
        }
        armGreetingTimer(loop)
    }

    private func deliverQueuedMessages() {
        guard !isDelivering, !deliveryHeld else { return }
        deliverQueuedMessagesOnce()
        if noSendersCheckPending {
            noSendersCheckPending = false
            checkNoSenders()
        }
    }

    private func deliverQueuedMessagesOnce() {
        isDelivering = true
        defer { isDelivering = false }
        var deliver = handler
        var deliverChanges = handlerChanges
        var progressed = true
        // A round a hold stopped among the connections goes on from there (the in-process
        // messages had their turn), and a whole round follows: a consumer that holds after
        // each message still lets every sender's turn come. (Looked at once, not each round.)
        var resumed = false
        var index = 0
        if readyResumesAt >= 0 {
            (resumed, index) = (true, readyResumesAt)
            readyResumesAt = -1
        }
        while progressed && isValid {
            progressed = resumed
            if resumed {
                resumed = false
                index = min(index, ready.count)
            } else {
                // A hold made by the resumed round's last delivery ends the call here, so that
                // the next one starts a whole round (the in-process messages' turn comes).
                if deliverChanges != handlerChanges && deliveryHeld { return }
                index = 0
                // In-process messages first, in the order they were sent, then each
                // connection's. (The head is 0 whenever the queue is empty, so this also finds
                // a queue delivered but not yet reset.)
                if !localQueue.isEmpty {
                    guard let delivered = deliverLocalMessages(&deliver, &deliverChanges) else { return }
                    progressed = delivered
                }
            }
            // One message per connection per round, so that one busy sender cannot hold up
            // the others; a connection leaves the list once it has nothing more.
            while index < ready.count {
                if deliverChanges != handlerChanges {
                    if deliveryHeld {  // the messages stay queued (see `holdDelivery()`)
                        readyResumesAt = index
                        return
                    }
                    (deliver, deliverChanges) = (handler, handlerChanges)
                }
                let connection = ready[index]
                guard let message = connection.dequeue() else {
                    unlistReady(at: index)
                    continue
                }
                index += 1
                progressed = true
                connection.resumeIfDrained()
                deliver(message)
                // Its bytes take the next message read; a handler that kept the message or its
                // bytes shares the array, and the reuse then copies it first. (Consumed from a
                // `let`: a `var` message was copied for the handler's call.)
                var delivered = consume message
                if var bytes = delivered.body.takeBytes() { SpareBytes.keep(&bytes, in: &readBuffer.spare) }
                if !isValid { return }
                // Its last message delivered, the connection leaves the list now rather than on
                // the next round. (A handler appends to the list, or empties it; if the
                // connection is not where it was, the next round sees to it.)
                if !connection.hasQueuedMessages, index <= ready.count, ready[index - 1] === connection {
                    index -= 1
                    unlistReady(at: index)
                }
            }
        }
    }

    /// Delivers the in-process messages queued, in the order they were sent, and resets the
    /// queue; returns whether it delivered any, or `nil` if a handler invalidated the port. Out
    /// of line: a port whose senders all write through sockets never calls it, and its code
    /// would sit among the delivery's own.
    @inline(never)
    private func deliverLocalMessages(_ deliver: inout (PKPortMessage) -> Void, _ deliverChanges: inout UInt64) -> Bool? {
        var delivered = false
        while localQueueHead < localQueue.count {
            if deliverChanges != handlerChanges {
                // The rest waits, and the mailbox stays full behind it (see `holdDelivery()`).
                if deliveryHeld { return delivered }
                (deliver, deliverChanges) = (handler, handlerChanges)
            }
            let message = localQueue.takeMessage(at: localQueueHead)
            localQueueHead += 1
            delivered = true
            deliver(message)
            if !isValid { return nil }
        }
        if localQueueHead > 0 {
            localQueue.removeAllKeepingStorage()
            localQueueHead = 0
            if mailboxDeferred, let loop = runLoop {
                mailboxDeferred = false
                adopter.signal(waking: loop)
            }
        }
        return delivered
    }

    /// Takes the connection at `index` of the ready list off it, its queue empty (see
    /// `connectionDrained`). Out of line: once a delivery round, and its code would otherwise
    /// sit twice among the delivery's.
    @inline(never)
    private func unlistReady(at index: Int) {
        // The last one (the usual case, one ready connection) without shifting.
        let connection = index == ready.count - 1 ? ready.removeLast() : ready.remove(at: index)
        connection.isListedReady = false
        connectionDrained(connection)
    }

    /// A connection's queue is empty: reading resumes if it had paused, and a connection that
    /// ended (its end seen while a handler held up its last messages) goes.
    private func connectionDrained(_ connection: ReceiveConnection) {
        guard !connection.isClosed else { return }  // dropped meanwhile (revoked, or the port invalidated)
        connection.resumeIfDrained()
        if connection.finished || connection.failed { drop(connection) }
    }

    @inline(never)  // a connection's end: out of the delivery's code (see `deliverLocalMessages`)
    private func drop(_ connection: ReceiveConnection) {
        guard connections.removeValue(forKey: ObjectIdentifier(connection)) != nil else { return }
        if connection.isListedAwaitingGreeting { unlistAwaitingGreeting(connection) }
        connection.close()
        checkNoSenders()
    }

    /// Calls `onNoSenders` if the port has no sender left, after delivering everything they sent
    /// (in memory too). During a delivery, or while a hold keeps in-process messages, the check
    /// waits for the delivery that takes them. Once per drop to no senders: an in-process
    /// right's leaving not yet taken by the adopter is taken here.
    private func checkNoSenders() {
        guard isValid, hasNoSenders else { return }
        if isDelivering {
            noSendersCheckPending = true
            return
        }
        absorbMailbox()
        if localQueueHead < localQueue.count { deliverQueuedMessages() }
        // Again: a handler of those messages may have sent the port in a message.
        guard isValid, hasNoSenders else { return }
        // In-process messages still wait (held back, or in the mailbox behind the local
        // queue): the delivery that takes them looks again.
        if hasUndeliveredLocalMessages {
            noSendersCheckPending = true
            return
        }
        shared.withLock { $0.localSendersGone = false }
        noSendersReports &+= 1
        onNoSenders?()
    }

    /// Messages read from connections and not yet delivered (for tests). Loop-only.
    var queuedOnConnections: Int { ready.reduce(0) { $0 + $1.queuedCount } }

    /// A no-senders check waits for a delivery (for tests). Loop-only.
    var noSendersCheckIsPending: Bool { noSendersCheckPending }

    /// In-process messages wait in the local queue or the mailbox. Loop-only.
    private var hasUndeliveredLocalMessages: Bool {
        localQueueHead < localQueue.count || shared.withLock { !$0.mailbox.isEmpty }
    }

    // MARK: - Holding delivery back

    /// Holds delivery back: the handler gets no more messages until `requestDeliveryRelease()`.
    /// They wait in the port's queues, whose limits (`PKPortLimits`) then hold the senders, as
    /// a handler that is slow to return would: the back-pressure of a consumer beyond the loop
    /// (`messages(bufferLimit:)`, `deliver(on:bufferLimit:_:)`). The port stays scheduled:
    /// connections are accepted and greeted, hang-ups and invalidation seen; no-senders waits
    /// for the in-process messages held. Loop-only.
    func holdDelivery() {
        deliveryHeld = true
        handlerChanges &+= 1  // what a delivery under way looks at before each message
    }

    /// Ends a hold: the port's own routine (which runs in the port's modes) delivers again
    /// what it kept waiting, from where the hold stopped. Safe from any thread.
    func requestDeliveryRelease() {
        releaseRequested.store(true, ordering: .releasing)
        if let loop = runLoop { adopter.signal(waking: loop) }
    }

    /// No connection, no in-process right, no connection waiting to be adopted. Loop-only.
    private var hasNoSenders: Bool {
        connections.isEmpty && shared.withLock {
            $0.pendingAdoptions.isEmpty && $0.pendingHandedOver.isEmpty && $0.localSenders == 0
        }
    }
}

/// A scheduled port's hold on itself (see `PKReceivePort.anchor`), and what is to run when the
/// port ends. Loop-only: set and read on the port's loop thread.
final class PortAnchor: @unchecked Sendable {
    /// The port, while its loop keeps it (scheduled, not invalidated).
    @exclusivity(unchecked) var port: PKReceivePort?
    /// Run when the port is invalidated, before `onInvalidation`, or released (a name's
    /// removal), each with the token that removes it. Here, not in the port: who added one
    /// holds the anchor, and removes it while the port is out of every mode (`port` nil).
    @exclusivity(unchecked) private(set) var invalidationHooks: [(token: Int, hook: () -> Void)] = []
    @exclusivity(unchecked) private var nextInvalidationHookToken = 0

    /// Runs `hook` when the port is invalidated (before `onInvalidation`) or released, unless
    /// `removeInvalidationHook` is given the token returned first. Loop-only.
    func addInvalidationHook(_ hook: @escaping () -> Void) -> Int {
        nextInvalidationHookToken += 1
        invalidationHooks.append((nextInvalidationHookToken, hook))
        return nextInvalidationHookToken
    }

    /// Drops the hook `addInvalidationHook` returned `token` for (none if it has run).
    func removeInvalidationHook(_ token: Int) {
        invalidationHooks.removeAll { $0.token == token }
    }

    /// The hooks, to run now; none is left.
    func takeInvalidationHooks() -> [(token: Int, hook: () -> Void)] {
        defer { invalidationHooks = [] }
        return invalidationHooks
    }
}
