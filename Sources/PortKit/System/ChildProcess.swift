// Starting a child process with posix_spawn (never fork after threads exist), handing it
// descriptors at fixed numbers, and waiting for its end through a pidfd with a deadline.

import CPortKit
import Glibc

/// A child process started by PortKit.
final class ChildProcess: @unchecked Sendable {
    let pid: Int32
    private let pidFD: Int32
    private var status: (code: Int32, signal: Int32)?

    /// Starts `path` with `arguments`; each `inherit` pair puts a descriptor of ours at a fixed
    /// number in the child. `environment` entries are added to this process's environment.
    /// The corresponding calls are `posix_spawn(3)` and `pidfd_open(2)`.
    init(path: String, arguments: [String], environment: [String: String], inherit: [(Int32, Int32)]) throws(PKError) {
        var env = Self.currentEnvironment().filter { entry in
            !environment.keys.contains { entry.hasPrefix($0 + "=") }
        }
        env += environment.map { "\($0.key)=\($0.value)" }
        let argv = [path] + arguments
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
            Glibc.kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            throw PKError(.system, "cannot watch child \(pid)", call: "pidfd_open", errno: err)
        }
        pidFD = fd
    }

    deinit {
        if status == nil {
            // Never leave a zombie or an orphan behind.
            Glibc.kill(pid, SIGKILL)
            _ = waitUntilExit(until: .after(.seconds(5)))
        }
        Descriptor.close(pidFD)
    }

    /// Sends `signal`. The corresponding system call is `kill(2)`.
    func kill(_ signal: Int32) {
        if status == nil { Glibc.kill(pid, signal) }
    }

    /// Waits until the child ends or `deadline` passes; returns its exit code and terminating
    /// signal (0 when it exited), or nil if it still runs.
    func waitUntilExit(until deadline: PKDeadline) -> (code: Int32, signal: Int32)? {
        while status == nil {
            var raw: Int32 = 0
            let rc = pk_waitpid_nohang(pid, &raw)
            if rc == pid {
                var code: Int32 = 0, signal: Int32 = 0
                if pk_exit_status(raw, &code, &signal) == 1 { status = (code, signal) }
                break
            }
            if rc < 0 && errno != EINTR { status = (-1, 0); break }
            let timeout = deadline.pollTimeoutMilliseconds(now: monotonicNanoseconds())
            if timeout == 0 { return nil }
            _ = try? Descriptor.poll(pidFD, events: Int16(POLLIN), timeoutMilliseconds: timeout)
        }
        return status
    }

    private static func currentEnvironment() -> [String] {
        var result: [String] = []
        var pointer = environ
        while let entry = pointer.pointee {
            result.append(String(cString: entry))
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

/// Runs `body` with a NULL-terminated C array of `strings`.
private func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for pointer in pointers { free(pointer) } }
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}
