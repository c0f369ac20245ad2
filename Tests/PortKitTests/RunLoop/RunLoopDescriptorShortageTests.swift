// A loop makes its epoll descriptor and eventfd when it first needs them. A process out of
// descriptors at that moment gets an error where the API throws, and a loop that must sleep
// naps and tries again: never a crash.

import Glibc
import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct RunLoopDescriptorShortageTests {
        /// A timer whose timerfd cannot be made (no descriptor left) still ends the sleep at
        /// its time, rather than the run's deadline doing so. Run in a child process, as above.
        @Test func aTimerTheLoopCannotArmStillEndsTheSleepOnTime() async {
            await exitTestInTurn {
                await #expect(processExitsWith: .success) {
                    let outcome = Locked<String?>(nil)
                    let thread = TestThread(name: "timer-shortage") {
                        let loop = PKRunLoop.current
                        let mode: PKRunLoopMode = "timer-shortage"
                        warmUpLoopDescriptors(loop)  // epoll, eventfd, deadlines' timerfd; no timers' yet
                        let filled = DescriptorTableFiller()
                        // Without the timer bounding the wait, the run sleeps until its deadline
                        // and the timer fires only then.
                        let deadline = PKDeadline.after(patience(.seconds(10)))
                        var fired = false
                        let timer = loop.scheduleTimer(after: .milliseconds(20), forMode: mode) { _ in
                            fired = !deadline.hasPassed
                            loop.stop()
                        }
                        let result = loop.run(in: mode, until: deadline)
                        timer.invalidate()
                        filled.release()
                        outcome.value = result == .stopped && fired
                            ? "ok" : "the run returned \(result), the timer \(fired ? "fired" : "did not fire before the run's deadline"): the sleep outlasted the timer"
                    }
                    do { try thread.joinPatiently(timeout: .seconds(60)) } catch { endExitTest("the thread did not end", failures: ["\(error)"]) }
                    let value = outcome.value ?? "no outcome"
                    endExitTest(value, failures: value == "ok" ? [] : [value])
                }
            }
        }

        /// A run whose deadline's timerfd cannot be made (no descriptor left) still ends at its
        /// deadline: epoll's timeout bounds the wait instead. (If nothing did, the run would
        /// sleep for ever, and the child's thread would not end.) Run in a child process.
        @Test func aDeadlineTheLoopCannotArmStillEndsTheRun() async {
            await exitTestInTurn {
                await #expect(processExitsWith: .success) {
                    let outcome = Locked<String?>(nil)
                    let thread = TestThread(name: "deadline-shortage") {
                        let loop = PKRunLoop.current
                        let mode: PKRunLoopMode = "deadline-shortage"
                        let keeper = keepAlive(loop, mode)
                        // A timer that never fires, whose timerfd cannot be made either: it
                        // bounds no wait (it used to make the wait unbounded).
                        let never = PKTimer(fireDate: .distantFuture) { _ in }
                        _ = try? loop.epollFD()  // epoll and eventfd; no timerfd of either kind
                        let filled = DescriptorTableFiller()
                        loop.add(never, forMode: mode)
                        let deadline = PKDeadline.after(.milliseconds(50))
                        let result = loop.run(in: mode, until: deadline)
                        let early = !deadline.hasPassed
                        filled.release()
                        never.invalidate()
                        keeper.invalidate()
                        outcome.value = result == .timedOut && !early
                            ? "ok" : "the run returned \(result)\(early ? " before its deadline" : "")"
                    }
                    do { try thread.joinPatiently(timeout: .seconds(60)) } catch { endExitTest("the thread did not end", failures: ["\(error)"]) }
                    let value = outcome.value ?? "no outcome"
                    endExitTest(value, failures: value == "ok" ? [] : [value])
                }
            }
        }

        /// Run in a child process: it lowers its own descriptor limit and fills it.
        @Test func aLoopOutOfDescriptorsAtItsFirstNeedThrowsOrNapsAndRecovers() async {
            await exitTestInTurn {
                await #expect(processExitsWith: .success) {
                    let outcome = Locked<String?>(nil)
                    let thread = TestThread(name: "fd-shortage") {
                        let loop = PKRunLoop.current
                        let mode: PKRunLoopMode = "shortage"
                        let keeper = keepAlive(loop, mode)
                        loop.runOnePass(in: mode)  // no sleep: nothing made yet
                        var failures: [String] = []
                        if loop.hasKernelObjects { failures.append("the loop made its descriptors before it needed them") }
                        var pipeEnds: [Int32] = [-1, -1]
                        guard pipe(&pipeEnds) == 0 else { outcome.value = "no pipe"; return }
                        // Fill the descriptor table up to a lowered limit.
                        let filled = DescriptorTableFiller()
                        // Watching a descriptor needs the epoll descriptor: the add throws.
                        var seen = false
                        let source = PKDescriptorSource(descriptor: pipeEnds[0], events: .readable) { _ in seen = true }
                        do throws(PKError) {
                            try loop.add(source, forMode: mode)
                            failures.append("adding a descriptor source succeeded with no descriptor free")
                        } catch {
                            if error.code != .system { failures.append("add threw \(error), not a system error") }
                        }
                        if !source.isValid { failures.append("the failed add invalidated the source") }
                        // A run that must sleep naps (10 ms at a time) until its deadline instead.
                        var passes = 0
                        let counter = PKRunLoopObserver(activities: .afterWaiting) { _, _ in passes += 1 }
                        loop.add(counter, forMode: mode)
                        let napped = loop.run(in: mode, until: .after(.milliseconds(30)))
                        counter.invalidate()
                        if napped != .timedOut { failures.append("the run without descriptors returned \(napped)") }
                        // Napping makes a few passes in 30 ms; spinning, thousands.
                        if passes > 50 { failures.append("the run without descriptors spun: \(passes) passes in 30 ms") }
                        // Descriptors free again: the loop makes its own and works as before.
                        filled.release()
                        var byte: UInt8 = 1
                        _ = write(pipeEnds[1], &byte, 1)
                        do throws(PKError) { try loop.add(source, forMode: mode) } catch { failures.append("adding the same source after recovery threw \(error)") }
                        let deadline = PKDeadline.after(patience(.seconds(10)))
                        while !seen && !deadline.hasPassed { loop.run(in: mode, until: deadline, returnAfterSourceHandled: true) }
                        if !seen { failures.append("the recovered loop did not report a readable pipe") }
                        if !loop.hasKernelObjects { failures.append("the recovered loop has no descriptors") }
                        source.invalidate()
                        keeper.invalidate()
                        close(pipeEnds[0])
                        close(pipeEnds[1])
                        outcome.value = failures.isEmpty ? "ok" : failures.joined(separator: "; ")
                    }
                    do { try thread.joinPatiently(timeout: .seconds(60)) } catch { endExitTest("the thread did not end", failures: ["\(error)"]) }
                    let value = outcome.value ?? "no outcome"
                    endExitTest(value, failures: value == "ok" ? [] : [value])
                }
            }
        }
    }
}
