// The example binaries end to end: checkin-main with worker threads and processes, and a
// checkin-worker started by hand against a waiting checkin-main. Both are built next to the test
// bundle (`swift build --build-tests` builds every executable target) and run in a private
// name directory.

import Foundation
import Testing

// Each test waits for its programs on a thread of its own (`awaitThread`): they run for seconds,
// and a synchronous test would hold one of Swift concurrency's two threads meanwhile.
@Suite(.serialized) struct ExampleBinariesTests {
    @Test func checkinMainRunsWorkerThreadsAndProcesses() async throws {
        let names = try PrivateNameDirectory()
        let result = try await awaitThread(timeout: patience(.seconds(180))) {
            try ExampleBinary("checkin-main", ["--processes", "2", "--workers", "2"], names: names).waitForExit(timeout: patience(.seconds(120)))
        }
        #expect(result.status == 0, "checkin-main failed: \(result.errors)")
        #expect(result.errors.isEmpty, "\(result.errors)")
        #expect(result.output.contains("verified: every chunk"), "\(result.output)")
        // Both kinds of worker, and the transports of the two cross-process forms.
        let rows = result.output.split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true) }
        #expect(rows.count(where: { $0.count > 2 && $0[1] == "thread" }) == 2, "\(result.output)")
        #expect(rows.count(where: { $0.count > 2 && $0[1] == "process" }) == 2, "\(result.output)")
        #expect(result.output.contains("named unix socket"))
        #expect(result.output.contains("port passed over fd"))
        #expect(result.output.contains("shut down: 4 of 4 workers stopped; 2 of 2 spawned processes exited with status 0"), "\(result.output)")
        // Every name was removed: the main port's and the worker's.
        #expect(names.sockets().isEmpty, "left behind: \(names.sockets())")
    }

    @Test func checkinWorkerStartedByHandChecksInWithAWaitingMain() async throws {
        let names = try PrivateNameDirectory()
        let name = "by-hand-\(getpid())"
        let (workerPID, workerResult, mainResult) = try await awaitThread(timeout: patience(.seconds(240))) {
            let main = try ExampleBinary(
                "checkin-main", ["--wait-for-workers", "1", "--processes", "0", "--workers", "1", "--name", name], names: names)
            // checkin-main says what to run; run that (the built checkin-worker) with the same name.
            try main.readOutput(until: "checkin-worker --name \(name)", timeout: patience(.seconds(60)))
            let worker = try ExampleBinary("checkin-worker", ["--name", name], names: names)
            let workerResult = try worker.waitForExit(timeout: patience(.seconds(120)))
            return (worker.pid, workerResult, try main.waitForExit(timeout: patience(.seconds(60))))
        }
        #expect(workerResult.status == 0, "checkin-worker failed: \(workerResult.errors)")
        #expect(mainResult.status == 0, "checkin-main failed: \(mainResult.errors)")
        #expect(workerResult.output.contains("checked in with \"\(name)\" as \"\(name).worker-\(workerPID)\""), "\(workerResult.output)")
        #expect(workerResult.output.contains("told to stop"), "\(workerResult.output)")
        #expect(mainResult.output.contains("\(name).worker-\(workerPID) checked in (1 of 1 started by hand)"), "\(mainResult.output)")
        #expect(mainResult.output.contains("by hand, 3-17..3-19"), "\(mainResult.output)")
        #expect(mainResult.output.contains("verified: every chunk"), "\(mainResult.output)")
        #expect(names.sockets().isEmpty, "left behind: \(names.sockets())")
    }

    @Test func checkinWorkerWithoutAMainFailsWithOneLine() async throws {
        let names = try PrivateNameDirectory()
        let result = try await awaitThread(timeout: patience(.seconds(120))) {
            try ExampleBinary("checkin-worker", ["--name", "nobody-home", "--wait-timeout", "1"], names: names).waitForExit(timeout: patience(.seconds(60)))
        }
        #expect(result.status == 1)
        let lines = result.errors.split(separator: "\n")
        #expect(lines.count == 1, "\(result.errors)")
        #expect(lines.first?.hasPrefix("checkin-worker: no port was registered as \"nobody-home\"") == true, "\(result.errors)")
    }

    /// Options that would make more jobs than the example keeps results for are refused: a
    /// count of rounds past the limit as a usage error (64), too many chunks times rounds with
    /// one line (1); neither allocates for them first.
    @Test func checkinMainRefusesTooManyJobs() async throws {
        let names = try PrivateNameDirectory()
        let (usage, tooMany) = try await awaitThread(timeout: patience(.seconds(120))) {
            let usage = try ExampleBinary("checkin-main", ["--workers", "1", "--rounds", "\(Int.max)"], names: names)
                .waitForExit(timeout: patience(.seconds(60)))
            let tooMany = try ExampleBinary("checkin-main", ["--workers", "1", "--chunk-size", "1", "--rounds", "1000"], names: names)
                .waitForExit(timeout: patience(.seconds(60)))
            return (usage, tooMany)
        }
        #expect(usage.status == 64, "\(usage.errors)")
        #expect(usage.errors.contains("--rounds must be from 1 to"), "\(usage.errors)")
        #expect(tooMany.status == 1, "\(tooMany.errors)")
        let lines = tooMany.errors.split(separator: "\n")
        #expect(lines.count == 1 && lines[0].hasPrefix("checkin-main: too many jobs:"), "\(tooMany.errors)")
        #expect(names.sockets().isEmpty, "left behind: \(names.sockets())")
    }
}

/// A name directory of the test's own (mode 0700), removed afterwards.
private final class PrivateNameDirectory: Sendable {
    let path: String

    init() throws {
        path = "/tmp/pk-examples-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        guard mkdir(path, 0o700) == 0 else { throw ExampleBinaryError("cannot make \(path): errno \(errno)") }
    }

    /// The sockets of the names still registered.
    func sockets() -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).filter { $0.hasSuffix(".sock") }
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

private struct ExampleBinaryError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One of the example binaries, running, with its standard output and error collected.
private final class ExampleBinary {
    let process = Process()
    private let stdoutPipe = Pipe()
    private let stderrPipe = Pipe()
    private var output: [UInt8] = []
    private var errors: [UInt8] = []
    private var stdoutOpen = true
    private var stderrOpen = true
    private let name: String

    /// The executable `name` next to the running test binary (the xctest bundle on Linux is a
    /// plain file in the build directory), as `PeerProcess.executablePath` finds its helper.
    static func path(_ name: String) throws -> String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = URL(fileURLWithPath: exe).deletingLastPathComponent()
        if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
        let path = directory.appendingPathComponent(name).path
        guard FileManager.default.isExecutableFile(atPath: path) else {
            throw ExampleBinaryError("\(name) is not built next to the tests (\(path)); swift build --build-tests builds it")
        }
        return path
    }

    init(_ name: String, _ arguments: [String], names: PrivateNameDirectory) throws {
        self.name = name
        process.executableURL = URL(fileURLWithPath: try Self.path(name))
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment["PORTKIT_NAME_DIRECTORY"] = names.path
        process.environment = environment
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = stdoutPipe
        process.standardError = stderrPipe
        try process.run()
    }

    var pid: Int32 { process.processIdentifier }

    /// Reads standard output until it contains `text`.
    func readOutput(until text: String, timeout: Duration) throws {
        let deadline = ContinuousClock.now + timeout
        while !String(decoding: output, as: UTF8.self).contains(text) {
            guard stdoutOpen else { throw failure("closed its output without printing \"\(text)\"") }
            guard ContinuousClock.now < deadline else { throw failure("did not print \"\(text)\" within \(timeout)") }
            pump(until: deadline)
        }
    }

    /// Reads both outputs to their end and waits for the process to exit; kills it if the
    /// timeout passes first.
    func waitForExit(timeout: Duration) throws -> (status: Int32, output: String, errors: String) {
        let deadline = ContinuousClock.now + timeout
        while stdoutOpen || stderrOpen {
            // Ended: what it wrote is in the pipes now. (Waiting for the end of output instead
            // hung under ThreadSanitizer: a program another test spawned meanwhile had inherited
            // the pipes' writing ends, so the end of output came only when that one exited.)
            if !process.isRunning || PeerProcess.childEnd(pid) != nil {
                drainAvailable()
                break
            }
            guard ContinuousClock.now < deadline else {
                kill(pid, SIGKILL)
                throw failure("did not finish within \(timeout)")
            }
            pump(until: deadline)
        }
        // Both outputs closed: the process is exiting, if it has not already. (Asked of the
        // kernel too: Foundation may learn of the end late; see `PeerProcess.childEnd`.)
        var end = PeerProcess.childEnd(pid)
        while process.isRunning && end == nil {
            guard ContinuousClock.now < deadline else {
                kill(pid, SIGKILL)
                throw failure("closed its outputs but did not exit within \(timeout)")
            }
            usleep(1000)
            end = PeerProcess.childEnd(pid)
        }
        let (status, signalled) = process.isRunning ? end! : (process.terminationStatus, process.terminationReason != .exit)
        guard !signalled else { throw failure("died of signal \(status)") }
        return (status, String(decoding: output, as: UTF8.self), String(decoding: errors, as: UTF8.self))
    }

    /// Reads whatever both outputs hold now, without waiting.
    private func drainAvailable() {
        while (stdoutOpen || stderrOpen) && hasInput() { pump(until: ContinuousClock.now) }
        stdoutOpen = false
        stderrOpen = false
    }

    /// Whether either open output has bytes to read (or its end) now.
    private func hasInput() -> Bool {
        var fds = [
            pollfd(fd: stdoutOpen ? stdoutPipe.fileHandleForReading.fileDescriptor : -1, events: Int16(POLLIN), revents: 0),
            pollfd(fd: stderrOpen ? stderrPipe.fileHandleForReading.fileDescriptor : -1, events: Int16(POLLIN), revents: 0),
        ]
        return poll(&fds, 2, 0) > 0
    }

    /// Waits up to `deadline` for either output to have something, and reads it.
    private func pump(until deadline: ContinuousClock.Instant) {
        let out = stdoutPipe.fileHandleForReading.fileDescriptor
        let err = stderrPipe.fileHandleForReading.fileDescriptor
        var fds = [
            pollfd(fd: stdoutOpen ? out : -1, events: Int16(POLLIN), revents: 0),
            pollfd(fd: stderrOpen ? err : -1, events: Int16(POLLIN), revents: 0),
        ]
        let left = ContinuousClock.now.duration(to: deadline)
        let milliseconds = max(1, min(1000, left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000))
        guard poll(&fds, 2, Int32(milliseconds)) > 0 else { return }
        var chunk = [UInt8](repeating: 0, count: 65536)
        if stdoutOpen && fds[0].revents != 0 {
            let count = read(out, &chunk, chunk.count)
            if count > 0 { output += chunk[0..<count] } else if count == 0 || errno != EINTR { stdoutOpen = false }
        }
        if stderrOpen && fds[1].revents != 0 {
            let count = read(err, &chunk, chunk.count)
            if count > 0 { errors += chunk[0..<count] } else if count == 0 || errno != EINTR { stderrOpen = false }
        }
    }

    private func failure(_ what: String) -> ExampleBinaryError {
        ExampleBinaryError("\(name) \(process.arguments ?? []) \(what); output:\n\(String(decoding: output, as: UTF8.self))\nerrors:\n\(String(decoding: errors, as: UTF8.self))")
    }

    deinit {
        if process.isRunning {
            kill(pid, SIGKILL)
            // Not `waitUntilExit()`: Foundation may learn of the end late (`PeerProcess.childEnd`).
            let deadline = ContinuousClock.now + .seconds(10)
            while process.isRunning && PeerProcess.childEnd(pid) == nil && ContinuousClock.now < deadline { usleep(1000) }
        }
    }
}
