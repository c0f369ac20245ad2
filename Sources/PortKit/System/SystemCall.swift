// The one way PortKit runs a system call: EINTR is retried, EAGAIN becomes "would block" on
// non-blocking descriptors, EBADF and EFAULT trap (they are bugs, not the environment), and
// every other failure throws a `PKError` naming the call and errno.
//
// Nothing outside `System/` imports Glibc's I/O calls or the CPortKit shim.

import CPortKit
import Glibc

/// The outcome of a call on a non-blocking descriptor.
enum IOResult<Value> {
    case done(Value)
    case wouldBlock
}

enum SystemCall {
    /// Runs `body` until it stops failing with `EINTR`; returns its non-negative result.
    ///
    /// - Throws: `PKError` with `.system` and the errno for any failure other than `EINTR`.
    @inline(__always)
    static func run<T: FixedWidthInteger>(
        _ name: StaticString, _ body: () -> T
    ) throws(PKError) -> T {
        while true {
            let result = body()
            if result >= 0 { return result }
            let err = errno
            if err == EINTR { continue }
            throw failure(name, err)
        }
    }

    /// Like `run`, for non-blocking descriptors: `EAGAIN`/`EWOULDBLOCK` is `.wouldBlock`.
    @inline(__always)
    static func nonBlocking<T: FixedWidthInteger>(
        _ name: StaticString, _ body: () -> T
    ) throws(PKError) -> IOResult<T> {
        while true {
            let result = body()
            if result >= 0 { return .done(result) }
            let err = errno
            if err == EINTR { continue }
            if err == EAGAIN || err == EWOULDBLOCK { return .wouldBlock }
            throw failure(name, err)
        }
    }

    /// The error `name` failing with `err` throws, recording `file` and `line` (by default
    /// where `failure` is called: in `run` and `nonBlocking`, this file); `EBADF` and `EFAULT`
    /// trap instead. Out of line, as is every failure path of the calls on a message's way:
    /// inlined, its code would sit among theirs and spread them over more lines of the
    /// instruction cache.
    @inline(never)
    static func failure(_ name: StaticString, _ err: Int32, file: String = #fileID, line: Int = #line) -> PKError {
        if err == EBADF || err == EFAULT {
            let what = err == EBADF ? "EBADF: a descriptor was used after it was closed" : "EFAULT"
            preconditionFailure("PortKit bug: \(name) failed with \(what)")
        }
        return PKError.system(name, errno: err, file: file, line: line)
    }
}
