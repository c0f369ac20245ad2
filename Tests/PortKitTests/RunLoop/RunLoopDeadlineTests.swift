// A run's deadline: a timerfd of the loop's bounds the wait (not epoll's timeout), armed only
// when it would fire too late, so a run may be woken at an earlier run's deadline. It still
// ends at its own, never before it and never long after it; a hosted loop's host is not woken
// for a deadline no run waits for.

import Glibc
import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct RunLoopDeadlineTests {
        /// The first run's deadline stays armed after the run handled its source; the second,
        /// with a later deadline, is woken at the first's, and sleeps again until its own.
        @Test func aRunWokenAtAnEarlierRunsDeadlineSleepsOnUntilItsOwn() throws {
            let (first, second, early, wakes, firstWaited) = try onLoopThread(timeout: patience(.seconds(30))) { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let mode: PKRunLoopMode = "deadline-earlier-run"
                // Ready at once, but only the wait finds it: the run arms its deadline first.
                let source = try readySource(on: loop, in: mode, pipe)
                let firstDeadline = PKDeadline.after(patience(.milliseconds(50)))
                let first = loop.run(in: mode, until: firstDeadline, returnAfterSourceHandled: true)
                // (A thread held up past the first deadline before the run's wait would see it
                // and the source in one wake-up: the early wake-up is then not there to count.)
                let firstWaited = !firstDeadline.hasPassed
                let wakes = Locked(0)
                let observer = PKRunLoopObserver(activities: .afterWaiting) { _, _ in wakes.withLock { $0 += 1 } }
                loop.add(observer, forMode: mode)
                let deadline = PKDeadline.after(patience(.milliseconds(300)))
                let second = loop.run(in: mode, until: deadline)
                let early = !deadline.hasPassed
                observer.invalidate()
                source.invalidate()
                return (first, second, early, wakes.value, firstWaited)
            }
            #expect(first == .handledSource)
            #expect(second == .timedOut)
            #expect(!early, "the run returned before its deadline")
            if firstWaited { #expect(wakes == 2, "woken at the first run's deadline, then at its own") }
        }

        /// The timerfd is armed at a much later deadline (an hour) when a run with a deadline
        /// 50 ms away sleeps: it is armed again, earlier. (If it were not, the run would sleep
        /// for the hour: a watchdog stops it after a while, and the run says `.stopped`.)
        @Test func aRunWithAnEarlierDeadlineThanTheArmedOneEndsAtIt() throws {
            let (first, second) = try withWatchdog { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let mode: PKRunLoopMode = "deadline-earlier"
                let source = try readySource(on: loop, in: mode, pipe)
                let first = loop.run(in: mode, until: .after(.seconds(3600)), returnAfterSourceHandled: true)
                let second = loop.run(in: mode, until: .after(.milliseconds(50)))
                source.invalidate()
                return (first, second)
            }
            #expect(first == .handledSource)
            #expect(second == .timedOut)
        }

        /// A `beforeWaiting` observer runs the loop in another mode with a shorter deadline:
        /// that nested run arms the timerfd for its own deadline and reads it when it fires.
        /// The outer pass arms it again for its own before it sleeps (if it did not, it would
        /// sleep for ever: a watchdog stops it, and the run says `.stopped`).
        @Test func aNestedRunThatTookTheDeadlineLeavesTheOuterRunItsOwn() throws {
            let (outer, inner) = try withWatchdog { loop in
                let outerMode: PKRunLoopMode = "deadline-outer"
                let innerMode: PKRunLoopMode = "deadline-inner"
                let keepers = [keepAlive(loop, outerMode), keepAlive(loop, innerMode)]
                var inner: PKRunLoopRunResult?
                let observer = PKRunLoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
                    inner = loop.run(in: innerMode, until: .after(.milliseconds(10)))
                }
                loop.add(observer, forMode: outerMode)
                let outer = loop.run(in: outerMode, until: .after(patience(.milliseconds(500))))
                for keeper in keepers { keeper.invalidate() }
                return (outer, inner)
            }
            #expect(inner == .timedOut)
            #expect(outer == .timedOut)
        }

        /// A run that ends before its deadline on a loop that became hosted during it disarms
        /// the deadline: the host, which runs a pass whenever the loop's descriptor is readable,
        /// is not woken when that deadline passes with no run waiting for it. (A hosted loop's
        /// runs never arm it: epoll's timeout bounds their waits.)
        @Test func aHostedLoopsDescriptorStaysQuietWhenAnEndedRunsDeadlinePasses() throws {
            let (result, readableAfter) = try onLoopThread(timeout: patience(.seconds(30))) { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let mode: PKRunLoopMode = "deadline-hosted"
                // Hosted from the source's handler on: the run armed its deadline before.
                let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    pipe.drain()
                    _ = loop.descriptor
                }
                try loop.add(source, forMode: mode)
                pipe.makeReadable()
                let deadline = PKDeadline.after(patience(.milliseconds(50)))
                let result = loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
                let readableAfter = try pollReadable(loop.descriptor, timeoutMilliseconds: millisecondsPast(deadline))
                source.invalidate()
                return (result, readableAfter)
            }
            #expect(result == .handledSource)
            #expect(!readableAfter, "the host was woken for a deadline no run waits for")
        }

        /// A loop that armed a deadline and then becomes hosted, its mode empty: the host's pass
        /// returns `.finished` at once, without a wait that would read the timerfd. It disarms
        /// the deadline, so that the descriptor does not turn readable for good when it passes
        /// (the host would run passes that do nothing, for ever).
        @Test func aHostedLoopWithNothingLeftIsNotWokenByADeadlineArmedBeforeIt() throws {
            let (ran, pass, readableAfter) = try onLoopThread(timeout: patience(.seconds(30))) { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                let mode: PKRunLoopMode = "deadline-hosted-empty"
                let source = try readySource(on: loop, in: mode, pipe)
                let deadline = PKDeadline.after(patience(.milliseconds(50)))
                let ran = loop.run(in: mode, until: deadline, returnAfterSourceHandled: true)
                source.invalidate()
                _ = loop.descriptor  // hosted from now on
                let pass = loop.runOnePass(in: mode)
                let readableAfter = try pollReadable(loop.descriptor, timeoutMilliseconds: millisecondsPast(deadline))
                return (ran, pass, readableAfter)
            }
            #expect(ran == .handledSource)
            #expect(pass == .finished)
            #expect(!readableAfter, "the host was woken for a deadline no run waits for")
        }

        /// A source registered after 2^31 others on the loop still gets its events: a token's
        /// generation leaves its top bit, which marks a blocked write, alone. (With a 32-bit
        /// generation the event went to the blocked-write path, and the run never handled it.)
        @Test func aSourceWhoseGenerationReachesTwoToTheThirtyFirstIsHandled() throws {
            let result = try onLoopThread(timeout: patience(.seconds(30))) { loop in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                loop.nextGeneration = 1 << 31
                let source = try readySource(on: loop, in: "generation", pipe)
                let result = loop.run(in: "generation", until: .after(patience(.seconds(2))), returnAfterSourceHandled: true)
                source.invalidate()
                return result
            }
            #expect(result == .handledSource)
        }

        /// A duration in nanoseconds (deadlines, timers' intervals): rounded toward zero and
        /// clamped to `Int64`, as `components` gives it, at both ends of the range and
        /// across it.
        @Test func aDurationsNanosecondsAreRoundedTowardZeroAndClamped() {
            #expect(Duration.zero.nanosecondsClamped == 0)
            #expect(Duration.seconds(60).nanosecondsClamped == 60_000_000_000)
            #expect(Duration.milliseconds(-1500).nanosecondsClamped == -1_500_000_000)
            #expect(Duration(secondsComponent: 0, attosecondsComponent: 999_999_999).nanosecondsClamped == 0)
            #expect(Duration(secondsComponent: 0, attosecondsComponent: -1_999_999_999).nanosecondsClamped == -1)
            // Int64's ends, exactly and one nanosecond past.
            let top = Duration.nanoseconds(Int64.max)
            #expect(top.nanosecondsClamped == .max)
            #expect((top + .nanoseconds(1)).nanosecondsClamped == .max)
            #expect(Duration.nanoseconds(Int64.min).nanosecondsClamped == .min)
            #expect((Duration.nanoseconds(Int64.min) - .nanoseconds(1)).nanosecondsClamped == .min)
            #expect(Duration.seconds(Int64.max).nanosecondsClamped == .max)
            #expect(Duration.seconds(Int64.min).nanosecondsClamped == .min)
            #expect((PKDeadline(uptimeNanoseconds: 5) + .seconds(Int64.max)).uptimeNanoseconds == 5 + UInt64(Int64.max))
            #expect((PKDeadline(uptimeNanoseconds: .max - 1) + .seconds(1)) == .distantFuture)
            #expect((PKDeadline(uptimeNanoseconds: 5) + .seconds(Int64.min)) == .distantPast)
            // Across the range, against the definition through `components`.
            var generator = SystemRandomNumberGenerator()
            for _ in 0..<10_000 {
                let duration = Duration(
                    secondsComponent: Int64.random(in: -20_000_000_000...20_000_000_000, using: &generator),
                    attosecondsComponent: Int64.random(in: -999_999_999_999_999_999...999_999_999_999_999_999, using: &generator))
                #expect(duration.nanosecondsClamped == nanosecondsThroughComponents(duration), "\(duration)")
            }
        }
    }
}

/// `duration` in nanoseconds through `components`: its seconds scaled and its attoseconds
/// divided, each toward zero, clamped to `Int64`.
private func nanosecondsThroughComponents(_ duration: Duration) -> Int64 {
    let (seconds, attoseconds) = duration.components
    let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
    if overflow { return seconds < 0 ? .min : .max }
    let (sum, overflowed) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000)
    if overflowed { return seconds < 0 ? .min : .max }
    return sum
}

/// A source in `mode` on `pipe`'s read end, which it drains, made readable: the run's wait
/// reports it at once.
private func readySource(on loop: PKRunLoop, in mode: PKRunLoopMode, _ pipe: TestPipe) throws -> PKDescriptorSource {
    let source = PKDescriptorSource(descriptor: pipe.readEnd) { _ in pipe.drain() }
    try loop.add(source, forMode: mode)
    pipe.makeReadable()
    return source
}

/// Milliseconds from now until 200 ms past `deadline` (at least 200).
private func millisecondsPast(_ deadline: PKDeadline) -> Int32 {
    Int32(clamping: max(0, nanoseconds(from: .now, to: deadline)) / 1_000_000 + 200)
}
