// When a send asks whether its connection's last write is still unread (`SIOCOUTQ`): the rule
// that lets a round trip read no clock (docs/decisions.md, coalesced writes). A write by a
// thread without a running loop is dated by the clock; a running loop's write is recent until
// the loop waits, and a loop's write is not recent once its loop has waited since.

import Testing
@testable import PortKit

@Suite struct SendRecencyTests {
    @Test func aWriteIsRecentUntilItsLoopWaits() async throws {
        let problems = try await awaitLoopThread(timeout: patience(.seconds(30))) { loop -> [String] in
            var problems: [String] = []
            func expect(_ got: Bool, _ want: Bool, _ what: String) { if got != want { problems.append(what) } }
            guard let outside = PKRunLoop.onCurrentThread else { return ["no loop on the loop thread"] }
            var state = SendConnection.State()
            expect(SendConnection.wroteRecently(state, outside), false, "never written: not recent")
            // Outside any run, a write is dated by the clock.
            state.writerLoop = outside.id
            state.writerWaits = outside.waits
            // (The clock is given: a preemption between two readings of it, under a sanitizer and
            // the suite's load, once aged a write "just now" past the 2 µs window.)
            let writtenAt = monotonicNanoseconds()
            state.lastWriteAt = writtenAt
            expect(SendConnection.wroteRecently(state, outside, now: { writtenAt }), true, "written just now outside a run: recent")
            expect(SendConnection.wroteRecently(state, outside, now: { writtenAt + 1_000_000 }), false, "written 1 ms ago outside a run: not recent")

            // Inside a run, a write of this run is recent with no clock, until the loop waits.
            let timer = PKTimer(fireDate: .after(.seconds(3600))) { _ in }
            loop.add(timer, forMode: .default)
            defer { timer.invalidate() }
            let loopID = outside.id
            let outsideWaits = outside.waits
            let found = Locked<[String]>([])
            let runWaits = Locked<UInt64?>(nil)
            loop.perform(inModes: [.default]) {
                guard let inside = PKRunLoop.onCurrentThread, inside.isRunning else {
                    found.withLock { $0.append("the perform block did not run inside the run") }
                    return
                }
                var earlier = SendConnection.State()
                earlier.writerLoop = loopID
                earlier.writerWaits = outsideWaits
                earlier.lastWriteAt = monotonicNanoseconds()
                if SendConnection.wroteRecently(earlier, inside) {
                    found.withLock { $0.append("an outside write, seen from a run entered since: recent") }
                }
                var ours = SendConnection.State()
                ours.writerLoop = inside.id
                ours.writerWaits = inside.waits
                if !SendConnection.wroteRecently(ours, inside) {
                    found.withLock { $0.append("this run's write, no wait since: not recent") }
                }
                var elsewhere = SendConnection.State()
                let elsewhereAt = monotonicNanoseconds()
                elsewhere.lastWriteAt = elsewhereAt
                if !SendConnection.wroteRecently(elsewhere, inside, now: { elsewhereAt }) {
                    found.withLock { $0.append("another thread's write just now: not recent") }
                }
                runWaits.value = inside.waits
            }
            loop.run(in: .default, until: .after(.milliseconds(20)))
            problems += found.value
            guard let waits = runWaits.value else { return problems + ["the perform block did not run"] }
            guard let after = PKRunLoop.onCurrentThread else { return problems + ["no loop after the run"] }
            expect(after.isRunning, false, "the run ended")
            var fromRun = SendConnection.State()
            fromRun.writerLoop = after.id
            fromRun.writerWaits = waits
            expect(SendConnection.wroteRecently(fromRun, after), false, "a run's write after the run waited: not recent")
            return problems
        }
        #expect(problems.isEmpty, "\(problems)")
    }
}
