// Where PortKit's loop does what `CFRunLoop` does, found missing by a review against
// CFRunLoop.c: nested runs and the batch of signalled sources, a run that returns after a
// source, observers re-entered by their own nested run, events a handler stopped watching.

import Glibc
import Testing
@testable import PortKit

extension RunLoopTests {
    @Suite struct RunLoopFidelityTests {
        /// A nested run, in the perform of a source, performs a source of its mode that was
        /// signalled in the same batch (after the outer one). The outer pass had taken the
        /// batch, and the nested run slept to its deadline: for ever with `.distantFuture`.
        @Test func aNestedRunPerformsItsSourceSignalledInTheSameBatch() throws {
            let (nested, performed) = try onLoopThread { loop -> (PKRunLoopRunResult?, Bool) in
                let mode: PKRunLoopMode = "fidelity-nested-batch"
                var performed = false
                var nested: PKRunLoopRunResult?
                let inner = PKCustomSource { performed = true }
                loop.add(inner, forMode: mode)
                let outer = PKCustomSource {
                    nested = loop.run(in: mode, until: .after(.seconds(2)), returnAfterSourceHandled: true)
                }
                loop.add(outer, forMode: .default)
                defer { inner.invalidate(); outer.invalidate() }
                outer.signal()
                inner.signal()
                loop.run(in: .default, until: .after(.seconds(10)), returnAfterSourceHandled: true)
                return (nested, performed)
            }
            #expect(nested == .handledSource)
            #expect(performed)
        }

        /// A run that returns after a custom source fires the timers due by then, as
        /// `CFRunLoop`'s does: a loop run once at a time whose source is signalled again each
        /// time (a busy port) never fired one.
        @Test func aRunThatReturnsAfterASourceFiresDueTimers() throws {
            let (fired, performs) = try onLoopThread { loop -> (Bool, Int) in
                var fired = false
                var performs = 0
                let timer = loop.scheduleTimer(after: .zero) { _ in fired = true }
                var busy: PKCustomSource?
                busy = PKCustomSource { performs += 1; busy?.signal() }
                loop.add(busy!, forMode: .default)
                defer { busy?.invalidate(); busy = nil; timer.invalidate() }  // (nil: the source's perform holds it)
                busy!.signal()
                for _ in 0..<20 where !fired { _ = loop.runOnce(before: .after(.seconds(5))) }
                return (fired, performs)
            }
            #expect(fired)
            #expect(performs >= 1)
        }

        /// And it reads its ready descriptor sources (one a run, as `CFRunLoop` handles one
        /// port a run): a socket beside a busy source was never read.
        @Test func aRunThatReturnsAfterASourceReadsAReadyDescriptor() throws {
            let read = try onLoopThread { loop -> Bool in
                let pipe = try TestPipe()
                defer { pipe.closeBoth() }
                var read = false
                let reader = PKDescriptorSource(descriptor: pipe.readEnd) { _ in
                    pipe.drain()
                    read = true
                }
                try loop.add(reader, forMode: .default)
                var busy: PKCustomSource?
                busy = PKCustomSource { busy?.signal() }
                loop.add(busy!, forMode: .default)
                defer { busy?.invalidate(); busy = nil; reader.invalidate() }  // (nil: the source's perform holds it)
                pipe.makeReadable()
                busy!.signal()
                for _ in 0..<20 where !read { _ = loop.runOnce(before: .after(.seconds(5))) }
                return read
            }
            #expect(read)
        }

        /// A run that returns after a source performs one (`CFRunLoop` stops after the first
        /// when asked to return after a source): a worker's `while !done { runOnce }` sees its
        /// flag before another source runs. The other stays signalled and runs next time.
        @Test func aRunThatReturnsAfterASourcePerformsOnlyOne() throws {
            let (afterFirst, afterSecond) = try onLoopThread { loop -> ([String], [String]) in
                var log: [String] = []
                let a = PKCustomSource(order: 1) { log.append("a") }
                let b = PKCustomSource(order: 2) { log.append("b") }
                loop.add(a, forMode: .default)
                loop.add(b, forMode: .default)
                defer { a.invalidate(); b.invalidate() }
                b.signal()
                a.signal()
                loop.run(in: .default, until: .after(.seconds(5)), returnAfterSourceHandled: true)
                let afterFirst = log
                loop.run(in: .default, until: .after(.seconds(5)), returnAfterSourceHandled: true)
                return (afterFirst, log)
            }
            #expect(afterFirst == ["a"])
            #expect(afterSecond == ["a", "b"])
        }

        /// In a loop run one source at a time, a source signalled again at every run does not
        /// keep another of its order waiting: the one that waited goes first next time (it
        /// came after the busy one's new signal, and ran only once the busy one stopped).
        @Test func aBusySourceDoesNotStarveAnotherRunOneAtATime() throws {
            let log = try onLoopThread { loop -> [String] in
                var log: [String] = []
                var busy: PKCustomSource?
                busy = PKCustomSource { log.append("busy"); busy?.signal() }
                let other = PKCustomSource { log.append("other") }
                loop.add(busy!, forMode: .default)
                loop.add(other, forMode: .default)
                defer { busy?.invalidate(); busy = nil; other.invalidate() }  // (nil: the source's perform holds it)
                busy!.signal()
                other.signal()
                for _ in 0..<4 { _ = loop.runOnce(before: .after(.seconds(5))) }
                return log
            }
            #expect(log.prefix(2).sorted() == ["busy", "other"], "\(log)")
        }

        /// An observer that runs the loop in its handler, in a mode it observes too, is not
        /// called again by that run (`CFRunLoop` skips a firing observer): it recursed until
        /// the stack ran out (here, until its own bound of 20).
        @Test func anObserverIsNotCalledAgainByItsOwnNestedRun() throws {
            let deepest = try onLoopThread { loop -> Int in
                let other: PKRunLoopMode = "fidelity-observer-nested"
                loop.addCommonMode(other)
                let keep = PKCustomSource(perform: {})
                loop.add(keep, forMode: .common)
                var depth = 0
                var deepest = 0
                let observer = PKRunLoopObserver(activities: .entry) { _, _ in
                    depth += 1
                    deepest = max(deepest, depth)
                    if depth < 20 { loop.run(in: other, until: .distantPast) }
                    depth -= 1
                }
                loop.add(observer, forMode: .common)
                defer { observer.invalidate(); keep.invalidate() }
                loop.run(in: .default, until: .distantPast)
                return deepest
            }
            #expect(deepest == 1)
        }

        /// A run nested in an entry observer of a new loop's first run, which had not made its
        /// pass's event buffer yet, runs (it indexed past the buffers and trapped).
        @Test func aRunNestedInTheFirstRunsEntryObserverRuns() throws {
            let nested = try onLoopThread { loop -> PKRunLoopRunResult? in
                let other: PKRunLoopMode = "fidelity-entry-nested"
                keepAlive(loop, other)
                keepAlive(loop, .default)
                var nested: PKRunLoopRunResult?
                let observer = PKRunLoopObserver(activities: .entry, repeats: false) { _, _ in
                    nested = loop.run(in: other, until: .distantPast)
                }
                loop.add(observer, forMode: .default)
                loop.run(in: .default, until: .distantPast)
                return nested
            }
            #expect(nested == .timedOut)
        }

        /// A one-shot observer is still valid while it is called, and invalid after: it is
        /// invalidated after its first call, as the documentation and `CFRunLoop` say.
        @Test func aOneShotObserverIsValidDuringItsCall() throws {
            let (during, after) = try onLoopThread { loop -> (Bool?, Bool) in
                let mode: PKRunLoopMode = "fidelity-one-shot"
                keepAlive(loop, mode)
                var during: Bool?
                let once = PKRunLoopObserver(activities: .entry, repeats: false) { observer, _ in
                    during = observer.isValid
                }
                loop.add(once, forMode: mode)
                loop.run(in: mode, until: .distantPast)
                return (during, once.isValid)
            }
            #expect(during == true)
            #expect(!after)
        }

        /// An invalidated timer and observer leave every mode at the next pass, in whatever
        /// mode it runs, as `CFRunLoop` removes them from all at once: one in a mode the loop
        /// does not run kept its handler, and what it captured, until that mode ran (the thread's
        /// end, for a mode that never runs again). `contains` says so of a timer at once.
        @Test func invalidatedTimersAndObserversLeaveEveryMode() throws {
            let (released, containedTimer) = try onLoopThread { loop -> (Bool, Bool) in
                final class Capture {}
                let idle: PKRunLoopMode = "fidelity-never-run"
                weak var weakCapture: Capture?
                var timer: PKTimer?
                var observer: PKRunLoopObserver?
                do {
                    let capture = Capture()
                    weakCapture = capture
                    timer = loop.scheduleTimer(after: .seconds(600), forMode: idle) { _ in _ = capture }
                    observer = PKRunLoopObserver(activities: .entry) { _, _ in _ = capture }
                    loop.add(observer!, forMode: idle)
                }
                keepAlive(loop, .default)
                timer?.invalidate()
                observer?.invalidate()
                let containedTimer = timer.map { loop.contains($0, inMode: idle) } ?? true
                timer = nil
                observer = nil
                loop.run(in: .default, until: .distantPast)
                return (weakCapture == nil, containedTimer)
            }
            #expect(released, "the invalidated timer's and observer's captures were released")
            #expect(!containedTimer)
        }

        /// A handler that stops another source watching (`events = []`) in the pass whose wait
        /// reported both: the other's handler is not called with the events the wait had
        /// collected.
        @Test func eventsStoppedByAnEarlierHandlerOfThePassAreNotDelivered() throws {
            let calls = try onLoopThread { loop -> [Int] in
                let pipes = [try TestPipe(), try TestPipe()]
                defer { for pipe in pipes { pipe.closeBoth() } }
                var calls = [0, 0]
                var sources: [PKDescriptorSource] = []
                for index in 0..<2 {
                    sources.append(PKDescriptorSource(descriptor: pipes[index].readEnd) { _ in
                        calls[index] += 1
                        pipes[index].drain()
                        sources[1 - index].events = []
                    })
                }
                for source in sources { try loop.add(source, forMode: .default) }
                defer {
                    for source in sources { source.invalidate() }
                    sources = []  // each handler holds the array
                }
                for pipe in pipes { pipe.makeReadable() }
                loop.run(in: .default, until: .after(.milliseconds(100)))
                return calls
            }
            #expect(calls.sorted() == [0, 1], "\(calls)")
        }
    }
}
