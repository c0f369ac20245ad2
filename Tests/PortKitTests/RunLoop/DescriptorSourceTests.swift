// Descriptor sources: readiness, level triggering, hang-up, removal from callbacks, a thousand
// sources on one loop, and a loop hosted by another event system through `descriptor`.

import Glibc
import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct DescriptorSourceTests {
        @Test func aReadableDescriptorCallsItsHandlerOnTheLoopThread() throws {
            let (events, onOwner, result) = try onLoopThread { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                var events: [PKIOEvents] = []
                var onOwner = false
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { ready in
                    events.append(ready)
                    onOwner = loop.isOwnedByCurrentThread
                    pipe.drain()
                }
                try loop.add(source, forMode: "ds-readable")
                pipe.makeReadable()
                let result = loop.run(in: "ds-readable", until: .after(.seconds(10)), returnAfterSourceHandled: true)
                source.invalidate()
                return (events, onOwner, result)
            }
            #expect(events == [.readable])
            #expect(onOwner)
            #expect(result == .handledSource)
        }

        @Test func readinessIsLevelTriggered() throws {
            let calls = try onLoopThread { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                var calls = 0
                // The handler leaves the byte unread: the next pass calls it again.
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    calls += 1
                    if calls == 3 { pipe.drain() }
                }
                try loop.add(source, forMode: "ds-level")
                pipe.makeReadable()
                for _ in 0..<5 { loop.runOnePass(in: "ds-level") }
                source.invalidate()
                return calls
            }
            #expect(calls == 3)
        }

        @Test func aClosedPeerIsReportedAsHangUp() throws {
            let events = try onLoopThread { loop in
                let pipe = try TestPipe()
                defer { close(pipe.readEnd) }
                var events: PKIOEvents = []
                var itself: PKDescriptorSource?
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { ready in
                    events = ready
                    itself!.events = []  // as documented: stop watching after a hang-up
                }
                itself = source
                try loop.add(source, forMode: "ds-hangup")
                close(pipe.writeEnd)
                loop.run(in: "ds-hangup", until: .after(.seconds(10)), returnAfterSourceHandled: true)
                source.invalidate()
                itself = nil
                return events
            }
            #expect(events.contains(.hangUp))
        }

        @Test func emptyEventsStopWatchingUntilSetAgain() throws {
            let (callsWhileEmpty, callsAfter, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "ds-empty-events"
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                var calls = 0
                let source = PKDescriptorSource(descriptor: pipe.readEnd, events: []) { _ in
                    calls += 1
                    pipe.drain()
                }
                try loop.add(source, forMode: mode)
                pipe.makeReadable()
                loop.run(in: mode, until: .after(.milliseconds(30)))
                let callsWhileEmpty = calls
                loop.scheduleTimer(after: .zero, forMode: mode) { _ in source.events = .readable }
                let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                source.invalidate()
                return (callsWhileEmpty, calls, result)
            }
            #expect(callsWhileEmpty == 0)
            #expect(callsAfter == 1)
            #expect(result == .handledSource)
        }

        /// epoll refuses a regular file: `add` throws, whether or not the loop is running, and
        /// the source is not left in the mode.
        @Test func aDescriptorEpollRefusesThrowsWhenAdded() throws {
            let (threwIdle, threwRunning, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "ds-refused"
                let fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC)
                guard fd >= 0 else { throw TestSystemCallFailed(call: "open", errno: errno) }
                defer { close(fd) }
                var threwIdle = false
                do { try loop.add(PKDescriptorSource(descriptor: fd) { _ in }, forMode: mode) } catch { threwIdle = true }
                var threwRunning = false
                keepAlive(loop, "ds-refused-running")
                loop.scheduleTimer(after: .zero, forMode: "ds-refused-running") { _ in
                    do { try loop.add(PKDescriptorSource(descriptor: fd) { _ in }, forMode: "ds-refused-running") } catch {
                        threwRunning = true
                    }
                }
                loop.run(in: "ds-refused-running", until: .after(.milliseconds(20)))
                return (threwIdle, threwRunning, loop.run(in: mode, until: .after(.seconds(5))))
            }
            #expect(threwIdle)
            #expect(threwRunning)
            #expect(result == .finished)
        }

        /// A source added with no events from a callback while its mode runs is watched as soon
        /// as its events are set.
        @Test func aSourceAddedWithNoEventsDuringARunIsWatchedOnceEventsAreSet() throws {
            let (calls, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "ds-added-empty-running"
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                var calls = 0
                let source = PKDescriptorSource(descriptor: pipe.readEnd, events: []) { _ in
                    calls += 1
                    pipe.drain()
                }
                keepAlive(loop, mode)
                loop.scheduleTimer(after: .zero, forMode: mode) { _ in
                    do { try loop.add(source, forMode: mode) } catch { return }
                    pipe.makeReadable()
                    loop.scheduleTimer(after: .milliseconds(5), forMode: mode) { _ in source.events = .readable }
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                source.invalidate()
                return (calls, result)
            }
            #expect(calls == 1)
            #expect(result == .handledSource)
        }

        /// A handler removes its own source from the run's only mode: it is not called again (its
        /// descriptor stays readable), the mode is empty so the run finishes, and the source stays
        /// valid (removal is not invalidation: no cancel) until it is invalidated.
        @Test func aSourceCanRemoveItselfInsideItsOwnHandler() throws {
            let (log, result, validAfterRemoval, contained) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "ds-remove-self"
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let log = Locked<[String]>([])
                var itself: PKDescriptorSource?
                let source = PKDescriptorSource(descriptor: pipe.readEnd, handler: { _ in
                    log.append("handler")
                    loop.remove(itself!, forMode: mode)
                    log.append("handler-end")
                }, cancel: { log.append("cancel") })
                itself = source
                try loop.add(source, forMode: mode)
                pipe.makeReadable()  // never drained: only the removal keeps it from firing again
                let result = loop.run(in: mode, until: .after(.seconds(10)))
                let validAfterRemoval = source.isValid
                let contained = !loop.isEmpty(mode)
                source.invalidate()
                itself = nil
                return (log.value, result, validAfterRemoval, contained)
            }
            #expect(log == ["handler", "handler-end", "cancel"])
            #expect(result == .finished)
            #expect(validAfterRemoval)
            #expect(!contained)
        }

        /// Two descriptors are ready in the same epoll_wait; whichever handler runs first removes
        /// the other source, which must not fire.
        @Test func aReadySourceRemovedByAnotherHandlerDoesNotFire() throws {
            let (log, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "ds-remove-other"
                let pipes = [try TestPipe(), try TestPipe()]
                defer { for pipe in pipes { pipe.closeBoth() } }
                let log = Locked<[String]>([])
                var sources: [PKDescriptorSource] = []
                for index in 0..<2 {
                    sources.append(PKDescriptorSource(descriptor: pipes[index].readEnd, handler: { _ in
                        log.append("handler\(index)")
                        loop.remove(sources[1 - index], forMode: mode)
                        pipes[index].drain()
                    }, cancel: { log.append("cancel\(index)") }))
                }
                for source in sources { try loop.add(source, forMode: mode) }
                keepAlive(loop, mode)
                for pipe in pipes { pipe.makeReadable() }
                let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                loop.runOnePass(in: mode)
                for source in sources { source.invalidate() }
                sources = []  // each handler captures the array: break the cycle (LeakSanitizer)
                return (log.value, result)
            }
            #expect(result == .handledSource)
            #expect(log == ["handler0", "cancel0", "cancel1"] || log == ["handler1", "cancel0", "cancel1"], "\(log)")
        }

        /// A thousand descriptor sources on one loop, one of them made ready: only that one fires.
        @Test func oneReadySourceAmongAThousandIsTheOnlyOneThatFires() throws {
            try descriptorHeavyTests.withLock { _ in
                let (fired, result) = try onLoopThread { loop in
                    let mode: PKRunLoopMode = "ds-thousand"
                    var pipes: [TestPipe] = []
                    defer { for pipe in pipes { pipe.closeBoth() } }
                    var fired: [Int] = []
                    var sources: [PKDescriptorSource] = []
                    for index in 0..<1_000 {
                        let pipe = try TestPipe()
                        pipes.append(pipe)
                        let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                            fired.append(index)
                            pipe.drain()
                        }
                        try loop.add(source, forMode: mode)
                        sources.append(source)
                    }
                    // Let the loop settle with nothing ready, then make one ready.
                    loop.run(in: mode, until: .after(.milliseconds(20)))
                    pipes[617].makeReadable()
                    let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                    loop.run(in: mode, until: .after(.milliseconds(20)))
                    for source in sources { source.invalidate() }
                    return (fired, result)
                }
                #expect(result == .handledSource)
                #expect(fired == [617])
            }
        }

        // MARK: - A loop hosted by another event system

        /// A foreign event loop (here plain `poll(2)` on the owner thread) hosts the run loop: it
        /// watches `loop.descriptor`, and when that is readable calls `runOnePass`, which handles
        /// the ready source and returns without blocking. A source added before the loop ever ran
        /// must make the descriptor readable too.
        @Test func aLoopHostedThroughItsDescriptorHandlesAReadySourceInOnePass() throws {
            let (readableBefore, readable, result, handled, readableAfter) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "ds-hosted"
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                var handled = 0
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    handled += 1
                    pipe.drain()
                }
                try loop.add(source, forMode: mode)
                let readableBefore = try pollReadable(loop.descriptor, timeoutMilliseconds: 0)
                pipe.makeReadable()
                let readable = try pollReadable(loop.descriptor, timeoutMilliseconds: 5_000)
                let result = loop.runOnePass(in: mode)
                let readableAfter = try pollReadable(loop.descriptor, timeoutMilliseconds: 0)
                source.invalidate()
                return (readableBefore, readable, result, handled, readableAfter)
            }
            #expect(!readableBefore)
            #expect(readable)
            #expect(result == .timedOut)
            #expect(handled == 1)
            #expect(!readableAfter)
        }

        /// The hosted loop's timers and cross-thread work make the descriptor readable as well,
        /// so a host that runs a pass whenever it is readable fires a timer once it is due and
        /// runs a block another thread performs. (Readable may also mean a wake-up the loop no
        /// longer needs: a host simply runs another pass.)
        @Test func aHostedLoopsDescriptorBecomesReadableForDueTimersAndPerforms() throws {
            let (fired, performed) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "ds-hosted-timer"
                let fired = Locked(false)
                keepAlive(loop, mode)
                // The host's pass adds the timer (as a callback would), then waits in poll(2).
                loop.perform(inModes: [mode]) {
                    loop.scheduleTimer(after: .milliseconds(20), forMode: mode) { _ in fired.value = true }
                }
                try runAsHost(loop, mode, "timer") { fired.value }

                let performed = Locked(false)
                let other = TestThread { loop.perform(inModes: [mode]) { performed.value = true } }
                try runAsHost(loop, mode, "perform") { performed.value }
                try other.join()
                return (fired.value, performed.value)
            }
            #expect(fired)
            #expect(performed)
        }
    }
}

extension RunLoopTests.DescriptorSourceTests {
    /// A hosted loop learns of an item its own thread invalidated between passes (a loop that
    /// is not hosted is not woken for it: its next run purges first).
    @Test func aHostedLoopsDescriptorBecomesReadableWhenItsThreadInvalidatesAnItem() throws {
        let (before, afterTimer, afterSource, emptied, afterEmpty) = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-hosted-invalidation"
            let keeper = keepAlive(loop, mode)
            let descriptor = loop.descriptor
            let timer = loop.scheduleTimer(after: .seconds(3600), forMode: mode) { _ in }
            let source = PKCustomSource {}
            loop.add(source, forMode: mode)
            loop.runOnePass(in: mode)
            let before = try pollReadable(descriptor, timeoutMilliseconds: 0)
            timer.invalidate()
            let afterTimer = try pollReadable(descriptor, timeoutMilliseconds: 0)
            loop.runOnePass(in: mode)
            source.invalidate()
            let afterSource = try pollReadable(descriptor, timeoutMilliseconds: 0)
            loop.runOnePass(in: mode)
            // The mode's last item goes: the pass that finds the mode empty consumes the
            // wake-up, so a host polling the descriptor does not spin.
            keeper.invalidate()
            let emptied = loop.runOnePass(in: mode)
            let afterEmpty = try pollReadable(descriptor, timeoutMilliseconds: 0)
            return (before, afterTimer, afterSource, emptied, afterEmpty)
        }
        #expect(!before)
        #expect(afterTimer)
        #expect(afterSource)
        #expect(emptied == .finished)
        #expect(!afterEmpty)
    }
}

extension RunLoopTests.DescriptorSourceTests {
    /// A handler that runs the loop in another mode after the pass armed the timerfd (here a
    /// descriptor source's) leaves it armed for that mode's timers; the hosted loop's outermost
    /// run re-arms it for its own mode when it ends, so its host still learns when a timer of
    /// that mode is due.
    @Test func aHostedLoopsTimerStaysArmedAfterANestedRunInAnotherMode() throws {
        let fired = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-hosted-nested"
            let other: PKRunLoopMode = "ds-hosted-nested-other"
            let pipe = try TestPipe()
            defer { pipe.closeBoth() }
            let far = loop.scheduleTimer(after: .seconds(3600), forMode: other) { _ in }
            defer { far.invalidate() }
            let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                pipe.drain()
                loop.runOnePass(in: other)  // arms the timerfd for the hour-long timer
            }
            try loop.add(source, forMode: mode)
            defer { source.invalidate() }
            let fired = Locked(false)
            let timer = loop.scheduleTimer(after: .milliseconds(20), forMode: mode) { _ in fired.value = true }
            defer { timer.invalidate() }
            _ = loop.descriptor
            pipe.makeReadable()
            try runAsHost(loop, mode, "the timer after a nested run") { fired.value }
            return fired.value
        }
        #expect(fired)
    }
}


extension RunLoopTests.DescriptorSourceTests {
    /// A perform block in the pass's first round (before the custom sources) runs the loop in
    /// another mode, which parks a ready descriptor source of this mode: the pass's wait still
    /// reports it.
    @Test func aSourceANestedRunInAnEarlyPerformBlockParkedIsWatchedBeforeSleeping() throws {
        let result = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-early-park"
            let other: PKRunLoopMode = "ds-early-park-other"
            return try withSourceToPark(loop, mode, other) { data in
                loop.perform(inModes: [mode]) {
                    data.makeReadable()
                    loop.runOnePass(in: other)  // parks the source
                }
                return runUntilASourceIsHandled(loop, mode)
            }
        }
        #expect(result == .handledSource)
    }

    /// A beforeWaiting observer gives a source added with no events something to watch while
    /// its descriptor is ready: the wait that follows watches it.
    @Test func eventsSetByABeforeWaitingObserverAreWatchedByTheWaitThatFollows() throws {
        let result = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-bw-events"
            let pipe = try TestPipe()
            defer { pipe.closeBoth() }
            let source = PKDescriptorSource(descriptor: pipe.readEnd, events: []) { _ in pipe.drain() }
            try loop.add(source, forMode: mode)
            defer { source.invalidate() }
            pipe.makeReadable()
            let observer = onceBeforeWaiting(loop, mode) { source.events = .readable }
            defer { observer.invalidate() }
            return runUntilASourceIsHandled(loop, mode)
        }
        #expect(result == .handledSource)
    }

    /// A beforeWaiting observer that runs the loop in another mode before every sleep parks a
    /// ready source of the running mode every time: the source is still handled (it is watched
    /// again right before the wait), and the loop neither spins nor starves it.
    @Test func aSourceParkedBeforeEverySleepIsStillHandled() throws {
        let result = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-every-park"
            let other: PKRunLoopMode = "ds-every-park-other"
            return try withSourceToPark(loop, mode, other) { data in
                let observer = PKRunLoopObserver(activities: .beforeWaiting) { _, _ in
                    loop.runOnePass(in: other)  // parks the source whenever it is ready
                }
                loop.add(observer, forMode: mode)
                defer { observer.invalidate() }
                data.makeReadable()
                return runUntilASourceIsHandled(loop, mode)
            }
        }
        #expect(result == .handledSource)
    }

    /// A timer of the common modes added to a hosted loop that never ran makes its descriptor
    /// readable when it is due (armed for the default mode, a common mode).
    @Test func aCommonTimerAddedToAHostedLoopThatNeverRanMakesItsDescriptorReadable() throws {
        let fired = try onLoopThread { loop in
            let keep = keepAlive(loop, .default)
            defer { keep.invalidate() }
            _ = loop.descriptor
            let fired = Locked(false)
            let timer = PKTimer(fireDate: .after(.milliseconds(20))) { _ in fired.value = true }
            loop.add(timer, forMode: .common)
            defer { timer.invalidate() }
            try runAsHost(loop, .default, "a common timer of a loop that never ran") { fired.value }
            return fired.value
        }
        #expect(fired)
    }
}

/// Runs `body` with a pipe whose read end is a descriptor source of `mode` (it drains what it
/// reads), while `other` holds an hour-long timer: a nested run in `other` neither ends at once
/// nor watches the pipe, so it parks the source once the pipe is readable.
private func withSourceToPark<R>(
    _ loop: PKRunLoop, _ mode: PKRunLoopMode, _ other: PKRunLoopMode, _ body: (TestPipe) throws -> R
) throws -> R {
    let far = loop.scheduleTimer(after: .seconds(3600), forMode: other) { _ in }
    defer { far.invalidate() }
    let data = try TestPipe()
    defer { data.closeBoth() }
    let source = PKDescriptorSource(descriptor: data.readEnd) { _ in data.drain() }
    try loop.add(source, forMode: mode)
    defer { source.invalidate() }
    return try body(data)
}

/// Runs `mode` until a source is handled, with a deadline far beyond what handling takes.
private func runUntilASourceIsHandled(_ loop: PKRunLoop, _ mode: PKRunLoopMode) -> PKRunLoopRunResult {
    loop.run(in: mode, until: .after(patience(.seconds(10))), returnAfterSourceHandled: true)
}

/// An observer of `mode` that runs `body` the first time the loop is about to sleep.
private func onceBeforeWaiting(_ loop: PKRunLoop, _ mode: PKRunLoopMode, _ body: @escaping () -> Void) -> PKRunLoopObserver {
    var done = false
    let observer = PKRunLoopObserver(activities: .beforeWaiting) { _, _ in
        if done { return }
        done = true
        body()
    }
    loop.add(observer, forMode: mode)
    return observer
}


extension RunLoopTests.DescriptorSourceTests {
    /// A nested run of another mode parks (unregisters) a descriptor source of the hosted loop's
    /// mode that became ready meanwhile: the outer run ends leaving `descriptor` readable, so the
    /// host's next pass watches it again.
    @Test func aHostedLoopWatchesAgainASourceANestedRunParked() throws {
        let handled = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-park"
            let other: PKRunLoopMode = "ds-park-other"
            let trigger = try TestPipe()
            let data = try TestPipe()
            defer { trigger.closeBoth(); data.closeBoth() }
            let far = loop.scheduleTimer(after: .seconds(3600), forMode: other) { _ in }
            defer { far.invalidate() }
            let handled = Locked(false)
            let dataSource = PKDescriptorSource(descriptor: data.readEnd) { _ in
                data.drain()
                handled.value = true
            }
            try loop.add(dataSource, forMode: mode)
            defer { dataSource.invalidate() }
            let triggerSource = PKDescriptorSource(descriptor: trigger.readEnd) { _ in
                trigger.drain()
                data.makeReadable()
                loop.runOnePass(in: other)  // sees `data` ready, not in `other`: parks it
            }
            try loop.add(triggerSource, forMode: mode)
            defer { triggerSource.invalidate() }
            _ = loop.descriptor
            trigger.makeReadable()
            try runAsHost(loop, mode, "the parked source") { handled.value }
            return handled.value
        }
        #expect(handled)
    }

    /// A source a nested run deferred keeps a hosted loop's descriptor readable after a run of
    /// an empty mode, which consumes the wake-up nobody sleeps for: the descriptor went quiet,
    /// and the host never ran the pass that performs the deferred source.
    @Test func aHostedLoopsDescriptorStaysReadableForADeferredSourceAfterAnEmptyRun() throws {
        let performed = try onLoopThread { loop in
            let other: PKRunLoopMode = "ds-defer-other"
            let far = loop.scheduleTimer(after: .seconds(3600), forMode: other) { _ in }  // `other` is not empty
            defer { far.invalidate() }
            let performed = Locked(false)
            let second = PKCustomSource { performed.value = true }
            loop.add(second, forMode: .default)
            defer { second.invalidate() }
            let first = PKCustomSource {
                second.signal()
                loop.runOnePass(in: other)  // takes the signal, and defers `second` (not in `other`)
            }
            loop.add(first, forMode: .default)
            defer { first.invalidate() }
            _ = loop.descriptor
            first.signal(waking: loop)
            loop.runOnePass(in: .default)  // performs `first`; `second` waits, deferred
            loop.run(in: "ds-defer-empty", until: .distantPast)  // an empty mode's run
            try runAsHost(loop, .default, "the deferred source") { performed.value }
            return performed.value
        }
        #expect(performed)
    }

    /// A loop that ran before it was hosted, with a nested run of another mode in its last pass,
    /// stays armed for the mode it ran: its host learns when that mode's timer is due.
    @Test func aLoopHostedAfterItRanIsArmedForTheModeItRan() throws {
        let fired = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-late-host"
            let other: PKRunLoopMode = "ds-late-host-other"
            let far = loop.scheduleTimer(after: .seconds(3600), forMode: other) { _ in }
            defer { far.invalidate() }
            let fired = Locked(false)
            let timer = loop.scheduleTimer(after: .milliseconds(50), forMode: mode) { _ in fired.value = true }
            defer { timer.invalidate() }
            let pipe = try TestPipe()
            defer { pipe.closeBoth() }
            let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                pipe.drain()
                loop.runOnePass(in: other)  // after the pass armed the timerfd
            }
            try loop.add(source, forMode: mode)
            defer { source.invalidate() }
            pipe.makeReadable()
            loop.runOnePass(in: mode)  // not hosted yet
            _ = loop.descriptor
            try runAsHost(loop, mode, "the timer of a loop hosted after a run") { fired.value }
            return fired.value
        }
        #expect(fired)
    }
}

extension RunLoopTests.DescriptorSourceTests {
    /// A beforeWaiting observer signals a source of the running mode and then runs the loop in
    /// another mode, which takes the source and defers it: the check before sleeping sees it.
    @Test func aSourceANestedRunInABeforeWaitingObserverDeferredIsPerformedBeforeSleeping() throws {
        let result = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-bw-defer"
            let other: PKRunLoopMode = "ds-bw-defer-other"
            let far = loop.scheduleTimer(after: .seconds(3600), forMode: other) { _ in }
            defer { far.invalidate() }
            let source = PKCustomSource(perform: {})
            loop.add(source, forMode: mode)
            defer { source.invalidate() }
            let observer = onceBeforeWaiting(loop, mode) {
                source.signal()
                loop.runOnePass(in: other)  // takes the source, defers it
            }
            defer { observer.invalidate() }
            return runUntilASourceIsHandled(loop, mode)
        }
        #expect(result == .handledSource)
    }

    /// A beforeWaiting observer makes a source of the running mode ready and then runs the loop
    /// in another mode, which parks it: the wait that follows watches it again.
    @Test func aSourceANestedRunInABeforeWaitingObserverParkedIsWatchedBeforeSleeping() throws {
        let result = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-bw-park"
            let other: PKRunLoopMode = "ds-bw-park-other"
            return try withSourceToPark(loop, mode, other) { data in
                let observer = onceBeforeWaiting(loop, mode) {
                    data.makeReadable()
                    loop.runOnePass(in: other)  // parks the source
                }
                defer { observer.invalidate() }
                return runUntilASourceIsHandled(loop, mode)
            }
        }
        #expect(result == .handledSource)
    }

    /// A hosted loop's thread adds a timer between passes: the descriptor becomes readable when
    /// it is due.
    @Test func aTimerAddedBetweenPassesMakesAHostedLoopsDescriptorReadable() throws {
        let fired = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-host-add"
            let keep = keepAlive(loop, mode)
            defer { keep.invalidate() }
            _ = loop.descriptor
            loop.runOnePass(in: mode)
            let fired = Locked(false)
            let timer = loop.scheduleTimer(after: .milliseconds(20), forMode: mode) { _ in fired.value = true }
            defer { timer.invalidate() }
            try runAsHost(loop, mode, "a timer added between passes") { fired.value }
            return fired.value
        }
        #expect(fired)
    }
}

extension RunLoopTests.DescriptorSourceTests {
    /// A perform block run after the custom sources (queued by an earlier block) runs the loop
    /// in another mode, which parks a ready descriptor source of this mode: the pass does not
    /// sleep with the source unwatched.
    @Test func aSourceANestedRunInALatePerformBlockParkedIsWatchedBeforeSleeping() throws {
        let result = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-pb-park"
            let other: PKRunLoopMode = "ds-pb-park-other"
            return try withSourceToPark(loop, mode, other) { data in
                loop.perform(inModes: [mode]) {
                    // Queued now, run by the pass's second round of perform blocks.
                    loop.perform(inModes: [mode]) {
                        data.makeReadable()
                        loop.runOnePass(in: other)  // parks the source
                    }
                }
                return runUntilASourceIsHandled(loop, mode)
            }
        }
        #expect(result == .handledSource)
    }
}

extension RunLoopTests.DescriptorSourceTests {
    /// A hosted loop's source given events between the host's passes (added with none) is
    /// watched at once: the loop's descriptor becomes readable when it is ready.
    @Test func aHostedLoopWatchesASourceGivenEventsBetweenPasses() throws {
        let calls = try onLoopThread { loop in
            let mode: PKRunLoopMode = "ds-host-events"
            let pipe = try TestPipe()
            defer { pipe.closeBoth() }
            var calls = 0
            let source = PKDescriptorSource(descriptor: pipe.readEnd, events: []) { _ in
                calls += 1
                pipe.drain()
            }
            try loop.add(source, forMode: mode)
            defer { source.invalidate() }
            _ = loop.descriptor
            loop.runOnePass(in: mode)
            source.events = .readable
            pipe.makeReadable()
            try runAsHost(loop, mode, "the source given events between passes") { calls > 0 }
            return calls
        }
        #expect(calls == 1)
    }

    /// A descriptor epoll refuses, added while another mode runs (so it is not watched yet), or
    /// with no events: `add` throws then, instead of the source being invalidated later by a
    /// pass of its mode.
    @Test func aParkedDescriptorEpollRefusesThrowsWhenAdded() throws {
        let (whileOtherRuns, withNoEvents) = try onLoopThread { loop -> (Bool, Bool) in
            let fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw TestSystemCallFailed(call: "open", errno: errno) }
            defer { close(fd) }
            var whileOtherRuns = false
            let other: PKRunLoopMode = "ds-refused-other"
            keepAlive(loop, other)
            loop.scheduleTimer(after: .zero, forMode: other) { _ in
                do { try loop.add(PKDescriptorSource(descriptor: fd) { _ in }, forMode: "ds-refused-parked") } catch {
                    whileOtherRuns = true
                }
            }
            loop.run(in: other, until: .after(.milliseconds(20)))
            var withNoEvents = false
            do { try loop.add(PKDescriptorSource(descriptor: fd, events: []) { _ in }, forMode: "ds-refused-parked") } catch {
                withNoEvents = true
            }
            return (whileOtherRuns, withNoEvents)
        }
        #expect(whileOtherRuns)
        #expect(withNoEvents)
    }

    /// `contains(_:inMode: .common)` tells whether an item was added to the common modes
    /// (`CFRunLoopContainsSource`, `CFRunLoopContainsTimer`).
    @Test func itemsAddedToTheCommonModesAreContainedInThem() throws {
        let answers = try onLoopThread { loop -> [Bool] in
            let source = PKCustomSource {}
            let timer = PKTimer(fireDate: .distantFuture) { _ in }
            let before = [loop.contains(source, inMode: .common), loop.contains(timer, inMode: .common)]
            loop.add(source, forMode: .common)
            loop.add(timer, forMode: .common)
            let added = [loop.contains(source, inMode: .common), loop.contains(timer, inMode: .common),
                         loop.contains(source, inMode: .default), loop.contains(timer, inMode: .default)]
            loop.remove(source, forMode: .common)
            loop.remove(timer, forMode: .common)
            let removed = [loop.contains(source, inMode: .common), loop.contains(timer, inMode: .common)]
            source.invalidate()
            timer.invalidate()
            return before + added + removed
        }
        #expect(answers == [false, false, true, true, true, true, false, false])
    }
}
