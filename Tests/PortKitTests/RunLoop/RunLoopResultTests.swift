// Why a run returns: finished, stopped, timed out, handled source (CFRunLoopRunResult).

import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct RunLoopResultTests {
        @Test func aRunInAnEmptyModeReturnsFinishedAtOnceWithoutNotifyingObservers() throws {
            let (never, onlyObservers, runOnce, log) = try onLoopThread { loop in
                let log = Locked<[String]>([])
                let never = loop.run(in: "empty-never-used", until: .distantFuture)
                // Observers alone do not make a mode worth running.
                logActivities(of: loop, in: "empty-only-observers", into: log)
                let onlyObservers = loop.run(in: "empty-only-observers", until: .distantFuture)
                let runOnce = loop.runOnce(in: "empty-run-once", before: .distantFuture)
                return (never, onlyObservers, runOnce, log.value)
            }
            #expect(never == .finished)
            #expect(onlyObservers == .finished)
            #expect(runOnce == false)
            #expect(log.isEmpty)
        }

        /// `runOnce` (`-[NSRunLoop runMode:beforeDate:]`) says whether the run started: a run
        /// whose only item, a one-shot timer, fires and empties the mode did start (Foundation
        /// answers YES). (It answered false, taking the run's `.finished` for "did not start".)
        @Test func runOnceIsTrueForARunWhoseOnlyTimerFired() throws {
            let (started, fired) = try onLoopThread { loop in
                var fired = false
                loop.scheduleTimer(after: .milliseconds(5), forMode: "run-once-timer") { _ in fired = true }
                let started = loop.runOnce(in: "run-once-timer", before: .after(patience(.seconds(30))))
                return (started, fired)
            }
            #expect(fired)
            #expect(started)
        }

        @Test func aRunReturnsFinishedWhenItsModeRunsOutOfItems() throws {
            let (afterTimer, afterRemoval, afterInvalidation, plainRunReturned) = try onLoopThread { loop in
                // The only item is a one-shot timer: once it fired, the mode is empty.
                loop.scheduleTimer(after: .milliseconds(5), forMode: "finished-timer") { _ in }
                let afterTimer = loop.run(in: "finished-timer", until: .after(.seconds(10)))

                // The only source removes itself.
                var itself: PKCustomSource?
                let source = PKCustomSource { loop.remove(itself!, forMode: "finished-removal") }
                itself = source
                loop.add(source, forMode: "finished-removal")
                source.signal()
                let afterRemoval = loop.run(in: "finished-removal", until: .after(.seconds(10)))
                itself = nil

                // The only source is invalidated by a timer.
                let doomed = PKCustomSource {}
                loop.add(doomed, forMode: "finished-invalidation")
                loop.scheduleTimer(after: .milliseconds(5), forMode: "finished-invalidation") { _ in doomed.invalidate() }
                let afterInvalidation = loop.run(in: "finished-invalidation", until: .after(.seconds(10)))

                // `run()` (NSRunLoop's -run) returns once the default mode is empty.
                loop.scheduleTimer(after: .milliseconds(5)) { _ in }
                loop.run()
                return (afterTimer, afterRemoval, afterInvalidation, true)
            }
            #expect(afterTimer == .finished)
            #expect(afterRemoval == .finished)
            #expect(afterInvalidation == .finished)
            #expect(plainRunReturned)
        }

        /// Invalidating an item on the loop's own thread wakes no one: the pass itself notices,
        /// before it sleeps, that the mode has nothing left.
        @Test func aRunEndsWhenAnObserverOrPerformBlockInvalidatesTheModesLastItem() throws {
            let (byObserver, byBlock) = try onLoopThread { loop in
                // The only item is a timer due in an hour; an observer invalidates it just before
                // the loop would sleep.
                let distant = loop.scheduleTimer(after: .seconds(3600), forMode: "finished-observer") { _ in }
                let observer = PKRunLoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in distant.invalidate() }
                loop.add(observer, forMode: "finished-observer")
                let byObserver = loop.run(in: "finished-observer", until: .after(patience(.seconds(10))))

                // The only item is a custom source that a perform block invalidates.
                let doomed = PKCustomSource {}
                loop.add(doomed, forMode: "finished-block")
                loop.perform(inModes: ["finished-block"]) { doomed.invalidate() }
                let byBlock = loop.run(in: "finished-block", until: .after(patience(.seconds(10))))
                return (byObserver, byBlock)
            }
            #expect(byObserver == .finished)
            #expect(byBlock == .finished)
        }

        /// What the pre-sleep purge sets off does not wait out the sleep: a cancel routine that
        /// invalidates the mode's other item ends the run, one that signals a source has it
        /// performed; and observers still see `afterWaiting` after `beforeWaiting`.
        @Test func whatAPurgeBeforeSleepingSetsOffDoesNotWaitOutTheSleep() throws {
            let (cascade, log, signalled, performed, timely) = try onLoopThread { loop in
                let deadline = PKDeadline.after(patience(.seconds(10)))
                // A's cancel invalidates B; an observer invalidates A just before the sleep.
                let b = PKCustomSource {}
                let a = PKCustomSource(cancel: { _, _ in b.invalidate() }) {}
                loop.add(a, forMode: "purge-cascade")
                loop.add(b, forMode: "purge-cascade")
                let observer = PKRunLoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in a.invalidate() }
                loop.add(observer, forMode: "purge-cascade")
                let log = Locked<[String]>([])
                logActivities(of: loop, in: "purge-cascade", into: log, [.beforeWaiting, .afterWaiting, .exit])
                let cascade = loop.run(in: "purge-cascade", until: deadline)

                // D's cancel signals C (a signal wakes no one); C must run without a sleep first.
                let performed = Locked(false)
                let c = PKCustomSource { performed.value = true }
                let d = PKCustomSource(cancel: { _, _ in c.signal() }) {}
                let keeper = keepAlive(loop, "purge-signal")
                loop.add(c, forMode: "purge-signal")
                loop.add(d, forMode: "purge-signal")
                let invalidator = PKRunLoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in d.invalidate() }
                loop.add(invalidator, forMode: "purge-signal")
                let signalled = loop.run(in: "purge-signal", until: deadline, returnAfterSourceHandled: true)
                keeper.invalidate()
                c.invalidate()
                return (cascade, log.value, signalled, performed.value, !deadline.hasPassed)
            }
            #expect(cascade == .finished)
            #expect(log == ["beforeWaiting", "afterWaiting", "exit"])
            #expect(signalled == .handledSource)
            #expect(performed)
            #expect(timely, "a run waited out its sleep")
        }

        /// An item invalidated on the loop's own thread between runs leaves no wake-up behind: the
        /// next run sleeps once until its deadline instead of waking at once for nothing.
        @Test func anItemInvalidatedOnTheLoopsThreadCostsTheNextRunNoExtraPass() throws {
            let wakes = try onLoopThread { loop in
                let mode: PKRunLoopMode = "no-stale-wake"
                loop.scheduleTimer(after: .seconds(3600), forMode: mode) { _ in }
                let doomedTimer = loop.scheduleTimer(after: .seconds(3600), forMode: mode) { _ in }
                let doomedSource = PKCustomSource {}
                loop.add(doomedSource, forMode: mode)
                doomedTimer.invalidate()
                doomedSource.invalidate()
                let wakes = Locked(0)
                let observer = PKRunLoopObserver(activities: .afterWaiting) { _, _ in wakes.withLock { $0 += 1 } }
                loop.add(observer, forMode: mode)
                let result = loop.run(in: mode, until: .after(.milliseconds(50)))
                #expect(result == .timedOut)
                observer.invalidate()
                return wakes.value
            }
            #expect(wakes == 1)
        }

        /// A beforeWaiting observer that runs the loop in another mode (a nested run leaves a
        /// hint to rescan sources) does not keep the loop from sleeping.
        @Test func aNestedRunInABeforeWaitingObserverLetsTheLoopSleep() throws {
            let (result, calls) = try onLoopThread { loop in
                let outer = keepAlive(loop, "nested-outer")
                let inner = keepAlive(loop, "nested-inner")
                var calls = 0
                let observer = PKRunLoopObserver(activities: .beforeWaiting) { _, _ in
                    calls += 1
                    loop.run(in: "nested-inner", until: .distantPast)
                }
                loop.add(observer, forMode: "nested-outer")
                let result = loop.run(in: "nested-outer", until: .after(.milliseconds(100)))
                observer.invalidate()
                outer.invalidate()
                inner.invalidate()
                return (result, calls)
            }
            #expect(result == .timedOut)
            // A loop that sleeps makes a pass or two in 100 ms; one that spins, tens of thousands.
            #expect(calls < 50, "the loop spun (\(calls) passes) instead of sleeping")
        }

        /// What an observer does before the sleep is seen before the sleep: removing the mode's
        /// last item ends the run; signalling a source (and removing itself) has it performed.
        @Test func anObserversChangesBeforeTheSleepAreSeenBeforeIt() throws {
            let (removed, signalled, performed, timely) = try onLoopThread { loop in
                let deadline = PKDeadline.after(patience(.seconds(10)))
                let timer = loop.scheduleTimer(after: .seconds(3600), forMode: "observer-removes") { _ in }
                // A repeating observer (a one-shot one is invalidated when it fires, which the
                // pass would notice for that reason alone).
                var removedIt = false
                let remover = PKRunLoopObserver(activities: .beforeSources) { _, _ in
                    if !removedIt { loop.remove(timer, forMode: "observer-removes") }
                    removedIt = true
                }
                loop.add(remover, forMode: "observer-removes")
                let removed = loop.run(in: "observer-removes", until: deadline)
                timer.invalidate()
                remover.invalidate()

                let mode: PKRunLoopMode = "observer-signals"
                let keeper = keepAlive(loop, mode)
                let performed = Locked(false)
                let source = PKCustomSource { performed.value = true }
                loop.add(source, forMode: mode)
                let signaller = PKRunLoopObserver(activities: .beforeWaiting) { observer, _ in
                    source.signal()  // a signal wakes no one
                    loop.remove(observer, forMode: mode)
                }
                loop.add(signaller, forMode: mode)
                let signalled = loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
                keeper.invalidate()
                source.invalidate()
                signaller.invalidate()
                return (removed, signalled, performed.value, !deadline.hasPassed)
            }
            #expect(removed == .finished)
            #expect(signalled == .handledSource)
            #expect(performed)
            #expect(timely, "a run waited out its sleep")
        }

        @Test func stopFromACallbackEndsTheRunWithStopped() throws {
            let result = try onLoopThread { loop in
                keepAlive(loop, "stopped-mode")
                loop.scheduleTimer(after: .milliseconds(5), forMode: "stopped-mode") { _ in loop.stop() }
                return loop.run(in: "stopped-mode", until: .after(.seconds(10)))
            }
            #expect(result == .stopped)
        }

        @Test func aRunEndsWithTimedOutAtItsDeadline() throws {
            let (result, reachedDeadline) = try onLoopThread { loop in
                keepAlive(loop, "timed-out-mode")
                let deadline = PKDeadline.after(.milliseconds(50))
                let result = loop.run(in: "timed-out-mode", until: deadline)
                return (result, deadline.hasPassed)
            }
            #expect(result == .timedOut)
            #expect(reachedDeadline)
        }

        @Test func aHandledSourceEndsTheRunOnlyWhenAskedTo() throws {
            let outcome = try onLoopThread { loop in
                let mode: PKRunLoopMode = "handled-source-mode"
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                var performed = 0
                var descriptorCalls = 0
                let custom = PKCustomSource { performed += 1 }
                loop.add(custom, forMode: mode)
                let descriptor = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    pipe.drain()
                    descriptorCalls += 1
                }
                try loop.add(descriptor, forMode: mode)

                custom.signal()
                let customResult = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                pipe.makeReadable()
                let descriptorResult = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                custom.signal()
                let runOnce = loop.runOnce(in: mode, before: .after(.seconds(10)))
                // Not asked to return: the run handles the source and goes on to its deadline.
                custom.signal()
                let notAsked = loop.run(in: mode, until: .after(.milliseconds(50)))
                return (customResult, descriptorResult, runOnce, notAsked, performed, descriptorCalls)
            }
            let (customResult, descriptorResult, runOnce, notAsked, performed, descriptorCalls) = outcome
            #expect(customResult == .handledSource)
            #expect(descriptorResult == .handledSource)
            #expect(runOnce)
            #expect(notAsked == .timedOut)
            #expect(performed == 3)
            #expect(descriptorCalls == 1)
        }

        @Test func aTimerNeverCountsAsAHandledSource() throws {
            let (result, fired) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "timer-not-a-source"
                keepAlive(loop, mode)
                var fired = 0
                let timer = loop.scheduleTimer(after: .milliseconds(1), repeats: true, forMode: mode) { _ in fired += 1 }
                let result = loop.run(in: mode, until: .after(.milliseconds(100)), returnAfterSourceHandled: true)
                timer.invalidate()
                return (result, fired)
            }
            #expect(result == .timedOut)
            #expect(fired >= 1)
        }

        /// A mode whose only work is a block `perform` queued for it runs the block, as Core
        /// Foundation counts a mode's blocks in whether it is empty: the run returns
        /// `.finished`, or `.handledSource` when asked to return after one; `runOnce` says it
        /// started; a block that adds a timer to the mode has the run go on until it fires.
        /// (The run returned `.finished` at once and left the blocks queued.)
        @Test func aModeWithOnlyPerformBlocksRunsThem() throws {
            let outcome = try onLoopThread { loop -> [String] in
                let log = Locked<[String]>([])
                @Sendable func note(_ entry: String) { log.withLock { $0.append(entry) } }
                let mode: PKRunLoopMode = "blocks-only"
                loop.perform(inModes: [mode]) { note("plain") }
                let plain = loop.run(in: mode, until: .distantFuture)
                note("run: \(plain)")
                loop.perform(inModes: [mode]) { note("returning") }
                let returning = loop.run(in: mode, until: .distantFuture, returnAfterSourceHandled: true)
                note("run: \(returning)")
                loop.perform(inModes: [mode]) { note("once") }
                let once = loop.runOnce(in: mode, before: .distantFuture)
                note("runOnce: \(once)")
                let nothing = loop.runOnce(in: mode, before: .distantFuture)
                note("runOnce: \(nothing)")
                loop.perform(inModes: [mode]) {
                    PKRunLoop.current.scheduleTimer(after: .milliseconds(1), forMode: mode) { _ in note("timer") }
                }
                let timed = loop.run(in: mode, until: .after(patience(.seconds(30))))
                note("run: \(timed)")
                return log.value
            }
            #expect(outcome == [
                "plain", "run: finished", "returning", "run: handledSource",
                "once", "runOnce: true", "runOnce: false", "timer", "run: finished",
            ])
        }

        /// PortKit's own clean-up (`performHousekeeping`: a port released on another thread)
        /// runs in a run of any mode, even an empty one that makes no pass, and is not a
        /// handled source: the run it woke goes on to its own end.
        @Test func housekeepingRunsInAnyModeAndIsNotAHandledSource() throws {
            let (empty, ranInEmpty, other, ran) = try onLoopThread { loop in
                let ran = Locked(0)
                loop.performHousekeeping { ran.withLock { $0 += 1 } }
                let empty = loop.run(in: "housekeeping-empty", until: .distantFuture)
                let ranInEmpty = ran.value
                let mode: PKRunLoopMode = "housekeeping-other"
                loop.scheduleTimer(after: .milliseconds(1), forMode: mode) { _ in PKRunLoop.current.stop() }
                loop.performHousekeeping { ran.withLock { $0 += 1 } }
                let other = loop.run(in: mode, until: .after(patience(.seconds(30))), returnAfterSourceHandled: true)
                return (empty, ranInEmpty, other, ran.value)
            }
            #expect(empty == .finished)
            #expect(ranInEmpty == 1)
            #expect(other == .stopped)
            #expect(ran == 2)
        }

        /// `stop()` on a loop that is not running makes its next run return `.stopped` at once:
        /// before it performs anything, even a source that is ready when it was asked to return
        /// after one. The stop is used up: the run after that works normally.
        @Test func stopBeforeRunMakesTheNextRunReturnStopped() throws {
            let outcome = try onLoopThread { loop in
                let mode: PKRunLoopMode = "stop-before-run"
                let log = Locked<[String]>([])
                let source = PKCustomSource { log.append("performed") }
                loop.add(source, forMode: mode)
                logActivities(of: loop, in: mode, into: log, [.entry, .exit])

                loop.stop()
                let plain = loop.run(in: mode, until: .after(.seconds(10)))

                source.signal()
                loop.stop()
                let withReadySource = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                let performedWhileStopped = log.value.contains("performed")

                let next = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                return (plain, withReadySource, performedWhileStopped, next, log.value)
            }
            let (plain, withReadySource, performedWhileStopped, next, log) = outcome
            #expect(plain == .stopped)
            #expect(withReadySource == .stopped)
            #expect(!performedWhileStopped)
            #expect(next == .handledSource)
            #expect(log == ["entry", "exit", "entry", "exit", "entry", "performed", "exit"])
        }

        @Test func aDeadlineInThePastStillGetsOnePass() throws {
            let (result, performed) = try onLoopThread { loop in
                var performed = false
                let source = PKCustomSource { performed = true }
                loop.add(source, forMode: "past-deadline")
                source.signal()
                let result = loop.run(in: "past-deadline", until: .distantPast)
                return (result, performed)
            }
            #expect(result == .timedOut)
            #expect(performed)
        }
    }
}
