// The operations that are safe from any thread: signal + wake, perform, stop. Each test lets the
// loop fall asleep first (an observer sees beforeWaiting), then acts from another thread.

import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct CrossThreadTests {
        /// A loop makes its epoll descriptor and eventfd at its first sleep. Wake-ups and
        /// messages from another thread before then are not lost: the first sleep finds them.
        @Test func workFromAnotherThreadBeforeTheLoopsFirstSleepIsNotLost() throws {
            let (madeBefore, handled, got) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-before-first-sleep"
                let performed = Locked(false)
                let source = PKCustomSource { performed.value = true }
                loop.add(source, forMode: mode)
                var got: [UInt32] = []
                let port = PKReceivePort { got.append($0.msgid) }
                try loop.add(port, forMode: mode)
                loop.runOnePass(in: mode)  // a pass that does not sleep makes nothing
                let madeBefore = loop.hasKernelObjects
                let right = port.makeSendRight()
                let other = TestThread {
                    source.signal(waking: loop)
                    try? right.send(PKPortMessage(msgid: 7), timeout: .seconds(5))
                }
                try other.join()
                let deadline = PKDeadline.after(patience(.seconds(10)))
                while !(performed.value && got == [7]) && !deadline.hasPassed {
                    loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
                }
                port.invalidate()
                source.invalidate()
                return (madeBefore, performed.value, got)
            }
            #expect(!madeBefore)
            #expect(handled)
            #expect(got == [7])
        }

        /// A bare `wakeUp()` from another thread before the loop ever slept (so before it has
        /// an eventfd to write): the loop's first sleep ends at once, not at its deadline.
        @Test func aWakeUpBeforeTheLoopsFirstSleepEndsThatSleep() throws {
            let (madeBefore, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-wake-before-first-sleep"
                keepAlive(loop, mode)
                let madeBefore = loop.hasKernelObjects
                let other = TestThread { loop.wakeUp() }
                try other.join()
                // A lost wake-up would show as a sleep that lasts until the run's deadline.
                let deadline = PKDeadline.after(patience(.seconds(10)))
                let observer = PKRunLoopObserver(activities: .afterWaiting) { _, _ in
                    if !deadline.hasPassed { loop.stop() }
                }
                loop.add(observer, forMode: mode)
                let result = loop.run(in: mode, until: deadline)
                observer.invalidate()
                return (madeBefore, result)
            }
            #expect(!madeBefore)
            #expect(result == .stopped, "the wake-up was lost: the first sleep lasted until the deadline")
        }

        /// A wake-up ends one sleep, not every sleep after it: woken three times from another
        /// thread, the loop sleeps again after each. (The eventfd is edge-triggered and never
        /// read, so a wake-up left readable would make every later wait return at once.)
        @Test func aLoopWokenFromAnotherThreadSleepsAgain() throws {
            let (result, wakes, passes) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-sleeps-again"
                let keeper = keepAlive(loop, mode)
                let asleep = Locked(false)
                let flagger = flagWhenAsleep(loop, mode, asleep)
                var passes = 0
                let counter = PKRunLoopObserver(activities: .beforeWaiting) { _, _ in passes += 1 }
                loop.add(counter, forMode: mode)
                let wakes = Locked(0)
                let other = TestThread {
                    for _ in 0..<3 {
                        guard (try? waitPatiently("loop asleep", { asleep.value })) != nil else { break }
                        asleep.value = false  // before the wake-up: the next sleep sets it again
                        loop.wakeUp()
                        wakes.value += 1
                    }
                    // A loop that sleeps makes no pass in these 100 ms; one that spins, thousands.
                    try? waitPatiently("loop asleep") { asleep.value }
                    sleepFor(.milliseconds(100))
                    loop.stop()
                }
                let result = loop.run(in: mode, until: .after(patience(.seconds(10))))
                try other.join()
                counter.invalidate()
                flagger.invalidate()
                keeper.invalidate()
                return (result, wakes.value, passes)
            }
            #expect(result == .stopped)
            #expect(wakes == 3)
            #expect(passes < 50, "the loop spun (\(passes) passes) instead of sleeping after its wake-ups")
        }

        @Test func aSignalFromAnotherThreadWakesASleepingLoop() throws {
            let (result, performedOnOwner) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-signal"
                let asleep = Locked(false)
                var performedOnOwner = false
                flagWhenAsleep(loop, mode, asleep)
                let source = PKCustomSource { performedOnOwner = loop.isOwnedByCurrentThread }
                loop.add(source, forMode: mode)
                let other = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    source.signal(waking: loop)
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                try other.join()
                return (result, performedOnOwner)
            }
            #expect(result == .handledSource)
            #expect(performedOnOwner)
        }

        /// The guide's Listing 3-9 pattern in two steps: `signal()` alone does not wake the loop
        /// (CFRunLoopSourceSignal), `wakeUp()` then does (CFRunLoopWakeUp).
        @Test func aSignalWithoutAWakeUpWaitsForTheWakeUp() throws {
            let (performedBeforeWake, result, performed) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-signal-no-wake"
                let asleep = Locked(false)
                let performed = Locked(false)
                let performedBeforeWake = Locked<Bool?>(nil)
                flagWhenAsleep(loop, mode, asleep)
                let source = PKCustomSource { performed.value = true }
                loop.add(source, forMode: mode)
                let other = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    source.signal()
                    sleepFor(.milliseconds(100))
                    performedBeforeWake.value = performed.value
                    loop.wakeUp()
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                try other.join()
                return (performedBeforeWake.value, result, performed.value)
            }
            #expect(performedBeforeWake == false)
            #expect(result == .handledSource)
            #expect(performed)
        }

        @Test func aPerformFromAnotherThreadWakesASleepingLoopAndRunsOnIt() throws {
            let (result, log) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-perform"
                let asleep = Locked(false)
                let log = Locked<[String]>([])
                flagWhenAsleep(loop, mode, asleep)
                keepAlive(loop, mode)
                let other = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    for index in 0..<3 {
                        loop.perform(inModes: [mode]) {
                            log.append("block\(index) owner=\(loop.isOwnedByCurrentThread)")
                            if index == 2 { loop.stop() }
                        }
                    }
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)))
                try other.join()
                return (result, log.value)
            }
            #expect(result == .stopped)
            #expect(log == ["block0 owner=true", "block1 owner=true", "block2 owner=true"])
        }

        /// Listing 3-14's worker loop, `while !shouldExit { runMode:beforeDate: }`, with the flag
        /// set by a block performed from another thread (`performSelector:onThread:`): the run
        /// returns after the block as after a handled source, and the loop sees the flag. (The
        /// run slept on to its deadline: the worker never left.)
        @Test func aPerformFromAnotherThreadEndsARunThatReturnsAfterASource() throws {
            let (result, shouldExit) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-perform-exit"
                let asleep = Locked(false)
                let shouldExit = Locked(false)
                flagWhenAsleep(loop, mode, asleep)
                keepAlive(loop, mode)
                let other = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    loop.perform(inModes: [mode]) { shouldExit.value = true }
                }
                let result = loop.run(in: mode, until: .after(patience(.seconds(60))), returnAfterSourceHandled: true)
                try other.join()
                return (result, shouldExit.value)
            }
            #expect(result == .handledSource)
            #expect(shouldExit)
        }

        @Test func aPerformForAnotherModeWaitsForARunInThatMode() throws {
            let (duringOther, afterOwn) = try onLoopThread { loop in
                let ran = Locked(false)
                loop.perform(inModes: ["xt-perform-target"]) { ran.value = true }
                keepAlive(loop, "xt-perform-other")
                keepAlive(loop, "xt-perform-target")
                loop.run(in: "xt-perform-other", until: .after(.milliseconds(30)))
                let duringOther = ran.value
                loop.run(in: "xt-perform-target", until: .after(.milliseconds(30)))
                return (duringOther, ran.value)
            }
            #expect(!duringOther)
            #expect(afterOwn)
        }

        @Test func aStopFromAnotherThreadEndsASleepingRun() throws {
            let result = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-stop"
                let asleep = Locked(false)
                flagWhenAsleep(loop, mode, asleep)
                keepAlive(loop, mode)
                let other = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    loop.stop()
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)))
                try other.join()
                return result
            }
            #expect(result == .stopped)
        }

        /// Several threads perform many blocks while the loop keeps falling asleep: none is lost,
        /// and each thread's blocks run in the order it gave them.
        @Test func manyThreadsPerformingConcurrentlyLoseNoWakeUp() throws {
            let threads = 4
            let perThread = 250
            let (result, count, inOrder) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "xt-many-performs"
                keepAlive(loop, mode)
                let seen = Locked<[[Int]]>(Array(repeating: [], count: threads))
                var others: [TestThread] = []
                for thread in 0..<threads {
                    others.append(TestThread {
                        for index in 0..<perThread {
                            loop.perform(inModes: [mode]) {
                                let total = seen.withLock { seen in
                                    seen[thread].append(index)
                                    return seen.map(\.count).reduce(0, +)
                                }
                                if total == threads * perThread { loop.stop() }
                            }
                            if index % 50 == 0 { sleepFor(.milliseconds(1)) }
                        }
                    })
                }
                // One long run: a lost wake-up would leave it asleep until the deadline.
                let result = loop.run(in: mode, until: .after(.seconds(20)))
                for other in others { try other.join() }
                let final = seen.value
                return (result, final.map(\.count).reduce(0, +), final.allSatisfy { $0 == Array(0..<perThread) })
            }
            #expect(result == .stopped)
            #expect(count == threads * perThread)
            #expect(inOrder)
        }
    }
}
