// Modes: a loop running one mode watches only that mode's items; the common-modes pseudo-mode;
// runs nested in a second mode.

import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct RunLoopModeTests {
        @Test func itemsOfModeAStayQuietWhileTheLoopRunsModeBThenFireInA() throws {
            let (duringB, resultB, duringA) = try onLoopThread { loop in
                let modeA: PKRunLoopMode = "mode-filter-A"
                let modeB: PKRunLoopMode = "mode-filter-B"
                let log = Locked<[String]>([])
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }

                // Every kind of item in A, each one ready before the runs start.
                let custom = PKCustomSource { log.append("custom") }
                loop.add(custom, forMode: modeA)
                custom.signal()
                let descriptor = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    pipe.drain()
                    log.append("descriptor")
                }
                try loop.add(descriptor, forMode: modeA)
                pipe.makeReadable()
                loop.scheduleTimer(after: .zero, forMode: modeA) { _ in log.append("timer") }
                loop.perform(inModes: [modeA]) { log.append("perform") }
                keepAlive(loop, modeB)

                let resultB = loop.run(in: modeB, until: .after(.milliseconds(100)))
                let duringB = log.value
                keepAlive(loop, modeA)
                loop.run(in: modeA, until: .after(.milliseconds(100)))
                return (duringB, resultB, log.value)
            }
            #expect(resultB == .timedOut)
            #expect(duringB.isEmpty)
            #expect(Set(duringA) == ["custom", "descriptor", "timer", "perform"])
            #expect(duringA.count == 4)
        }

        @Test func commonModeItemsFireInDefaultAndInEveryCommonModeEvenOneAddedLater() throws {
            let outcome = try onLoopThread { loop in
                let early: PKRunLoopMode = "common-early"
                let late: PKRunLoopMode = "common-late"
                let notCommon: PKRunLoopMode = "common-not-a-member"
                let log = Locked<[String]>([])
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }

                loop.addCommonMode(early)
                let custom = PKCustomSource { log.append("custom@\(loop.currentModeIfRunning!)") }
                loop.add(custom, forMode: .common)
                let descriptor = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    pipe.drain()
                    log.append("descriptor@\(loop.currentModeIfRunning!)")
                }
                try loop.add(descriptor, forMode: .common)
                let timer = PKTimer(fireDate: .now, interval: .milliseconds(1)) { _ in
                    log.append("timer@\(loop.currentModeIfRunning!)")
                }
                loop.add(timer, forMode: .common)
                // Added after the items: they join it.
                loop.addCommonMode(late)

                var results: [PKRunLoopMode: PKRunLoopRunResult] = [:]
                for mode in [PKRunLoopMode.default, early, late] {
                    custom.signal()
                    pipe.makeReadable()
                    results[mode] = loop.run(in: mode, until: .after(.milliseconds(50)))
                }
                // A mode outside the common set has none of them: it is empty.
                results[notCommon] = loop.run(in: notCommon, until: .after(.milliseconds(50)))
                let members = loop.allCommonModes
                // Asked before the invalidation: an invalidated timer is in no mode.
                let contained = (loop.contains(custom, inMode: late), loop.contains(timer, inMode: late))
                timer.invalidate()
                return (log.value, results, members, contained.0, contained.1)
            }
            let (log, results, members, customInLate, timerInLate) = outcome
            #expect(members == [.default, "common-early", "common-late"])
            #expect(customInLate && timerInLate)
            for mode in ["PKDefaultRunLoopMode", "common-early", "common-late"] {
                #expect(log.contains("custom@\(mode)"))
                #expect(log.contains("descriptor@\(mode)"))
                #expect(log.contains("timer@\(mode)"))
                #expect(results[PKRunLoopMode(mode)] == .timedOut)
            }
            #expect(!log.contains { $0.hasSuffix("@common-not-a-member") })
            #expect(results["common-not-a-member"] == .finished)
        }

        @Test func removingAnItemFromCommonRemovesItFromEveryCommonMode() throws {
            let (inDefault, inExtra, result) = try onLoopThread { loop in
                let extra: PKRunLoopMode = "common-remove-extra"
                loop.addCommonMode(extra)
                let source = PKCustomSource {}
                loop.add(source, forMode: .common)
                loop.remove(source, forMode: .common)
                return (loop.contains(source, inMode: .default), loop.contains(source, inMode: extra),
                        loop.run(in: extra, until: .after(.seconds(5))))
            }
            #expect(!inDefault && !inExtra)
            #expect(result == .finished)
        }

        @Test func currentModeIsTheInnermostRunsMode() throws {
            let (before, outer, inner, afterInner, after) = try onLoopThread { loop in
                let outerMode: PKRunLoopMode = "current-mode-outer"
                let innerMode: PKRunLoopMode = "current-mode-inner"
                keepAlive(loop, innerMode)
                var seen: [PKRunLoopMode?] = []
                let before = loop.currentModeIfRunning
                loop.scheduleTimer(after: .zero, forMode: outerMode) { _ in
                    seen.append(loop.currentModeIfRunning)
                    loop.scheduleTimer(after: .zero, forMode: innerMode) { _ in
                        seen.append(loop.currentModeIfRunning)
                        loop.stop()
                    }
                    loop.run(in: innerMode, until: .after(.seconds(10)))
                    seen.append(loop.currentModeIfRunning)
                }
                loop.run(in: outerMode, until: .after(.seconds(10)))
                return (before, seen[0], seen[1], seen[2], loop.currentModeIfRunning)
            }
            #expect(before == nil)
            #expect(outer == "current-mode-outer")
            #expect(inner == "current-mode-inner")
            #expect(afterInner == "current-mode-outer")
            #expect(after == nil)
        }

        /// A callback in mode A runs the loop in mode B: A's items stay quiet during the inner run,
        /// `stop` ends only the inner run, and the outer run carries on in A afterwards.
        @Test func nestedRunInASecondModeKeepsTheOuterModeQuietAndTheOuterRunContinues() throws {
            let (log, innerResult, outerResult) = try onLoopThread { loop in
                let outerMode: PKRunLoopMode = "nested-outer"
                let innerMode: PKRunLoopMode = "nested-inner"
                let log = Locked<[String]>([])
                let outerPipe = try TestPipe()
                defer { outerPipe.closeBoth() }

                // Outer items that would fire at every chance.
                let outerSource = PKCustomSource { log.append("outer-source") }
                loop.add(outerSource, forMode: outerMode)
                let outerDescriptor = PKDescriptorSource(descriptor: outerPipe.readEnd) { _ in
                    outerPipe.drain()
                    log.append("outer-descriptor")
                }
                try loop.add(outerDescriptor, forMode: outerMode)
                let outerTicks = PKTimer(fireDate: .after(.milliseconds(1)), interval: .milliseconds(1)) { _ in
                    log.append("outer-tick")
                }
                loop.add(outerTicks, forMode: outerMode)

                // The inner mode: a timer that makes the outer items ready, then stops the inner run.
                var innerResult: PKRunLoopRunResult?
                keepAlive(loop, innerMode)
                let start = PKTimer(fireDate: .now) { _ in
                    log.append("inner-start")
                    loop.scheduleTimer(after: .milliseconds(30), forMode: innerMode) { _ in
                        outerSource.signal(waking: loop)
                        outerPipe.makeReadable()
                        loop.perform(inModes: [outerMode]) { log.append("outer-perform") }
                        loop.scheduleTimer(after: .milliseconds(30), forMode: innerMode) { _ in
                            log.append("inner-stop")
                            loop.stop()
                        }
                    }
                    innerResult = loop.run(in: innerMode, until: .after(.seconds(10)))
                    log.append("inner-end")
                    // Once the outer run carries on, stop it after everything has fired.
                    loop.scheduleTimer(after: .milliseconds(30), forMode: outerMode) { _ in loop.stop() }
                }
                loop.add(start, forMode: outerMode)
                let outerResult = loop.run(in: outerMode, until: .after(.seconds(10)))
                outerTicks.invalidate()
                return (log.value, innerResult, outerResult)
            }
            #expect(innerResult == .stopped)
            #expect(outerResult == .stopped)
            let start = try #require(log.firstIndex(of: "inner-start"))
            let stop = try #require(log.firstIndex(of: "inner-stop"))
            let end = try #require(log.firstIndex(of: "inner-end"))
            #expect(start < stop && stop + 1 == end, "nothing of the outer mode between the inner run's start and end")
            #expect(!log[start...end].contains { $0.hasPrefix("outer-") })
            let afterwards = log[(end + 1)...]
            #expect(afterwards.contains("outer-source"))
            #expect(afterwards.contains("outer-descriptor"))
            #expect(afterwards.contains("outer-perform"))
            #expect(afterwards.contains("outer-tick"))
        }

        @Test func aRunMayNestInItsOwnMode() throws {
            let (log, result) = try onLoopThread { loop in
                let mode: PKRunLoopMode = "nested-same-mode"
                var log: [String] = []
                keepAlive(loop, mode)
                loop.scheduleTimer(after: .zero, forMode: mode) { _ in
                    log.append("outer-timer")
                    loop.scheduleTimer(after: .milliseconds(5), forMode: mode) { _ in
                        log.append("inner-timer")
                        loop.stop()
                    }
                    log.append("inner-\(loop.run(in: mode, until: .after(.seconds(10))))")
                }
                let result = loop.run(in: mode, until: .after(.milliseconds(100)))
                return (log, result)
            }
            #expect(log == ["outer-timer", "inner-timer", "inner-stopped"])
            #expect(result == .timedOut)
        }
    }
}
