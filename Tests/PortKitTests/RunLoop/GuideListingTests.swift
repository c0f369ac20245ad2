// The Threading Programming Guide's run-loop listings (chapter 3, Listings 3-1 to 3-11),
// rewritten against PortKit and run. Times are scaled down (the guide's seconds become tens of
// milliseconds); names follow the listings where they can.

import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct GuideListingTests {
        // MARK: - Listing 3-1

        /// Listing 3-1 "Creating a run loop observer": a thread adds an observer of all activities
        /// to its loop's default mode, schedules a repeating timer (0.1 s; here 10 ms) and runs the
        /// loop ten times with `runUntilDate:` (1 s each; here 50 ms).
        @Test func listing3_1_anObserverWatchesAThreadsLoopRunTenTimes() throws {
            let (activities, timerFires) = try onLoopThread { _ in
                let myRunLoop = PKRunLoop.current  // [NSRunLoop currentRunLoop]

                // Create a run loop observer and attach it to the run loop
                // (CFRunLoopObserverCreate with kCFRunLoopAllActivities, repeats YES, order 0).
                var activities: [PKRunLoopActivity] = []
                let observer = PKRunLoopObserver(activities: .all, repeats: true, order: 0) { _, activity in
                    activities.append(activity)  // myRunLoopObserver
                }
                myRunLoop.add(observer, forMode: .default)

                // Create and schedule the timer
                // ([NSTimer scheduledTimerWithTimeInterval:0.1 ... repeats:YES]).
                var timerFires = 0
                let timer = myRunLoop.scheduleTimer(after: .milliseconds(10), repeats: true) { _ in
                    timerFires += 1  // doFireTimer:
                }

                var loopCount = 10
                repeat {
                    // Run the run loop 10 times to let the timer fire
                    // ([myRunLoop runUntilDate:[NSDate dateWithTimeIntervalSinceNow:1]]).
                    myRunLoop.run(in: .default, until: .after(.milliseconds(50)))
                    loopCount -= 1
                } while loopCount > 0
                timer.invalidate()
                return (activities, timerFires)
            }
            #expect(activities.filter { $0 == .entry }.count == 10)
            #expect(activities.filter { $0 == .exit }.count == 10)
            #expect(activities.first == .entry && activities.last == .exit)
            #expect(activities.filter { $0 == .beforeTimers }.count >= 10)
            #expect(activities.filter { $0 == .afterWaiting }.count >= 10)
            #expect(timerFires >= 10, "at least once per 50 ms run of a 10 ms timer")
        }

        // MARK: - Listing 3-2

        /// Listing 3-2 "Running a run loop": the skeleton thread body runs its loop in the default
        /// mode, returning after each handled source, until a stop or an empty mode (or its own
        /// `done`). Here another thread hands it three pieces of work, then stops the loop or
        /// invalidates the loop's only source.
        @Test(arguments: ["stop", "invalidate"])
        func listing3_2_theSkeletonThreadLoopChecksEachRunResult(ending: String) throws {
            let results = try onLoopThread { loop in
                var done = false

                // Add your sources or timers to the run loop and do any other setup.
                let handled = Locked(0)
                let work = PKCustomSource { handled.withLock { $0 += 1 } }
                loop.add(work, forMode: .default)
                let client = TestThread {
                    for expected in 1...3 {
                        work.signal(waking: loop)
                        try? waitUntil("work \(expected) handled") { handled.value == expected }
                    }
                    if ending == "stop" { loop.stop() } else { work.invalidate() }
                }

                var results: [PKRunLoopRunResult] = []
                var result: PKRunLoopRunResult
                repeat {
                    // Start the run loop but return after each source is handled
                    // (CFRunLoopRunInMode(kCFRunLoopDefaultMode, 10, YES)).
                    result = loop.run(in: .default, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                    results.append(result)
                    // Check for any other exit conditions here and set the done variable as needed:
                    // a test never waits past its deadline.
                    if result == .timedOut { done = true }
                // If a source explicitly stopped the run loop, or if there are no sources or
                // timers, go ahead and exit.
                } while result != .stopped && result != .finished && !done

                try client.join()
                return results
            }
            let last: PKRunLoopRunResult = ending == "stop" ? .stopped : .finished
            #expect(results == [.handledSource, .handledSource, .handledSource, last])
        }

        // MARK: - Listings 3-3 to 3-9

        /// Listings 3-3 to 3-9, the custom input source with a command buffer (Figure 3-2): a
        /// worker thread installs a `RunLoopSource` (3-7); its schedule routine registers it with
        /// the client by performing `registerSource:` on the client's loop with a
        /// `RunLoopContext` (3-4, 3-8); the client adds commands and fires the source from its own
        /// thread: signal, then wake the worker's loop (3-9); the perform routine drains the
        /// commands on the worker (3-5); invalidating the source runs its cancel routine, which has
        /// the client remove it, waiting until it has (3-6, 3-8); with no source left the worker's
        /// loop finishes (3-2).
        @Test func listings3_3to3_9_aCustomInputSourceWithACommandBuffer() throws {
            let outcome = try onLoopThread { clientLoop in
                // The client plays the guide's application delegate on the main thread.
                let delegate = AppDelegate(loop: clientLoop)
                keepAlive(clientLoop, .default)

                let workerLoop = TestLatch<PKRunLoop>()
                let workerSource = TestLatch<RunLoopSource>()
                let workerResults = Locked<[PKRunLoopRunResult]>([])
                let worker = TestThread(name: "worker") {
                    let source = RunLoopSource(delegate: delegate)
                    workerLoop.set(PKRunLoop.current)
                    workerSource.set(source)
                    source.addToCurrentRunLoop()
                    // Listing 3-2's loop.
                    var result: PKRunLoopRunResult
                    repeat {
                        result = PKRunLoop.current.run(in: .default, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                        workerResults.withLock { $0.append(result) }
                    } while result != .stopped && result != .finished && result != .timedOut
                }

                // registerSource: arrives on the client's loop.
                try spin(clientLoop, "registerSource:") { !delegate.sourcesToPing.value.isEmpty }
                let context = delegate.sourcesToPing.value[0]
                let contextIsTheWorkers = try context.runLoop === workerLoop.wait() && context.source === workerSource.wait()

                // The client hands the worker commands and fires the source (Listing 3-9).
                context.source.addCommand(1, withData: "alpha")
                context.source.addCommand(2, withData: "beta")
                context.source.fireAllCommands(on: context.runLoop)
                try waitUntil("first commands") { context.source.processed.value.count == 2 }
                context.source.addCommand(3, withData: "gamma")
                context.source.fireAllCommands(on: context.runLoop)
                try waitUntil("third command") { context.source.processed.value.count == 3 }

                // Invalidate: the cancel routine has the client remove the source (Listing 3-6).
                context.source.invalidate()
                try spin(clientLoop, "removeSource:") { delegate.sourcesToPing.value.isEmpty }
                try worker.join()
                return (contextIsTheWorkers, context.source.processed.value, context.source.performedOnWorker.value,
                        context.source.cancelled.value, workerResults.value)
            }
            let (contextIsTheWorkers, processed, performedOnWorker, cancelled, workerResults) = outcome
            #expect(contextIsTheWorkers)
            #expect(processed == [Command(command: 1, data: "alpha"), Command(command: 2, data: "beta"),
                                  Command(command: 3, data: "gamma")])
            #expect(performedOnWorker)
            #expect(cancelled)
            #expect(workerResults == [.handledSource, .handledSource, .finished])
        }

        // MARK: - Listing 3-10

        /// Listing 3-10 "Creating and scheduling timers using NSTimer": a timer made with a fire
        /// date 1 s away and a 0.1 s interval (here 100 ms and 10 ms) added to the default mode
        /// with `addTimer:forMode:`, and one scheduled every 0.2 s (here 20 ms).
        @Test func listing3_10_aTimerWithAFireDateAndAScheduledTimer() throws {
            let (futureDate, log, fireDates) = try onLoopThread { _ in
                let myRunLoop = PKRunLoop.current
                var log: [String] = []
                var fireDates: [PKDeadline] = []
                var second: PKTimer?

                // Create and schedule the first timer.
                let futureDate = PKDeadline.after(.milliseconds(100))
                let myTimer = PKTimer(fireDate: futureDate, interval: .milliseconds(10)) { timer in
                    // myDoFireTimer1:
                    log.append("timer1")
                    fireDates.append(timer.fireDate)
                    if fireDates.count == 3 {
                        timer.invalidate()
                        second?.invalidate()
                    }
                }
                myRunLoop.add(myTimer, forMode: .default)

                // Create and schedule the second timer.
                second = myRunLoop.scheduleTimer(after: .milliseconds(20), repeats: true) { _ in
                    log.append("timer2")  // myDoFireTimer2:
                }

                myRunLoop.run(in: .default, until: .after(.seconds(10)))
                return (futureDate, log, fireDates)
            }
            let firstOfTimer1 = try #require(log.firstIndex(of: "timer1"))
            #expect(firstOfTimer1 > 0 && log[0] == "timer2", "the 20 ms timer fires before the one due at 100 ms")
            #expect(log.filter { $0 == "timer1" }.count == 3)
            #expect(fireDates.first == futureDate)
            let step = Duration.milliseconds(10).nanosecondsClamped
            for date in fireDates { #expect(nanoseconds(from: futureDate, to: date) % step == 0) }
        }

        // MARK: - Listing 3-11

        /// Listing 3-11 "Creating and scheduling a timer using Core Foundation": a repeating timer
        /// (0.1 s, then every 0.3 s; here 10 ms and 30 ms) whose callback gets a context, added to
        /// the common modes: it fires in the default mode and in any mode made common.
        @Test func listing3_11_aTimerWithAContextInTheCommonModes() throws {
            let modes = try onLoopThread { _ in
                let runLoop = PKRunLoop.current  // CFRunLoopGetCurrent()
                let context = TimerContext()  // CFRunLoopTimerContext's info
                let timer = PKTimer(fireDate: .after(.milliseconds(10)), interval: .milliseconds(30)) { timer in
                    myCFTimerCallback(timer, context)
                }
                runLoop.add(timer, forMode: .common)  // CFRunLoopAddTimer(runLoop, timer, kCFRunLoopCommonModes)

                let tracking: PKRunLoopMode = "listing-3-11-tracking"
                runLoop.addCommonMode(tracking)
                for mode in [PKRunLoopMode.default, .default, tracking, tracking] {
                    runLoop.run(in: mode, until: .after(.seconds(10)))  // each fire stops the run
                }
                timer.invalidate()
                return context.modes
            }
            #expect(modes == [.default, .default, "listing-3-11-tracking", "listing-3-11-tracking"])
        }
    }
}

// MARK: - Listing 3-3: the custom input source object and its context

private struct Command: Sendable, Equatable {
    let command: Int
    let data: String
}

/// Listing 3-3's `RunLoopSource`: a custom input source that manages a command buffer, filled
/// by other threads, behind a lock.
private final class RunLoopSource: @unchecked Sendable {
    // `runLoopSource` is set once, at the end of init (the routines need `self`), then only read.
    private(set) var runLoopSource: PKCustomSource!
    private let commands = Locked<[Command]>([])
    let delegate: AppDelegate
    private let installedOn = Locked<PKRunLoop?>(nil)
    /// What the perform routine did, for the test.
    let processed = Locked<[Command]>([])
    let performedOnWorker = Locked(true)
    let cancelled = Locked(false)

    /// Listing 3-7 `init`: the source's context carries `self` to the schedule, cancel and
    /// perform routines.
    init(delegate: AppDelegate) {
        self.delegate = delegate
        runLoopSource = PKCustomSource(
            schedule: { [weak self] loop, mode in if let self { runLoopSourceScheduleRoutine(self, loop, mode) } },
            cancel: { [weak self] loop, mode in if let self { runLoopSourceCancelRoutine(self, loop, mode) } },
            perform: { [weak self] in if let self { runLoopSourcePerformRoutine(self) } })
    }

    /// Listing 3-7 `addToCurrentRunLoop`.
    func addToCurrentRunLoop() {
        let runLoop = PKRunLoop.current  // CFRunLoopGetCurrent()
        installedOn.value = runLoop
        runLoop.add(runLoopSource, forMode: .default)  // CFRunLoopAddSource(..., kCFRunLoopDefaultMode)
    }

    /// `invalidate`: CFRunLoopSourceInvalidate. Safe from any thread.
    func invalidate() { runLoopSource.invalidate() }

    /// Handler method: runs the commands the clients queued.
    func sourceFired() {
        let pending = commands.withLock { queue in
            defer { queue.removeAll() }
            return queue
        }
        if PKRunLoop.current !== installedOn.value { performedOnWorker.value = false }
        processed.withLock { $0.append(contentsOf: pending) }
    }

    /// Client interface for registering commands to process.
    func addCommand(_ command: Int, withData data: String) {
        commands.withLock { $0.append(Command(command: command, data: data)) }
    }

    /// Listing 3-9 `fireAllCommandsOnRunLoop:`: signal the source, then wake its loop.
    func fireAllCommands(on runLoop: PKRunLoop) {
        runLoopSource.signal()  // CFRunLoopSourceSignal
        runLoop.wakeUp()  // CFRunLoopWakeUp
    }
}

/// Listing 3-3's `RunLoopContext`: carries the source and its run loop to the client.
private final class RunLoopContext: Sendable {
    let runLoop: PKRunLoop
    let source: RunLoopSource
    init(source: RunLoopSource, loop: PKRunLoop) {
        self.source = source
        self.runLoop = loop
    }
}

/// Listing 3-4 "Scheduling a run loop source": hand the client a context, on the client's
/// thread (`performSelectorOnMainThread:withObject:waitUntilDone:NO`).
private func runLoopSourceScheduleRoutine(_ obj: RunLoopSource, _ rl: PKRunLoop, _ mode: PKRunLoopMode) {
    let del = obj.delegate
    let theContext = RunLoopContext(source: obj, loop: rl)
    del.loop.perform { del.registerSource(theContext) }
}

/// Listing 3-5 "Performing work in the input source".
private func runLoopSourcePerformRoutine(_ obj: RunLoopSource) {
    obj.sourceFired()
}

/// Listing 3-6 "Invalidating an input source": have the client drop its context, and wait
/// until it has (`waitUntilDone:YES`).
private func runLoopSourceCancelRoutine(_ obj: RunLoopSource, _ rl: PKRunLoop, _ mode: PKRunLoopMode) {
    let del = obj.delegate
    let theContext = RunLoopContext(source: obj, loop: rl)
    let removed = TestLatch<Bool>()
    del.loop.perform {
        del.removeSource(theContext)
        removed.set(true)
    }
    obj.cancelled.value = (try? removed.wait(timeout: .seconds(10), "removeSource:")) ?? false
}

/// Listing 3-8: the client (the guide's application delegate) keeps the contexts of the
/// sources it may ping. Only its own thread touches the list (it is locked for the test's reads).
private final class AppDelegate: Sendable {
    let loop: PKRunLoop
    let sourcesToPing = Locked<[RunLoopContext]>([])
    init(loop: PKRunLoop) { self.loop = loop }

    func registerSource(_ sourceInfo: RunLoopContext) {
        sourcesToPing.withLock { $0.append(sourceInfo) }
    }

    func removeSource(_ sourceInfo: RunLoopContext) {
        // The guide compares contexts with isEqual:; two contexts are equal when they name the
        // same source on the same loop.
        sourcesToPing.withLock { contexts in
            contexts.removeAll { $0.source === sourceInfo.source && $0.runLoop === sourceInfo.runLoop }
        }
    }
}

/// Runs `loop` in short slices until `condition` holds, up to a deadline.
private func spin(_ loop: PKRunLoop, _ what: String, timeout: Duration = .seconds(10), until condition: () -> Bool) throws {
    let deadline = PKDeadline.after(timeout)
    while !condition() {
        if deadline.hasPassed { throw TestTimeout(what: what) }
        loop.run(in: .default, until: .after(.milliseconds(10)))
    }
}

// MARK: - Listing 3-11: a timer callback with a context

/// What `CFRunLoopTimerContext`'s info pointer would carry. Only the loop's thread touches it.
private final class TimerContext: @unchecked Sendable {
    var modes: [PKRunLoopMode] = []
}

/// `myCFTimerCallback`: records the mode it fired in and ends the current run.
private func myCFTimerCallback(_ timer: PKTimer, _ info: TimerContext) {
    let runLoop = PKRunLoop.current
    info.modes.append(runLoop.currentModeIfRunning!)
    runLoop.stop()
}
