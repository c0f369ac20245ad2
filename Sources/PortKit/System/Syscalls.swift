// Thin wrappers over the system calls PortKit makes, grouped by facility and keeping the C
// names. Each one goes through `SystemCall`; none of them is public.

import CPortKit
import Glibc

extension SystemCall {
    /// The text of an errno value, for error messages.
    static func describe(errno: Int32) -> String {
        guard let text = strerror(errno) else { return "errno \(errno)" }
        return "\(String(cString: text)) (errno \(errno))"
    }
}

/// Descriptor-generic calls.
enum Descriptor {
    /// Closes a descriptor. `EINTR` is not retried: on Linux the descriptor is gone either way.
    /// The corresponding system call is `close(2)`.
    static func close(_ fd: Int32) {
        let rc = Glibc.close(fd)
        if rc < 0 && errno == EBADF { preconditionFailure("PortKit bug: close(\(fd)) got EBADF") }
    }

    /// A close-on-exec duplicate of `fd`. The corresponding system call is `fcntl(2)` with
    /// `F_DUPFD_CLOEXEC`.
    static func duplicate(_ fd: Int32) throws(PKError) -> Int32 {
        try SystemCall.run("fcntl(F_DUPFD_CLOEXEC)") { fcntl(fd, F_DUPFD_CLOEXEC, 0) }
    }

    /// Reads into `buffer`. The corresponding system call is `read(2)`.
    static func read(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws(PKError) -> IOResult<Int> {
        try SystemCall.nonBlocking("read") { Glibc.read(fd, buffer.baseAddress, buffer.count) }
    }

    /// Writes `buffer`. The corresponding system call is `write(2)`.
    static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(PKError) -> IOResult<Int> {
        try SystemCall.nonBlocking("write") { Glibc.write(fd, buffer.baseAddress, buffer.count) }
    }

    /// `POLLIN`, for `poll`.
    static let readable = Int16(POLLIN)

    /// Waits for one descriptor. The corresponding system call is `poll(2)`.
    /// Returns the reported events, or 0 on timeout.
    ///
    /// An interrupted wait resumes with what is left of the timeout, not all of it: under a
    /// storm of signals (`EINTR` every few hundred microseconds) a wait must still time out.
    static func poll(_ fd: Int32, events: Int16, timeoutMilliseconds: Int32) throws(PKError) -> Int16 {
        var entry = pollfd(fd: fd, events: events, revents: 0)
        let start = monotonicNanoseconds()
        var remaining = timeoutMilliseconds
        while true {
            let n = Glibc.poll(&entry, 1, remaining)
            if n >= 0 { return n == 0 ? 0 : entry.revents }
            let err = errno
            guard err == EINTR else {
                throw SystemCall.failure("poll", err)
            }
            if timeoutMilliseconds > 0 {
                let elapsed = Int64((monotonicNanoseconds() - start) / 1_000_000)
                remaining = Int32(max(0, Int64(timeoutMilliseconds) - elapsed))
            }
        }
    }
}

/// epoll(7).
enum Epoll {
    static let readable = PK_EPOLLIN
    static let writable = PK_EPOLLOUT
    static let error = PK_EPOLLERR
    static let hangUp = PK_EPOLLHUP
    static let readHangUp = PK_EPOLLRDHUP
    static let edgeTriggered = PK_EPOLLET

    /// The corresponding system call is `epoll_create1(2)` with `EPOLL_CLOEXEC`.
    static func create() throws(PKError) -> Int32 {
        try SystemCall.run("epoll_create1") { pk_epoll_create1(PK_EPOLL_CLOEXEC) }
    }

    /// The corresponding system call is `epoll_ctl(2)` with `EPOLL_CTL_ADD`.
    static func add(_ epfd: Int32, _ fd: Int32, events: UInt32, token: UInt64) throws(PKError) {
        _ = try SystemCall.run("epoll_ctl(ADD)") { pk_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, events, token) }
    }

    /// The corresponding system call is `epoll_ctl(2)` with `EPOLL_CTL_MOD`.
    static func modify(_ epfd: Int32, _ fd: Int32, events: UInt32, token: UInt64) throws(PKError) {
        _ = try SystemCall.run("epoll_ctl(MOD)") { pk_epoll_ctl(epfd, EPOLL_CTL_MOD, fd, events, token) }
    }

    /// The corresponding system call is `epoll_ctl(2)` with `EPOLL_CTL_DEL`.
    static func remove(_ epfd: Int32, _ fd: Int32) {
        _ = pk_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits for events; `timeoutMilliseconds` -1 waits for ever, 0 polls.
    /// An interrupted wait returns 0 events. The corresponding system call is `epoll_wait(2)`.
    static func wait(
        _ epfd: Int32, events: UnsafeMutablePointer<UInt32>, tokens: UnsafeMutablePointer<UInt64>,
        capacity: Int32, timeoutMilliseconds: Int32
    ) throws(PKError) -> Int {
        let n = pk_epoll_wait(epfd, events, tokens, capacity, timeoutMilliseconds)
        if n >= 0 { return Int(n) }
        let err = errno
        if err == EINTR { return 0 }
        throw SystemCall.failure("epoll_wait", err)
    }
}

/// eventfd(2): the run loop's wake-up.
enum EventFD {
    /// The corresponding system call is `eventfd(2)`, non-blocking and close-on-exec.
    static func create() throws(PKError) -> Int32 {
        try SystemCall.run("eventfd") { pk_eventfd(0, PK_EFD_CLOEXEC | PK_EFD_NONBLOCK) }
    }

    /// A blocking-free eventfd in semaphore mode (each read takes one).
    static func createSemaphore() throws(PKError) -> Int32 {
        try SystemCall.run("eventfd") { pk_eventfd(0, PK_EFD_CLOEXEC | PK_EFD_NONBLOCK | PK_EFD_SEMAPHORE) }
    }

    /// Takes one from a semaphore eventfd; false if it is zero.
    static func tryConsume(_ fd: Int32) -> Bool {
        var value: UInt64 = 0
        let result = try? SystemCall.nonBlocking("read(eventfd)") { Glibc.read(fd, &value, 8) }
        if case .done = result { return true }
        return false
    }

    /// Adds one to the counter. The corresponding system call is `write(2)`.
    static func signal(_ fd: Int32) {
        var one: UInt64 = 1
        // EAGAIN means the counter is saturated (2^64 - 2): the reader has a wake-up pending
        // anyway. (A run loop's eventfd is never read, but 2^64 wake-ups take millennia.)
        _ = try? SystemCall.nonBlocking("write(eventfd)") { pk_sys_write(fd, &one, 8) }
    }

    /// Resets the counter. The corresponding system call is `read(2)`.
    static func drain(_ fd: Int32) {
        var value: UInt64 = 0
        _ = try? SystemCall.nonBlocking("read(eventfd)") { Glibc.read(fd, &value, 8) }
    }
}

/// timerfd_create(2) on CLOCK_MONOTONIC: the run loop's timers, and its runs' deadlines.
enum TimerFD {
    /// The corresponding system call is `timerfd_create(2)`, non-blocking and close-on-exec.
    static func create() throws(PKError) -> Int32 {
        try SystemCall.run("timerfd_create") { pk_timerfd_create(PK_TFD_CLOEXEC | PK_TFD_NONBLOCK) }
    }

    /// Arms the timer at an absolute CLOCK_MONOTONIC time; `nil` disarms it.
    /// The corresponding system call is `timerfd_settime(2)`.
    static func set(_ fd: Int32, deadline: UInt64?) {
        // A deadline of 0 would disarm: the earliest armed time is 1 ns.
        _ = try? SystemCall.run("timerfd_settime") { pk_timerfd_set_abs(fd, deadline.map { max($0, 1) } ?? 0) }
    }

    /// Consumes the expiration count. The corresponding system call is `read(2)`.
    static func drain(_ fd: Int32) {
        var value: UInt64 = 0
        _ = try? SystemCall.nonBlocking("read(timerfd)") { Glibc.read(fd, &value, 8) }
    }
}

/// The calling thread and the clock.
enum ThreadIdentity {
    /// The kernel thread id of the calling thread (cached). The corresponding system call is `gettid(2)`.
    @inline(__always)
    static var current: Int32 { pk_gettid() }

    /// The process id; the main thread's thread id equals it. The corresponding call is `getpid(2)`.
    static var processID: Int32 { getpid() }
}

/// CLOCK_MONOTONIC in nanoseconds. The corresponding call is `clock_gettime(2)`.
@inline(__always)
func monotonicNanoseconds() -> UInt64 { pk_monotonic_ns() }
