#if ZeroMQ
// The lock that makes an `ipc://` endpoint exclusive. libzmq's bind on an `ipc://` path unlinks
// whatever socket file is there and binds a new one, so a second process would silently steal a
// live endpoint. PortKit first takes the name server's lock for the path: `<path>.lock`, held
// with flock for the owner's whole life, never waited for. With the lock held it removes a stale
// socket file (only a socket of this user's that accepts no connection); on release it unlinks
// the socket file it bound (if still the same inode), then the lock file (if still the one it
// locked), then drops the lock.

import Glibc
import PortKit

/// A held claim on one `ipc://` path. Owns the lock descriptor. Not thread-safe: its owner
/// releases it once (the inbox keeps its claims under its lock, hence `@unchecked Sendable`).
final class EndpointClaim: @unchecked Sendable {
    let socketPath: String
    let lockPath: String
    private var lockFD: Int32
    /// The lock file's inode: `release` removes the file at the path only if it is still this one.
    private let lockInode: UInt64
    private var socketInode: UInt64?

    /// Takes the lock for `socketPath`, failing at once if a live owner holds it.
    ///
    /// - Throws: `.nameInUse` if another live owner holds it; `.unsafeDirectory` if something
    ///   other than a socket of this user's is in the way; `.system` otherwise.
    init(socketPath: String) throws(PKError) {
        self.socketPath = socketPath
        self.lockPath = socketPath + ".lock"
        (lockFD, lockInode) = try Self.takeLock(lockPath, endpoint: socketPath)
        do throws(PKError) {
            try Self.removeStale(socketPath)
        } catch {
            Self.releaseLock(lockFD, lockPath, inode: lockInode)
            throw error
        }
    }

    deinit { release() }

    /// Remembers the socket file libzmq made, so that release removes that file and no other.
    func recordBoundSocket() {
        socketInode = FileInfo.lstat(socketPath)?.inode
    }

    /// Removes the socket file (if it is still the one bound) and the lock; idempotent.
    func release() {
        guard lockFD >= 0 else { return }
        if let inode = socketInode, let status = FileInfo.lstat(socketPath), status.isSocket, status.inode == inode {
            _ = unlink(socketPath)
        }
        Self.releaseLock(lockFD, lockPath, inode: lockInode)
        lockFD = -1
    }

    private static func releaseLock(_ fd: Int32, _ path: String, inode: UInt64) {
        // Unlink while holding the lock (if it is still ours: someone may have removed it, and
        // a new owner made another): a claimant that opened the old file notices (its inode no
        // longer matches the path) and tries again.
        if let current = FileInfo.lstat(path), current.inode == inode { _ = unlink(path) }
        _ = close(fd)
    }

    /// Opens and locks the lock file; fails at once if a live owner holds it. The
    /// corresponding system calls are `open(2)` and `flock(2)`.
    private static func takeLock(_ path: String, endpoint: String) throws(PKError) -> (fd: Int32, inode: UInt64) {
        for _ in 0..<16 {
            let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
            guard fd >= 0 else {
                let err = errno
                throw PKError(.system, "cannot open the lock file \(path) for ipc://\(endpoint)", call: "open", errno: err)
            }
            var rc: Int32
            repeat { rc = flock(fd, LOCK_EX | LOCK_NB) } while rc != 0 && errno == EINTR
            if rc != 0 {
                let err = errno
                _ = close(fd)
                if err == EWOULDBLOCK {
                    throw PKError(.nameInUse, "the endpoint ipc://\(endpoint) is bound by a live owner (it holds \(path))")
                }
                throw PKError(.system, "cannot lock \(path)", call: "flock", errno: err)
            }
            // The lock counts only if the file locked is still the one at the path.
            if let held = FileInfo.fstat(fd), let current = FileInfo.lstat(path), held.inode == current.inode, current.isRegular {
                return (fd, held.inode)
            }
            _ = close(fd)
        }
        throw PKError(.nameInUse, "the endpoint ipc://\(endpoint) is changing hands too fast to bind")
    }

    /// With the lock held: removes a leftover socket of a dead owner, only if it is a socket of
    /// ours that accepts no connection. One that accepts has a live owner whose lock file was
    /// removed from outside: the endpoint is in use, not taken over (libzmq's bind would unlink
    /// the live socket).
    private static func removeStale(_ path: String) throws(PKError) {
        guard let status = FileInfo.lstat(path) else { return }
        guard status.isSocket, status.owner == geteuid() else {
            throw PKError(.unsafeDirectory, "\(path) is in the way of ipc://\(path) and is not a socket of this user's; PortKit will not remove it")
        }
        switch SocketFileProbe.probe(path) {
        case .live:
            throw PKError(.nameInUse, "the endpoint ipc://\(path) is bound by a live owner (its lock file is missing)")
        case .gone:
            return
        case .unknown(let error):
            throw error  // not known to be stale: left as it is
        case .stale:
            if unlink(path) != 0 {
                throw PKError(.system, "cannot remove the stale socket \(path)", call: "unlink", errno: errno)
            }
        }
    }
}

/// What lstat/fstat say of a file.
struct FileInfo {
    let mode: UInt32
    let owner: UInt32
    let inode: UInt64

    var isSocket: Bool { mode & 0o170000 == 0o140000 }
    var isRegular: Bool { mode & 0o170000 == 0o100000 }
    var isDirectory: Bool { mode & 0o170000 == 0o040000 }
    var permissions: UInt32 { mode & 0o7777 }

    /// The status of `path` itself (links not followed), or nil if it cannot be read.
    /// The corresponding system call is `lstat(2)`.
    static func lstat(_ path: String) -> FileInfo? {
        var info = stat()
        guard Glibc.lstat(path, &info) == 0 else { return nil }
        return FileInfo(mode: info.st_mode, owner: info.st_uid, inode: UInt64(info.st_ino))
    }

    /// The corresponding system call is `fstat(2)`.
    static func fstat(_ fd: Int32) -> FileInfo? {
        var info = stat()
        guard Glibc.fstat(fd, &info) == 0 else { return nil }
        return FileInfo(mode: info.st_mode, owner: info.st_uid, inode: UInt64(info.st_ino))
    }

    /// Makes `path` (mode 0700) if missing, then checks the name server's rules: a real
    /// directory, owned by this user, closed to group and others.
    static func ensurePrivateDirectory(_ path: String) throws(PKError) {
        if lstat(path) == nil, mkdir(path, 0o700) != 0, errno != EEXIST {
            throw PKError(.system, "cannot make the directory \(path)", call: "mkdir", errno: errno)
        }
        guard let status = lstat(path) else {
            throw PKError(.unsafeDirectory, "the directory \(path) vanished while being made")
        }
        guard status.isDirectory else {
            throw PKError(.unsafeDirectory, "\(path) is not a real directory (a link, or another kind of file)")
        }
        guard status.owner == geteuid() else {
            throw PKError(.unsafeDirectory, "the directory \(path) belongs to uid \(status.owner), not to this user (uid \(geteuid()))")
        }
        guard status.permissions & 0o077 == 0 else {
            throw PKError(.unsafeDirectory, "the directory \(path) has mode \(String(status.permissions, radix: 8)); it must be 700")
        }
    }
}
#endif
