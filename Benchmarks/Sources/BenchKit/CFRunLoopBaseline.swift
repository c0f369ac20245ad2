// The guide's own model on Apple's own run loop: the custom input source of the Threading
// Programming Guide ("Defining a Custom Input Source": a queue of commands behind a lock; the
// sender adds one, then calls CFRunLoopSourceSignal and CFRunLoopWakeUp; the source's perform
// routine takes them on the receiver's loop), on swift-corelibs-foundation's CFRunLoop, which
// Linux's Foundation is built on (epoll, an eventfd to wake it, as PortKit's loop).
//
// It is the least a port between threads can do on that loop: no port object, no limits, no
// invalidation, no reply port; a message is the 64-byte array itself, passed by reference (as
// PortKit passes a message between threads). So it bounds what the guide's pattern costs on a
// general run loop, against PortKit's port on its own (docs/performance.md, the instructions).

import CBench
import CoreFoundation
import Foundation
import Synchronization

/// One side's input source: messages for it queue behind a lock; `post` signals the source and
/// wakes the side's loop, whose perform routine hands each to `handler`.
private final class GuideInputSource: @unchecked Sendable {
    /// The loop the source is on (its owner thread's).
    let loop: CFRunLoop
    private(set) var source: CFRunLoopSource?
    private let queue = Mutex<[[UInt8]]>([])
    /// The perform routine's spare array, swapped with the queue (no allocation a message).
    private var taken: [[UInt8]] = []
    /// Loop-only: set before the first post.
    var handler: ([UInt8]) -> Void = { _ in }

    /// Makes the source and adds it to the calling thread's loop, default mode.
    init() {
        loop = CFRunLoopGetCurrent()
        queue.withLock { $0.reserveCapacity(16) }
        taken.reserveCapacity(16)
        var context = CFRunLoopSourceContext()
        context.info = Unmanaged.passUnretained(self).toOpaque()
        context.perform = { info in
            Unmanaged<GuideInputSource>.fromOpaque(info!).takeUnretainedValue().performCommands()
        }
        source = CFRunLoopSourceCreate(nil, 0, &context)
        CFRunLoopAddSource(loop, source, kCFRunLoopDefaultMode)
    }

    /// From any thread: queues `message`, signals the source, wakes its loop.
    func post(_ message: [UInt8]) {
        queue.withLock { $0.append(message) }
        CFRunLoopSourceSignal(source)
        CFRunLoopWakeUp(loop)
    }

    private func performCommands() {
        queue.withLock { swap(&$0, &taken) }
        for message in taken { handler(message) }
        taken.removeAll(keepingCapacity: true)
    }

    /// Owner-only: removes the source from its loop.
    func invalidate() {
        if let source { CFRunLoopSourceInvalidate(source) }
        source = nil
    }

    /// The source's info pointer is this object, unretained: it must not outlive it.
    deinit { invalidate() }
}

/// Round trips of 64-byte messages between two threads, each running its CFRunLoop once per
/// message (`CFRunLoopRunInMode(kCFRunLoopDefaultMode, seconds, true)`, `-runMode:beforeDate:`)
/// as PortKit's thread pair runs its loop: the main side with a deadline 60 s away (the guide's
/// skeleton thread gives 10 s), the worker with none (the guide's worker: `distantFuture`).
/// CFRunLoop makes a libdispatch timer for each run with a deadline; `mainDeadline: false`
/// runs the main side without one too (`pkbench rt cf-threads-nodeadline`).
public final class CFRunLoopRoundTrip: Workload {
    private let driver: PinnedDriver
    /// A run's length that stands for "no deadline": past CFRunLoop's limit for a run's timer
    /// (`TIMER_INTERVAL_LIMIT`, about 5.05e8 s), so it makes none, as for `distantFuture`.
    private static let noDeadline: CFTimeInterval = 1.0e10

    /// The worker thread's start, as the main side and the worker agree on it.
    private enum WorkerStart {
        case starting
        case running(GuideInputSource)
        /// The main side stopped waiting: a worker that starts after that ends at once.
        case abandoned
    }

    private final class StartState: Sendable {
        let value = Mutex<WorkerStart>(.starting)
    }

    public init(_ placement: Placement, size: Int = 64, mainDeadline: Bool = true) throws {
        let workerCPU = placement.cpus.second
        let mainSeconds: CFTimeInterval = mainDeadline ? 60 : Self.noDeadline
        driver = try PinnedDriver(cpu: placement.cpus.first) {
            var answers = 0
            let mine = GuideInputSource()
            mine.handler = { _ in answers += 1 }

            // The worker: its own loop and source, echoing each message to the main side. An
            // empty message is the guide's command to exit: a signalled source is performed
            // before its loop sleeps, so unlike `CFRunLoopStop` (lost between two runs) it
            // cannot be missed.
            let started = DispatchSemaphore(value: 0)
            let start = StartState()
            let thread = try startThread {
                if workerCPU >= 0 { cb_pin_self(workerCPU) }
                let source = GuideInputSource()
                var done = false
                source.handler = { message in
                    if message.isEmpty { done = true } else { mine.post(message) }
                }
                let abandoned = start.value.withLock { state in
                    if case .abandoned = state { return true }
                    state = .running(source)
                    return false
                }
                started.signal()
                while !done && !abandoned {
                    _ = CFRunLoopRunInMode(kCFRunLoopDefaultMode, Self.noDeadline, true)
                }
                source.invalidate()
            }
            _ = started.wait(timeout: .now() + 30)
            let running: GuideInputSource? = start.value.withLock { state in
                if case .running(let source) = state { return source }
                state = .abandoned
                return nil
            }
            guard let peer = running else {
                pthread_detach(thread)
                mine.invalidate()
                throw BenchError("the CFRunLoop worker did not start within 30 s")
            }

            let payload = [UInt8](repeating: 0x5A, count: size)
            return DriverBody(work: { n in
                let start = nowNanoseconds()
                for _ in 0..<n {
                    let target = answers + 1
                    peer.post(payload)
                    while answers < target {
                        let result = CFRunLoopRunInMode(kCFRunLoopDefaultMode, mainSeconds, true)
                        if result == .timedOut || result == .finished { throw BenchError("no answer from the CFRunLoop worker (\(result.rawValue))") }
                    }
                }
                return nowNanoseconds() - start
            }, tearDown: {
                peer.post([])
                pthread_join(thread, nil)
                mine.invalidate()
            })
        }
    }

    public func run(_ n: Int) throws -> UInt64 { try driver.run(n) }
    public func close() { driver.close() }
}
