// Helpers for the reliability tests: what a process holds (resident memory, descriptors),
// spawning an unrelated program, latency summaries, and signal storms at chosen threads.

import Foundation
import Testing
import Synchronization
@testable import PortKit

/// Whether resident memory says anything about PortKit here: not under a sanitizer, whose
/// shadow memory and (AddressSanitizer's) quarantine of freed blocks grow with whatever every
/// test running in parallel allocates. Tests then report the figure without checking it.
let residentMemoryIsMeaningful = !runsUnderThreadSanitizer && dlsym(nil, "__asan_init") == nil

/// The bound the reliability tests state for noticing a peer's death (its `kill -9` to our
/// invalidation): 1 s; 5 s under a sanitizer, whose processes take far longer to tear down
/// (under ThreadSanitizer on a loaded machine, p50 5 ms but a maximum of 0.4 s).
let peerDeathBound: Duration = residentMemoryIsMeaningful ? .seconds(1) : .seconds(5)

/// This process's resident set size in bytes (`/proc/self/statm`).
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return -1 }
    let fields = text.split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return -1 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// The descriptor numbers process `pid` has open (`/proc/PID/fd`), sorted.
func descriptorNumbers(ofProcess pid: pid_t) -> [Int32] {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
    return entries.compactMap { Int32($0) }.sorted()
}

/// The scheduler state of process `pid` (`R`, `S`, `D`, `Z`, ...), from `/proc/PID/stat`.
func processState(_ pid: pid_t) -> Character? {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return nil }
    return stat[stat.index(after: close)...].first { $0 != " " }
}

/// What this process's descriptors refer to, by number (`/proc/self/fd`).
func descriptorTargets() -> [Int32: String] {
    Dictionary(uniqueKeysWithValues: descriptorNumbers(ofProcess: getpid()).map { ($0, descriptorTarget(ofProcess: getpid(), $0)) })
}

/// The descriptors in `after` that were not in `before` (or now refer to something else), for
/// a failure's message: "12=socket:[345] 13=anon_inode:[eventfd]".
func newDescriptors(since before: [Int32: String], _ after: [Int32: String]) -> String {
    after.filter { before[$0.key] != $0.value }.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
}

/// What descriptor `fd` of process `pid` refers to (`socket:[...]`, a path, `anon_inode:...`).
func descriptorTarget(ofProcess pid: pid_t, _ fd: Int32) -> String {
    (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(fd)")) ?? "?"
}

/// Starts `path` with `arguments` by `posix_spawn`, inheriting whatever this process does not
/// mark close-on-exec, as any library call that starts a program would. Returns its pid.
func spawnUnrelated(_ path: String, _ arguments: [String]) throws -> pid_t {
    let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
    defer { for arg in argv { free(arg) } }
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, path, nil, nil, argv, environ)
    guard rc == 0 else { throw PeerError(description: "posix_spawn \(path) failed: errno \(rc)") }
    return pid
}

/// Kills and reaps a child started by `spawnUnrelated`.
func killAndReap(_ pid: pid_t) {
    kill(pid, SIGKILL)
    var status: Int32 = 0
    _ = waitpid(pid, &status, 0)
}

/// Runs `body` on a new thread and awaits it instead of holding a thread of Swift concurrency's
/// pool: a synchronous test blocks one for its whole length, and on two cores the pool has two,
/// which async tests running alongside need (two synchronous tests of ten seconds each once
/// held async requests past their deadline). For tests that take a second or more. Throws
/// `TestTimeout` if `timeout` passes first.
func awaitThread<R: Sendable>(
    timeout: Duration, _ body: @escaping @Sendable () throws -> R
) async throws -> R {
    let resumed = Locked(false)
    return try await withCheckedThrowingContinuation { continuation in
        let finish: @Sendable (Result<R, any Error>) -> Void = { result in
            let first = resumed.withLock { done -> Bool in
                defer { done = true }
                return !done
            }
            if first { continuation.resume(with: result) }
        }
        _ = TestThread(name: "test-thread") { finish(Result { try body() }) }
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        DispatchQueue.global().asyncAfter(deadline: .now() + seconds) {
            finish(.failure(TestTimeout(what: "the test's thread, after \(timeout)")))
        }
    }
}

/// `awaitThread` with a run loop of the thread's own, as `onLoopThread` gives.
func awaitLoopThread<R: Sendable>(
    timeout: Duration, _ body: @escaping @Sendable (PKRunLoop) throws -> R
) async throws -> R {
    try await awaitThread(timeout: timeout) { try body(PKRunLoop.current) }
}

/// "p50 …, p99 …, max …" of `durations`, in milliseconds.
func latencySummary(_ durations: [Duration]) -> String {
    guard !durations.isEmpty else { return "no samples" }
    let sorted = durations.sorted()
    func at(_ fraction: Double) -> Duration { sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))] }
    return "p50 \(milliseconds(at(0.5))), p99 \(milliseconds(at(0.99))), max \(milliseconds(sorted.last!)) over \(sorted.count)"
}

/// A duration as "1.23 ms".
func milliseconds(_ duration: Duration) -> String {
    let ms = Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
    return String(format: "%.2f ms", ms)
}

/// Sends SIGUSR1 every `interval` to each registered thread, whose handler does nothing and is
/// installed without `SA_RESTART`: every blocking system call of those threads keeps failing
/// with `EINTR`. A thread must leave (`leave()`) before it ends; the storm never signals a thread
/// that has left (the list is locked while signalling).
final class SignalStorm: Sendable {
    /// Shared with the storm's thread. The target list is contended every 200 µs: its lock is
    /// `PKMutex`, whose hand-offs ThreadSanitizer sees (a plain `Mutex`'s it does not).
    private final class State: Sendable {
        let targets = PKMutex<[UInt: Int]>([:])
        let running = Atomic<Bool>(true)
        let rounds = Atomic<Int>(0)
    }
    private let state = State()
    private let thread: TestThread

    /// Installs the no-op handler (left installed afterwards: a signal still in flight when the
    /// storm stops must not find the default disposition, which would end the process).
    private static let handlerInstalled: Bool = {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0  // no SA_RESTART: interrupted calls fail with EINTR
        return sigaction(SIGUSR1, &action, nil) == 0
    }()

    init(every interval: Duration = .microseconds(200)) {
        precondition(Self.handlerInstalled, "cannot install the SIGUSR1 handler")
        let state = self.state
        thread = TestThread(name: "signal-storm") {
            while state.running.load(ordering: .acquiring) {
                state.targets.withLock { threads in
                    for thread in threads.keys { pthread_kill(pthread_t(thread), SIGUSR1) }
                }
                state.rounds.add(1, ordering: .relaxed)
                sleepFor(interval)
            }
        }
    }

    /// Makes the calling thread a target until it calls `leave()`. Threads started from Swift
    /// concurrency's pool inherit a mask that blocks nearly every signal: SIGUSR1 is unblocked.
    func join() {
        Self.setBlocked(false)
        state.targets.withLock { $0[UInt(pthread_self()), default: 0] += 1 }
    }

    /// Stops signalling the calling thread (and blocks SIGUSR1 in it again).
    func leave() {
        defer { Self.setBlocked(true) }
        state.targets.withLock { threads in
            let key = UInt(pthread_self())
            threads[key, default: 1] -= 1
            if threads[key] == 0 { threads[key] = nil }
        }
    }

    private static func setBlocked(_ blocked: Bool) {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGUSR1)
        pthread_sigmask(blocked ? SIG_BLOCK : SIG_UNBLOCK, &set, nil)
    }

    /// How many rounds of signals were sent.
    var rounds: Int { state.rounds.load(ordering: .relaxed) }

    /// Ends the storm and waits for its thread.
    func stop() throws {
        state.running.store(false, ordering: .releasing)
        try thread.join(timeout: .seconds(60))
    }
}

/// Makes libdispatch open what it opens once per process (the timer descriptors of each of its
/// clocks), so that a test counting this process's descriptors does not count them as a leak:
/// a child process once showed one timerfd more after a thousand loops had come and gone, and
/// PortKit's loops had all closed theirs (every loop was released). Call it before the count.
func warmUpDispatchTimers() async {
    let fired = Locked(0)
    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(1)) { fired.withLock { $0 += 1 } }
    DispatchQueue.global().asyncAfter(wallDeadline: .now() + .milliseconds(1)) { fired.withLock { $0 += 1 } }
    try? await Task.sleep(for: .milliseconds(2))
    try? await Task.sleep(until: .now + .milliseconds(2), clock: .suspending)
    let deadline = PKDeadline.after(.seconds(10))
    while fired.value < 2 && !deadline.hasPassed { try? await Task.sleep(for: .milliseconds(1)) }
}

/// Ends an exit test's child process: leaves `report` for the parent to print (in
/// `exitReportPath`; see `exitTestInTurn`), records each failed check as an issue with the
/// report beside it (the parent shows the child's issues), and exits 0 only if none failed.
/// `exit` runs no deinit: the caller removes its directories first.
func endExitTest(_ report: String, failures: [String]) -> Never {
    _ = FileManager.default.createFile(atPath: exitReportPath(parent: getppid()), contents: Data((report + "\n").utf8))
    for failure in failures { Issue.record("\(failure)\n\(report)") }
    exit(failures.isEmpty ? 0 : 1)
}

/// Where the running exit test's child leaves its report (one exit test runs at a time).
func exitReportPath(parent: pid_t) -> String { "/tmp/pk-exit-report-\(parent)" }

/// Takes turns among exit tests.
private actor ExitTestTurns {
    private var busy = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    func enter() async {
        guard busy else { busy = true; return }
        await withCheckedContinuation { waiting.append($0) }
    }

    func leave() {
        if waiting.isEmpty { busy = false } else { waiting.removeFirst().resume() }
    }
}

private let exitTestTurns = ExitTestTurns()

/// Runs `body`, an exit test (`#expect(processExitsWith:)`), when no other is running, then
/// prints the report its child left (`endExitTest`). swift-testing waits for a child by
/// reading its back channel (and any output it observes) with blocking reads on Swift
/// concurrency's threads, two on these machines: two exit tests at once, or one that observes
/// its output, held both, and async tests starved for tens of seconds. So exit tests take
/// turns and observe no output; their figures come through the report.
func exitTestInTurn(_ body: () async -> Void) async {
    await exitTestTurns.enter()
    let path = exitReportPath(parent: getpid())
    unlink(path)
    await body()
    if let report = try? String(contentsOfFile: path, encoding: .utf8) { print(report, terminator: "") }
    unlink(path)
    await exitTestTurns.leave()
}
