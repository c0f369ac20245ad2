// File-system calls the name server makes: directories, lock files held with flock, status,
// unlink and rename, named Unix sockets, and inotify.

import CPortKit
import Glibc

/// What `lstat`/`fstat` says of a file.
struct FileStatus {
    enum Kind { case directory, socket, regular, symbolicLink, other }
    let kind: Kind
    let permissions: UInt32
    let owner: UInt32
    let inode: UInt64

    init(mode: UInt32, owner: UInt32, inode: UInt64) {
        switch mode & PK_S_IFMT {
        case PK_S_IFDIR: kind = .directory
        case PK_S_IFSOCK: kind = .socket
        case PK_S_IFREG: kind = .regular
        case PK_S_IFLNK: kind = .symbolicLink
        default: kind = .other
        }
        permissions = mode & 0o7777
        self.owner = owner
        self.inode = inode
    }
}

enum Files {
    /// The status of `path` itself (links are not followed), or nil if it does not exist.
    /// The corresponding system call is `lstat(2)`.
    static func status(_ path: String) throws(PKError) -> FileStatus? {
        var mode: UInt32 = 0, uid: UInt32 = 0, ino: UInt64 = 0
        let rc = pk_lstat_info(path, 0, &mode, &uid, &ino)
        if rc == 0 { return FileStatus(mode: mode, owner: uid, inode: ino) }
        let err = errno
        if err == ENOENT || err == ENOTDIR { return nil }
        throw PKError.system("lstat", errno: err)
    }

    /// The status of an open descriptor. The corresponding system call is `fstat(2)`.
    static func status(of fd: Int32) throws(PKError) -> FileStatus {
        var mode: UInt32 = 0, uid: UInt32 = 0, ino: UInt64 = 0
        _ = try SystemCall.run("fstat") { pk_fstat_info(fd, &mode, &uid, &ino) }
        return FileStatus(mode: mode, owner: uid, inode: ino)
    }

    /// Makes a directory with `permissions`; false if it already exists.
    /// The corresponding system call is `mkdir(2)`.
    static func makeDirectory(_ path: String, permissions: UInt32) throws(PKError) -> Bool {
        let rc = mkdir(path, permissions)
        if rc == 0 { return true }
        let err = errno
        if err == EEXIST { return false }
        throw PKError.system("mkdir", errno: err)
    }

    /// Opens (creating if needed, never following a link) a lock file, close-on-exec.
    /// The corresponding system call is `open(2)`.
    static func openLockFile(_ path: String) throws(PKError) -> Int32 {
        try SystemCall.run("open") { open(path, O_RDWR | O_CREAT | PK_O_NOFOLLOW | PK_O_CLOEXEC, 0o600) }
    }

    /// Whether `openLockFile` failed on something at the path that is no file to lock: a link
    /// (`ELOOP`), a directory (`EISDIR`) or a socket (`ENXIO`).
    static func isNoLockFile(_ errno: Int32?) -> Bool {
        errno == ELOOP || errno == EISDIR || errno == ENXIO
    }

    /// Takes an exclusive lock without waiting; false if another open file description holds it.
    /// The corresponding system call is `flock(2)`.
    static func tryLock(_ fd: Int32) throws(PKError) -> Bool {
        switch try SystemCall.nonBlocking("flock", { flock(fd, PK_LOCK_EX | PK_LOCK_NB) }) {
        case .done: return true
        case .wouldBlock: return false
        }
    }

    /// Removes a name; false if it did not exist. The corresponding system call is `unlink(2)`.
    @discardableResult
    static func unlink(_ path: String) throws(PKError) -> Bool {
        if Glibc.unlink(path) == 0 { return true }
        let err = errno
        if err == ENOENT { return false }
        throw PKError.system("unlink", errno: err)
    }

    /// Renames `from` to `to`, replacing it. The corresponding system call is `rename(2)`.
    static func rename(_ from: String, _ to: String) throws(PKError) {
        _ = try SystemCall.run("rename") { Glibc.rename(from, to) }
    }

    /// The value of an environment variable. The corresponding call is `getenv(3)`.
    static func environment(_ name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        return String(cString: value)
    }

    /// Removes an environment variable. The corresponding call is `unsetenv(3)`.
    static func removeEnvironment(_ name: String) {
        _ = unsetenv(name)
    }
}

extension Socket {
    /// The longest socket path, in bytes.
    static var maxPathLength: Int { pk_sun_path_capacity() - 1 }

    /// A listening stream socket bound to `path`, close-on-exec and non-blocking.
    /// The corresponding system calls are `socket(2)`, `bind(2)` and `listen(2)`.
    static func listen(at path: String, backlog: Int32 = 128) throws(PKError) -> Int32 {
        let fd = try SystemCall.run("socket") { socket(AF_UNIX, PK_SOCK_STREAM | PK_SOCK_CLOEXEC | PK_SOCK_NONBLOCK, 0) }
        do throws(PKError) {
            _ = try SystemCall.run("bind") { pk_bind_unix(fd, path) }
            _ = try SystemCall.run("listen") { Glibc.listen(fd, backlog) }
            return fd
        } catch {
            Descriptor.close(fd)
            throw error
        }
    }

    /// Accepts one connection, close-on-exec and non-blocking; `.wouldBlock` when none waits.
    /// The corresponding system call is `accept4(2)`.
    static func accept(_ fd: Int32) throws(PKError) -> IOResult<Int32> {
        try SystemCall.nonBlocking("accept4") { pk_accept4(fd, PK_SOCK_CLOEXEC | PK_SOCK_NONBLOCK) }
    }

    /// Why connecting to a named socket failed.
    enum ConnectFailure: Error { case noSuchName, refused, busy, system(PKError) }

    /// Connects a new non-blocking, close-on-exec stream socket to `path`.
    /// The corresponding system calls are `socket(2)` and `connect(2)`.
    static func connect(to path: String) -> Result<Int32, ConnectFailure> {
        let fd: Int32
        do throws(PKError) {
            fd = try SystemCall.run("socket") { socket(AF_UNIX, PK_SOCK_STREAM | PK_SOCK_CLOEXEC | PK_SOCK_NONBLOCK, 0) }
        } catch { return .failure(.system(error)) }
        while true {
            if pk_connect_unix(fd, path) == 0 { return .success(fd) }
            let err = errno
            if err == EINTR { continue }
            Descriptor.close(fd)
            switch err {
            case ENOENT, ENOTDIR: return .failure(.noSuchName)
            case ECONNREFUSED: return .failure(.refused)
            case EAGAIN: return .failure(.busy)
            default: return .failure(.system(PKError.system("connect", errno: err)))
            }
        }
    }
}

/// inotify(7): waiting for a name to appear in a directory without polling.
enum Inotify {
    /// An inotify instance watching `directory` for new entries.
    /// The corresponding system calls are `inotify_init1(2)` and `inotify_add_watch(2)`.
    static func watchDirectory(_ directory: String) throws(PKError) -> Int32 {
        let fd = try SystemCall.run("inotify_init1") { inotify_init1(PK_IN_CLOEXEC | PK_IN_NONBLOCK) }
        do throws(PKError) {
            _ = try SystemCall.run("inotify_add_watch") { inotify_add_watch(fd, directory, PK_IN_CREATE | PK_IN_MOVED_TO) }
            return fd
        } catch {
            Descriptor.close(fd)
            throw error
        }
    }

    /// Drains pending events; true if one named `name` (or an overflow) was among them.
    static func sawName(_ fd: Int32, _ name: String) -> Bool {
        pk_inotify_saw_name(fd, name) == 1
    }
}
