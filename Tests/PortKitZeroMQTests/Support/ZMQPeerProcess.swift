#if ZeroMQ
// Runs a helper executable built next to the test bundle (PortKitZMQPeer, or the plain-libzmq
// PortKitZMQCPeer) and reads its output lines with deadlines.

import Foundation
import PortKit

struct PeerError: Error, CustomStringConvertible {
    let description: String
}

final class ZMQPeerProcess: @unchecked Sendable {
    let process = Process()
    private let stdinPipe = Pipe()
    private let stdoutPipe = Pipe()
    private var buffered: [UInt8] = []

    /// A helper executable: next to the running test binary.
    static func path(of executable: String) -> String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // The xctest bundle on Linux is a plain file in the build directory.
        if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
        return directory.appendingPathComponent(executable).path
    }

    /// Starts `executable` (PortKitZMQPeer by default) with `arguments`.
    init(_ arguments: [String], executable: String = "PortKitZMQPeer", environment: [String: String] = [:]) throws {
        process.executableURL = URL(fileURLWithPath: Self.path(of: executable))
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
            if deadline.hasPassed { throw PeerError(description: "peer \(process.arguments ?? []) printed no line in time") }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 50) > 0 else { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { throw PeerError(description: "peer \(process.arguments ?? []) closed its output (exit \(process.isRunning ? "-" : "\(process.terminationStatus)"))") }
            buffered += chunk[0..<n]
        }
    }

    /// The next line, which must start with `prefix`; returns the rest after one space.
    func expectLine(startingWith prefix: String, timeout: Duration = .seconds(20)) throws -> String {
        let line = try readLine(timeout: timeout)
        guard line == prefix || line.hasPrefix(prefix + " ") else {
            throw PeerError(description: "peer printed \"\(line)\", expected \"\(prefix) ...\"")
        }
        return String(line.dropFirst(prefix.count).drop { $0 == " " })
    }

    /// Closes the peer's standard input.
    func closeInput() { try? stdinPipe.fileHandleForWriting.close() }

    /// Tells a peer that reads its standard input to the end to finish: a newline, then the end
    /// of input (another test's child may hold the pipe's writing end too, so closing ours is no
    /// end of input until it exits).
    func endInput() {
        let fd = stdinPipe.fileHandleForWriting.fileDescriptor
        var pfd = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        if poll(&pfd, 1, 0) > 0, pfd.revents & Int16(POLLERR | POLLHUP) == 0 {
            var newline: UInt8 = 10
            _ = write(fd, &newline, 1)
        }
        closeInput()
    }

    /// Waits for the peer to exit; returns its status.
    @discardableResult
    func waitForExit(timeout: Duration = .seconds(20)) throws -> Int32 {
        var end: (status: Int32, signalled: Bool)?
        try waitUntil("peer \(process.arguments ?? []) to exit", timeout: timeout) {
            if !process.isRunning { return true }
            end = Self.childEnd(pid)
            return end != nil
        }
        guard process.isRunning, let end else { return process.terminationStatus }
        return end.status  // the exit status, or the signal's number, as Foundation gives it
    }

    /// How child `pid` ended, if it has, without reaping it (`waitid` with `WNOWAIT`):
    /// Foundation's `Process` reaps it but learns of the end from `SIGCHLD`, and with
    /// swift-testing's exit tests waiting for their own children in the same process a peer
    /// was seen a zombie for good while `isRunning` stayed true.
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
            // Not `waitUntilExit()`: it waits for Foundation to learn of the end (see `childEnd`).
            try? waitUntil("peer \(pid) to die", timeout: .seconds(10)) { !process.isRunning || Self.childEnd(pid) != nil }
        }
    }
}
#endif
