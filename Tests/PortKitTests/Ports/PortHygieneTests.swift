// Process hygiene and hosting: no descriptor outlives its port, and a loop driven by another
// event system (polling the loop's descriptor) delivers port messages.

import Glibc
import Testing
@testable import PortKit

@Suite struct PortHygieneTests {
    /// A thousand ports, each made, scheduled, sent to once (through a local right and through
    /// an independent one), served and invalidated: the process's descriptor count comes back
    /// to where it started. Run in a child process, so that no other test's descriptors blur
    /// the count.
    @Test func aThousandPortsLeaveNoDescriptorOpen() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                await warmUpDispatchTimers()  // once-per-process descriptors out of the count
                let outcome = Locked<String?>(nil)
                let thread = TestThread(name: "thousand-ports") {
                    let loop = PKRunLoop.current
                    _ = PKRunLoop.background  // first-use set-up out of the count
                    let warmUp = PKReceivePort()
                    try? loop.add(warmUp, forMode: .default)
                    warmUpLoopDescriptors(loop)
                    warmUp.invalidate()
                    let before = openDescriptorCount()
                    for index in 0..<1_000 {
                        var got = 0
                        let port = PKReceivePort { _ in got += 1 }
                        try? loop.add(port, forMode: .default)
                        try? port.makeSendRight().send(PKPortMessage(msgid: UInt32(index), data: [1]), timeout: .seconds(5))
                        if let right = try? independentRight(to: port) {
                            try? right.send(PKPortMessage(msgid: UInt32(index), components: [.port(port.makeSendRight())]), timeout: .seconds(5))
                        }
                        let deadline = PKDeadline.after(patience(.seconds(10)))
                        while got < 2 && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
                        if got < 2 { outcome.value = "port \(index) got \(got) messages"; return }
                        port.invalidate()
                    }
                    var after = openDescriptorCount()
                    let deadline = PKDeadline.after(patience(.seconds(20)))
                    while after != before && !deadline.hasPassed {
                        loop.run(in: .default, until: .after(.milliseconds(5)))
                        after = openDescriptorCount()
                    }
                    outcome.value = after == before ? "ok" : "descriptors before \(before), after \(after)"
                }
                do { try thread.joinPatiently(timeout: .seconds(120)) } catch { endExitTest("the thread did not end", failures: ["\(error)"]) }
                let value = outcome.value ?? "no outcome"
                endExitTest(value, failures: value == "ok" ? [] : [value])
            }
        }
    }

    /// A loop hosted by another event system: another thread polls the loop's `descriptor`;
    /// when it is readable the owner thread runs one pass (`runOnePass`), which delivers the
    /// port messages. The owner never sleeps in its own loop.
    @Test func aLoopHostedByAnotherEventSystemDeliversPortMessages() throws {
        let count = 20
        let notices = Locked(0)        // the poller saw the loop's descriptor readable
        let passes = Locked(0)         // the owner ran a pass for a notice
        let got = Locked<[UInt32]>([])
        let published = TestLatch<UncheckedBox<(PKReceivePort, Int32)>>()
        let finished = Locked(false)
        let owner = TestThread(name: "hosted-owner") {
            let loop = PKRunLoop.current
            let port = PKReceivePort { message in got.withLock { $0.append(message.msgid) } }
            guard (try? loop.add(port, forMode: .default)) != nil else { return }
            published.set(UncheckedBox((port, loop.descriptor)))
            // The owner's own "event system": it waits for the poller's notices and runs one
            // pass of the loop for each; it never runs the loop any other way.
            let deadline = PKDeadline.after(patience(.seconds(30)))
            while !finished.value && !deadline.hasPassed {
                if notices.value > passes.value {
                    loop.runOnePass(in: .default)
                    passes.withLock { $0 += 1 }
                } else {
                    sleepFor(.microseconds(200))
                }
            }
            port.invalidate()
        }
        let (port, descriptor) = try published.waitPatiently().value
        let poller = TestThread(name: "poller") {
            let deadline = PKDeadline.after(patience(.seconds(30)))
            while !finished.value && !deadline.hasPassed {
                var pfd = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
                guard poll(&pfd, 1, 50) > 0, pfd.revents & Int16(POLLIN) != 0 else { continue }
                let notice = notices.withLock { value -> Int in value += 1; return value }
                // Wait for the owner to run its pass before polling again (level-triggered).
                while passes.value < notice && !finished.value && !deadline.hasPassed { sleepFor(.microseconds(200)) }
            }
        }
        let right = port.makeSendRight()
        for id in UInt32(0)..<UInt32(count) {
            try right.send(PKPortMessage(msgid: id), timeout: .seconds(5))
            try waitPatiently("message \(id) through the hosted loop") { got.value.count == Int(id) + 1 }
        }
        finished.value = true
        try poller.joinPatiently()
        try owner.joinPatiently()
        #expect(got.value == (0..<UInt32(count)).map { $0 })
        #expect(passes.value >= count)
        #expect(!right.isValid)
    }
}
