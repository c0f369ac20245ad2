// Custom (version-0) sources: schedule, perform and cancel routines; signalling; order; removal
// from callbacks.

import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct CustomSourceTests {
        @Test func scheduleAndCancelRunOnTheLoopThreadForEachMode() throws {
            let (log, ownerThreads) = try onLoopThread { loop in
                let log = Locked<[String]>([])
                var onOwner = true
                let source = PKCustomSource(
                    schedule: { scheduledOn, mode in
                        onOwner = onOwner && scheduledOn === loop && loop.isOwnedByCurrentThread
                        log.append("schedule \(mode)")
                    },
                    cancel: { cancelledOn, mode in
                        onOwner = onOwner && cancelledOn === loop && loop.isOwnedByCurrentThread
                        log.append("cancel \(mode)")
                    },
                    perform: { log.append("perform") })
                loop.add(source, forMode: "cs-routines-1")
                loop.add(source, forMode: "cs-routines-2")
                loop.add(source, forMode: "cs-routines-2")  // already there: no second schedule
                source.signal()
                loop.run(in: "cs-routines-1", until: .after(.seconds(10)), returnAfterSourceHandled: true)
                loop.remove(source, forMode: "cs-routines-1")
                loop.remove(source, forMode: "cs-routines-1")  // no longer there: no second cancel
                loop.remove(source, forMode: "cs-routines-2")
                return (log.value, onOwner)
            }
            #expect(log == ["schedule cs-routines-1", "schedule cs-routines-2", "perform",
                            "cancel cs-routines-1", "cancel cs-routines-2"])
            #expect(ownerThreads)
        }

        @Test func signalsBeforeAPassCoalesceIntoOnePerform() throws {
            let (performed, stillSignalled) = try onLoopThread { loop in
                var performed = 0
                let source = PKCustomSource { performed += 1 }
                loop.add(source, forMode: "cs-coalesce")
                source.signal()
                source.signal()
                source.signal()
                loop.run(in: "cs-coalesce", until: .after(.milliseconds(30)))
                return (performed, source.isSignalled)
            }
            #expect(performed == 1)
            #expect(!stillSignalled)
        }

        @Test func aSourceSignalledDuringItsPerformIsPerformedAgain() throws {
            let (results, performed) = try onLoopThread { loop in
                var performed = 0
                var itself: PKCustomSource?
                let source = PKCustomSource {
                    performed += 1
                    if performed < 3 { itself!.signal() }
                }
                itself = source
                loop.add(source, forMode: "cs-resignal")
                source.signal()
                // Each run returns after one perform; the fourth finds nothing signalled.
                var results: [PKRunLoopRunResult] = []
                for _ in 0..<3 {
                    results.append(loop.run(in: "cs-resignal", until: .after(.seconds(10)), returnAfterSourceHandled: true))
                }
                results.append(loop.runOnePass(in: "cs-resignal"))
                itself = nil
                return (results, performed)
            }
            #expect(results == [.handledSource, .handledSource, .handledSource, .timedOut])
            #expect(performed == 3)
        }

        @Test func readySourcesArePerformedInAscendingOrder() throws {
            let log = try onLoopThread { loop in
                var log: [Int] = []
                var sources: [PKCustomSource] = []
                for order in [3, -2, 7, 0] {
                    let source = PKCustomSource(order: order) { log.append(order) }
                    loop.add(source, forMode: "cs-order")
                    sources.append(source)
                }
                for source in sources { source.signal() }
                loop.runOnePass(in: "cs-order")
                return log
            }
            #expect(log == [-2, 0, 3, 7])
        }

        @Test func aSourceCanRemoveItselfInsideItsOwnCallback() throws {
            let (log, contained, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "cs-remove-self"
                let log = Locked<[String]>([])
                var itself: PKCustomSource?
                let source = PKCustomSource(cancel: { _, _ in log.append("cancel") }) {
                    log.append("perform")
                    loop.remove(itself!, forMode: mode)
                    log.append("perform-end")
                }
                itself = source
                loop.add(source, forMode: mode)
                source.signal()
                let result = loop.run(in: mode, until: .after(.seconds(10)))
                itself = nil
                return (log.value, loop.contains(source, inMode: mode), result)
            }
            #expect(log == ["perform", "cancel", "perform-end"])
            #expect(!contained)
            #expect(result == .finished)
        }

        /// Two sources are ready in the same pass; the first one's callback removes the second:
        /// the second must not be performed (it left the mode), its cancel routine runs, and its
        /// signal is still pending for any mode it is still in.
        @Test func aReadySourceRemovedByAnotherSourcesCallbackDoesNotFire() throws {
            let (log, stillSignalled) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "cs-remove-other"
                let log = Locked<[String]>([])
                let second = PKCustomSource(order: 1, cancel: { _, _ in log.append("second-cancel") }) {
                    log.append("second")
                }
                let first = PKCustomSource(order: 0) {
                    log.append("first")
                    loop.remove(second, forMode: mode)
                }
                loop.add(first, forMode: mode)
                loop.add(second, forMode: mode)
                keepAlive(loop, mode)
                first.signal()
                second.signal()
                loop.run(in: mode, until: .after(.milliseconds(30)))
                return (log.value, second.isSignalled)
            }
            #expect(log == ["first", "second-cancel"])
            #expect(stillSignalled)
        }

        @Test func aReadySourceInvalidatedByAnotherSourcesCallbackDoesNotFire() throws {
            let log = try onLoopThread { loop in
                let mode: PKRunLoopMode = "cs-invalidate-other"
                let log = Locked<[String]>([])
                let second = PKCustomSource(order: 1, cancel: { _, _ in log.append("second-cancel") }) {
                    log.append("second")
                }
                let first = PKCustomSource(order: 0) {
                    log.append("first")
                    second.invalidate()
                }
                loop.add(first, forMode: mode)
                loop.add(second, forMode: mode)
                keepAlive(loop, mode)
                first.signal()
                second.signal()
                loop.run(in: mode, until: .after(.milliseconds(30)))
                return log.value
            }
            #expect(log == ["first", "second-cancel"])
        }

        /// `invalidate()` from another thread: the loop wakes, calls the cancel routine on its own
        /// thread, and the source is gone from the mode.
        @Test func invalidateFromAnotherThreadCancelsOnTheLoopThread() throws {
            let (cancelledOnOwner, result, valid) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "cs-invalidate-cross-thread"
                let asleep = Locked(false)
                var cancelledOnOwner: Bool?
                flagWhenAsleep(loop, mode, asleep)
                let source = PKCustomSource(cancel: { _, _ in cancelledOnOwner = loop.isOwnedByCurrentThread }) {}
                loop.add(source, forMode: mode)
                let other = TestThread {
                    try? waitUntil("loop asleep") { asleep.value }
                    source.invalidate()
                }
                let result = loop.run(in: mode, until: .after(.seconds(10)))
                try other.join()
                return (cancelledOnOwner, result, source.isValid)
            }
            #expect(cancelledOnOwner == true)
            #expect(result == .finished)
            #expect(!valid)
        }

        /// As `CFRunLoopSourceInvalidate`: an invalidated source leaves every mode it is in at the
        /// loop's next purge, not only the mode that runs, with a cancel for each; sources
        /// invalidated together are cancelled in their order.
        @Test func anInvalidatedSourceLeavesAllItsModesAtOnce() throws {
            let one: PKRunLoopMode = "cs-invalidate-all-1"
            let two: PKRunLoopMode = "cs-invalidate-all-2"
            let common: PKRunLoopMode = "cs-invalidate-all-common"
            let (log, stillIn) = try onLoopThread { loop in
                let log = Locked<[String]>([])
                loop.addCommonMode(common)
                let source = PKCustomSource(order: 1, cancel: { _, mode in log.append("cancel \(mode)") }) {}
                let earlier = PKCustomSource(order: 0, cancel: { _, mode in log.append("earlier cancel \(mode)") }) {}
                for mode in [one, two, .common] { loop.add(source, forMode: mode) }
                loop.add(earlier, forMode: one)
                keepAlive(loop, one)
                source.invalidate()
                earlier.invalidate()
                loop.run(in: one, until: .after(.milliseconds(20)))
                let stillIn = [one, two, common, .default].filter { loop.contains(source, inMode: $0) }
                return (log.value, stillIn)
            }
            #expect(log.first == "earlier cancel \(one)")
            #expect(log.count == 5)
            #expect(Set(log.dropFirst()) == Set([one, two, common, .default].map { "cancel \($0)" }))
            #expect(stillIn.isEmpty)
        }

        /// A source invalidated while it is being added to the common modes (its schedule
        /// routine invalidates it and runs a nested pass, whose purge takes it out of the modes
        /// it has reached): the modes it reaches after that lose it too, with a cancel each.
        @Test func aSourceInvalidatedWhileBeingAddedLeavesEveryMode() throws {
            let one: PKRunLoopMode = "cs-adding-1"
            let two: PKRunLoopMode = "cs-adding-2"
            let (cancelled, stillIn) = try onLoopThread { loop in
                loop.addCommonMode(one)
                loop.addCommonMode(two)
                let log = Locked<[String]>([])
                var first: PKRunLoopMode?
                var source: PKCustomSource?
                source = PKCustomSource(
                    schedule: { _, mode in
                        guard first == nil else { return }
                        first = mode
                        source?.invalidate()
                        loop.runOnePass(in: mode)
                    },
                    cancel: { _, mode in log.append("\(mode)") },
                    perform: {})
                let added = try #require(source)
                loop.add(added, forMode: .common)
                for mode in [one, two, .default] { loop.runOnePass(in: mode) }
                source = nil
                return (Set(log.value), [one, two, .default].filter { loop.contains(added, inMode: $0) })
            }
            #expect(stillIn.isEmpty)
            #expect(cancelled == Set([one, two, .default].map { "\($0)" }))
        }

        /// A source of the common modes, removed from each of them and then invalidated, is not
        /// put into a common mode added later (it was left among the common items).
        @Test func anInvalidatedSourceDoesNotJoinACommonModeAddedLater() throws {
            let later: PKRunLoopMode = "cs-common-later"
            let (schedules, contained) = try onLoopThread { loop in
                var schedules: [String] = []
                let source = PKCustomSource(schedule: { _, mode in schedules.append("\(mode)") }) {}
                loop.add(source, forMode: .common)
                loop.remove(source, forMode: .default)
                source.invalidate()
                loop.addCommonMode(later)
                return (schedules, loop.contains(source, inMode: later))
            }
            #expect(schedules == ["\(PKRunLoopMode.default)"])
            #expect(!contained)
        }

        @Test func anInvalidatedSourceCannotBeAddedOrPerformed() throws {
            let (scheduled, performed, result) = try onLoopThread { loop in
                var scheduled = false
                var performed = false
                let source = PKCustomSource(schedule: { _, _ in scheduled = true }) { performed = true }
                source.invalidate()
                loop.add(source, forMode: "cs-invalid-add")
                source.signal()
                let result = loop.run(in: "cs-invalid-add", until: .after(.seconds(5)))
                return (scheduled, performed, result)
            }
            #expect(!scheduled)
            #expect(!performed)
            #expect(result == .finished)
        }
        /// A source signalled while another mode runs waits for a run of its own mode; removed
        /// from its last mode meanwhile, it is let go (the loop does not keep it, nor look at it
        /// every run), and it stays signalled: added again, it is performed.
        @Test func aSignalledSourceRemovedFromItsLastModeIsLetGo() throws {
            let (released, performedAgain) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "cs-letgo"
                let other: PKRunLoopMode = "cs-letgo-other"
                let keeper = keepAlive(loop, other)
                weak var weakSource: PKCustomSource?
                do {
                    let source = PKCustomSource {}
                    weakSource = source
                    loop.add(source, forMode: mode)
                    source.signal()
                    loop.runOnePass(in: other)  // takes the signal, defers the source
                    loop.remove(source, forMode: mode)
                }
                loop.runOnePass(in: other)
                let released = weakSource == nil

                var performed = 0
                let kept = PKCustomSource { performed += 1 }
                loop.add(kept, forMode: mode)
                kept.signal()
                loop.runOnePass(in: other)
                loop.remove(kept, forMode: mode)
                loop.runOnePass(in: other)
                loop.add(kept, forMode: mode)
                loop.run(in: mode, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                loop.remove(keeper, forMode: other)
                return (released, performed)
            }
            #expect(released)
            #expect(performedAgain == 1)
        }
    }
}
