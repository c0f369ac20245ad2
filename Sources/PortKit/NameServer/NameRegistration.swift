// One registered name: the lock file held for the owner's whole life, and the listening
// socket whose connections become senders of the port.
//
// Registering: take the lock (flock, never waiting); with it held, remove a stale socket only
// if lstat shows a socket of ours that refuses a connection (one that accepts has a live owner
// whose lock file was removed from outside); bind a staging socket, listen, and rename it into
// place, so a name appears only when it already accepts connections. Unregistering undoes it
// in reverse, removing the socket and the lock file only if they are still its own.

final class NameRegistration {
    let name: String
    let directory: NameDirectory
    private let lockFD: Int32
    /// The lock file's inode: `end` removes the file at the path only if it is still this one.
    private let lockInode: UInt64
    private let listenFD: Int32
    private let socketInode: UInt64
    private var listener: PKDescriptorSource?
    /// Resumes accepting after descriptors ran out.
    private var resumeTimer: PKTimer?
    /// The port, while its loop keeps it (no weak reference: see `PKReceivePort.anchor`).
    private let anchor: PortAnchor
    private var port: PKReceivePort? { anchor.port }
    private(set) var isActive = true
    /// The port's invalidation hook that ends this registration, removed when it ends first.
    var invalidationHook: Int?

    /// Registers `name` for `port`, whose loop is the calling thread's. Loop-only.
    init(name: String, port: PKReceivePort, directory: NameDirectory) throws(PKError) {
        let paths = try directory.paths(for: name)
        try directory.ensureSafe()
        let (lockFD, lockInode) = try Self.takeLock(paths.lock, name: name)
        do throws(PKError) {
            try Self.removeStale(paths.socket, name: name)
            try Self.removeStale(paths.staging, name: name)
            let listenFD = try Socket.listen(at: paths.staging)
            do throws(PKError) {
                let inode = try Files.status(of: listenFD).inode
                try Files.rename(paths.staging, paths.socket)
                self.listenFD = listenFD
                self.socketInode = try Files.status(paths.socket)?.inode ?? inode
            } catch {
                Descriptor.close(listenFD)
                _ = try? Files.unlink(paths.staging)
                throw error
            }
        } catch {
            Descriptor.close(lockFD)
            throw error
        }
        self.name = name
        self.directory = directory
        self.lockFD = lockFD
        self.lockInode = lockInode
        self.anchor = port.anchor
        let source = PKDescriptorSource(descriptor: listenFD, events: .readable) { [weak self] _ in
            self?.acceptWaiting()
        }
        listener = source
        do throws(PKError) { try port.attachCompanion(source) } catch {
            listener = nil
            end()
            throw error
        }
    }

    deinit { end() }

    /// Accepts every waiting connection and hands it to the port. A connection's first message
    /// is delivered as it is accepted: a handler that ends the registration (invalidating the
    /// port, unregistering the name) closes the listening socket, whose number a new socket
    /// may take at once, so each accept looks first.
    private func acceptWaiting() {
        guard let port else { return }
        for _ in 0..<64 {
            guard isActive else { return }
            do throws(PKError) {
                switch try Socket.accept(listenFD) {
                case .done(let fd): port.adoptAccepted(fd)
                case .wouldBlock: return
                }
            } catch {
                if Socket.isOutOfDescriptors(error.errno) { pauseAccepting() }
                return
            }
        }
    }

    /// Out of descriptors, the listener stays readable with connections it cannot accept, and
    /// every pass of the loop would try again: stop watching it for a moment (the connections
    /// wait in the backlog), then try again. Loop-only.
    private func pauseAccepting() {
        guard let listener, !listener.events.isEmpty, let loop = listener.loop else { return }
        listener.events = []
        let timer = PKTimer(fireDate: .after(Self.acceptRetryDelay)) { [weak self] _ in
            self?.resumeTimer = nil
            self?.listener?.events = .readable
        }
        resumeTimer = timer
        for mode in listener.modes { loop.add(timer, forMode: mode) }
    }

    /// How long a listener that ran out of descriptors waits before it accepts again.
    static let acceptRetryDelay: Duration = .milliseconds(50)

    /// Traps unless called on the thread of the port's loop (the registration's state is that
    /// thread's). A port no loop holds any more has no thread to check.
    func assertOwner(_ function: StaticString) {
        port?.runLoop?.assertOwner(function)
    }

    /// Removes the name: the socket file (if it is still ours), the listener, the lock file,
    /// then the lock. Loop-only; idempotent.
    func end() {
        guard isActive else { return }
        isActive = false
        if let invalidationHook, let port { port.removeInvalidationHook(invalidationHook) }
        invalidationHook = nil
        resumeTimer?.invalidate()
        resumeTimer = nil
        if let listener, let port { port.detachCompanion(listener) } else { listener?.invalidate() }
        listener = nil
        let socketPath = directory.socketPath(name)
        if let status = try? Files.status(socketPath), status.kind == .socket, status.inode == socketInode {
            _ = try? Files.unlink(socketPath)
        }
        Descriptor.close(listenFD)
        // Unlink the lock file while holding the lock (if it is still ours: someone may have
        // removed it, and a new owner made another); a registrant that opened the old file
        // notices (its inode no longer matches the path) and tries again.
        let lockPath = directory.lockPath(name)
        if let status = try? Files.status(lockPath), status.inode == lockInode { _ = try? Files.unlink(lockPath) }
        Descriptor.close(lockFD)
    }

    /// Opens and locks the lock file; fails at once if a live owner holds it. Returns the
    /// descriptor and the file's inode.
    private static func takeLock(_ path: String, name: String) throws(PKError) -> (Int32, UInt64) {
        for _ in 0..<16 {
            let fd = try Files.openLockFile(path)
            let locked: Bool
            do throws(PKError) { locked = try Files.tryLock(fd) } catch {
                Descriptor.close(fd)
                throw error
            }
            guard locked else {
                Descriptor.close(fd)
                throw PKError(.nameInUse, "the port name \"\(name)\" is registered by a live owner")
            }
            // The lock counts only if the file we locked is still the one at the path.
            let held = try? Files.status(of: fd)
            let current: FileStatus?
            do throws(PKError) { current = try Files.status(path) } catch {
                Descriptor.close(fd)
                throw error
            }
            if let held, let current, held.inode == current.inode {
                guard current.kind == .regular else {
                    Descriptor.close(fd)
                    throw PKError(.unsafeDirectory, "\(path) is in the way of the name \"\(name)\" and is not a regular file; PortKit will not use it")
                }
                return (fd, held.inode)
            }
            Descriptor.close(fd)
        }
        throw PKError(.nameInUse, "the port name \"\(name)\" is changing hands too fast to register")
    }

    /// With the lock held: removes a leftover socket of a dead owner, only if it is a socket of
    /// ours that accepts no connection. One that accepts (or whose backlog is full) has a live
    /// owner, whose lock file was removed from outside (a cleaner of `/tmp`, a user's `rm`):
    /// the name is in use, not taken over.
    private static func removeStale(_ path: String, name: String) throws(PKError) {
        guard let status = try Files.status(path) else { return }
        guard status.kind == .socket, status.owner == Socket.effectiveUserID else {
            throw PKError(.unsafeDirectory, "\(path) is in the way of the name \"\(name)\" and is not a socket of this user's; PortKit will not remove it")
        }
        switch SocketFileProbe.probe(path) {
        case .live:
            throw PKError(.nameInUse, "the port name \"\(name)\" is registered by a live owner (its lock file is missing)")
        case .stale:
            try Files.unlink(path)
        case .gone:
            return
        case .unknown(let error):
            // Not known to be stale: left as it is.
            throw error
        }
    }
}
