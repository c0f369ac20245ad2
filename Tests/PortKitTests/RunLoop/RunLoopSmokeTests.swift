import Testing
import Synchronization
@testable import PortKit

@Suite struct RunLoopSmokeTests {
    @Test func emptyModeFinishesAtOnce() {
        let loop = PKRunLoop.current
        #expect(loop.run(in: "empty-mode", until: .after(.seconds(5))) == .finished)
    }

    @Test func timerFiresAndTimesOut() {
        let loop = PKRunLoop.current
        var fired = 0
        let timer = loop.scheduleTimer(after: .milliseconds(5), forMode: "smoke") { _ in fired += 1 }
        let keepAlive = loop.scheduleTimer(after: .seconds(60), forMode: "smoke") { _ in }
        let result = loop.run(in: "smoke", until: .after(.milliseconds(50)))
        #expect(result == .timedOut)
        #expect(fired == 1)
        #expect(!timer.isValid)
        keepAlive.invalidate()
    }

    @Test func performFromAnotherThreadWakesSleepingLoop() throws {
        let loop = PKRunLoop.current
        let keepAlive = loop.scheduleTimer(after: .seconds(60), forMode: "perf") { _ in }
        defer { keepAlive.invalidate() }
        let ran = Locked(false)
        let t = TestThread {
            sleepFor(.milliseconds(20))
            loop.perform(inModes: ["perf"]) { ran.value = true; loop.stop() }
        }
        let result = loop.run(in: "perf", until: .after(.seconds(10)))
        #expect(result == .stopped)
        #expect(ran.value)
        try t.join()
    }
}
