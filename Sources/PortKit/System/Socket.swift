// Unix-domain socket calls: socketpair, send, sendmsg/recvmsg with SCM_RIGHTS, shutdown and peer
// credentials. Every socket is close-on-exec and non-blocking; every send uses MSG_NOSIGNAL.

import CPortKit
import Glibc

enum Socket {
    /// A connected pair of stream sockets, both close-on-exec and non-blocking.
    /// The corresponding system call is `socketpair(2)`.
    static func pair() throws(PKError) -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        _ = try SystemCall.run("socketpair") {
            socketpair(AF_UNIX, PK_SOCK_STREAM | PK_SOCK_CLOEXEC | PK_SOCK_NONBLOCK, 0, &fds)
        }
        return (fds[0], fds[1])
    }

    /// The inode of the socket connected to the Unix socket of inode `inode`, or nil if it has
    /// none or the kernel will not say. The corresponding call is a `NETLINK_SOCK_DIAG` query
    /// (`sock_diag(7)`, `UDIAG_SHOW_PEER`).
    static func peerInode(ofSocketInode inode: UInt64) -> UInt64? {
        var peer: UInt64 = 0
        return pk_unix_peer_inode(inode, &peer) == 1 ? peer : nil
    }

    /// Whether `fd` is a connected Unix-domain stream socket. The corresponding calls are
    /// `getsockopt(2)` `SO_DOMAIN` and `SO_TYPE`, and `getpeername(2)`.
    static func isUnixStream(_ fd: Int32) -> Bool { pk_is_unix_stream(fd) == 1 }

    /// Sends `bytes` with `descriptors` attached, without blocking and without SIGPIPE.
    /// The corresponding system call is `sendmsg(2)`, or `send(2)` when no descriptor goes
    /// (the kernel's `sendto` path takes the buffer as it is; `sendmsg` first copies a message
    /// header and an iovec in: about 0.2 µs a call here).
    static func send(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, descriptors: [Int32]) throws(PKError) -> IOResult<Int> {
        if descriptors.isEmpty {
            return try SystemCall.nonBlocking("send") { pk_send_bytes(fd, bytes.baseAddress, bytes.count) }
        }
        var iov = iovec(iov_base: UnsafeMutableRawPointer(mutating: bytes.baseAddress), iov_len: bytes.count)
        let space = pk_cmsg_space_fds(UInt32(descriptors.count))
        let control = UnsafeMutableRawPointer.allocate(byteCount: space, alignment: 8)
        defer { control.deallocate() }
        let result: Result<IOResult<Int>, PKError> = descriptors.withUnsafeBufferPointer { fds in
            Result { () throws(PKError) in
                try SystemCall.nonBlocking("sendmsg") {
                    pk_sendmsg_fds(fd, &iov, 1, fds.baseAddress, UInt32(fds.count), control)
                }
            }
        }
        return try result.get()
    }

    /// Sends `bytes[offset...]` with `descriptors` attached. See `send(_:_:descriptors:)`.
    static func send(_ fd: Int32, _ bytes: [UInt8], from offset: Int, descriptors: [Int32]) throws(PKError) -> IOResult<Int> {
        let result: Result<IOResult<Int>, PKError> = bytes.withUnsafeBytes { raw in
            Result { () throws(PKError) in
                try send(fd, UnsafeRawBufferPointer(rebasing: raw[offset...]), descriptors: descriptors)
            }
        }
        return try result.get()
    }

    /// What one `receive` got.
    struct Received {
        var byteCount: Int
        var descriptors: [Int32]
        /// The kernel dropped descriptors (MSG_CTRUNC) or more arrived than allowed.
        var truncated: Bool
    }

    /// Receives into `buffer` with up to `descriptors.count` descriptors (close-on-exec), written
    /// to `descriptors`; any beyond that are closed and reported as `truncated`. `control` is the
    /// control-message area (`controlSpace(descriptors:)` bytes). The caller owns both areas and
    /// reuses them, so a read allocates nothing. The corresponding system call is `recvmsg(2)`.
    static func receive(
        _ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, descriptors: UnsafeMutableBufferPointer<Int32>,
        control: UnsafeMutableRawBufferPointer
    ) throws(PKError) -> IOResult<Received> {
        var count: UInt32 = 0
        var truncated: Int32 = 0
        let outcome = try SystemCall.nonBlocking("recvmsg") {
            pk_recvmsg_fds(fd, buffer.baseAddress, buffer.count, descriptors.baseAddress, UInt32(descriptors.count),
                           &count, &truncated, control.baseAddress, control.count)
        }
        switch outcome {
        case .wouldBlock: return .wouldBlock
        case .done(let n):
            let received = count == 0 ? [] : Array(UnsafeBufferPointer(rebasing: descriptors[..<Int(count)]))
            return .done(Received(byteCount: n, descriptors: received, truncated: truncated != 0))
        }
    }

    /// The control-buffer size for `count` descriptors.
    static func controlSpace(descriptors count: Int) -> Int { pk_cmsg_space_fds(UInt32(count)) }

    /// Shuts both directions down: the peer sees end-of-file, and the descriptor stays allocated
    /// (so no other thread can see its number reused) until it is closed.
    /// The corresponding system call is `shutdown(2)`.
    static func shutdown(_ fd: Int32) {
        _ = Glibc.shutdown(fd, Int32(SHUT_RDWR))
    }

    /// The peer's process, user and group ids as the kernel reports them.
    /// The corresponding system call is `getsockopt(2)` with `SO_PEERCRED`.
    static func peerCredentials(_ fd: Int32) throws(PKError) -> (pid: Int32, uid: UInt32, gid: UInt32) {
        var pid: pid_t = 0
        var uid: uid_t = 0
        var gid: gid_t = 0
        _ = try SystemCall.run("getsockopt(SO_PEERCRED)") { pk_peer_credentials(fd, &pid, &uid, &gid) }
        return (pid, uid, gid)
    }

    /// The calling process's effective user id. The corresponding call is `geteuid(2)`.
    static var effectiveUserID: UInt32 { geteuid() }

    /// Waits until `fd` is writable, the peer hangs up, or `deadline` passes.
    /// - Returns: `.writable`, `.hangUp` or `.timedOut`.
    static func waitWritable(_ fd: Int32, until deadline: PKDeadline) throws(PKError) -> WaitResult {
        while true {
            let now = monotonicNanoseconds()
            let timeout = deadline.pollTimeoutMilliseconds(now: now)
            if timeout == 0 && deadline.uptimeNanoseconds <= now {
                let revents = try Descriptor.poll(fd, events: Int16(POLLOUT), timeoutMilliseconds: 0)
                return classify(revents) ?? .timedOut
            }
            let revents = try Descriptor.poll(fd, events: Int16(POLLOUT), timeoutMilliseconds: timeout)
            if let result = classify(revents) { return result }
        }
    }

    /// Bytes written to `fd` that its peer has not read yet (0 if unknown). The corresponding
    /// call is `ioctl(2)` `SIOCOUTQ`.
    static func unsentBytes(_ fd: Int32) -> Int { Int(max(0, pk_unsent_bytes(fd))) }

    /// Whether the peer of `fd` has hung up, without waiting.
    static func peerHasHungUp(_ fd: Int32) -> Bool {
        let revents = (try? Descriptor.poll(fd, events: Int16(POLLOUT), timeoutMilliseconds: 0)) ?? Int16(POLLERR)
        return revents & Int16(POLLHUP | POLLERR) != 0
    }

    enum WaitResult { case writable, hangUp, timedOut }

    private static func classify(_ revents: Int16) -> WaitResult? {
        if revents & Int16(POLLHUP | POLLERR | POLLNVAL) != 0 { return .hangUp }
        if revents & Int16(POLLOUT) != 0 { return .writable }
        return nil
    }

    /// Whether an errno means the process or the system has no descriptor left.
    static func isOutOfDescriptors(_ errno: Int32?) -> Bool {
        errno == EMFILE || errno == ENFILE
    }

    /// Whether an errno from a send means the peer is gone.
    static func isPeerGone(_ errno: Int32?) -> Bool {
        errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN
    }

    /// Whether a `sendmsg` with descriptors was refused for the moment, nothing of it sent:
    /// too many of this user's descriptors in flight (`isTooManyInFlight`), or no memory.
    static func isRefusedForNow(_ errno: Int32?) -> Bool {
        errno == ETOOMANYREFS || errno == ENOBUFS || errno == ENOMEM
    }

    /// Whether a `sendmsg` failed because this user's descriptors in flight (sent, not yet
    /// received, in every process) passed `RLIMIT_NOFILE`.
    static func isTooManyInFlight(_ errno: Int32?) -> Bool { errno == ETOOMANYREFS }
}
