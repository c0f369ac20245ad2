// Starting a child process with posix_spawn (never fork after threads exist), handing it
// descriptors at fixed numbers, and waiting for its end through a pidfd with a deadline.

import CPortKit
import Glibc

/// A child process started by PortKit. Safe from any thread: it is reaped through its pidfd
/// under a lock, once, and signalled through its pidfd, never by a pid another process may
/// have taken since.
final class ChildProcess: Sendable {
    let pid: Int32
    private let pidFD: Int32
    /// How it ended, once reaped.
    private let status = PKMutex<(code: Int32, signal: Int32)?>(nil)

    /// Starts `path` with `arguments`; each `inherit` pair puts a descriptor of ours at a fixed
    /// number in the child. `environment` entries are added to this process's environment.
    /// The corresponding calls are `posix_spawn(3)` and `pidfd_open(2)`.
    init(path: String, arguments: [String], environment: [String: String], inherit: [(Int32, Int32)]) throws(PKError) {
        // This process's entries as they are (bytes, not strings: an entry that is not UTF-8
        // passes unchanged), less those `environment` replaces.
        var env = Self.currentEnvironment().filter { entry in
            !environment.keys.contains { key in entry.starts(with: Array((key + "=").utf8)) }
        }
        env += environment.map { Array("\($0.key)=\($0.value)".utf8) }
        let argv = ([path] + arguments).map { Array($0.utf8) }
        var pid: pid_t = 0
        let rc = withCStrings(argv) { cArgv in
            withCStrings(env) { cEnv in
                inherit.map(\.0).withUnsafeBufferPointer { from in
                    inherit.map(\.1).withUnsafeBufferPointer { to in
                        pk_spawn(&pid, path, cArgv, cEnv, from.baseAddress, to.baseAddress, Int32(inherit.count))
                    }
                }
            }
        }
        if rc != 0 { throw PKError(.system, "cannot start \(path)", call: "posix_spawn", errno: rc) }
        self.pid = pid
        let fd = pk_pidfd_open(pid)
        if fd < 0 {
            let err = errno
            // ESRCH: the child has ended and someone else reaped it already (`SIGCHLD` ignored,
            // a `waitpid(-1)` of the program's): its pid may be another process's by now, so
            // nothing is sent to it. Otherwise (out of descriptors) it is not reaped yet, and
            // the pid is still the child's.
            if err != ESRCH {
                Glibc.kill(pid, SIGKILL)
                var raw: Int32 = 0
                while waitpid(pid, &raw, 0) < 0 && errno == EINTR {}
            }
            throw PKError(.system, "cannot watch child \(pid)", call: "pidfd_open", errno: err)
        }
        pidFD = fd
    }

    deinit {
        if status.withLock({ $0 == nil }) {
            // Never leave a zombie or an orphan behind.
            kill(SIGKILL)
            _ = waitUntilExit(until: .after(.seconds(5)))
        }
        Descriptor.close(pidFD)
    }

    /// Sends `signal`, unless the child has been reaped. The corresponding system call is
    /// `pidfd_send_signal(2)`.
    func kill(_ signal: Int32) {
        if status.withLock({ $0 == nil }) { _ = pk_pidfd_send_signal(pidFD, signal) }
    }

    /// Waits until the child ends or `deadline` passes; returns its exit code and terminating
    /// signal (0 when it exited; code -1 when a signal killed it), or nil if it still runs.
    /// Any number of threads may wait at once: each gets the same status. (-1, 0) if it was
    /// reaped by someone else (a `SIGCHLD` ignored, a `waitpid(-1)` of the program's): its
    /// status is unknown.
    func waitUntilExit(until deadline: PKDeadline) -> (code: Int32, signal: Int32)? {
        while true {
            let ended = status.withLock { status -> (code: Int32, signal: Int32)? in
                if let status { return status }
                var code: Int32 = 0, signal: Int32 = 0
                switch pk_pidfd_reap(pidFD, &code, &signal) {
                case 1: status = (code, signal)
                case 0: break
                default: if errno != EINTR { status = (-1, 0) }
                }
                return status
            }
            if let ended { return ended }
            let timeout = deadline.pollTimeoutMilliseconds(now: monotonicNanoseconds())
            if timeout == 0 { return nil }
            _ = try? Descriptor.poll(pidFD, events: Int16(POLLIN), timeoutMilliseconds: timeout)
        }
    }

    /// This process's environment entries, as bytes.
    private static func currentEnvironment() -> [[UInt8]] {
        var result: [[UInt8]] = []
        var pointer = environ
        while let entry = pointer.pointee {
            result.append(Array(UnsafeRawBufferPointer(start: entry, count: strlen(entry))))
            pointer += 1
        }
        return result
    }
}

/// SIGKILL, for code outside `System/`.
let SIGKILL_VALUE: Int32 = SIGKILL

extension Descriptor {
    /// Takes over a descriptor this process inherited at a fixed number, making it
    /// close-on-exec and non-blocking. The corresponding system call is `fcntl(2)`.
    static func adoptInherited(_ fd: Int32) throws(PKError) -> Int32 {
        let flags = try SystemCall.run("fcntl(F_GETFD)") { fcntl(fd, F_GETFD) }
        _ = try SystemCall.run("fcntl(F_SETFD)") { fcntl(fd, F_SETFD, flags | FD_CLOEXEC) }
        let status = try SystemCall.run("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
        _ = try SystemCall.run("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, status | O_NONBLOCK) }
        return fd
    }
}

/// The path of this process's executable (`/proc/self/exe`). The corresponding call is `readlink(2)`.
func currentExecutablePath() -> String? {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    guard n > 0 else { return nil }
    return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// Runs `body` with a NULL-terminated C array of `strings` (their bytes, each then a NUL).
private func withCStrings<R>(_ strings: [[UInt8]], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { bytes in
        let copy = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
        bytes.withUnsafeBytes { if let from = $0.baseAddress { UnsafeMutableRawPointer(copy).copyMemory(from: from, byteCount: bytes.count) } }
        copy[bytes.count] = 0
        return copy
    }
    pointers.append(nil)
    defer { for pointer in pointers { pointer?.deallocate() } }
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}
