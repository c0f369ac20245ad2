// The run loop: one per thread, on epoll (sources), an eventfd (wake-ups) and a timerfd (timers).
//
// One pass, as in CFRunLoop and the guide's "event order":
//
//     notify entry
//     repeat {
//         notify beforeTimers; notify beforeSources
//         run perform blocks; perform signalled custom sources
//         if a source was handled, work is pending or the deadline has passed: poll, do not sleep
//         if sleeping: notify beforeWaiting; epoll_wait (until the earliest timer / the deadline);
//                      notify afterWaiting
//         handle what woke it: the wake-up, due timers, then ready descriptor sources
//         run perform blocks
//     } until handled-and-asked-to-return | timed out | stopped | the mode is empty
//     notify exit

import Synchronization

/// A run loop (`NSRunLoop`, `CFRunLoop`): the event loop of one thread.
///
/// Each thread has one loop, made the first time the thread asks for `current`. A loop runs in
/// one mode at a time and watches that mode's input sources (ports, descriptor sources, custom
/// sources) and timers, calling their handlers on its own thread; observers see each pass.
/// Runs may nest, in any mode.
///
/// A loop sleeps in `epoll_wait` when nothing is ready: no polling, no periodic wake-up.
///
/// - Warning: A loop belongs to its thread. Running it and adding or removing items are
///   loop-only: calling them from another thread is a programmer error and traps. `wakeUp()`,
///   `stop()`, `perform(inModes:_:)`, signalling a custom source and sending to a port are safe
///   from any thread.
public final class PKRunLoop: @unchecked Sendable {
    /// The kernel thread id of the thread that owns the loop.
    public let threadID: Int32

    /// The loop's epoll descriptor, for hosting the loop inside another event system: when it is
    /// readable, call `runOnePass(in:)` on the loop's thread. Owned by the loop; do not close it.
    public var descriptor: Int32 { epollFD }

    let epollFD: Int32
    let wakeFD: Int32
    let timerFD: Int32

    // Cross-thread state.
    private let wakePending = Atomic<Bool>(false)
    /// Set when a custom source may have been signalled since the last scan, so a pass looks at
    /// the mode's custom sources only then (a loop with a thousand idle ports scans nothing).
    private let signalHint = Atomic<Bool>(true)
    /// Counts invalidations of this loop's timers, custom sources and observers, so a pass
    /// purges a mode only when something in it may have been invalidated.
    private let invalidations = Atomic<UInt64>(0)
    private let stopRequested = Atomic<Bool>(false)
    private let performQueue = PKMutex<[(modes: [PKRunLoopMode], block: @Sendable () -> Void)]>([])
    private let performCount = Atomic<Int>(0)

    // Loop-only state.
    var modeItems: [PKRunLoopMode: ModeItems] = [:]
    var commonModes: Set<PKRunLoopMode> = [.default]
    var commonItems = ModeItems()
    var descriptorSources: [UInt64: PKDescriptorSource] = [:]
    var parkedSources: Set<UInt64> = []
    var nextToken: UInt64 = Token.firstSource
    private(set) var currentMode: PKRunLoopMode?
    private var armedTimer: UInt64?
    private let ended = Atomic<Bool>(false)
    /// Whether the loop's thread has ended (every item has left the loop). Safe from any thread.
    var threadEnded: Bool { ended.load(ordering: .acquiring) }

    enum Token {
        static let wake: UInt64 = 0
        static let timer: UInt64 = 1
        static let firstSource: UInt64 = 2
    }

    /// The items of one mode.
    struct ModeItems {
        var customSources: [PKCustomSource] = []
        var descriptorTokens: Set<UInt64> = []
        var timers: [PKTimer] = []
        var observers: [PKRunLoopObserver] = []
        /// The value of `invalidations` when this mode was last purged.
        var purgedAt: UInt64 = .max
    }

    /// One run's buffers for `epoll_wait`, reused by every run at that nesting depth.
    private final class EventBuffer {
        static let capacity: Int32 = 64
        let events = UnsafeMutablePointer<UInt32>.allocate(capacity: Int(capacity))
        let tokens = UnsafeMutablePointer<UInt64>.allocate(capacity: Int(capacity))
        deinit {
            events.deallocate()
            tokens.deallocate()
        }
    }
    private var eventBuffers: [EventBuffer] = []
    private var runDepth = 0

    init(ownerThread: Int32) {
        self.threadID = ownerThread
        do {
            epollFD = try Epoll.create()
            wakeFD = try EventFD.create()
            timerFD = try TimerFD.create()
            try Epoll.add(epollFD, wakeFD, events: Epoll.readable, token: Token.wake)
            try Epoll.add(epollFD, timerFD, events: Epoll.readable, token: Token.timer)
        } catch {
            // A thread without a run loop cannot do anything PortKit offers.
            fatalError("PortKit cannot create a run loop: \(error)")
        }
    }

    deinit {
        Descriptor.close(timerFD)
        Descriptor.close(wakeFD)
        Descriptor.close(epollFD)
    }

    /// The mode the innermost run of this loop is in, or `nil` when the loop is not running.
    /// Loop-only.
    public var currentModeIfRunning: PKRunLoopMode? {
        assertOwner("currentModeIfRunning")
        return currentMode
    }

    // MARK: - Thread rules

    /// Whether the calling thread owns this loop.
    public var isOwnedByCurrentThread: Bool { ThreadIdentity.current == threadID }

    @inline(__always)
    func assertOwner(_ function: StaticString) {
        if ThreadIdentity.current != threadID {
            fatalError("PKRunLoop.\(function) is loop-only: the loop belongs to thread \(threadID), but thread \(ThreadIdentity.current) called it")
        }
    }

    // MARK: - Cross-thread operations

    /// Notes that a custom source of this loop was signalled. Safe from any thread.
    func noteSignalled() { signalHint.store(true, ordering: .releasing) }

    /// Notes that an item of this loop was invalidated. Safe from any thread.
    func noteInvalidation() { invalidations.add(1, ordering: .releasing) }

    /// The invalidation count, for `purgeInvalid`.
    var invalidationCount: UInt64 { invalidations.load(ordering: .acquiring) }

    /// Wakes the loop if it sleeps, so it runs another pass (`CFRunLoopWakeUp`). Safe from any thread.
    public func wakeUp() {
        if !wakePending.exchange(true, ordering: .acquiringAndReleasing) {
            EventFD.signal(wakeFD)
        }
    }

    /// Ends the innermost run of the loop, which returns `.stopped` (`CFRunLoopStop`). Safe from
    /// any thread. If the loop is not running, its next run returns `.stopped` at once.
    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeUp()
    }

    /// Runs `block` on the loop's thread on a pass in one of `modes`, and wakes the loop so it
    /// does so promptly even if it was asleep (`CFRunLoopPerformBlock` + `CFRunLoopWakeUp`, the
    /// guide's `performSelector:onThread:`). Blocks run in the order they were given. Safe from
    /// any thread.
    public func perform(inModes modes: [PKRunLoopMode] = [.common], _ block: @escaping @Sendable () -> Void) {
        performQueue.withLock { $0.append((modes, block)) }
        performCount.add(1, ordering: .releasing)
        wakeUp()
    }

    // MARK: - Running

    /// Runs the loop in `mode` until `deadline`, a stop, an empty mode or (if asked) one handled
    /// source (`CFRunLoopRunInMode`). Loop-only.
    ///
    /// A mode with no sources and no timers returns `.finished` at once. A deadline that has
    /// passed still gets one pass that does not sleep. Timers never count as handled sources.
    ///
    /// - Parameters:
    ///   - mode: the mode to run; not `.common`.
    ///   - deadline: when to return `.timedOut`.
    ///   - returnAfterSourceHandled: return `.handledSource` after the first source handled.
    /// - Returns: why the run ended.
    @discardableResult
    public func run(
        in mode: PKRunLoopMode = .default, until deadline: PKDeadline = .distantFuture,
        returnAfterSourceHandled: Bool = false
    ) -> PKRunLoopRunResult {
        assertOwner("run(in:until:returnAfterSourceHandled:)")
        precondition(mode != .common, "PKRunLoop.run: a loop cannot run in the common-modes pseudo-mode; run a real mode such as .default")
        if threadEnded { return .finished }
        purgeInvalid(mode)
        if isEmpty(mode) { return .finished }
        let previous = currentMode
        currentMode = mode
        // Signalled sources of this mode may have been skipped while another mode ran.
        signalHint.store(true, ordering: .releasing)
        runDepth += 1
        defer {
            runDepth -= 1
            currentMode = previous
            signalHint.store(true, ordering: .releasing)
            // After the outermost run, stay armed for the mode just run: a loop hosted through
            // `descriptor` learns that way when its next timer is due.
            armTimer(for: previous ?? mode)
        }
        notifyObservers(.entry, mode)
        let result = runPasses(mode, deadline, returnAfterSourceHandled)
        notifyObservers(.exit, mode)
        // Work that arrived during the last pass (a wake-up that found one already pending)
        // must keep `descriptor` readable for a host that runs one pass at a time.
        if result != .stopped && hasPendingWork(mode) { wakeUp() }
        return result
    }

    /// Runs the loop in `mode` for at most `timeout`. Loop-only.
    @discardableResult
    public func run(in mode: PKRunLoopMode = .default, for timeout: Duration, returnAfterSourceHandled: Bool = false) -> PKRunLoopRunResult {
        run(in: mode, until: .after(timeout), returnAfterSourceHandled: returnAfterSourceHandled)
    }

    /// Runs the loop once in `mode`, returning after the first source handled or at `deadline`
    /// (`-[NSRunLoop runMode:beforeDate:]`). Loop-only.
    ///
    /// - Returns: `false` if the mode has no sources or timers (the run did not start).
    @discardableResult
    public func runOnce(in mode: PKRunLoopMode = .default, before deadline: PKDeadline) -> Bool {
        run(in: mode, until: deadline, returnAfterSourceHandled: true) != .finished
    }

    /// Runs the default mode until it has no sources and no timers, or a stop
    /// (`-[NSRunLoop run]`, `CFRunLoopRun`). Loop-only.
    public func run() {
        while true {
            let result = run(in: .default, until: .distantFuture)
            if result == .finished || result == .stopped { return }
        }
    }

    /// One pass that does not sleep: handles whatever is ready in `mode` and returns. For a loop
    /// hosted by another event system (see `descriptor`). Loop-only.
    @discardableResult
    public func runOnePass(in mode: PKRunLoopMode = .default) -> PKRunLoopRunResult {
        run(in: mode, until: .distantPast)
    }

    private func runPasses(_ mode: PKRunLoopMode, _ deadline: PKDeadline, _ returnAfter: Bool) -> PKRunLoopRunResult {
        let capacity = EventBuffer.capacity
        if eventBuffers.count < runDepth { eventBuffers.append(EventBuffer()) }
        let buffer = eventBuffers[runDepth - 1]
        let readyEvents = buffer.events
        let readyTokens = buffer.tokens
        // A stop requested while the loop was not running ends this run before it does anything.
        if stopRequested.exchange(false, ordering: .acquiringAndReleasing) { return .stopped }
        while true {
            if !parkedSources.isEmpty { registerParkedSources(for: mode) }
            notifyObservers(.beforeTimers, mode)
            notifyObservers(.beforeSources, mode)
            runPerformBlocks(mode)
            var handledSource = performCustomSources(mode)
            runPerformBlocks(mode)
            if handledSource && returnAfter { return .handledSource }

            let pollOnly = handledSource || hasPendingWork(mode)
            armTimer(for: mode)
            let timeout: Int32 = pollOnly ? 0 : deadline.pollTimeoutMilliseconds(now: monotonicNanoseconds())
            // A pass that will not sleep (something ready, or the deadline passed) does not say so.
            let sleeps = timeout != 0
            if sleeps { notifyObservers(.beforeWaiting, mode) }
            let count = (try? Epoll.wait(epollFD, events: readyEvents, tokens: readyTokens, capacity: capacity, timeoutMilliseconds: timeout)) ?? 0
            if sleeps { notifyObservers(.afterWaiting, mode) }

            for index in 0..<count {
                switch readyTokens[index] {
                case Token.wake:
                    EventFD.drain(wakeFD)
                    // An exchange, not a store: it acquires whatever a waker published before it
                    // found a wake-up already pending (and so did not write the eventfd).
                    _ = wakePending.exchange(false, ordering: .acquiringAndReleasing)
                case Token.timer:
                    TimerFD.drain(timerFD)
                    armedTimer = nil
                default:
                    break
                }
            }
            // Due timers first (even if the timerfd has not been read yet), then ready
            // descriptor sources, as the pass above documents.
            fireDueTimers(mode)
            for index in 0..<count where readyTokens[index] >= Token.firstSource {
                if handledSource && returnAfter { break }
                if handleDescriptorEvent(token: readyTokens[index], mask: readyEvents[index], mode: mode) {
                    handledSource = true
                }
            }
            runPerformBlocks(mode)

            if handledSource && returnAfter { return .handledSource }
            if stopRequested.exchange(false, ordering: .acquiringAndReleasing) { return .stopped }
            if threadEnded { return .finished }
            if deadline.hasPassed { return .timedOut }
            purgeInvalid(mode)
            if isEmpty(mode) { return .finished }
        }
    }

    /// Whether something is ready that must not wait for a sleep.
    private func hasPendingWork(_ mode: PKRunLoopMode) -> Bool {
        if stopRequested.load(ordering: .acquiring) { return true }
        if performCount.load(ordering: .acquiring) > 0 && performQueue.withLock({ queue in queue.contains { modesMatch($0.modes, mode) } }) {
            return true
        }
        guard let items = modeItems[mode] else { return false }
        guard signalHint.load(ordering: .acquiring) else { return false }
        return items.customSources.contains { $0.isSignalled && $0.isValid }
    }

    // MARK: - Items in a pass

    private func runPerformBlocks(_ mode: PKRunLoopMode) {
        guard performCount.load(ordering: .acquiring) > 0 else { return }
        let runnable: [@Sendable () -> Void] = performQueue.withLock { queue in
            var taken: [@Sendable () -> Void] = []
            queue.removeAll { item in
                guard modesMatch(item.modes, mode) else { return false }
                taken.append(item.block)
                return true
            }
            return taken
        }
        guard !runnable.isEmpty else { return }
        performCount.subtract(runnable.count, ordering: .releasing)
        for block in runnable { block() }
    }

    private func modesMatch(_ modes: [PKRunLoopMode], _ mode: PKRunLoopMode) -> Bool {
        modes.contains { $0 == mode || ($0 == .common && commonModes.contains(mode)) }
    }

    private func performCustomSources(_ mode: PKRunLoopMode) -> Bool {
        guard signalHint.exchange(false, ordering: .acquiringAndReleasing) else { return false }
        guard let sources = modeItems[mode]?.customSources, !sources.isEmpty else { return false }
        var handled = false
        // `sources` is a snapshot: skip one that an earlier callback removed from the mode.
        for source in sources where source.isSignalled && contains(source, in: mode) && source.performIfSignalled() {
            handled = true
        }
        return handled
    }

    private func fireDueTimers(_ mode: PKRunLoopMode) {
        guard let timers = modeItems[mode]?.timers, !timers.isEmpty else { return }
        let now = monotonicNanoseconds()
        let due = timers.filter { $0.isValid && !$0.isFiring && $0.fireNanoseconds <= now }
            .sorted { $0.fireNanoseconds < $1.fireNanoseconds }
        // `due` is a snapshot: skip a timer that an earlier callback removed or moved.
        for timer in due where timer.isValid && timer.fireNanoseconds <= now && contains(timer, in: mode) {
            timer.fireOnLoop(now: monotonicNanoseconds)
        }
    }

    private func contains(_ source: PKCustomSource, in mode: PKRunLoopMode) -> Bool {
        modeItems[mode]?.customSources.contains { $0 === source } ?? false
    }

    private func contains(_ timer: PKTimer, in mode: PKRunLoopMode) -> Bool {
        modeItems[mode]?.timers.contains { $0 === timer } ?? false
    }

    /// Arms the timerfd at the latest moment that still fires every timer of `mode` within its
    /// tolerance; re-arms only when that moment changes.
    func armTimer(for mode: PKRunLoopMode?) {
        var earliest: UInt64? = nil
        if let mode, let timers = modeItems[mode]?.timers {
            for timer in timers where timer.isValid && !timer.isFiring {
                let latest = timer.latestNanoseconds
                if earliest == nil || latest < earliest! { earliest = latest }
            }
        }
        guard earliest != armedTimer else { return }
        armedTimer = earliest
        TimerFD.set(timerFD, deadline: earliest)
    }

    /// Called when a timer's dates change, so the timerfd follows.
    func timersChanged() {
        if ThreadIdentity.current == threadID {
            armedTimer = .max - 1  // force a re-arm on the next pass
            if currentMode != nil { armTimer(for: currentMode) }
        } else {
            wakeUp()
        }
    }

    private func handleDescriptorEvent(token: UInt64, mask: UInt32, mode: PKRunLoopMode) -> Bool {
        guard let source = descriptorSources[token] else { return false }
        guard source.modes.contains(mode) else {
            // Ready, but not in this mode: stop watching until a run in one of its modes.
            unregister(source)
            parkedSources.insert(token)
            return false
        }
        source.handler(PKDescriptorSource.events(fromEpoll: mask))
        return true
    }

    func notifyObservers(_ activity: PKRunLoopActivity, _ mode: PKRunLoopMode) {
        guard let observers = modeItems[mode]?.observers, !observers.isEmpty else { return }
        for observer in observers { observer.call(activity) }
    }

    // MARK: - Thread end

    /// Called when the owning thread ends: every item leaves the loop (ports invalidate).
    func threadDidExit() {
        ended.store(true, ordering: .releasing)
        for mode in Array(modeItems.keys) {
            for source in modeItems[mode]?.customSources ?? [] { source.invalidate() }
            for timer in modeItems[mode]?.timers ?? [] { timer.invalidate() }
            for observer in modeItems[mode]?.observers ?? [] { observer.invalidate() }
            purgeInvalid(mode)
        }
        for source in Array(descriptorSources.values) { removeDescriptorSourceEverywhere(source) }
        modeItems = [:]
        commonItems = ModeItems()
        performQueue.withLock { $0.removeAll() }
    }
}
