// Runs the PortKitTestPeer helper executable (built next to the test bundle) and reads its
// output lines with deadlines.

import Foundation
@testable import PortKit

struct PeerError: Error, CustomStringConvertible {
    let description: String
}

final class PeerProcess: @unchecked Sendable {
    let process = Process()
    private let stdinPipe = Pipe()
    private let stdoutPipe = Pipe()
    private var buffered: [UInt8] = []

    /// The helper executable: next to the running test binary.
    static var executablePath: String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // The xctest bundle on Linux is a plain file in the build directory.
        if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
        return directory.appendingPathComponent("PortKitTestPeer").path
    }

    init(_ arguments: [String], environment: [String: String] = [:]) throws {
        process.executableURL = URL(fileURLWithPath: Self.executablePath)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        for (key, value) in environment { env[key] = value }
        process.environment = env
        process.standardInput = stdinPipe
        process.standardOutput = stdoutPipe
        try process.run()
    }

    var pid: Int32 { process.processIdentifier }

    /// The next line the peer printed, waiting up to `timeout`.
    func readLine(timeout: Duration = .seconds(20)) throws -> String {
        let fd = stdoutPipe.fileHandleForReading.fileDescriptor
        let deadline = PKDeadline.after(timeout)
        while true {
            if let newline = buffered.firstIndex(of: 10) {
                let line = String(decoding: buffered[..<newline], as: UTF8.self)
                buffered.removeSubrange(...newline)
                return line
            }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ms = Int32(clamping: max(0, (deadline - .now).components.seconds * 1000 + (deadline - .now).components.attoseconds / 1_000_000_000_000_000))
            if deadline.hasPassed { throw PeerError(description: "peer \(process.arguments ?? []) printed no line in time") }
            guard poll(&pfd, 1, max(ms, 1)) > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { throw PeerError(description: "peer \(process.arguments ?? []) closed its output (exit \(process.isRunning ? "-" : "\(process.terminationStatus)"))") }
            buffered += chunk[0..<n]
        }
    }

    /// Expects the next line to be `expected`.
    func expectLine(_ expected: String, timeout: Duration = .seconds(20)) throws {
        let line = try readLine(timeout: timeout)
        if line != expected { throw PeerError(description: "peer printed \"\(line)\", expected \"\(expected)\"") }
    }

    /// Writes `line` and a newline to the peer's standard input. A peer that closed its input
    /// (it died) is an error, not a SIGPIPE: the pipe is checked first.
    func writeLine(_ line: String) throws {
        let fd = stdinPipe.fileHandleForWriting.fileDescriptor
        var pfd = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        guard poll(&pfd, 1, 0) >= 0, pfd.revents & Int16(POLLERR | POLLHUP) == 0 else {
            throw PeerError(description: "peer \(process.arguments ?? []) closed its input")
        }
        let bytes = Array((line + "\n").utf8)
        guard bytes.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == bytes.count else {
            throw PeerError(description: "writing to peer \(process.arguments ?? []) failed: errno \(errno)")
        }
    }

    /// Closes the peer's standard input.
    func closeInput() { try? stdinPipe.fileHandleForWriting.close() }

    /// Tells a peer that reads its standard input to the end to finish: the line "end", then
    /// the end of input. The line matters: a program started meanwhile by another test (an exit
    /// test's child, say) may have inherited the pipe's writing end, and then closing ours is
    /// no end of input until that program exits.
    func endInput() {
        try? writeLine("end")
        closeInput()
    }

    /// Waits for the peer to exit; returns its status.
    @discardableResult
    func waitForExit(timeout: Duration = .seconds(20)) throws -> Int32 {
        // A peer built with a sanitizer takes long to end (LeakSanitizer scans it at exit).
        var exited: Int32?
        do {
            try waitUntil("peer \(process.arguments ?? []) to exit", timeout: patience(timeout)) {
                if !process.isRunning { return true }
                exited = Self.childEnd(pid)?.status
                return exited != nil
            }
        } catch {
            // Say what the kernel sees: still running (and in which call), or a zombie no one reaped.
            let state = processState(pid).map(String.init) ?? "gone"
            let channel = (try? String(contentsOfFile: "/proc/\(pid)/wchan", encoding: .utf8)) ?? "?"
            throw PeerError(description: "peer \(process.arguments ?? []) (pid \(pid)) did not exit within \(patience(timeout)): state \(state), waiting in \(channel)")
        }
        return process.isRunning ? exited ?? -1 : process.terminationStatus
    }

    /// How child `pid` ended, if it has, without reaping it (`waitid` with `WNOWAIT`): its exit
    /// status, or the signal that killed it (`status` then holds the signal's number, as
    /// `Process.terminationStatus` does). Foundation's `Process` reaps the child, but learns of
    /// the end from `SIGCHLD`, and with swift-testing's exit tests waiting for their own children
    /// in the same process a peer was seen a zombie for good while `isRunning` stayed true.
    static func childEnd(_ pid: pid_t) -> (status: Int32, signalled: Bool)? {
        var info = siginfo_t()
        guard waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT | WNOHANG) == 0,
              info._sifields._sigchld.si_pid == pid else { return nil }
        return (info._sifields._sigchld.si_status, info.si_code != Int32(CLD_EXITED))
    }

    func kill(_ signal: Int32 = SIGKILL) { Glibc.kill(pid, signal) }

    deinit {
        if process.isRunning {
            Glibc.kill(pid, SIGKILL)
            // Not `waitUntilExit()`: it waits for Foundation to learn of the end (see above).
            try? waitUntil("peer \(pid) to die", timeout: .seconds(10)) { !process.isRunning || Self.childEnd(pid) != nil }
        }
        // Foundation's Process outlives this object (and holds the pipes), so close our ends
        // here, or every peer would leave two descriptors behind.
        try? stdinPipe.fileHandleForWriting.close()
        try? stdoutPipe.fileHandleForReading.close()
    }
}
