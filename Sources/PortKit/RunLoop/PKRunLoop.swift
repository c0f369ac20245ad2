// The run loop: one per thread, on epoll (sources), an eventfd (wake-ups), a timerfd (timers) and
// another for runs' deadlines.
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

import Logging
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
    /// Once read, the loop counts as hosted: work its own thread gives it between passes (an
    /// invalidated timer or source, say) makes the descriptor readable too.
    /// Read it on the loop's thread, before the host starts waiting on it. A process out of
    /// descriptors when the loop first needs its own cannot host it: that traps.
    public var descriptor: Int32 {
        hosted.store(true, ordering: .relaxed)
        do throws(PKError) { return try epollFD() } catch {
            fatalError("PortKit cannot make the run loop's descriptor: \(error)")
        }
    }

    /// The epoll descriptor, made with the wake-up eventfd when the loop first needs them: to
    /// sleep, or to watch a descriptor. A loop that only runs passes that do not sleep (or whose
    /// thread reports to another before its first sleep, as a worker checks in) makes them off
    /// that path: the two cost about 2 µs of system calls here. Safe from any thread.
    ///
    /// - Throws: `PKError` if the process is out of descriptors (the next need tries again).
    func epollFD() throws(PKError) -> Int32 {
        let made = epollDescriptor.load(ordering: .acquiring)
        return made >= 0 ? made : try makeKernelObjects()
    }

    /// Whether the loop has made its epoll descriptor and eventfd yet (for tests).
    var hasKernelObjects: Bool { epollDescriptor.load(ordering: .acquiring) >= 0 }

    /// -1 until `makeKernelObjects()`.
    let epollDescriptor = Atomic<Int32>(-1)
    /// The wake-up eventfd and the signalled sources: what other threads touch to wake the loop.
    let doorbell = LoopDoorbell()
    /// Serializes the making of loops' kernel objects (once per loop; `descriptor` may be read
    /// from another thread).
    private static let kernelObjectsMaking = PKMutex(())
    /// The timerfd, made when the loop first arms a timer (a loop that never has one and only
    /// runs until `.distantFuture`, such as a worker's, costs two descriptors and no more system
    /// calls than it needs).
    @exclusivity(unchecked) private var timerFD: Int32 = -1
    /// A second timerfd, for the deadline of a run (see `sleepTimeout(until:unobserved:)`),
    /// made when a run with a deadline other than `.distantFuture` first sleeps on a loop not
    /// hosted.
    @exclusivity(unchecked) private var deadlineFD: Int32 = -1
    /// When `deadlineFD` fires: the deadline of the run that last armed it (`nil`: disarmed, or
    /// fired and read).
    @exclusivity(unchecked) private var armedDeadline: UInt64?
    /// Whether the loop said once that it could not make its epoll descriptor.
    @exclusivity(unchecked) private var reportedNoDescriptors = false
    private static let logger = Logger(label: "PortKit.PKRunLoop")

    // Cross-thread state (and the doorbell's).
    /// Whether someone read `descriptor` to host the loop (see `noteInvalidationWaking`).
    private let hosted = Atomic<Bool>(false)
    /// Counts invalidations of this loop's timers, custom sources and observers, so a pass
    /// purges a mode only when something in it may have been invalidated.
    private let invalidations = Atomic<UInt64>(0)
    /// Timers and observers invalidated, counted apart: the next purge takes them out of every
    /// mode, not only the running one (a timer in a mode that never runs again kept its
    /// handler and captures alive for the loop's life).
    private let itemInvalidations = Atomic<UInt64>(0)
    private let stopRequested = Atomic<Bool>(false)
    /// Set under `performQueue`'s lock when the thread's end takes the queue for the last time:
    /// housekeeping runs at once from then on.
    @exclusivity(unchecked) private var housekeepingClosed = false
    /// Private runs (`runPrivately`) in progress: housekeeping waits for their end, as it may
    /// call a port's `onInvalidation`, which a request's or a check-in's wait must not run.
    @exclusivity(unchecked) private var privateRuns = 0
    /// Blocks given to `perform` (`modes` nil: `performHousekeeping`'s, for any mode).
    private let performQueue = PKMutex<[(modes: [PKRunLoopMode]?, block: @Sendable () -> Void)]>([])
    private let performCount = Atomic<Int>(0)
    /// Counts changes of this loop's timers (see `refreshTimerDates`).
    private let timerEpoch = Atomic<UInt64>(0)
    /// Custom sources invalidated since the last purge: a purge removes these from their
    /// modes, never scanning a mode's other sources (a loop has one per port). Nil once the
    /// loop's thread has ended: no purge would take them, and a source whose closure holds the
    /// loop would keep both alive.
    private let invalidatedSources = PKMutex<[PKCustomSource]?>([])

    // Loop-only state. `@exclusivity(unchecked)`: only the loop's thread touches it (every
    // entry point asserts the owner), and the dynamic exclusivity checks it would otherwise
    // get on every access were the largest single cost of a pass.
    @exclusivity(unchecked) var modeItems: [PKRunLoopMode: ModeRecord] = [:]
    /// The record the last lookup found, so that runs of one mode hash its name once. Unmanaged:
    /// `modeItems` holds every record, from its making until the thread's end (`threadDidExit`),
    /// so a run borrows its record from here without a retain and a release.
    @exclusivity(unchecked) private var lastRecord: Unmanaged<ModeRecord>?
    @exclusivity(unchecked) var commonModes: Set<PKRunLoopMode> = [.default]
    @exclusivity(unchecked) var commonItems = ModeRecord(mode: .common)
    /// Descriptor sources by slot (the low 32 bits of a token, less `Token.firstSource`); the
    /// 31 bits above are a generation, so an event for a source removed earlier in the same
    /// batch never reaches a newer source in its slot (the top bit marks a blocked write).
    @exclusivity(unchecked) var descriptorSlots: [PKDescriptorSource?] = []
    @exclusivity(unchecked) var freeSlots: [Int] = []
    /// The last sequence number given to a custom source or timer when first added, which
    /// orders ties (sources of one order cancelled together, timers of one fire date).
    @exclusivity(unchecked) var nextAddedSequence: UInt64 = 0
    @exclusivity(unchecked) var nextGeneration: UInt64 = 1
    /// `itemInvalidations` when every mode's invalid timers and observers were last removed.
    @exclusivity(unchecked) var itemsPurgedAt: UInt64 = 0
    @exclusivity(unchecked) var parkedSources: Set<UInt64> = []
    /// Signalled sources taken from `doorbell.signalledQueue` that are not in the running
    /// mode but in another: they wait for a run in one of their modes.
    @exclusivity(unchecked) private var deferredSignalled: [PKCustomSource] = []
    /// The other half of `doorbell.signalledQueue`'s buffer, swapped in under the lock.
    @exclusivity(unchecked) private var spareSignalled: [PKCustomSource] = []
    /// The signalled sources the innermost pass that performs sources took, and, from
    /// `signalledCursor` on, has not looked at yet: a nested run, in one of their performs,
    /// takes the rest (a source of its mode signalled in the same batch would otherwise wait,
    /// its signal taken, until the nested run ended).
    @exclusivity(unchecked) private var signalledBatch: [PKCustomSource] = []
    @exclusivity(unchecked) private var signalledCursor = 0
    /// The other half of `invalidatedSources`' buffer.
    @exclusivity(unchecked) private var spareInvalidated: [PKCustomSource] = []
    /// The record of the mode the innermost run is in; `nil` when the loop is not running.
    /// Unowned and unsafe, so that setting it costs a run no reference counting: each record
    /// stored here is held by the run that stored it (its `record`), which puts the outer run's
    /// back before it returns. Loop-only.
    @exclusivity(unchecked) private unowned(unsafe) var currentRecord: ModeRecord?
    /// The mode the innermost run is in; `nil` when the loop is not running. Loop-only.
    var currentMode: PKRunLoopMode? { currentRecord?.mode }
    /// The read area every connection of this loop reads into while it holds no partial frame
    /// (`WireDecoder.withBorrowedStorage`), so an idle connection costs no read buffer.
    @exclusivity(unchecked) private var readStorage: [UInt8] = []
    /// `sendRequest`'s reusable reply ports and private modes, one per nesting depth.
    @exclusivity(unchecked) var replySlots: [ReplySlot] = []
    @exclusivity(unchecked) var requestDepth = 0
    /// Check-ins being waited for on this loop (`CheckInListener`), for their private modes.
    @exclusivity(unchecked) var checkInDepth = 0
    /// ZeroMQ requests being waited for on this loop, for their private modes: one mode a
    /// nesting depth, reused by every request (a mode's record lives as long as its loop).
    @exclusivity(unchecked) package var zmqRequestDepth = 0
    /// Connections this thread left bytes pending on during the current pass (coalesced
    /// writes): written before the loop waits or returns.
    @exclusivity(unchecked) var pendingWrites: [SendConnection] = []
    /// `pendingWrites`' other buffer, swapped in while a flush goes through the first.
    @exclusivity(unchecked) private var spareWrites: [SendConnection] = []
    /// Connections whose pending bytes the socket would not take: watched for room in every
    /// mode (token `Token.blockedWrite | fd`), flushed when writable.
    @exclusivity(unchecked) var blockedWrites: [Int32: SendConnection] = [:]
    /// Counts passes, so a connection knows whether it was written to in the current one.
    @exclusivity(unchecked) private(set) var passNumber: UInt64 = 0
    /// How many times the loop has waited for something to happen, or been entered from outside
    /// any run (where the thread may have waited for other things, as a host's passes do): a
    /// send on the loop's thread asks whether its connection's last write is still unread only
    /// if the loop has not waited since (see `SendConnection.wroteRecently`). Loop-only.
    @exclusivity(unchecked) private(set) var waits: UInt64 = 0
    @exclusivity(unchecked) private var armedTimer: UInt64?
    /// When the earliest timer is due, if the loop could not arm the timerfd for it (out of
    /// descriptors): the pass's wait then ends by that time itself.
    @exclusivity(unchecked) private var timerWithoutDescriptor: UInt64?
    /// The mode record the timerfd was last armed for (records live as long as the loop).
    @exclusivity(unchecked) private var armedRecord: ModeRecord?
    private let ended = Atomic<Bool>(false)
    /// Whether the loop's thread has ended (every item has left the loop). Safe from any thread.
    var threadEnded: Bool { ended.load(ordering: .acquiring) }

    enum Token {
        static let wake: UInt64 = 0
        static let timer: UInt64 = 1
        static let deadline: UInt64 = 2
        static let firstSource: UInt64 = 3
        /// The high bit marks a blocked connection's descriptor (the low 32 bits).
        static let blockedWrite: UInt64 = 1 << 63
    }

    /// The items of one mode. A reference, so that a run resolves its mode once and every
    /// step of a pass reaches the items without hashing the mode's name.
    final class ModeRecord {
        let mode: PKRunLoopMode
        /// Keyed by identity: adding, finding and removing one of a loop's thousands is O(1).
        @exclusivity(unchecked) var customSources: [ObjectIdentifier: PKCustomSource] = [:]
        @exclusivity(unchecked) var descriptorTokens: Set<UInt64> = []
        /// Keyed by identity, as the custom sources are.
        @exclusivity(unchecked) var timers: [ObjectIdentifier: PKTimer] = [:]
        /// The earliest fire date of the mode's valid timers that are not firing, and the
        /// earliest moment one of them must fire by (its fire date plus its tolerance), as of
        /// `timerEpoch`'s value `timersSeenAt`: a pass reads these instead of every timer.
        @exclusivity(unchecked) var earliestFire: UInt64 = .max
        @exclusivity(unchecked) var earliestLatest: UInt64?
        @exclusivity(unchecked) var timersSeenAt: UInt64 = .max
        @exclusivity(unchecked) var observers: [PKRunLoopObserver] = []
        /// The activities some observer of this mode watches: a pass skips the others.
        @exclusivity(unchecked) var observedActivities: PKRunLoopActivity = []
        /// The value of `invalidations` when this mode was last purged.
        @exclusivity(unchecked) var purgedAt: UInt64 = .max

        init(mode: PKRunLoopMode) { self.mode = mode }

        var isEmpty: Bool { customSources.isEmpty && descriptorTokens.isEmpty && timers.isEmpty }
        /// Whether a look (an epoll_wait) could find anything of this mode ready.
        var hasTimersOrDescriptors: Bool { !descriptorTokens.isEmpty || !timers.isEmpty }

        func observersChanged() {
            observedActivities = observers.reduce(into: []) { $0.formUnion($1.activities) }
        }
    }

    /// The record of `mode`, if it has ever had an item. Loop-only.
    @inline(__always)
    func record(_ mode: PKRunLoopMode) -> ModeRecord? {
        recordReference(mode)?.takeUnretainedValue()
    }

    /// `record(_:)`, unretained: the record lives until the thread's end (see `lastRecord`).
    @inline(__always)
    private func recordReference(_ mode: PKRunLoopMode) -> Unmanaged<ModeRecord>? {
        if let last = lastRecord, last._withUnsafeGuaranteedRef({ $0.mode == mode }) { return last }
        guard let found = modeItems[mode] else { return nil }
        let reference = Unmanaged.passUnretained(found)
        lastRecord = reference
        return reference
    }

    /// The record of `mode`, made if it has none. Loop-only.
    func recordMaking(_ mode: PKRunLoopMode) -> ModeRecord {
        if let found = record(mode) { return found }
        let made = ModeRecord(mode: mode)
        modeItems[mode] = made
        lastRecord = Unmanaged.passUnretained(made)
        return made
    }

    /// One run's buffers for `epoll_wait`, reused by every run at that nesting depth.
    /// Where one run depth's `epoll_wait` reports: raw memory the loop frees in its deinit. A
    /// value of two pointers, so a pass reads it without a retain and a release (a class did).
    private struct EventBuffer {
        static let capacity: Int32 = 64
        let events = UnsafeMutablePointer<UInt32>.allocate(capacity: Int(capacity))
        let tokens = UnsafeMutablePointer<UInt64>.allocate(capacity: Int(capacity))

        func deallocate() {
            events.deallocate()
            tokens.deallocate()
        }
    }
    @exclusivity(unchecked) private var eventBuffers: [EventBuffer] = []
    @exclusivity(unchecked) private var runDepth = 0

    init(ownerThread: Int32) {
        self.threadID = ownerThread
    }

    deinit {
        for buffer in eventBuffers { buffer.deallocate() }
        if timerFD >= 0 { Descriptor.close(timerFD) }
        if deadlineFD >= 0 { Descriptor.close(deadlineFD) }
        let epoll = epollDescriptor.load(ordering: .acquiring)
        if epoll >= 0 { Descriptor.close(epoll) }
    }

    /// Makes the epoll descriptor and the wake-up eventfd, once; returns the epoll descriptor.
    private func makeKernelObjects() throws(PKError) -> Int32 {
        try Self.kernelObjectsMaking.withLock { (_: inout Void) throws(PKError) -> Int32 in
            let existing = epollDescriptor.load(ordering: .acquiring)
            if existing >= 0 { return existing }
            let epoll = try Epoll.create()
            let wake: Int32
            do throws(PKError) {
                wake = try EventFD.create()
                // Edge-triggered: a pass consumes a wake-up by being told of it (see `runPasses`).
                do throws(PKError) { try Epoll.add(epoll, wake, events: Epoll.readable | Epoll.edgeTriggered, token: Token.wake) } catch {
                    Descriptor.close(wake)
                    throw error
                }
            } catch {
                Descriptor.close(epoll)
                throw error
            }
            // Sequentially consistent with `wakeUp()`: a waker that found no eventfd yet set
            // `doorbell.wakePending` first, and is seen here; one that comes after finds the
            // eventfd.
            doorbell.wakeDescriptor.store(wake, ordering: .sequentiallyConsistent)
            if doorbell.wakePending.load(ordering: .sequentiallyConsistent) { EventFD.signal(wake) }
            epollDescriptor.store(epoll, ordering: .releasing)
            return epoll
        }
    }

    /// Consumes a wake-up nobody sleeps for (a run that returns `.finished` at once), so that a
    /// hosted loop's descriptor does not stay readable. Loop-only.
    /// (A loop that is not hosted needs none of this: its next run makes a full pass before it
    /// sleeps, and a stale wake-up costs it one pass.)
    private func consumeStaleWake() {
        guard hosted.load(ordering: .relaxed) else { return }
        let wake = doorbell.wakeDescriptor.load(ordering: .acquiring)
        guard wake >= 0 else { return }  // never slept: the eventfd's maker signals it
        // Drained whatever the flag says: a waker may have set it before this looked and
        // written after. Drained, the eventfd no longer counts as ready when the host polls the
        // descriptor, though its edge was never reported (the kernel polls a ready item again).
        EventFD.drain(wake)
        _ = doorbell.wakePending.exchange(false, ordering: .acquiringAndReleasing)
        // A deadline armed before the loop was hosted, which no pass would read now.
        disarmDeadline()
        // Work a consumed wake-up announced for another mode keeps the descriptor readable:
        // queued work, and sources a nested run deferred or parked for the host's mode.
        if hasQueuedWork(nil) || !deferredSignalled.isEmpty || !parkedSources.isEmpty { wakeUp() }
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

    /// Notes that a custom source of this loop was signalled: its next pass in one of the
    /// source's modes performs it. Safe from any thread.
    func noteSignalled(_ source: PKCustomSource) { doorbell.noteSignalled(source) }

    /// Notes that an item of this loop was invalidated. Safe from any thread.
    func noteInvalidation() { invalidations.add(1, ordering: .releasing) }

    /// Notes that `source`, one of this loop's, was invalidated: the next purge removes it
    /// from its modes (see `noteInvalidationWaking`). Safe from any thread.
    func noteInvalidated(_ source: PKCustomSource) {
        // In no mode (removed from them before it was invalidated, as a port's adopter is):
        // nothing to purge, and nothing to keep it for; nor in the common items, which a
        // common mode added later would take it from.
        if isOwnedByCurrentThread && source.modes.isEmpty {
            commonItems.customSources[ObjectIdentifier(source)] = nil
            return
        }
        // Queued before it is counted: a purge that sees the count finds the source.
        invalidatedSources.withLock { $0?.append(source) }
        noteInvalidationWaking()
    }

    /// Takes the custom sources invalidated since the last call, handing the queue the buffer
    /// of the previous batch (a request's reply port is one a request: no allocation each).
    /// Loop-only.
    func takeInvalidatedSources() -> [PKCustomSource] {
        invalidatedSources.withLock { queue in
            guard queue?.isEmpty == false else { return [] }
            var taken = spareInvalidated
            spareInvalidated = []
            swap(&queue!, &taken)
            return taken
        }
    }

    /// Gives `takeInvalidatedSources` back its batch's buffer, emptied. Loop-only.
    func recycleInvalidatedSources(_ batch: consuming [PKCustomSource]) {
        batch.removeAll(keepingCapacity: true)
        spareInvalidated = batch
    }

    /// Notes that a timer or observer of the loop was invalidated (see `itemInvalidations`).
    /// Safe from any thread.
    func noteItemInvalidated() { itemInvalidations.add(1, ordering: .releasing) }

    /// The timer and observer invalidation count, for `purge`.
    var itemInvalidationCount: UInt64 { itemInvalidations.load(ordering: .acquiring) }

    /// Notes that a timer or custom source of this loop was invalidated, and wakes the loop so
    /// that a run whose mode it leaves empty ends. On the loop's own thread there is no one to
    /// wake: a pass purges before it sleeps, and a run before it starts (a wake-up written
    /// there only cost the next run a pass, two system calls and the write). A hosted loop is
    /// woken all the same: its host runs a pass only when `descriptor` is readable.
    /// Safe from any thread.
    func noteInvalidationWaking() {
        noteInvalidation()
        if hosted.load(ordering: .relaxed) || !isOwnedByCurrentThread { wakeUp() }
    }

    /// The invalidation count, for `purgeInvalid`.
    var invalidationCount: UInt64 { invalidations.load(ordering: .acquiring) }

    /// Wakes the loop if it sleeps, so it runs another pass (`CFRunLoopWakeUp`). Safe from any thread.
    public func wakeUp() { doorbell.wakeUp() }

    /// Ends the innermost run of the loop, which returns `.stopped` (`CFRunLoopStop`). Safe from
    /// any thread. If the loop is not running, its next run returns `.stopped` at once.
    public func stop() {
        // An exchange, not a store: a second stopper's store would cut the first one's writes
        // out of what the loop acquires when it takes the request.
        _ = stopRequested.exchange(true, ordering: .acquiringAndReleasing)
        wakeUp()
    }

    /// Runs `block` on the loop's thread on a pass in one of `modes`, and wakes the loop so it
    /// does so promptly even if it was asleep (`CFRunLoopPerformBlock` + `CFRunLoopWakeUp`, the
    /// guide's `performSelector:onThread:`). Blocks run in the order they were given. A pass
    /// that runs a block has handled a source, as one that performs a selector has in Apple's
    /// loop: a run asked to return after a handled source (`runOnce`) returns after it, so a
    /// worker's `while !shouldExit { loop.runOnce(...) }` sees a flag a block set. A block
    /// given once the loop's thread has ended is dropped, as those still queued at its end are
    /// (no pass will ever run it, and kept, it would keep what it holds, the loop perhaps). Safe
    /// from any thread.
    public func perform(inModes modes: [PKRunLoopMode] = [.common], _ block: @escaping @Sendable () -> Void) {
        // Looked at under the queue's lock, as `performHousekeeping` does; a dropped block is
        // released after it (its captures may perform on this loop as they go).
        let queued = performQueue.withLock { queue -> Bool in
            guard !housekeepingClosed else { return false }
            queue.append((modes, block))
            return true
        }
        guard queued else { return }
        performCount.add(1, ordering: .releasing)
        wakeUp()
    }

    /// Runs `block` on the loop's thread at its next pass in whatever mode (outside private
    /// runs: a request's or a check-in's wait), or in an empty mode's run, or when the thread
    /// ends; on the calling thread at once if the thread has ended. PortKit's own clean-up of items in no mode (a port released or invalidated on
    /// another thread after it left its modes): the loop may never run the modes a `perform`
    /// would wait for, and a block still queued when the thread ends runs rather than being
    /// dropped. Such a block is not a handled source. Safe from any thread.
    package func performHousekeeping(_ block: @escaping @Sendable () -> Void) {
        // Looked at under the queue's lock: the thread's end takes the queue under it too, once
        // every item has left the loop, and closes it; a block is either taken there or runs
        // here after that teardown.
        let queued = performQueue.withLock { queue -> Bool in
            guard !housekeepingClosed else { return false }
            queue.append((nil, block))
            return true
        }
        guard queued else { return block() }
        performCount.add(1, ordering: .releasing)
        wakeUp()
    }

    /// How many blocks given to `perform` wait to run (for tests). Safe from any thread.
    var queuedPerformBlocks: Int { performCount.load(ordering: .acquiring) }

    // MARK: - Running

    /// Runs the loop in `mode` until `deadline`, a stop, an empty mode or (if asked) one handled
    /// source (`CFRunLoopRunInMode`). Loop-only.
    ///
    /// A mode with no sources and no timers returns `.finished` at once, after running the
    /// blocks `perform` queued for it (`.handledSource` if it ran one and was asked to return
    /// after one; a block that gave the mode items goes on with them). A deadline that has
    /// passed still gets one pass that does not sleep. Timers never count as handled sources.
    ///
    /// Asked to return after a source, a run performs one custom source (others signalled with
    /// it stay signalled, and go first among sources of their order at the next run), and, as
    /// `CFRunLoop`'s, a run that had not waited before it looks once at its timers and
    /// descriptors first, if its mode has any (or the loop has writes waiting for room): it
    /// fires the timers due and handles one ready descriptor source, without sleeping. A run
    /// that waited for its source returns at once.
    ///
    /// - Parameters:
    ///   - mode: the mode to run; not `.common`.
    ///   - deadline: when to return `.timedOut`.
    ///   - returnAfterSourceHandled: return `.handledSource` after the first source handled (a
    ///     custom source performed, a descriptor source's handler called, or blocks given to
    ///     `perform` run).
    /// - Returns: why the run ended.
    @discardableResult
    public func run(
        in mode: PKRunLoopMode = .default, until deadline: PKDeadline = .distantFuture,
        returnAfterSourceHandled: Bool = false
    ) -> PKRunLoopRunResult {
        assertOwner("run(in:until:returnAfterSourceHandled:)")
        // `.common` never has a record of its own (its items join each common mode's), so only
        // a mode without one needs the string comparison.
        guard let record = recordReference(mode) else {
            precondition(mode != .common, "PKRunLoop.run: a loop cannot run in the common-modes pseudo-mode; run a real mode such as .default")
            return runEmpty(mode, deadline, returnAfterSourceHandled)
        }
        // Borrowed: `modeItems` holds it for as long as the loop runs (see `lastRecord`).
        return record._withUnsafeGuaranteedRef { run($0, deadline, returnAfterSourceHandled) }
    }

    /// `run(in:until:returnAfterSourceHandled:)` once the mode's record is found.
    private func run(_ record: ModeRecord, _ deadline: PKDeadline, _ returnAfterSourceHandled: Bool) -> PKRunLoopRunResult {
        let mode = record.mode
        if threadEnded { return .finished }
        purgeInvalid(record)
        if record.isEmpty { return runEmpty(mode, deadline, returnAfterSourceHandled) }
        unowned(unsafe) let previous = currentRecord
        // Whether this run is nested in another's (`previous` is not nil), asked once: each
        // look at an unowned reference makes it strong, a retain and a release.
        let nested = previous != nil
        currentRecord = record
        // Signalled sources of this mode may have been skipped while another mode ran: those
        // wait in `deferredSignalled`; and a nested run in a source's perform looks at the rest
        // of the outer pass's batch. (Every other signal sets the hint itself.)
        if !deferredSignalled.isEmpty || signalledCursor < signalledBatch.count {
            doorbell.signalHint.store(true, ordering: .releasing)
        }
        if runDepth == 0 { waits &+= 1 }
        runDepth += 1
        defer {
            if !pendingWrites.isEmpty { flushPendingWrites() }
            runDepth -= 1
            if runDepth == 0 && !blockedWrites.isEmpty { handBlockedWritesToFlusher() }
            currentRecord = previous
            // A nested run may have deferred signalled sources of the outer mode: the hint
            // makes the outer pass look at them before it sleeps. (Descriptor sources it parked
            // are watched again before the outer pass's wait.)
            if nested, !deferredSignalled.isEmpty { doorbell.signalHint.store(true, ordering: .releasing) }
            // Stay armed for the mode the loop returns to (the outer run's, or after the
            // outermost run this one's): a loop hosted through `descriptor` learns that way
            // when its next timer is due, now or once it is hosted. Any other run arms for its
            // mode before it sleeps, and so does the pass a nested run returns to.
            if hosted.load(ordering: .relaxed) {
                armTimer(for: previous ?? record)
                // Nor does a host's descriptor turn readable for a deadline no run waits for
                // (armed before the loop became hosted: a hosted loop never arms it).
                if !nested { disarmDeadline() }
            } else if !nested, armedRecord !== record {
                armTimer(for: record)
            }
        }
        notifyObservers(.entry, record)
        let result = runPasses(record, deadline, returnAfterSourceHandled)
        notifyObservers(.exit, record)
        // Work that arrived during the last pass (a wake-up that found one already pending), or
        // a ready source of this mode that a nested run parked after the pass's wait, must keep
        // `descriptor` readable for a host that runs one pass at a time.
        if result != .stopped && (hasPendingWork(mode) || hasParkedSource(in: mode)) { wakeUp() }
        return result
    }

    /// Runs the loop in `mode` for at most `timeout`. Loop-only.
    @discardableResult
    public func run(in mode: PKRunLoopMode = .default, for timeout: Duration, returnAfterSourceHandled: Bool = false) -> PKRunLoopRunResult {
        run(in: mode, until: .after(timeout), returnAfterSourceHandled: returnAfterSourceHandled)
    }

    /// Runs the loop once in `mode`, returning after the first source handled or at `deadline`
    /// (`-[NSRunLoop runMode:beforeDate:]`): `run(in:until:returnAfterSourceHandled:)` with
    /// `true`, whose documentation says what one run handles. Loop-only.
    ///
    /// - Returns: `false` if the mode has no sources, no timers and no `perform` blocks queued
    ///   for it (the run did not start); `true` for a run that started, even if its mode
    ///   emptied in it (a one-shot timer that fired).
    @discardableResult
    public func runOnce(in mode: PKRunLoopMode = .default, before deadline: PKDeadline) -> Bool {
        assertOwner("runOnce(in:before:)")
        let starts = record(mode).map { record in
            purgeInvalid(record)
            return !record.isEmpty
        } ?? false
        // A mode with nothing but blocks queued for it starts too, and its run handles them.
        return run(in: mode, until: deadline, returnAfterSourceHandled: true) == .handledSource || starts
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

    /// A run in a mode of PortKit's own (a request's wait for its reply, a check-in's): as
    /// `run(in:until:returnAfterSourceHandled:)`, except that on a hosted loop between two of
    /// its host's passes it leaves the loop as it found it for the host's mode. The timers'
    /// timerfd is armed for that mode again (an outermost run otherwise stays armed for its own
    /// mode, whose timers no host runs), and work for other modes that woke the private run (a
    /// perform, a signal, a source that became ready), which it could not do, keeps
    /// `descriptor` readable for the host's next pass. A stop ends the private run and is
    /// passed on, not consumed: it is not the private run's, and the run the wait was made in
    /// returns `.stopped` too. Loop-only.
    @discardableResult
    package func runPrivately(
        in mode: PKRunLoopMode, until deadline: PKDeadline, returnAfterSourceHandled: Bool
    ) -> PKRunLoopRunResult {
        let hostRecord = armedRecord
        privateRuns += 1
        let result = run(in: mode, until: deadline, returnAfterSourceHandled: returnAfterSourceHandled)
        privateRuns -= 1
        if result == .stopped { stop() }
        guard currentRecord == nil else { return result }
        // (Hosted may have begun during the run: a handler read `descriptor`.)
        if hosted.load(ordering: .relaxed) {
            armTimer(for: hostRecord)
            let hostMode = hostRecord?.mode  // nil: the host never ran, nor armed for a timer
            let parked = hostMode.map { hasParkedSource(in: $0) } ?? !parkedSources.isEmpty
            let deferred = hostMode.map { hasDeferredSource(in: $0) } ?? !deferredSignalled.isEmpty
            // (`hasQueuedWork` counts a signal not yet taken for any mode: at worst the host
            // makes one pass for nothing.)
            if parked || deferred || hasQueuedWork(hostMode) { wakeUp() }
        }
        return result
    }

    private func runPasses(_ record: ModeRecord, _ deadline: PKDeadline, _ returnAfter: Bool) -> PKRunLoopRunResult {
        let mode = record.mode
        let capacity = EventBuffer.capacity
        // (A while: a run nested in an entry observer of the first run comes before that run made
        // its buffer.)
        while eventBuffers.count < runDepth { addEventBuffer() }
        let buffer = eventBuffers[runDepth - 1]
        let readyEvents = buffer.events
        let readyTokens = buffer.tokens
        // A stop requested while the loop was not running ends this run before it does anything.
        if takeStopRequest() { return .stopped }
        // Whether this run has looked at its timers and descriptors (a pass's wait, or poll).
        var looked = false
        while true {
            passNumber &+= 1
            if !parkedSources.isEmpty { registerParkedSources(for: mode) }
            notifyObservers(.beforeTimers, record)
            notifyObservers(.beforeSources, record)
            // A block performed counts as a handled source, as `performSelector:onThread:`'s
            // source does in Apple's loop (Listing 3-14's worker loop ends on one).
            var handledSource = runPerformBlocks(mode)
            if performCustomSources(record, returnAfter) { handledSource = true }
            if runPerformBlocks(mode) { handledSource = true }
            // A run that returns after a source has looked at its timers and descriptors first,
            // as `CFRunLoop`'s does (it polls, fires due timers, and handles one ready
            // descriptor source): a loop run once a message, whose sources are always signalled
            // again by the time it runs, would otherwise never fire a timer or read a socket.
            // The guide's round trip waited for its message, and returns at once; so does a run
            // whose mode has neither timers nor descriptor sources to look at, and the loop no
            // blocked write to retry (a request's wait for its answer, which has often come
            // before the wait began: the look was an epoll_wait a request, a fifth of a
            // request's time between threads on one CPU).
            if handledSource && returnAfter && (looked || (!record.hasTimersOrDescriptors && blockedWrites.isEmpty)) {
                return .handledSource
            }

            let pollOnly = handledSource || hasPendingWork(mode)
            armTimer(for: record)
            if !pendingWrites.isEmpty { flushPendingWrites() }
            let unobserved = record.observedActivities.isDisjoint(with: [.beforeWaiting, .afterWaiting])
            var timeout: Int32 = pollOnly ? 0 : sleepTimeout(until: deadline, unobserved: unobserved)
            // A pass that will not sleep (something ready, or the deadline passed) does not say so.
            let sleeps = timeout != 0
            if sleeps {
                let observed = record.observedActivities.contains(.beforeWaiting)
                notifyObservers(.beforeWaiting, record)
                // Items invalidated on this thread since the last purge (by a perform block or
                // an observer, say) woke no one: purge them now. If the mode is empty (an
                // observer may also have removed its last item), or the beforeWaiting observers
                // or the purge's cancel routines gave the loop work (another invalidation, a
                // signal, a perform, a stop, a send), the wait only polls, and the end of the
                // pass sees to it (an empty mode returns `.finished` there). Nothing else runs
                // between `pollOnly` and here.
                let purgedBefore = record.purgedAt
                purgeInvalid(record)
                if record.isEmpty {
                    timeout = 0
                } else if observed || record.purgedAt != purgedBefore {
                    if record.purgedAt != invalidationCount || hasQueuedWork(mode) || hasDeferredSource(in: mode) {
                        timeout = 0
                    } else {
                        armTimer(for: record)  // the timers may have changed
                        // And the deadline's timerfd: a nested run may have read it, or armed it
                        // for its own deadline.
                        timeout = sleepTimeout(until: deadline, unobserved: unobserved)
                    }
                    if !pendingWrites.isEmpty { flushPendingWrites() }
                }
            }
            // Ready descriptor sources of this mode that a nested run parked during this pass
            // (in an observer, a perform block, a custom source) are watched again before the
            // wait, which then reports them.
            if !parkedSources.isEmpty { registerParkedSources(for: mode) }
            // A timer the timerfd could not be armed for bounds the wait itself.
            if timeout != 0, let due = timerWithoutDescriptor { timeout = Self.bounded(timeout, by: due) }
            // A loop that has watched nothing and never slept has no epoll descriptor yet, and
            // nothing it could report: a pass that does not sleep skips the system call.
            var epoll = epollDescriptor.load(ordering: .acquiring)
            if epoll < 0 && timeout != 0 { epoll = makeKernelObjectsOrNap(timeout) }
            if timeout != 0 { waits &+= 1 }
            let count = epoll < 0 ? 0 : (try? Epoll.wait(epoll, events: readyEvents, tokens: readyTokens, capacity: capacity, timeoutMilliseconds: timeout)) ?? 0
            if sleeps { notifyObservers(.afterWaiting, record) }
            looked = true

            for index in 0..<count {
                switch readyTokens[index] {
                case Token.wake:
                    // The eventfd is watched edge-triggered: each write is reported once, so the
                    // wake-up is consumed without reading it (a `read` per wake-up, two system
                    // calls per round trip between threads, saved; its counter only grows, and
                    // would need 2^64 wake-ups to saturate).
                    // An exchange, not a store: it acquires whatever a waker published before it
                    // found a wake-up already pending (and so did not write the eventfd).
                    _ = doorbell.wakePending.exchange(false, ordering: .acquiringAndReleasing)
                case let token where token < Token.firstSource || token & Token.blockedWrite != 0:
                    handleTimerOrBlockedWrite(token)
                default:
                    break
                }
            }
            // Due timers first (even if the timerfd has not been read yet), then ready
            // descriptor sources, as the pass above documents.
            fireDueTimers(record)
            var handledDescriptor = false
            for index in 0..<count where readyTokens[index] >= Token.firstSource && readyTokens[index] & Token.blockedWrite == 0 {
                if handledDescriptor && returnAfter { break }
                if handleDescriptorEvent(token: readyTokens[index], mask: readyEvents[index], mode: mode) {
                    handledDescriptor = true
                }
            }
            if handledDescriptor { handledSource = true }
            if runPerformBlocks(mode) { handledSource = true }

            if handledSource && returnAfter { return .handledSource }
            if takeStopRequest() { return .stopped }
            if threadEnded { return .finished }
            if deadline.hasPassed { return .timedOut }
            purgeInvalid(record)
            if record.isEmpty { return .finished }
        }
    }

    /// The epoll timeout of a pass that may sleep until `deadline`: 0 once it has passed, and
    /// otherwise -1 (no timeout) while `deadlineFD` fires by then. An epoll timeout costs the
    /// kernel a timer started and cancelled on every sleep (about 0.17 µs each on the machine of
    /// the run of `51a6336`, docs/performance-history.md; nothing measurable on `cc456c6`'s), and
    /// the guide's loops sleep once a message, each run with a deadline a little later than the
    /// last: the timerfd is armed only when it would fire after `deadline`, so it stays armed at an
    /// earlier run's deadline and fires at most that early, for one pass more (its end sees that
    /// the deadline has not passed, and the next pass arms it for this one). Without a timerfd (out
    /// of descriptors) the epoll timeout bounds the wait, and so it does on a hosted loop, whose
    /// host must not be woken by a deadline no run waits for (its requests' waits are not the
    /// guide's hot path).
    ///
    /// `unobserved`: no observer of the mode watches the wait. Then, while the timerfd is armed
    /// at this deadline or an earlier one and not yet read, it ends the wait by the deadline,
    /// and at once if the deadline has passed (it is then readable): the clock is not read
    /// (a call into the kernel's clock per message, about 26 ns on the machine of
    /// docs/performance-history.md, "The bounds as written for `2d83177`'s run"). A pass whose deadline has passed then waits for that timerfd
    /// instead of polling, which only an observer of the wait could tell.
    private func sleepTimeout(until deadline: PKDeadline, unobserved: Bool) -> Int32 {
        if deadline.uptimeNanoseconds == .max { return -1 }  // .distantFuture
        if unobserved, let armed = armedDeadline, armed <= deadline.uptimeNanoseconds, !hosted.load(ordering: .relaxed) {
            return -1
        }
        let now = monotonicNanoseconds()
        let timeout = deadline.pollTimeoutMilliseconds(now: now)
        if timeout == 0 || hosted.load(ordering: .relaxed) { return timeout }
        if let armed = armedDeadline, armed <= deadline.uptimeNanoseconds { return -1 }
        guard let fd = deadlineTimer() else { return timeout }
        TimerFD.set(fd, deadline: deadline.uptimeNanoseconds)
        armedDeadline = deadline.uptimeNanoseconds
        return -1
    }

    /// Disarms `deadlineFD` (an expiry not yet read goes with it).
    private func disarmDeadline() {
        guard armedDeadline != nil else { return }
        armedDeadline = nil
        TimerFD.set(deadlineFD, deadline: nil)
    }

    /// The timerfd for runs' deadlines, made and watched on first use; `nil` if it cannot be
    /// (out of descriptors). Loop-only.
    func deadlineTimer() -> Int32? {
        if deadlineFD < 0 { deadlineFD = (try? makeWatchedTimerFD(token: Token.deadline)) ?? -1 }
        return deadlineFD >= 0 ? deadlineFD : nil
    }

    /// A new timerfd that epoll watches under `token` (the loop's epoll descriptor is made if
    /// need be).
    private func makeWatchedTimerFD(token: UInt64) throws(PKError) -> Int32 {
        let epoll = try epollFD()
        let made = try TimerFD.create()
        do throws(PKError) { try Epoll.add(epoll, made, events: Epoll.readable, token: token) } catch {
            Descriptor.close(made)
            throw error
        }
        return made
    }

    // MARK: - A pass's rare steps
    //
    // Out of line (`@inline(never)`), as are the others marked so in this file: their code would
    // otherwise sit among the pass's own, which every message runs, and spread it over more
    // lines of the instruction cache.

    /// One more event buffer, for a run nested deeper than any before.
    @inline(never)
    private func addEventBuffer() { eventBuffers.append(EventBuffer()) }

    /// `timeout` (-1: none) shortened to end when `due` (monotonic nanoseconds) comes.
    @inline(never)
    private static func bounded(_ timeout: Int32, by due: UInt64) -> Int32 {
        let untilDue = PKDeadline(uptimeNanoseconds: due).pollTimeoutMilliseconds(now: monotonicNanoseconds())
        // (-1: a timer that never fires bounds nothing.)
        if untilDue < 0 { return timeout }
        return timeout < 0 || untilDue < timeout ? untilDue : timeout
    }

    /// The epoll descriptor, made for the loop's first sleep; without one (out of descriptors)
    /// the loop naps for `timeout` instead, and the result is -1.
    @inline(never)
    private func makeKernelObjectsOrNap(_ timeout: Int32) -> Int32 {
        do throws(PKError) { return try makeKernelObjects() } catch {
            napWithoutDescriptors(timeout, error)
            return -1
        }
    }

    /// Out of descriptors at the loop's first sleep: sleeps at most 10 ms without epoll (a
    /// wake-up from another thread is seen within that), and the next pass tries again.
    private func napWithoutDescriptors(_ timeout: Int32, _ error: PKError) {
        if !reportedNoDescriptors {
            reportedNoDescriptors = true
            Self.logger.error("the run loop of thread \(threadID) cannot make its epoll descriptor (\(error)); it polls every 10 ms until it can")
        }
        _ = try? Descriptor.poll(-1, events: 0, timeoutMilliseconds: timeout < 0 ? 10 : Swift.min(timeout, 10))
    }

    /// Takes a stop request, if there is one. Every pass asks, and almost every pass finds
    /// none: a load comes first, since the exchange that takes it is a locked instruction
    /// (about 4.7 ns on these machines, docs/performance.md).
    private func takeStopRequest() -> Bool {
        stopRequested.load(ordering: .relaxed) && stopRequested.exchange(false, ordering: .acquiringAndReleasing)
    }

    /// Whether a stop, or a perform block for `mode` (for any mode when `nil`), is queued.
    /// Inlined: every pass that handled no source asks, and so does a run's end; almost always
    /// two loads answer.
    @inline(__always)
    private func stopOrPerformQueued(_ mode: PKRunLoopMode?) -> Bool {
        if stopRequested.load(ordering: .acquiring) { return true }
        guard performCount.load(ordering: .acquiring) > 0 else { return false }
        return performQueued(for: mode)
    }

    /// Whether a perform block for `mode` (any mode when `nil`) is queued, the count being
    /// positive.
    @inline(never)
    private func performQueued(for mode: PKRunLoopMode?) -> Bool {
        guard let mode else { return true }
        return performQueue.withLock { queue in queue.contains { modesMatch($0.modes, mode) } }
    }

    /// Whether work was queued for this loop that a sleep must not wait for: a stop, a perform in
    /// `mode` (any mode when `nil`), a signalled source. Unlike `hasPendingWork`, it does not
    /// count the hint a run leaves when it ends (a nested run in an observer would otherwise
    /// keep the loop from ever sleeping), and it takes the signalled queue's lock. Loop-only.
    private func hasQueuedWork(_ mode: PKRunLoopMode?) -> Bool {
        stopOrPerformQueued(mode) || doorbell.signalledQueue.withLock { $0?.isEmpty == false }
    }

    /// Whether a nested run took a signalled source of `mode` and deferred it (see `run`'s
    /// end). Loop-only.
    private func hasDeferredSource(in mode: PKRunLoopMode) -> Bool {
        deferredSignalled.contains { $0.modes.contains(mode) }
    }

    /// Whether a descriptor source of `mode` that watches something waits parked. Loop-only.
    @inline(__always)
    private func hasParkedSource(in mode: PKRunLoopMode) -> Bool {
        !parkedSources.isEmpty && hasWatchingParkedSource(in: mode)
    }

    /// `hasParkedSource(in:)` once some source is parked.
    @inline(never)
    private func hasWatchingParkedSource(in mode: PKRunLoopMode) -> Bool {
        parkedSources.contains { token in
            guard let source = descriptorSource(token) else { return false }
            return source.isIn(mode) && source.epollMask != nil
        }
    }

    /// Whether something is ready that must not wait for a sleep.
    private func hasPendingWork(_ mode: PKRunLoopMode) -> Bool {
        // Or a source signalled since this pass performed sources.
        stopOrPerformQueued(mode) || doorbell.signalHint.load(ordering: .acquiring)
    }

    // MARK: - Items in a pass

    /// Runs the perform blocks queued for `mode`; whether it ran any. Inlined: a pass asks up
    /// to three times, and almost always one load answers.
    @inline(__always)
    private func runPerformBlocks(_ mode: PKRunLoopMode) -> Bool {
        performCount.load(ordering: .acquiring) > 0 && runQueuedPerformBlocks(mode)
    }

    /// A run of a mode with no items. It runs the blocks queued for the mode (as Core
    /// Foundation counts a mode's blocks in whether it is empty) and the housekeeping queued,
    /// then ends: `.handledSource` if a `perform` block ran and the run was to return after
    /// one; the run goes on if a block gave the mode items; `.finished` otherwise.
    @inline(never)
    private func runEmpty(_ mode: PKRunLoopMode, _ deadline: PKDeadline, _ returnAfterSourceHandled: Bool) -> PKRunLoopRunResult {
        consumeStaleWake()
        guard !threadEnded, performCount.load(ordering: .acquiring) > 0, runQueuedPerformBlocks(mode) else { return .finished }
        if returnAfterSourceHandled { return .handledSource }
        guard let record = record(mode) else { return .finished }
        purgeInvalid(record)
        return record.isEmpty ? .finished : run(in: mode, until: deadline)
    }

    /// Runs the blocks queued for `mode` and the housekeeping; whether one of them was a
    /// `perform` block (a handled source).
    @inline(never)
    private func runQueuedPerformBlocks(_ mode: PKRunLoopMode) -> Bool {
        var handled = false
        let runnable: [@Sendable () -> Void] = performQueue.withLock { queue in
            var taken: [@Sendable () -> Void] = []
            queue.removeAll { item in
                guard modesMatch(item.modes, mode) else { return false }
                if item.modes != nil { handled = true }
                taken.append(item.block)
                return true
            }
            return taken
        }
        guard !runnable.isEmpty else { return false }
        performCount.subtract(runnable.count, ordering: .releasing)
        for block in runnable { block() }
        return handled
    }

    /// Whether a block queued for `modes` (`nil`: any mode, outside private runs) runs in `mode`.
    private func modesMatch(_ modes: [PKRunLoopMode]?, _ mode: PKRunLoopMode) -> Bool {
        guard let modes else { return privateRuns == 0 }
        return modes.contains { $0 == mode || ($0 == .common && commonModes.contains(mode)) }
    }

    /// Performs the signalled sources of the running mode, in their order; those of other
    /// modes wait in `deferredSignalled` for a run of theirs. Inlined: the hint is looked at
    /// before it is taken, since most passes find it clear, and a load is cheaper than a call
    /// and a locked exchange (as for a stop request).
    @inline(__always)
    private func performCustomSources(_ record: ModeRecord, _ returnAfter: Bool) -> Bool {
        doorbell.signalHint.load(ordering: .relaxed) && performSignalledSources(record, returnAfter)
    }

    /// `performCustomSources` once the hint is set: takes it, and performs what was signalled.
    /// With `returnAfter`, only the first that performs (as `CFRunLoop` does when a run returns
    /// after a source): the rest stay signalled for the next pass.
    @inline(never)
    private func performSignalledSources(_ record: ModeRecord, _ returnAfter: Bool) -> Bool {
        guard doorbell.signalHint.exchange(false, ordering: .acquiringAndReleasing) else { return false }
        // The spare buffer is moved, not copied, into the queue: a copy is a retain and a
        // release, and it would leave the queue's buffer shared until the end, so that a
        // signal from another thread meanwhile copied it under the lock. (A nested run in the
        // perform of a batch finds no spare, and gives the queue an empty array; one source
        // alone gives the spare back before its perform.)
        var candidates: [PKCustomSource] = []
        swap(&spareSignalled, &candidates)
        doorbell.signalledQueue.withLock { queue in
            if queue != nil { swap(&queue!, &candidates) }
        }
        if !deferredSignalled.isEmpty {
            // In front: among sources of one order, those that waited go first (a source
            // signalled again at every pass would otherwise always come before them, in a loop
            // run one source at a time).
            candidates.insert(contentsOf: deferredSignalled, at: 0)
            deferredSignalled.removeAllKeepingStorage()
        }
        // In a nested run: what the outer pass took and has not looked at yet.
        if signalledCursor < signalledBatch.count { takeRestOfBatch(into: &candidates) }
        // Usually one: a port's message, moved out of the array rather than copied (a retain
        // and a release). No rest for a nested run to find, nor to leave.
        if candidates.count == 1 {
            let source = candidates.removeLast()
            swap(&spareSignalled, &candidates)
            return perform(source, record)
        }
        defer {
            candidates.removeAllKeepingStorage()
            swap(&spareSignalled, &candidates)
        }
        return performBatch(&candidates, record, returnAfter)
    }

    /// Performs `source` if it is still signalled, valid and in the running mode. Checked now,
    /// not when taken: an earlier callback may have removed it from the mode. One in another
    /// mode waits in `deferredSignalled`; one in no mode any more is let go (it stays
    /// signalled: adding it to a mode again queues it again), not deferred, where it would be
    /// kept, and looked at every run, for as long as the loop lives.
    @inline(__always)
    private func perform(_ source: PKCustomSource, _ record: ModeRecord) -> Bool {
        guard source.isSignalled && source.isValid else { return false }
        guard source.modes.contains(record.mode) else {
            if !source.modes.isEmpty { deferredSignalled.append(source) }
            return false
        }
        return source.performIfSignalled()
    }

    /// Performs several signalled sources, in their order, from `signalledBatch`, where a
    /// nested run in one of their performs finds the rest; the outer pass's batch (usually
    /// none) waits in `candidates` meanwhile.
    @inline(never)
    private func performBatch(_ candidates: inout [PKCustomSource], _ record: ModeRecord, _ returnAfter: Bool) -> Bool {
        if candidates.count > 1 { orderCandidates(&candidates) }
        swap(&signalledBatch, &candidates)
        let outerCursor = signalledCursor
        signalledCursor = 0
        defer {
            swap(&signalledBatch, &candidates)
            signalledCursor = outerCursor
        }
        var handled = false
        while signalledCursor < signalledBatch.count {
            let source = signalledBatch[signalledCursor]
            signalledCursor += 1
            guard perform(source, record) else { continue }
            handled = true
            if returnAfter {
                if signalledCursor < signalledBatch.count { deferRestOfBatch() }
                break
            }
        }
        return handled
    }

    /// Moves what the outer pass's batch has not looked at yet into `candidates` (a nested
    /// run's), in front: they were signalled first. Out of line: nested runs are rare.
    @inline(never)
    private func takeRestOfBatch(into candidates: inout [PKCustomSource]) {
        candidates.insert(contentsOf: signalledBatch[signalledCursor...], at: 0)
        signalledBatch.removeSubrange(signalledCursor...)
    }

    /// A run that returns after one source leaves the rest of the batch for the next pass:
    /// they wait with the deferred sources, which the hint makes the next pass look at (and a
    /// hosted loop's host learns of them from its descriptor).
    @inline(never)
    private func deferRestOfBatch() {
        deferredSignalled.append(contentsOf: signalledBatch[signalledCursor...])
        signalledBatch.removeSubrange(signalledCursor...)
        doorbell.signalHint.store(true, ordering: .releasing)
        if hosted.load(ordering: .relaxed) { wakeUp() }
    }

    /// Sorts signalled sources by order (stable), each once.
    private func orderCandidates(_ candidates: inout [PKCustomSource]) {
        var seen = Set<ObjectIdentifier>()
        candidates = candidates.enumerated()
            .filter { seen.insert(ObjectIdentifier($0.element)).inserted }
            .sorted { ($0.element.order, $0.offset) < ($1.element.order, $1.offset) }
            .map(\.element)
    }

    /// Fires the due timers of `record`'s mode. Inlined: most modes have none.
    @inline(__always)
    private func fireDueTimers(_ record: ModeRecord) {
        if !record.timers.isEmpty { fireDueTimersNow(record) }
    }

    @inline(never)
    private func fireDueTimersNow(_ record: ModeRecord) {
        refreshTimerDates(record)
        let now = monotonicNanoseconds()
        // Most passes find no timer due: look before making anything.
        guard record.earliestFire <= now else { return }
        // By fire date, and for one date in the order they were added (as CFRunLoop does).
        let due = record.timers.values.filter { $0.isValid && !$0.isFiring && $0.fireNanoseconds <= now }
            .sorted { ($0.fireNanoseconds, $0.addedSequence) < ($1.fireNanoseconds, $1.addedSequence) }
        // `due` is a snapshot: skip a timer that an earlier callback removed or moved.
        for timer in due where timer.isValid && timer.fireNanoseconds <= now && record.timers[ObjectIdentifier(timer)] != nil {
            timer.fireOnLoop(self, now: monotonicNanoseconds)
        }
    }

    /// Notes that a timer of this loop may have changed (added, removed, fired, moved,
    /// invalidated): each mode's earliest dates are computed again when next read. Safe from
    /// any thread.
    func noteTimersChanged() { timerEpoch.add(1, ordering: .releasing) }

    /// Computes `record`'s earliest timer dates again if a timer changed since they were:
    /// a pass costs the same with a thousand timers waiting as with none.
    @inline(__always)
    private func refreshTimerDates(_ record: ModeRecord) {
        // Acquiring: a timer invalidated on another thread before it counted is seen invalid.
        let epoch = timerEpoch.load(ordering: .acquiring)
        guard record.timersSeenAt != epoch else { return }
        record.timersSeenAt = epoch
        var fire = UInt64.max
        var latest: UInt64? = nil
        for timer in record.timers.values where timer.isValid && !timer.isFiring {
            fire = min(fire, timer.fireNanoseconds)
            let must = timer.latestNanoseconds
            if latest == nil || must < latest! { latest = must }
        }
        record.earliestFire = fire
        record.earliestLatest = latest
    }

    /// Arms the timerfd for `mode` (see `armTimer(for record:)`).
    func armTimer(for mode: PKRunLoopMode?) {
        armTimer(for: mode.flatMap { record($0) })
    }

    /// Arms the timerfd at the latest moment that still fires every timer of the mode within
    /// its tolerance; re-arms only when that moment changes. Inlined: every pass that does not
    /// return before its wait asks, and for a mode without timers that is already armed for,
    /// nothing changes.
    @inline(__always)
    private func armTimer(for record: ModeRecord?) {
        if let record, record.timers.isEmpty, armedRecord === record, armedTimer == nil, timerWithoutDescriptor == nil { return }
        armTimerNow(for: record)
    }

    @inline(never)
    private func armTimerNow(for record: ModeRecord?) {
        var earliest: UInt64? = nil
        if let record, !record.timers.isEmpty {
            refreshTimerDates(record)
            earliest = record.earliestLatest
        }
        if armedRecord !== record { armedRecord = record }
        timerWithoutDescriptor = nil
        guard earliest != armedTimer else { return }
        armedTimer = earliest
        if timerFD < 0 {
            guard earliest != nil else { return }
            do throws(PKError) { timerFD = try makeWatchedTimerFD(token: Token.timer) } catch {
                // Out of descriptors: the timerfd cannot wake the loop now, so the pass's wait
                // ends by the timer's time instead; the next arming tries again.
                armedTimer = nil
                timerWithoutDescriptor = earliest
                return
            }
        }
        TimerFD.set(timerFD, deadline: earliest)
    }

    /// Between passes, a hosted loop's timerfd follows a change of timers (its host waits for
    /// the descriptor, not for a run): armed for the mode it was last armed for, or `mode`'s if
    /// it never was (the default mode's for a timer of the common modes). Loop-only.
    func armHostedBetweenPasses(_ mode: PKRunLoopMode?) {
        guard hosted.load(ordering: .relaxed) else { return }
        let firstMode = mode == .common ? PKRunLoopMode.default : mode
        guard let target = armedRecord ?? firstMode.flatMap({ record($0) }) else { return }
        armTimer(for: target)
    }

    /// Called when a timer's dates change, so the timerfd follows.
    func timersChanged() {
        noteTimersChanged()
        if ThreadIdentity.current == threadID {
            armedTimer = .max - 1  // force a re-arm on the next pass
            if currentMode != nil { armTimer(for: currentMode) } else { armHostedBetweenPasses(nil) }
        } else {
            wakeUp()
        }
    }

    private func handleDescriptorEvent(token: UInt64, mask: UInt32, mode: PKRunLoopMode) -> Bool {
        // The source is held while its handler runs (as CFRunLoop holds a source it calls out
        // to): a handler may remove it, and still use it.
        guard let source = descriptorSource(token) else { return false }
        guard source.isIn(mode) else {
            park(source)
            return false
        }
        // Only what the source still watches: a handler earlier in this pass may have changed
        // its events (`[]` stops watching, even hang-ups) after the wait reported them.
        let watched = source.events
        var events = PKDescriptorSource.events(fromEpoll: mask)
        if !watched.isSuperset(of: events) {
            guard !watched.isEmpty else { return false }
            events.formIntersection(watched.union([.hangUp, .error]))
            guard !events.isEmpty else { return false }
        }
        source.callHandler(events, self)
        return true
    }

    /// Ready, but not in the running mode: the source is not watched until a run in one of its
    /// modes. Out of line (see "A pass's rare steps").
    @inline(never)
    private func park(_ source: PKDescriptorSource) {
        unregister(source)
        parkedSources.insert(source.token)
    }

    /// Calls `record`'s observers of `activity`. The check is inlined into the pass; the calls,
    /// which a loop without observers never makes, are not (their code would sit among the
    /// pass's own).
    @inline(__always)
    func notifyObservers(_ activity: PKRunLoopActivity, _ record: ModeRecord) {
        guard record.observedActivities.contains(activity) else { return }
        callObservers(activity, record)
    }

    @inline(never)
    private func callObservers(_ activity: PKRunLoopActivity, _ record: ModeRecord) {
        for observer in record.observers { observer.call(activity) }
    }

    /// Lends the loop's read area to `body`. Loop-only, and not re-entrant: `body` must not
    /// run anything that reads another connection.
    func withReadStorage(_ body: (inout [UInt8]) -> Void) {
        body(&readStorage)
        // A large message grew it: keep the usual size only.
        if readStorage.count > 256 << 10 { readStorage = [] }
    }

    // MARK: - Coalesced writes

    /// The calling thread's loop, running or not, not retained: the thread's slot holds the
    /// loop until the thread ends, and a loop, having weak references, is costly to retain.
    /// Valid on the calling thread for as long as it is on the stack.
    struct ThreadLoop {
        /// The loop's identity.
        let id: ObjectIdentifier
        /// Whether the loop is running (inside a pass).
        let isRunning: Bool
        /// The pass the loop is in, when it is running.
        let pass: UInt64
        /// How many times the loop has waited (see `waits`).
        let waits: UInt64
        private let loop: Unmanaged<PKRunLoop>

        fileprivate init(_ unmanaged: Unmanaged<PKRunLoop>, _ loop: PKRunLoop) {
            self.loop = unmanaged
            self.id = ObjectIdentifier(loop)
            self.isRunning = loop.runDepth > 0
            self.pass = loop.passNumber
            self.waits = loop.waits
        }

        /// A send on this thread left bytes pending on `connection`: the loop writes them
        /// before it next waits. Only while the loop is running.
        func notePendingWrite(_ connection: SendConnection) {
            loop._withUnsafeGuaranteedRef { $0.pendingWrites.append(connection) }
        }
    }

    /// The calling thread's loop, if it has one: where a send may leave bytes pending for the
    /// loop to write, and whether the loop waited since a write (see `SendConnection.write`).
    static var onCurrentThread: ThreadLoop? {
        guard let unmanaged = ThreadLocalLoop.getUnmanaged() else { return nil }
        return unmanaged._withUnsafeGuaranteedRef { ThreadLoop(unmanaged, $0) }
    }

    /// Writes every connection's pending bytes the sockets take now; a connection whose socket
    /// is full is watched for room and finished when it has some. Loop-only.
    func flushPendingWrites() {
        // Swapped with a spare array, not copied: emptying a shared copy would copy it first.
        var connections = spareWrites
        swap(&connections, &pendingWrites)
        for connection in connections where blockedWrites[connection.fd] == nil {
            if connection.flushPendingWithoutWaiting() == .blocked { watchForRoom(connection) }
        }
        connections.removeAllKeepingStorage()
        spareWrites = connections
    }

    /// Writes `connection`'s pending bytes for a thread that is not running a loop (this is
    /// PortKit's flusher loop, `PKRunLoop.flusher`). Loop-only. `ownsDuty`: the caller took
    /// the connection's flush duty for this loop (not so for an invalidated connection's
    /// lingering bytes that another loop may have the duty to write too).
    func flushPendingWrites(of connection: SendConnection, ownsDuty: Bool = true) {
        guard blockedWrites[connection.fd] == nil else { return }
        if connection.flushPendingWithoutWaiting() == .blocked { watchForRoom(connection, ownsDuty: ownsDuty) }
    }

    /// Flushes pending bytes, waiting for room (`SendConnection.finalFlushPatience` at most,
    /// for all of them together), when the thread ends. Loop-only.
    func flushPendingWritesFinally() {
        let connections = pendingWrites + takeBlockedWrites()
        pendingWrites = []
        let limit = PKDeadline.after(SendConnection.finalFlushPatience)
        for connection in connections { connection.flushPending(until: limit) }
    }

    /// The connections watched for room, no longer watched. Loop-only.
    private func takeBlockedWrites() -> [SendConnection] {
        let epoll = epollDescriptor.load(ordering: .acquiring)
        for fd in blockedWrites.keys { Epoll.remove(epoll, fd) }
        defer { blockedWrites = [:] }
        return Array(blockedWrites.values)
    }

    /// The outermost run ends with connections whose bytes wait for room: the thread may not
    /// run its loop again for a long while (it waits on something else), and another thread's
    /// send to one of them only adds to its pending bytes, counting on this loop to write them.
    /// The flusher watches them instead. Loop-only; out of line (a run's rare step).
    @inline(never)
    private func handBlockedWritesToFlusher() {
        guard let flusher = PKRunLoop.flusher, flusher !== self else { return }
        for connection in takeBlockedWrites() {
            flusher.perform { flusher.flushPendingWrites(of: connection) }
        }
    }

    private func watchForRoom(_ connection: SendConnection, ownsDuty: Bool = true) {
        do throws(PKError) {
            try Epoll.add(try epollFD(), connection.fd, events: Epoll.writable, token: Token.blockedWrite | UInt64(UInt32(bitPattern: connection.fd)))
            blockedWrites[connection.fd] = connection
        } catch {
            // Not watchable (epoll refused a connected socket: out of memory). The bytes stay
            // pending, and the duty goes back (if it was this loop's): the connection's next
            // send arranges another flush, and the exit's flush no longer counts on this one.
            if ownsDuty { connection.flushDutyReturned() }
        }
    }

    /// A timerfd expired, or a connection blocked on a full socket may take bytes again. Out
    /// of line (see "A pass's rare steps").
    @inline(never)
    private func handleTimerOrBlockedWrite(_ token: UInt64) {
        switch token {
        case Token.timer:
            TimerFD.drain(timerFD)
            armedTimer = nil
        case Token.deadline:
            // A run's deadline (this run's, or an earlier run's that armed it): the end of the
            // pass compares this run's deadline with the clock.
            TimerFD.drain(deadlineFD)
            armedDeadline = nil
        case let token where token & Token.blockedWrite != 0:
            retryBlockedWrite(Int32(truncatingIfNeeded: token & 0xFFFF_FFFF))
        default:
            break
        }
    }

    private func retryBlockedWrite(_ fd: Int32) {
        guard let connection = blockedWrites[fd] else { return }
        if connection.flushPendingWithoutWaiting() == .blocked { return }
        Epoll.remove(epollDescriptor.load(ordering: .acquiring), fd)
        blockedWrites[fd] = nil
    }

    // MARK: - Thread end

    /// Called when the owning thread ends: every item leaves the loop (ports invalidate).
    func threadDidExit() {
        flushPendingWritesFinally()
        ended.store(true, ordering: .releasing)
        // From here the queue takes nothing (no purge would take it), and every source still in
        // a mode leaves it now, cancelled for each: those another thread is invalidating at
        // this moment too, which it may not have queued yet.
        // (Released after the lock: a source's closures may hold the last reference to an
        // object whose deinit invalidates another source, which takes the lock.)
        var queued: [PKCustomSource]? = nil
        invalidatedSources.withLock { swap(&queued, &$0) }
        queued = nil
        var sources: [ObjectIdentifier: PKCustomSource] = commonItems.customSources
        for record in modeItems.values { sources.merge(record.customSources) { first, _ in first } }
        for source in sources.values { source.invalidate() }
        removeEverywhere(Array(sources.values))
        for record in Array(modeItems.values) {
            for timer in record.timers.values { timer.invalidate() }
            for observer in record.observers { observer.invalidate() }
            purgeInvalid(record)
        }
        for case let source? in descriptorSlots { removeDescriptorSourceEverywhere(source) }
        modeItems = [:]
        lastRecord = nil
        commonItems = ModeRecord(mode: .common)
        deferredSignalled = []
        replySlots = []
        // Released after the locks: a block's captures may perform on this loop as they go.
        var signalled: [PKCustomSource]? = nil  // closes the queue
        doorbell.signalledQueue.withLock { swap(&signalled, &$0) }
        var blocks: [(modes: [PKRunLoopMode]?, block: @Sendable () -> Void)] = []
        performQueue.withLock { queue in
            swap(&blocks, &queue)
            housekeepingClosed = true
        }
        performCount.subtract(blocks.count, ordering: .releasing)
        signalled = []
        // Housekeeping runs (it closes what would otherwise leak); `perform` blocks are dropped.
        for item in blocks where item.modes == nil { item.block() }
        blocks = []
    }
}
