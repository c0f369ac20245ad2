// The lock that makes a named socket path exclusive, one piece for the name server's names and
// PortKitZeroMQ's `ipc://` endpoints (protocol.md 1.1 and 10.6), which take the same lock file
// for the same name.
//
// Claiming: open the lock file (never following a link) and flock it, never waiting; the lock
// counts only if the file locked is still the one at the path, a regular file. With the lock
// held, a socket file in the way is a dead owner's leftover, removed only if it is a socket of
// this user's that refuses a connection: one that accepts has a live owner whose lock file was
// removed from outside (a cleaner of `/tmp`, a user's `rm`). Releasing: unlink the socket file
// the owner made (if it is still the same inode), then the lock file (if it is still the one
// locked), then drop the lock.

/// A held claim on one socket path: the lock file, locked for the owner's whole life, and the
/// socket file the owner made there. Released once (idempotent; `deinit` releases too).
package final class SocketFileClaim: Sendable {
    /// The socket file the claim makes exclusive.
    package let socketPath: String
    /// The lock file held for it.
    package let lockPath: String
    /// What the claim is for, in errors: `the port name "x"`, `the endpoint ipc:///run/x`.
    private let subject: String
    /// The lock file's inode: `release` removes the file at the path only if it is still this one.
    private let lockInode: UInt64
    private let state: PKMutex<State>

    private struct State {
        /// The locked descriptor, -1 once released.
        var lockFD: Int32
        /// The socket file the owner made (`recordSocket`): `release` removes that one, no other.
        var socketInode: UInt64?
    }

    /// Takes the lock for `socketPath`, failing at once if a live owner holds it, then removes
    /// a dead owner's socket file from `socketPath`.
    ///
    /// - Throws: `.nameInUse` if a live owner holds it (or holds the socket file, its lock file
    ///   removed from outside); `.unsafeDirectory` if something other than a regular file is at
    ///   `lockPath` or something other than a socket of this user's is at `socketPath`;
    ///   `.system` otherwise.
    package init(socketPath: String, lockPath: String, subject: String) throws(PKError) {
        self.socketPath = socketPath
        self.lockPath = lockPath
        self.subject = subject
        let (fd, inode) = try Self.takeLock(lockPath, subject: subject)
        lockInode = inode
        state = PKMutex(State(lockFD: fd, socketInode: nil))
        try removeStale(socketPath)  // on failure, deinit releases the lock
    }

    deinit { release() }

    /// With the lock held: removes a leftover socket file of a dead owner at `path` (the
    /// claimed path, or a staging path beside it), only if it is a socket of this user's that
    /// accepts no connection. One that accepts (or whose backlog is full) has a live owner: the
    /// name is in use, not taken over.
    package func removeStale(_ path: String) throws(PKError) {
        guard let status = try Files.status(path) else { return }
        guard status.kind == .socket, status.owner == Socket.effectiveUserID else {
            throw PKError(.unsafeDirectory, "\(path) is in the way of \(subject) and is not a socket of this user's; PortKit will not remove it")
        }
        switch SocketFileProbe.probe(path) {
        case .live:
            throw PKError(.nameInUse, "\(subject) is held by a live owner (its lock file is missing)")
        case .stale:
            try Files.unlink(path)
        case .gone:
            return
        case .unknown(let error):
            throw error  // not known to be stale: left as it is
        }
    }

    /// Remembers the socket file now at `socketPath` as the owner's, so that `release` removes
    /// that file and no other.
    package func recordSocket() {
        guard let status = try? Files.status(socketPath), status.kind == .socket else { return }
        state.withLock { $0.socketInode = status.inode }
    }

    /// Removes the owner's socket file (if it is still the one recorded) and the lock file (if
    /// it is still the one locked), then drops the lock. Idempotent.
    package func release() {
        let (fd, socketInode) = state.withLock { state -> (Int32, UInt64?) in
            defer { state.lockFD = -1 }
            return (state.lockFD, state.socketInode)
        }
        guard fd >= 0 else { return }
        if let socketInode, let status = try? Files.status(socketPath), status.kind == .socket, status.inode == socketInode {
            _ = try? Files.unlink(socketPath)
        }
        // Unlink the lock file while holding the lock (if it is still ours: someone may have
        // removed it, and a new owner made another): a claimant that opened the old file
        // notices (its inode no longer matches the path) and tries again.
        if let status = try? Files.status(lockPath), status.inode == lockInode { _ = try? Files.unlink(lockPath) }
        Descriptor.close(fd)
    }

    /// Opens and locks the lock file; fails at once if a live owner holds it. Returns the
    /// descriptor and the file's inode. The corresponding system calls are `open(2)` and
    /// `flock(2)`.
    private static func takeLock(_ path: String, subject: String) throws(PKError) -> (Int32, UInt64) {
        func notALockFile(_ path: String, _ subject: String) -> PKError {
            PKError(.unsafeDirectory, "\(path) is in the way of \(subject) and is not a regular file; PortKit will not use it")
        }
        for _ in 0..<16 {
            let fd: Int32
            do throws(PKError) { fd = try Files.openLockFile(path) } catch {
                // A link, a directory or a socket at the lock path (a FIFO opens, and is
                // refused below).
                if Files.isNoLockFile(error.errno) { throw notALockFile(path, subject) }
                throw error
            }
            let locked: Bool
            do throws(PKError) { locked = try Files.tryLock(fd) } catch {
                Descriptor.close(fd)
                throw error
            }
            guard locked else {
                Descriptor.close(fd)
                throw PKError(.nameInUse, "\(subject) is held by a live owner (it holds \(path))")
            }
            // The lock counts only if the file locked is still the one at the path.
            let held = try? Files.status(of: fd)
            let current: FileStatus?
            do throws(PKError) { current = try Files.status(path) } catch {
                Descriptor.close(fd)
                throw error
            }
            if let held, let current, held.inode == current.inode {
                guard current.kind == .regular else {
                    Descriptor.close(fd)
                    throw notALockFile(path, subject)
                }
                return (fd, held.inode)
            }
            Descriptor.close(fd)
        }
        throw PKError(.nameInUse, "\(subject) is changing hands too fast to take")
    }
}

/// What a connect to a socket file says of its owner, for a claimant that holds the name's lock
/// and finds a socket file in the way: with the lock held, a socket file should be a dead
/// owner's leftover, unless the live owner's lock file was removed from outside.
enum SocketFileProbe {
    /// A listener accepts, or its backlog is full: the owner lives.
    case live
    /// Nothing listens there (ECONNREFUSED): a dead owner's leftover, safe to remove.
    case stale
    /// No file there any more.
    case gone
    /// Not known: the probe itself failed (out of descriptors, say).
    case unknown(PKError)

    /// Connects to `path` and hangs up at once (the owner's listener, if any, sees a connection
    /// end before its greeting).
    static func probe(_ path: String) -> SocketFileProbe {
        switch Socket.connect(to: path) {
        case .success(let probe):
            Descriptor.close(probe)
            return .live
        case .failure(.busy): return .live
        case .failure(.refused): return .stale
        case .failure(.noSuchName): return .gone
        case .failure(.system(let error)): return .unknown(error)
        }
    }
}
