// A run's deadline: a timerfd of the loop's bounds the wait (not epoll's timeout), armed only
// when it would fire too late, so a run may be woken at an earlier run's deadline. It still
// ends at its own, never before it and never long after it.

import Glibc
import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct RunLoopDeadlineTests {
        /// The first run's deadline stays armed after the run handled its source; the second,
        /// with a later deadline, is woken at the first's, and sleeps again until its own.
        @Test func aRunWokenAtAnEarlierRunsDeadlineSleepsOnUntilItsOwn() throws {
            let (first, second, early, wakes) = try onLoopThread { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let mode: PKRunLoopMode = "deadline-earlier-run"
                // Ready at once, but only the wait finds it: the run arms its deadline first.
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in pipe.drain() }
                try loop.add(source, forMode: mode)
                pipe.makeReadable()
                let first = loop.run(in: mode, until: .after(.milliseconds(20)), returnAfterSourceHandled: true)
                let wakes = Locked(0)
                let observer = PKRunLoopObserver(activities: .afterWaiting) { _, _ in wakes.withLock { $0 += 1 } }
                loop.add(observer, forMode: mode)
                let deadline = PKDeadline.after(patience(.milliseconds(200)))
                let second = loop.run(in: mode, until: deadline)
                let early = !deadline.hasPassed
                observer.invalidate()
                source.invalidate()
                return (first, second, early, wakes.value)
            }
            #expect(first == .handledSource)
            #expect(second == .timedOut)
            #expect(!early, "the run returned before its deadline")
            #expect(wakes == 2, "woken at the first run's deadline, then at its own")
        }

        /// The timerfd is armed at a much later deadline (an hour) when a run with a deadline
        /// 50 ms away sleeps: it is armed again, earlier. (If it were not, the run would sleep
        /// for the hour: another thread stops it after a while, and the run says `.stopped`.)
        @Test func aRunWithAnEarlierDeadlineThanTheArmedOneEndsAtIt() throws {
            let loopBox = Locked<PKRunLoop?>(nil)
            let finished = Locked(false)
            let watchdog = TestThread(name: "deadline-watchdog") {
                let limit = PKDeadline.after(patience(.seconds(10)))
                while !finished.value && !limit.hasPassed { sleepFor(.milliseconds(5)) }
                if !finished.value { loopBox.value?.stop() }
            }
            let (first, second) = try onLoopThread { loop in
                loopBox.value = loop
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let mode: PKRunLoopMode = "deadline-earlier"
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in pipe.drain() }
                try loop.add(source, forMode: mode)
                pipe.makeReadable()
                let first = loop.run(in: mode, until: .after(.seconds(3600)), returnAfterSourceHandled: true)
                let second = loop.run(in: mode, until: .after(.milliseconds(50)))
                finished.value = true
                source.invalidate()
                return (first, second)
            }
            try watchdog.join(timeout: patience(.seconds(30)))
            #expect(first == .handledSource)
            #expect(second == .timedOut)
        }

        /// A run that ends before its deadline on a hosted loop disarms the deadline: the host,
        /// which runs a pass whenever the loop's descriptor is readable, is not woken when that
        /// deadline passes with no run waiting for it.
        @Test func aHostedLoopsDescriptorStaysQuietWhenAnEndedRunsDeadlinePasses() throws {
            let (result, readableAfter) = try onLoopThread { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let mode: PKRunLoopMode = "deadline-hosted"
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in pipe.drain() }
                try loop.add(source, forMode: mode)
                _ = loop.descriptor  // hosted from now on
                pipe.makeReadable()
                let deadline = PKDeadline.after(.milliseconds(50))
                let result = loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
                // Well past the deadline.
                let wait = Int32(clamping: nanoseconds(from: .now, to: deadline) / 1_000_000 + 200)
                let readableAfter = try pollReadable(loop.descriptor, timeoutMilliseconds: wait)
                source.invalidate()
                return (result, readableAfter)
            }
            #expect(result == .handledSource)
            #expect(!readableAfter, "the host was woken for a deadline no run waits for")
        }
    }
}
