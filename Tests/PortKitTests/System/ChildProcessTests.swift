// Child processes: waited for by several threads at once, handed descriptors whose numbers
// collide, and given the environment's bytes as they are.

import CPortKit
import Foundation
import Glibc
import Testing
@testable import PortKit

@Suite struct ChildProcessTests {
    /// Reads `fd` to its end, or what came within 20 s.
    private static func readAll(_ fd: Int32) -> [UInt8] {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 256)
        let deadline = PKDeadline.after(.seconds(20))
        while !deadline.hasPassed {
            var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&entry, 1, 100) >= 0 || errno == EINTR else { return bytes }
            guard entry.revents != 0 else { continue }
            let count = read(fd, &buffer, buffer.count)
            if count <= 0 { return bytes }
            bytes += buffer[0..<count]
        }
        return bytes
    }

    /// A pipe, both ends close-on-exec from the start (a child another test spawns meanwhile
    /// inherits neither, and cannot keep a write end open).
    private static func pipeEnds() throws -> (read: Int32, write: Int32) {
        var ends: [Int32] = [0, 0]
        try #require(pk_pipe_cloexec(&ends) == 0)
        return (ends[0], ends[1])
    }

    /// Threads that wait for one child at once each get its exit status (one of them reaps
    /// it; the others read what it found, never a failed wait's (-1, 0)).
    @Test func everyWaiterGetsTheExitStatus() throws {
        for _ in 0..<5 {
            let child = try ChildProcess(path: "/bin/sh", arguments: ["-c", "sleep 0.05; exit 3"], environment: [:], inherit: [])
            let statuses = Locked<[String]>([])
            let waiters = (0..<4).map { index in
                TestThread(name: "waiter-\(index)") {
                    let status = child.waitUntilExit(until: .after(.seconds(20)))
                    statuses.withLock { $0.append(status.map { "\($0.code) \($0.signal)" } ?? "running") }
                }
            }
            for waiter in waiters { try waiter.joinPatiently() }
            #expect(statuses.value == Array(repeating: "3 0", count: 4))
        }
    }

    /// A descriptor handed to the child at a number that is itself a source of another one:
    /// each arrives as given (placing the first used to overwrite the second's source).
    @Test func descriptorsWhoseNumbersCollideArriveAsGiven() throws {
        // Each descriptor closed once, whatever fails: other tests run meanwhile, and a number
        // closed twice may be theirs by then.
        var open: [Int32] = []
        defer { for fd in open { close(fd) } }
        func closeOnce(_ fd: Int32) {
            guard let index = open.firstIndex(of: fd) else { return }
            open.remove(at: index)
            close(fd)
        }
        let first = try Self.pipeEnds()
        open += [first.read, first.write]
        let second = try Self.pipeEnds()
        open += [second.read, second.write]
        let output = try Self.pipeEnds()
        open += [output.read, output.write]
        // The second pipe's read end at a number of its own, which the first goes to.
        let collide = fcntl(second.read, F_DUPFD_CLOEXEC, 900)
        try #require(collide >= 0)
        open.append(collide)
        let child = try ChildProcess(
            path: "/bin/sh", arguments: ["-c", "cat /proc/self/fd/\(collide); cat /proc/self/fd/\(collide + 1)"], environment: [:],
            inherit: [(first.read, collide), (collide, collide + 1), (output.write, 1)])
        _ = write(first.write, "one ", 4)
        _ = write(second.write, "two", 3)
        closeOnce(first.write)
        closeOnce(second.write)
        closeOnce(output.write)
        let status = child.waitUntilExit(until: .after(.seconds(20)))
        #expect(String(decoding: Self.readAll(output.read), as: UTF8.self) == "one two")
        #expect(status?.code == 0)
    }

    /// A child starts as from a shell, with no signal blocked and none ignored, whatever the
    /// thread that starts it blocks (a thread of Swift concurrency's pool blocks nearly every
    /// signal: a worker started from a task could be stopped by SIGKILL alone) and whatever
    /// this process ignores.
    @Test func aChildStartsWithNoSignalBlockedOrIgnored() throws {
        let output = try Self.pipeEnds()
        defer { close(output.read) }
        var ignoring = sigaction()
        ignoring.__sigaction_handler.sa_handler = SIG_IGN
        var previous = sigaction()
        try #require(sigaction(SIGXFSZ, &ignoring, &previous) == 0)
        let spawned = Locked<Result<ChildProcess, PKError>?>(nil)
        let starter = TestThread(name: "blocking-starter") {
            var blocked = sigset_t()
            sigemptyset(&blocked)
            sigaddset(&blocked, SIGTERM)
            pthread_sigmask(SIG_BLOCK, &blocked, nil)
            spawned.value = Result { () throws(PKError) in
                try ChildProcess(path: "/bin/cat", arguments: ["/proc/self/status"], environment: [:], inherit: [(output.write, 1)])
            }
        }
        try starter.joinPatiently()
        sigaction(SIGXFSZ, &previous, nil)
        close(output.write)
        let child = try #require(spawned.value).get()
        let status = String(decoding: Self.readAll(output.read), as: UTF8.self)
        _ = child.waitUntilExit(until: .after(.seconds(20)))
        func mask(_ name: String) -> UInt64? {
            status.split(separator: "\n").first { $0.hasPrefix(name + ":") }
                .flatMap { UInt64($0.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces), radix: 16) }
        }
        // Signal n is bit n - 1. Signals 32 and 33 are glibc's own (thread cancellation and
        // set*id), which no program sees; the kernel shows them ignored after the exec.
        let glibcOwn: UInt64 = 1 << 31 | 1 << 32
        #expect(mask("SigBlk") == 0, "\(status)")
        #expect(mask("SigIgn").map { $0 & ~glibcOwn } == 0, "\(status)")
    }

    /// A worker run with `PORTKIT_WORKER` set and no check-in connection on descriptor 3 (a
    /// pipe there) fails its check-in with a message and an exit status, not a trap: the
    /// descriptor is looked at before it is adopted.
    @Test func aWorkerWithoutItsCheckInSocketFailsItsCheckIn() throws {
        let stand = try Self.pipeEnds()
        let errors = try Self.pipeEnds()
        defer { close(stand.read); close(stand.write); close(errors.read) }
        let child = try ChildProcess(
            path: PeerProcess.executablePath, arguments: ["worker"], environment: ["PORTKIT_WORKER": "w:0"],
            inherit: [(stand.read, 3), (errors.write, 2)])
        close(errors.write)
        let message = String(decoding: Self.readAll(errors.read), as: UTF8.self)
        let status = child.waitUntilExit(until: .after(.seconds(20)))
        #expect(status?.signal == 0)
        #expect(status?.code == 2)
        #expect(message.contains("descriptor 3, the check-in connection, is not an inherited Unix stream socket"), "\(message)")
    }

    /// An environment entry that is not UTF-8 reaches the child byte for byte. In a child
    /// process of its own: `setenv` may move `environ` under another thread reading it.
    @Test func environmentBytesPassUnchanged() async {
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                let name = "PK_TEST_BYTES"
                let value: [CChar] = [0x63, 0x61, 0x66, CChar(bitPattern: 0xE9), 0]
                guard setenv(name, value, 1) == 0, let output = try? Self.pipeEnds() else {
                    endExitTest("no environment entry or pipe", failures: ["errno \(errno)"])
                }
                guard let child = try? ChildProcess(
                    path: "/bin/sh", arguments: ["-c", "printf %s \"$\(name)\""], environment: ["PK_TEST_OTHER": "x"],
                    inherit: [(output.write, 1)])
                else { endExitTest("no child", failures: ["spawn failed"]) }
                close(output.write)
                _ = child.waitUntilExit(until: .after(.seconds(20)))
                let got = Self.readAll(output.read)
                endExitTest("environment", failures: got == [0x63, 0x61, 0x66, 0xE9] ? [] : ["the child got \(got)"])
            }
        }
    }
}
