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

    /// Waits for the peer to exit; returns its status.
    @discardableResult
    func waitForExit(timeout: Duration = .seconds(20)) throws -> Int32 {
        try waitUntil("peer \(process.arguments ?? []) to exit", timeout: timeout) { !process.isRunning }
        return process.terminationStatus
    }

    func kill(_ signal: Int32 = SIGKILL) { Glibc.kill(pid, signal) }

    deinit {
        if process.isRunning {
            Glibc.kill(pid, SIGKILL)
            process.waitUntilExit()
        }
    }
}
#endif
