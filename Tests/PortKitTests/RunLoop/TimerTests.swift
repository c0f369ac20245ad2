// Timers: never early, repeating timers stay on their grid, one-shot timers invalidate, and
// timers can be added, removed and invalidated from callbacks and other threads.

import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct TimerTests {
        struct Fire: Sendable {
            let fireDate: PKDeadline
            let start: PKDeadline
            let end: PKDeadline
        }

        /// A repeating timer whose first callback blocks for 3.5 intervals misses three fire dates:
        /// it fires once for them, then on the next point of its original grid, and every fire
        /// date stays on fireDate0 + k * interval. No burst of catch-up fires.
        @Test func aRepeatingTimerThatBlocksFiresOnceThenStaysOnItsGrid() throws {
            let interval = Duration.milliseconds(60)
            let step = interval.nanosecondsClamped
            let (first, fires) = try onLoopThread { loop in
                let first = PKDeadline.after(.milliseconds(10))
                var fires: [Fire] = []
                let timer = PKTimer(fireDate: first, interval: interval) { timer in
                    let start = PKDeadline.now
                    if fires.isEmpty { sleepFor(interval * 3.5) }
                    fires.append(Fire(fireDate: timer.fireDate, start: start, end: .now))
                    if fires.count == 5 { timer.invalidate() }
                }
                loop.add(timer, forMode: "timer-grid")
                loop.run(in: "timer-grid", until: .after(.seconds(10)))
                return (first, fires)
            }
            try #require(fires.count == 5)
            let k = fires.map { nanoseconds(from: first, to: $0.fireDate) / step }
            for fire in fires {
                #expect(nanoseconds(from: first, to: fire.fireDate) % step == 0, "fire date on the grid")
                #expect(fire.start >= fire.fireDate, "never early")
            }
            #expect(k[0] == 0)
            #expect(zip(k, k.dropFirst()).allSatisfy { $0 < $1 }, "each grid point fires at most once: \(k)")
            // Grid points 1, 2 and 3 passed while the first callback blocked: none of them fired.
            #expect(k[1] >= 4, "\(k)")
            #expect(fires[1].fireDate > fires[0].end, "no catch-up fire for a grid point that had passed")
            // The next fire date is the first grid point after the callback returned (the loop reads
            // the clock a moment after the callback's own last reading: allow the next point too).
            let firstAfterReturn = nanoseconds(from: first, to: fires[0].end) / step + 1
            #expect(k[1] == firstAfterReturn || k[1] == firstAfterReturn + 1, "\(k), returned in interval \(firstAfterReturn - 1)")
        }

        /// Tolerance lets the loop fire a timer late, never early: whatever else wakes the loop
        /// (here a timer without tolerance just before), a tolerant timer fires at or after its date.
        @Test func toleranceNeverFiresEarly() throws {
            let fires = try onLoopThread { loop in
                let mode: PKRunLoopMode = "tolerance-never-early"
                var fires: [Fire] = []
                func record(_ timer: PKTimer) {
                    fires.append(Fire(fireDate: timer.fireDate, start: .now, end: .now))
                }
                for (offset, tolerance) in [(2, 0), (5, 40), (6, 0), (9, 25), (20, 100), (21, 0)] {
                    let timer = PKTimer(
                        fireDate: .after(.milliseconds(offset)), tolerance: .milliseconds(tolerance), handler: record)
                    loop.add(timer, forMode: mode)
                }
                var repeatsLeft = 5
                let repeating = PKTimer(fireDate: .after(.milliseconds(3)), interval: .milliseconds(7)) { timer in
                    record(timer)
                    repeatsLeft -= 1
                    if repeatsLeft == 0 { timer.invalidate() }
                }
                repeating.tolerance = .milliseconds(5)
                loop.add(repeating, forMode: mode)
                loop.run(in: mode, until: .after(.seconds(10)))
                return fires
            }
            #expect(fires.count == 11)
            for fire in fires { #expect(fire.start >= fire.fireDate) }
        }

        @Test func timersDueTogetherFireInFireDateOrder() throws {
            let order = try onLoopThread { loop in
                let base = PKDeadline.now
                var order: [Int] = []
                for index in [3, 1, 4, 0, 2] {
                    loop.add(PKTimer(fireDate: base + .microseconds(index)) { _ in order.append(index) }, forMode: "timer-order")
                }
                sleepFor(.milliseconds(2))  // all five are due before the run starts
                loop.run(in: "timer-order", until: .after(.seconds(10)))
                return order
            }
            #expect(order == [0, 1, 2, 3, 4])
        }

        @Test func aOneShotTimerIsInvalidatedAfterFiringAndLeavesItsModes() throws {
            let (fired, validAfter, containedAfter, result) = try onLoopThread { loop in
                var fired = 0
                let timer = PKTimer(interval: .milliseconds(5), repeats: false) { _ in fired += 1 }
                loop.add(timer, forMode: "one-shot")
                let result = loop.run(in: "one-shot", until: .after(.seconds(10)))
                return (fired, timer.isValid, loop.contains(timer, inMode: "one-shot"), result)
            }
            #expect(fired == 1)
            #expect(!validAfter)
            #expect(!containedAfter)
            #expect(result == .finished)
        }

        @Test func timersAddedFromCallbacksFire() throws {
            let log = try onLoopThread { loop in
                let mode: PKRunLoopMode = "timers-from-callbacks"
                let log = Locked<[String]>([])
                keepAlive(loop, mode)
                loop.scheduleTimer(after: .milliseconds(1), forMode: mode) { _ in
                    log.append("timer")
                    loop.scheduleTimer(after: .milliseconds(5), forMode: mode) { _ in log.append("timer-from-timer") }
                    // A fire date already past when added.
                    loop.add(PKTimer(fireDate: .distantPast) { _ in log.append("past-timer-from-timer") }, forMode: mode)
                }
                let source = PKCustomSource {
                    log.append("source")
                    loop.scheduleTimer(after: .milliseconds(5), forMode: mode) { _ in log.append("timer-from-source") }
                }
                loop.add(source, forMode: mode)
                source.signal()
                loop.perform(inModes: [mode]) {
                    log.append("perform")
                    loop.scheduleTimer(after: .milliseconds(5), forMode: mode) { _ in log.append("timer-from-perform") }
                }
                let deadline = PKDeadline.after(patience(.seconds(10)))
                while log.value.count < 7 && !deadline.hasPassed {
                    loop.run(in: mode, until: .after(.milliseconds(20)))
                }
                return log.value
            }
            #expect(Set(log) == ["timer", "timer-from-timer", "past-timer-from-timer", "source", "timer-from-source",
                                 "perform", "timer-from-perform"])
            #expect(log.count == 7)
        }

        /// Invalidation from another thread while the loop sleeps: the timer never fires, and the
        /// woken loop drops it (its mode is then empty, so the run finishes).
        @Test func aTimerInvalidatedFromAnotherThreadNeverFires() throws {
            let (fired, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "invalidate-cross-thread"
                let asleep = Locked(false)
                let fired = Locked(false)
                flagWhenAsleep(loop, mode, asleep)
                let timer = loop.scheduleTimer(after: .seconds(1), forMode: mode) { _ in fired.value = true }
                let other = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    timer.invalidate()
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)))
                // Past the old fire date too: nothing left to fire it.
                keepAlive(loop, mode)
                loop.run(in: mode, until: timer.fireDate + .milliseconds(50))
                try other.join()
                return (fired.value, result)
            }
            #expect(!fired)
            #expect(result == .finished)
        }

        /// Like a source, a timer removed by another timer's callback in the same pass, while both
        /// are due, must not fire.
        @Test func aDueTimerRemovedByAnotherTimersCallbackDoesNotFire() throws {
            let (log, removedIsValid) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "timer-removed-in-pass"
                var log: [String] = []
                let base = PKDeadline.now
                let second = PKTimer(fireDate: base + .microseconds(1)) { _ in log.append("second") }
                let first = PKTimer(fireDate: base) { _ in
                    log.append("first")
                    loop.remove(second, forMode: mode)
                }
                loop.add(first, forMode: mode)
                loop.add(second, forMode: mode)
                sleepFor(.milliseconds(2))  // both are due before the run starts
                keepAlive(loop, mode)
                loop.run(in: mode, until: .after(.milliseconds(50)))
                return (log, second.isValid)
            }
            #expect(log == ["first"])
            #expect(removedIsValid, "removing a timer does not invalidate it")
        }

        @Test func aRemovedTimerCanBeAddedAgainAndFires() throws {
            let (firedWhileRemoved, firedAfter) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "timer-remove-readd"
                var fired = 0
                keepAlive(loop, mode)
                let timer = loop.scheduleTimer(after: .milliseconds(5), forMode: mode) { _ in fired += 1 }
                loop.remove(timer, forMode: mode)
                loop.run(in: mode, until: .after(.milliseconds(30)))
                let firedWhileRemoved = fired
                loop.add(timer, forMode: mode)
                loop.run(in: mode, until: .after(.milliseconds(30)))
                return (firedWhileRemoved, fired)
            }
            #expect(firedWhileRemoved == 0)
            #expect(firedAfter == 1)
        }

        @Test func movingAFireDateLaterIsObeyed() throws {
            let (newDate, firedAt) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "timer-move-later"
                var firedAt: PKDeadline?
                let timer = loop.scheduleTimer(after: .milliseconds(10), forMode: mode) { _ in firedAt = .now }
                let newDate = PKDeadline.after(.milliseconds(60))
                loop.scheduleTimer(after: .milliseconds(1), forMode: mode) { _ in timer.fireDate = newDate }
                loop.run(in: mode, until: .after(.seconds(10)))
                return (newDate, firedAt)
            }
            let fired = try #require(firedAt)
            #expect(fired >= newDate)
        }

        /// Timers due at one date fire in the order they were added, as CFRunLoop's do.
        @Test func timersDueAtOneDateFireInTheOrderTheyWereAdded() throws {
            let order = try onLoopThread { loop in
                let mode: PKRunLoopMode = "timer-ties"
                var order: [Int] = []
                let date = PKDeadline.after(.milliseconds(10))
                for index in 0..<8 {
                    loop.add(PKTimer(fireDate: date) { _ in order.append(index) }, forMode: mode)
                }
                loop.run(in: mode, until: .after(.seconds(10)))  // .finished once they have fired
                return order
            }
            #expect(order == Array(0..<8))
        }

        // A pass reads each mode's earliest timer dates, computed again only after a timer
        // changed: each change below must reach them.

        /// An earlier timer added to a mode whose later timer's date the loop already knows.
        @Test func anEarlierTimerAddedAfterALaterOneWakesTheLoop() throws {
            let (firedInTime, result) = try withWatchdog { loop, barked in
                let mode: PKRunLoopMode = "timer-earlier-added"
                var firedInTime: Bool?
                loop.scheduleTimer(after: .seconds(3600), forMode: mode) { _ in }
                loop.runOnePass(in: mode)
                loop.scheduleTimer(after: .milliseconds(20), forMode: mode) { _ in
                    firedInTime = !barked.value
                    loop.stop()
                }
                let result = loop.run(in: mode, until: .after(.seconds(3600)))
                return (firedInTime, result)
            }
            #expect(firedInTime == true, "the earlier timer fired only when the watchdog woke the loop")
            #expect(result == .stopped)
        }

        /// A timer's fire date moved earlier after the loop knew it (by a custom source, not a
        /// timer: a timer's firing is itself a change).
        @Test func movingAFireDateEarlierWakesTheLoop() throws {
            let (firedInTime, result) = try withWatchdog { loop, barked in
                let mode: PKRunLoopMode = "timer-move-earlier"
                var firedInTime: Bool?
                let timer = loop.scheduleTimer(after: .seconds(3600), forMode: mode) { _ in
                    firedInTime = !barked.value
                    loop.stop()
                }
                loop.runOnePass(in: mode)
                let mover = PKCustomSource { timer.fireDate = .after(.milliseconds(20)) }
                loop.add(mover, forMode: mode)
                mover.signal()
                let result = loop.run(in: mode, until: .after(.seconds(3600)))
                mover.invalidate()
                return (firedInTime, result)
            }
            #expect(firedInTime == true, "the moved timer fired only when the watchdog woke the loop")
            #expect(result == .stopped)
        }

        /// A repeating timer's next fire date, once it fired: the loop sleeps until then, waking
        /// once a firing (not spinning on the date it fired at), also after a nested run in its
        /// handler (which must neither count the firing timer nor leave it out afterwards).
        @Test func aRepeatingTimerWakesTheLoopOnceAFiring() throws {
            let (firings, wakeUps) = try withWatchdog { loop, _ in
                let mode: PKRunLoopMode = "timer-repeat-wakes"
                var firings = 0
                var wakeUps = 0
                let observer = PKRunLoopObserver(activities: .afterWaiting) { _, _ in wakeUps += 1 }
                loop.add(observer, forMode: mode)
                loop.scheduleTimer(after: .milliseconds(30), repeats: true, forMode: mode) { timer in
                    firings += 1
                    if firings == 1 { loop.run(in: mode, until: .after(.milliseconds(5))) }
                    if firings == 3 {
                        timer.invalidate()
                        loop.stop()
                    }
                }
                loop.run(in: mode, until: .after(.seconds(3600)))
                observer.invalidate()
                return (firings, wakeUps)
            }
            #expect(firings == 3)
            #expect(wakeUps <= 6, "\(wakeUps) wake-ups for 3 firings and a nested run")
        }

        @Test func fireRunsTheHandlerNowWithoutChangingTheSchedule() throws {
            let (oneShotCalls, oneShotValid, repeatingCalls, repeatingValid, dateKept) = try onLoopThread { _ in
                var oneShotCalls = 0
                let oneShot = PKTimer(interval: .seconds(60), repeats: false) { _ in oneShotCalls += 1 }
                oneShot.fire()
                oneShot.fire()
                var repeatingCalls = 0
                let repeating = PKTimer(interval: .seconds(60), repeats: true) { _ in repeatingCalls += 1 }
                let date = repeating.fireDate
                repeating.fire()
                return (oneShotCalls, oneShot.isValid, repeatingCalls, repeating.isValid, repeating.fireDate == date)
            }
            #expect(oneShotCalls == 1)
            #expect(!oneShotValid)
            #expect(repeatingCalls == 1)
            #expect(repeatingValid)
            #expect(dateKept)
        }
    }
}
