// Observers: the activities of a pass in the documented order (PKRunLoop.swift's pass), observer
// order, one-shot observers.

import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct ObserverTests {
        /// One pass with a due timer and a ready descriptor source, in the order PKRunLoop.swift
        /// documents (the guide's "event order"): entry; beforeTimers; beforeSources; nothing
        /// signalled, so beforeWaiting; epoll_wait returns at once; afterWaiting; handle what woke
        /// it: due timers first, then ready descriptor sources; the source was handled and the run
        /// was asked to return after one, so exit.
        @Test func onePassWithADueTimerAndAReadySourceFollowsTheDocumentedOrder() throws {
            let (log, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "observer-one-pass"
                let log = Locked<[String]>([])
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                logActivities(of: loop, in: mode, into: log)
                loop.add(PKTimer(fireDate: .now) { _ in log.append("timer") }, forMode: mode)
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    pipe.drain()
                    log.append("source")
                }
                try loop.add(source, forMode: mode)
                pipe.makeReadable()
                let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                return (log.value, result)
            }
            #expect(result == .handledSource)
            #expect(log == ["entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting",
                            "timer", "source", "exit"])
        }

        /// Two passes: the first sleeps until a timer is due; the timer signals a custom source,
        /// which the second pass performs before it would sleep again.
        @Test func aTimerThatSignalsASourceTakesTwoPasses() throws {
            let (log, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "observer-two-passes"
                let log = Locked<[String]>([])
                logActivities(of: loop, in: mode, into: log)
                let source = PKCustomSource { log.append("source") }
                loop.add(source, forMode: mode)
                loop.scheduleTimer(after: .milliseconds(20), forMode: mode) { _ in
                    log.append("timer")
                    source.signal()
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                return (log.value, result)
            }
            #expect(result == .handledSource)
            #expect(log == ["entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "timer",
                            "beforeTimers", "beforeSources", "source", "exit"])
        }

        /// A pass that will not sleep does not say it is about to: `runOnePass` (a deadline already
        /// past) and a pass right after a handled custom source skip beforeWaiting and afterWaiting.
        @Test func passesThatDoNotSleepDoNotNotifyWaiting() throws {
            let (onePass, afterHandled) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "observer-no-sleep"
                let log = Locked<[String]>([])
                logActivities(of: loop, in: mode, into: log)
                let source = PKCustomSource { log.append("source") }
                loop.add(source, forMode: mode)
                loop.runOnePass(in: mode)
                let onePass = log.value
                log.value = []
                source.signal()
                loop.run(in: mode, until: .after(.milliseconds(300)))
                return (onePass, log.value)
            }
            #expect(onePass == ["entry", "beforeTimers", "beforeSources", "exit"])
            // The first pass performs the source and only polls; the second sleeps to the deadline.
            #expect(afterHandled == ["entry", "beforeTimers", "beforeSources", "source",
                                     "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "exit"])
        }

        @Test func observersAreCalledInAscendingOrder() throws {
            let log = try onLoopThread { loop in
                let mode: PKRunLoopMode = "observer-order"
                let log = Locked<[String]>([])
                for order in [5, -1, 2, 0] {
                    loop.add(PKRunLoopObserver(activities: [.entry, .exit], order: order) { _, activity in
                        log.append("\(activity)\(order)")
                    }, forMode: mode)
                }
                keepAlive(loop, mode)
                loop.runOnePass(in: mode)
                return log.value
            }
            #expect(log == ["entry-1", "entry0", "entry2", "entry5", "exit-1", "exit0", "exit2", "exit5"])
        }

        @Test func aOneShotObserverIsCalledOnceAndLeavesTheMode() throws {
            let (oneShot, repeating, oneShotValid) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "observer-one-shot"
                var oneShot: [String] = []
                var repeating: [String] = []
                let once = PKRunLoopObserver(activities: [.beforeTimers, .exit], repeats: false) { _, activity in
                    oneShot.append(activity.description)
                }
                loop.add(once, forMode: mode)
                loop.add(PKRunLoopObserver(activities: [.beforeTimers]) { _, activity in
                    repeating.append(activity.description)
                }, forMode: mode)
                keepAlive(loop, mode)
                for _ in 0..<3 { loop.runOnePass(in: mode) }
                return (oneShot, repeating, once.isValid)
            }
            #expect(oneShot == ["beforeTimers"])
            #expect(repeating == ["beforeTimers", "beforeTimers", "beforeTimers"])
            #expect(!oneShotValid)
        }

        @Test func observersSeeOnlyTheirActivitiesAndOnlyTheirModes() throws {
            let (entryExit, otherMode) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "observer-activities"
                let other: PKRunLoopMode = "observer-activities-other"
                let entryExit = Locked<[String]>([])
                let otherLog = Locked<[String]>([])
                logActivities(of: loop, in: mode, into: entryExit, [.entry, .exit])
                logActivities(of: loop, in: other, into: otherLog)
                keepAlive(loop, mode)
                loop.scheduleTimer(after: .milliseconds(5), forMode: mode) { _ in }
                loop.run(in: mode, until: .after(.milliseconds(30)))
                return (entryExit.value, otherLog.value)
            }
            #expect(entryExit == ["entry", "exit"])
            #expect(otherMode.isEmpty)
        }

        @Test func aRemovedOrInvalidatedObserverIsNoLongerCalled() throws {
            let (removedCalls, invalidatedCalls) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "observer-removal"
                var removedCalls = 0
                var invalidatedCalls = 0
                let removed = PKRunLoopObserver(activities: .entry) { _, _ in removedCalls += 1 }
                let invalidated = PKRunLoopObserver(activities: .entry) { _, _ in invalidatedCalls += 1 }
                loop.add(removed, forMode: mode)
                loop.add(invalidated, forMode: mode)
                keepAlive(loop, mode)
                loop.runOnePass(in: mode)
                loop.remove(removed, forMode: mode)
                invalidated.invalidate()
                loop.runOnePass(in: mode)
                return (removedCalls, invalidatedCalls)
            }
            #expect(removedCalls == 1)
            #expect(invalidatedCalls == 1)
        }
    }
}
