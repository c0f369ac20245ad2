// Process hygiene: the thread rule traps, no descriptor outlives its loop or source, a loop's
// items leave it when its thread ends, and an idle loop sleeps in epoll_wait without waking.

import Foundation
import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct RunLoopHygieneTests {
        // MARK: - The thread rule

        @Test func runningTheMainLoopFromAnotherThreadTraps() async {
            var result: ExitTest.Result?
            await exitTestInTurn {
                result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
                    let thread = TestThread {
                        PKRunLoop.main.run(in: "wrong-thread-main", until: .after(.seconds(1)))
                        exit(0)  // reached only if the call did not trap
                    }
                    try? thread.join(timeout: .seconds(30))
                    exit(0)
                }
            }
            let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
            #expect(message.contains("is loop-only"))
        }

        @Test func runningALoopFromAThreadThatDoesNotOwnItTraps() async {
            var result: ExitTest.Result?
            await exitTestInTurn {
                result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
                    let made = TestLatch<PKRunLoop>()
                    let release = TestLatch<Bool>()
                    let owner = TestThread {
                        made.set(PKRunLoop.current)
                        _ = try? release.wait(timeout: .seconds(30))
                    }
                    let loop = try! made.wait()
                    loop.run(in: "wrong-thread-other", until: .after(.seconds(1)))
                    release.set(true)
                    try? owner.join()
                    exit(0)  // reached only if the call did not trap
                }
            }
            let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
            #expect(message.contains("PKRunLoop.run(in:until:returnAfterSourceHandled:) is loop-only"))
        }

        @Test func addingAnItemFromAThreadThatDoesNotOwnTheLoopTraps() async {
            await exitTestInTurn {
                await #expect(processExitsWith: .failure) {
                    let made = TestLatch<PKRunLoop>()
                    let release = TestLatch<Bool>()
                    let owner = TestThread {
                        made.set(PKRunLoop.current)
                        _ = try? release.wait(timeout: .seconds(30))
                    }
                    let loop = try! made.wait()
                    loop.add(PKCustomSource {}, forMode: "wrong-thread-add")
                    release.set(true)
                    try? owner.join()
                    exit(0)  // reached only if the call did not trap
                }
            }
        }

        /// An observer belongs to one loop, as a timer does: adding it to a second traps.
        @Test func addingAnObserverToASecondLoopTraps() async {
            var result: ExitTest.Result?
            await exitTestInTurn {
                result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
                    let observer = PKRunLoopObserver(activities: .beforeWaiting) { _, _ in }
                    let added = TestLatch<Bool>()
                    let release = TestLatch<Bool>()
                    let first = TestThread {
                        PKRunLoop.current.add(observer, forMode: "first-loop")
                        added.set(true)
                        _ = try? release.wait(timeout: .seconds(30))  // its loop lives meanwhile
                    }
                    _ = try? added.wait()
                    let second = TestThread { PKRunLoop.current.add(observer, forMode: "second-loop") }
                    try? second.join()
                    release.set(true)
                    try? first.join()
                    exit(0)  // reached only if the add did not trap
                }
            }
            let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
            #expect(message.contains("an observer belongs to one run loop"), "\(message)")
        }

        @Test func runningInTheCommonPseudoModeTraps() async {
            await exitTestInTurn {
                await #expect(processExitsWith: .failure) {
                    let thread = TestThread {
                        PKRunLoop.current.run(in: .common, until: .after(.seconds(1)))
                        exit(0)  // reached only if the call did not trap
                    }
                    try? thread.join(timeout: .seconds(30))
                    exit(0)
                }
            }
        }

        // MARK: - Descriptors

        /// A thousand threads each make a loop (with a few items, after one pass and a run with a
        /// deadline) and end: every loop is released and its epoll, eventfd and two timerfd
        /// descriptors (timers, deadlines) are closed.
        /// Run in a child process (an exit test), so the count is exact: no other test's
        /// descriptors blur it.
        @Test func aThousandLoopsWhoseThreadsEndLeaveNoDescriptorOpen() async {
            await exitTestInTurn {
                await #expect(processExitsWith: .success) {
                    await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                    do {
                        try TestThread { _ = PKRunLoop.current }.join()  // first-use set-up out of the count
                        let before = openDescriptorCount()
                        let targets = descriptorTargets()
                        // Eight threads at a time, each handing back a weak reference to its loop.
                        var loops: [WeakLoop] = []
                        for _ in 0..<125 {
                            let latches = (0..<8).map { _ in TestLatch<WeakLoop>() }
                            let threads = latches.map { latch in
                                TestThread(name: "short-lived-loop") {
                                    let loop = PKRunLoop.current
                                    keepAlive(loop, "short-lived")
                                    loop.scheduleTimer(after: .seconds(60), forMode: "short-lived") { _ in }
                                    loop.runOnePass(in: "short-lived")
                                    loop.run(in: "short-lived", until: .after(.milliseconds(1)))
                                    latch.set(WeakLoop(loop))
                                }
                            }
                            for thread in threads { try thread.join() }
                            for latch in latches { loops.append(try latch.wait()) }
                        }
                        try waitUntil("every loop released", timeout: patience(.seconds(20))) { loops.allSatisfy { $0.loop == nil } }
                        let after = settledDescriptorCount(atMost: before, timeout: patience(.seconds(20)))
                        endExitTest("1,000 loops: descriptors \(before) before, \(after) after; new: \(newDescriptors(since: targets, descriptorTargets()))",
                                    failures: (loops.count == 1_000 ? [] : ["\(loops.count) loops"]) + (after <= before ? [] : ["descriptors left open"]))
                    } catch {
                        endExitTest("failed: \(error)", failures: ["\(error)"])
                    }
                }
            }
        }

        /// A thousand descriptor sources (and as many custom sources and timers) added to a loop,
        /// run, then removed: nothing the loop opened for them stays open.
        /// Run in a child process (an exit test), so the count is exact.
        @Test func aThousandSourcesAddedAndRemovedLeaveNoDescriptorOpen() async {
            await exitTestInTurn {
                await #expect(processExitsWith: .success) {
                    await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                    do {
                        // First-use set-up out of the count: a loop thread with one of each item.
                        _ = try onLoopThread { loop in
                            let pipe = try TestPipe()
                            defer { pipe.closeBoth() }
                            let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in pipe.drain() }
                            try loop.add(source, forMode: "warm-up")
                            loop.add(PKCustomSource {}, forMode: "warm-up")
                            let timer = loop.scheduleTimer(after: .seconds(60), forMode: "warm-up") { _ in }
                            pipe.makeReadable()
                            loop.run(in: "warm-up", until: .after(.milliseconds(10)), returnAfterSourceHandled: true)
                            source.invalidate()
                            timer.invalidate()
                        }
                        let before = openDescriptorCount()
                        let targets = descriptorTargets()
                        let (handled, remaining) = try onLoopThread { loop in
                            let mode: PKRunLoopMode = "hygiene-thousand-sources"
                            var handled = 0
                            var pipes: [TestPipe] = []
                            var descriptors: [PKDescriptorSource] = []
                            var customs: [PKCustomSource] = []
                            var timers: [PKTimer] = []
                            for _ in 0..<1_000 {
                                let pipe = try TestPipe()
                                pipes.append(pipe)
                                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                                    handled += 1
                                    pipe.drain()
                                }
                                try loop.add(source, forMode: mode)
                                descriptors.append(source)
                                let custom = PKCustomSource {}
                                loop.add(custom, forMode: mode)
                                customs.append(custom)
                                timers.append(loop.scheduleTimer(after: .seconds(60), forMode: mode) { _ in })
                                pipe.makeReadable()
                            }
                            let deadline = PKDeadline.after(patience(.seconds(20)))
                            while handled < 1_000 && !deadline.hasPassed { loop.run(in: mode, until: .after(.milliseconds(50))) }
                            for (index, source) in descriptors.enumerated() {
                                // Half leave their mode first; all are invalidated before their pipes close.
                                if index.isMultiple(of: 2) { loop.remove(source, forMode: mode) }
                                source.invalidate()
                            }
                            for custom in customs { loop.remove(custom, forMode: mode) }
                            for timer in timers { timer.invalidate() }
                            for pipe in pipes { pipe.closeBoth() }
                            let remaining = loop.run(in: mode, until: .after(.seconds(5)))
                            return (handled, remaining)
                        }
                        let after = settledDescriptorCount(atMost: before, timeout: patience(.seconds(20)))
                        endExitTest("1,000 sources: \(handled) handled; descriptors \(before) before, \(after) after; new: \(newDescriptors(since: targets, descriptorTargets()))",
                                    failures: (handled == 1_000 ? [] : ["\(handled) handled"]) + (remaining == .finished ? [] : ["the mode still has items"])
                                        + (after <= before ? [] : ["descriptors left open"]))
                    } catch {
                        endExitTest("failed: \(error)", failures: ["\(error)"])
                    }
                }
            }
        }

        // MARK: - Thread end

        /// When a loop's thread ends, its items leave it: custom sources are invalidated and their
        /// cancel routine runs for each mode, descriptor sources' cancel handlers run, timers and
        /// observers are invalidated.
        @Test func aLoopWhoseThreadEndsInvalidatesItsItems() throws {
            let pipe = try TestPipe()
            defer { pipe.closeBoth() }
            let log = Locked<[String]>([])
            let items = TestLatch<ThreadEndItems>()
            let thread = TestThread(name: "ending-loop-thread") {
                let loop = PKRunLoop.current
                let custom = PKCustomSource(cancel: { _, mode in log.append("custom-cancel \(mode)") }) {}
                loop.add(custom, forMode: "thread-end-a")
                loop.add(custom, forMode: "thread-end-b")
                let descriptor = PKDescriptorSource(
                    descriptor: pipe.readEnd, handler: { _ in }, cancel: { log.append("descriptor-cancel") })
                do { try loop.add(descriptor, forMode: "thread-end-a") } catch { log.append("add failed: \(error)") }
                let timer = loop.scheduleTimer(after: .seconds(60), forMode: "thread-end-a") { _ in }
                let observer = PKRunLoopObserver(activities: .all) { _, _ in }
                loop.add(observer, forMode: "thread-end-a")
                loop.runOnePass(in: "thread-end-a")
                items.set(ThreadEndItems(custom: custom, descriptor: descriptor, timer: timer, observer: observer))
            }
            try thread.join()
            // The pthread key's destructor runs after the thread's body returned.
            try waitUntil("cancel routines") { log.value.count == 3 }
            let ended = try items.wait()
            #expect(Set(log.value) == ["custom-cancel thread-end-a", "custom-cancel thread-end-b", "descriptor-cancel"])
            #expect(!ended.custom.isValid)
            #expect(!ended.descriptor.isValid)
            #expect(!ended.timer.isValid)
            #expect(!ended.observer.isValid)
        }

        /// A custom source invalidated or signalled after its loop's thread ended is not kept
        /// by the loop (no purge or pass will take it): a source whose closure holds its loop
        /// would keep both alive, and the loop's descriptors. (A signal was queued for good.)
        @Test(arguments: [false, true])
        func aSourceInvalidatedOrSignalledAfterItsLoopsThreadEndedIsReleased(signalled: Bool) throws {
            let handOff = Locked<PKCustomSource?>(nil)
            let weakLoop = Locked<WeakLoop?>(nil)
            let thread = TestThread(name: "ending-loop-thread") {
                let loop = PKRunLoop.current
                let source = PKCustomSource { _ = loop }  // its closure holds the loop
                loop.add(source, forMode: "thread-end-late")
                loop.remove(source, forMode: "thread-end-late")  // in no mode: the end leaves it valid
                handOff.value = source
                weakLoop.value = WeakLoop(loop)
            }
            try thread.join()
            // The thread's end runs after its body returned (a thread-local destructor).
            try waitUntil("the loop's thread ended") { weakLoop.value?.loop?.threadEnded ?? true }
            handOff.withLock { source in
                if signalled { source?.signal() } else { source?.invalidate() }
                source = nil
            }
            try waitUntil("the loop released") { weakLoop.value?.loop == nil }
        }

        /// A source invalidated from another thread while in no mode waits in the loop's queue
        /// of invalidated sources; released at the thread's end, its closure may release the
        /// last reference to an object whose deinit invalidates another source of the loop,
        /// which takes that queue's lock: it was released under the lock, and the thread hung.
        @Test func aSourceReleasedAtItsLoopsThreadEndMayInvalidateAnother() throws {
            final class InvalidatesOnDeinit: @unchecked Sendable {
                let other: PKCustomSource
                init(_ other: PKCustomSource) { self.other = other }
                deinit { other.invalidate() }
            }
            let handOff = Locked<PKCustomSource?>(nil)
            let dropped = Locked(false)
            let thread = TestThread(name: "ending-loop-release") {
                let loop = PKRunLoop.current
                let other = PKCustomSource {}
                loop.add(other, forMode: .default)
                let holder = InvalidatesOnDeinit(other)
                let first = PKCustomSource { _ = holder }
                loop.add(first, forMode: .default)
                loop.remove(first, forMode: .default)
                handOff.value = first
                // Until another thread has invalidated it and let it go: the loop holds the
                // last reference, in its queue.
                try? waitUntil("the source invalidated elsewhere", timeout: patience(.seconds(10))) { dropped.value }
            }
            try waitUntil("the source handed off") { handOff.value != nil }
            handOff.withLock { source in
                source?.invalidate()
                source = nil
            }
            dropped.value = true
            try thread.join(timeout: patience(.seconds(10)))
        }

        /// A block given to `perform` once the loop's thread has ended is dropped, not queued
        /// for good: one that holds the loop (a port's watch queues such a block) kept it, and
        /// its descriptors, for the life of the process.
        @Test func aBlockPerformedAfterItsLoopsThreadEndedIsDropped() throws {
            let handOff = Locked<PKRunLoop?>(nil)
            let thread = TestThread(name: "ended-loop-perform") { handOff.value = PKRunLoop.current }
            try thread.join()
            let ran = Locked(false)
            // The strong reference ends with this function.
            func performOnTheEndedLoop() throws -> WeakLoop {
                let loop = handOff.value!
                handOff.value = nil
                // The thread's end runs after its body returned (a thread-local destructor).
                try waitUntil("the loop's thread ended") { loop.threadEnded }
                loop.perform { _ = loop; ran.value = true }
                #expect(loop.queuedPerformBlocks == 0)
                return WeakLoop(loop)
            }
            let weakLoop = try performOnTheEndedLoop()
            try waitUntil("the loop released") { weakLoop.loop == nil }
            #expect(!ran.value)
        }

        // MARK: - Sleeping

        /// No periodic wake-up: a run with nothing to do (one timer a minute away) sleeps once for
        /// its whole 300 ms.
        @Test func anIdleLoopSleepsOnceForTheWholeRun() throws {
            let (log, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "hygiene-idle"
                let log = Locked<[String]>([])
                keepAlive(loop, mode)
                let far = loop.scheduleTimer(after: .seconds(60), forMode: mode) { _ in }
                logActivities(of: loop, in: mode, into: log, [.beforeWaiting, .afterWaiting])
                let result = loop.run(in: mode, until: .after(.milliseconds(300)))
                far.invalidate()
                return (log.value, result)
            }
            #expect(result == .timedOut)
            #expect(log == ["beforeWaiting", "afterWaiting"])
        }

        /// While it sleeps, the loop's thread is blocked in epoll_wait (its kernel wait channel is
        /// `ep_poll`). Cancelled where the kernel does not report wait channels.
        @Test func anIdleLoopBlocksInEpollWait() throws {
            let channels = try onLoopThread { loop in
                let mode: PKRunLoopMode = "hygiene-wchan"
                let asleep = Locked(false)
                let channels = Locked<Set<String>>([])
                flagWhenAsleep(loop, mode, asleep)
                keepAlive(loop, mode)
                let path = "/proc/self/task/\(loop.threadID)/wchan"
                let watcher = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    try? waitUntil("ep_poll", timeout: .seconds(5)) {
                        let channel = (try? String(contentsOfFile: path, encoding: .utf8)) ?? "?"
                        channels.withLock { _ = $0.insert(channel) }
                        return epollWaitChannels.contains(channel)
                    }
                    loop.stop()
                }
                loop.run(in: mode, until: .after(.seconds(10)))
                try watcher.join()
                return channels.value
            }
            if !channels.contains(where: epollWaitChannels.contains) && channels.isSubset(of: ["0", "?", ""]) {
                try Test.cancel("the kernel does not report wait channels here")
            }
            #expect(channels.contains(where: epollWaitChannels.contains), "\(channels)")
        }
    }
}

/// The wait channels of a thread blocked in epoll_wait.
private let epollWaitChannels: Set<String> = ["ep_poll", "do_epoll_wait"]

/// The items of a loop whose thread ends, handed back to the test.
private struct ThreadEndItems: Sendable {
    let custom: PKCustomSource
    let descriptor: PKDescriptorSource
    let timer: PKTimer
    let observer: PKRunLoopObserver
}

/// A weak reference to a loop, to see it released once its thread ended.
private final class WeakLoop: @unchecked Sendable {
    weak var loop: PKRunLoop?
    init(_ loop: PKRunLoop) { self.loop = loop }
}
