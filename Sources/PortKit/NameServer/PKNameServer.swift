// The name server (NSMessagePortNameServer, CFMessagePort names): register a receive port under
// a name; look a name up from any thread or process of the same user.

import Synchronization

/// Registers receive ports by name and looks names up (`NSMessagePortNameServer`,
/// `CFMessagePortCreateLocal`/`CFMessagePortCreateRemote` with a name).
///
/// Names live in a per-user directory: `$PORTKIT_NAME_DIRECTORY` if set, else
/// `$XDG_RUNTIME_DIR/portkit`, else `/tmp/portkit-<uid>`. PortKit refuses a directory that is a
/// symbolic link, belongs to another user, or is open to group or others, and says why.
/// A name is 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not starting with a dot.
///
/// A registered name is a Unix socket plus a lock file held for the owner's whole life: a
/// second registrant of a live name fails with `.nameInUse`; when the owner dies, even by
/// `kill -9`, the kernel drops the lock and the name is free again at once. Every connection is
/// checked with `SO_PEERCRED`: only the same user may connect, either way.
///
/// The same calls work between threads of one process and between processes.
public struct PKNameServer: Sendable {
    /// The directory holding the names.
    public let directory: String

    /// The name server in the default directory.
    public static var shared: PKNameServer { PKNameServer() }

    /// A name server in `directory` (the default when `nil`), kept without trailing `/` or
    /// `/.`, so that the directory checked is the one named, never a link's target.
    public init(directory: String? = nil) {
        self.directory = NameDirectory(path: directory ?? NameDirectory.defaultPath()).path
    }

    private var names: NameDirectory { NameDirectory(path: directory) }

    /// Registers `port` under `name` (`-[NSPortNameServer registerPort:name:]`). Loop-only: call
    /// it on the thread of the loop the port is scheduled on. The name lasts until
    /// `unregister`, the port's invalidation or release (a port out of every mode that nothing
    /// else holds), or the process's end.
    ///
    /// - Throws: `PKError` with `.badName` (the name breaks the rule, or its socket path would
    ///   not fit in a Unix socket address), `.nameInUse`, `.unsafeDirectory` (the directory, or a
    ///   file in the way of the name that PortKit will not remove), `.invalidPort` (the port is
    ///   invalid or not scheduled), or `.system`.
    public func register(_ port: PKReceivePort, name: String) throws(PKError) {
        guard port.isValid else { throw PKError(.invalidPort, "cannot register an invalidated port") }
        guard let loop = port.runLoop else {
            throw PKError(.invalidPort, "schedule the port on a run loop before registering it")
        }
        loop.assertOwner("PKNameServer.register(_:name:)")
        let registration = try NameRegistration(name: name, port: port, directory: names)
        let key = RegistryKey(directory: directory, name: name)
        registry.withLock { $0[key] = UncheckedBox(registration) }
        // The hook goes with the registration (`end` removes it): a port registered and
        // unregistered over and over keeps none, and its invalidation removes only the name it
        // still holds, not one registered again since for another port.
        registration.invalidationHook = port.anchor.addInvalidationHook {
            registration.end()
            registry.withLock { entries in
                if entries[key]?.value === registration { entries.removeValue(forKey: key) }
            }
        }
    }

    /// Removes a name this process registered (`-[NSPortNameServer removePortForName:]`).
    /// Loop-only: call it on the thread of the registered port's loop (it traps elsewhere, as
    /// `register` does). The port stays valid.
    ///
    /// - Throws: `PKError` with `.badName` if `name` breaks the name rule, or `.nameNotFound` if
    ///   this process has not registered `name`.
    public func unregister(name: String) throws(PKError) {
        try NameDirectory.validate(name)
        let key = RegistryKey(directory: directory, name: name)
        guard let registration = registry.withLock({ $0[key] }) else {
            throw PKError(.nameNotFound, "this process has not registered the name \"\(name)\"")
        }
        registration.value.assertOwner("PKNameServer.unregister(name:)")
        registry.withLock { entries in
            if entries[key]?.value === registration.value { entries.removeValue(forKey: key) }
        }
        registration.value.end()
    }

    /// A send right to the port registered under `name` (`-[NSPortNameServer portForName:]`).
    /// Safe from any thread.
    ///
    /// - Throws: `PKError` with `.nameNotFound` (no live owner, or, rarely, an owner whose
    ///   backlog of connections is full: `lookUp(_:timeout:)` waits that out), `.badName`,
    ///   `.permissionDenied` (the owner is another user), `.unsafeDirectory`, `.transport` (the
    ///   greeting could not be written whole on the new connection), or `.system`.
    public func lookUp(_ name: String) throws(PKError) -> PKSendPort {
        let paths = try names.paths(for: name)
        try names.ensureSafe()
        switch Socket.connect(to: paths.socket) {
        case .success(let fd):
            return try Self.finishConnection(fd, name: name)
        case .failure(.noSuchName), .failure(.refused):
            throw PKError(.nameNotFound, "no live port is registered under \"\(name)\" in \(directory)")
        case .failure(.busy):
            throw PKError(.nameNotFound, "the port registered under \"\(name)\" is not accepting connections (its backlog is full)")
        case .failure(.system(let error)):
            throw error
        }
    }

    /// A send right to the port registered under `name`, waiting until `deadline` for the
    /// name to appear (`-[NSPortNameServer portForName:host:]` with a wait). It waits on
    /// inotify for the name's socket to be made, not by polling; an owner that dies while the
    /// connection is being made is waited past in the same way. Only an owner whose backlog of
    /// connections is full, which no file event announces, is tried again every 10 ms. Safe
    /// from any thread; it blocks the calling thread.
    ///
    /// - Throws: as `lookUp(_:)`, with `.nameNotFound` once the deadline passes.
    public func lookUp(_ name: String, waitingUntil deadline: PKDeadline) throws(PKError) -> PKSendPort {
        let paths = try names.paths(for: name)
        try names.ensureSafe()
        let watch = try Inotify.watchDirectory(directory)
        defer { Descriptor.close(watch) }
        let socketFile = "\(name).sock"
        while true {
            var backlogFull = false
            switch Socket.connect(to: paths.socket) {
            case .success(let fd):
                do throws(PKError) {
                    return try Self.finishConnection(fd, name: name)
                } catch where error.code == .nameNotFound {
                    // The owner went away during the greeting: wait for the next one.
                }
            case .failure(.system(let error)):
                throw error
            case .failure(.busy):
                backlogFull = true
            case .failure(.noSuchName), .failure(.refused):
                break
            }
            // Wait for the name to be (re)created: the owner renames its socket into place. A
            // full backlog ends with no event: try again 10 ms after this try, whatever else
            // the directory saw meanwhile (other names' files).
            let retry: PKDeadline? = backlogFull ? .after(.milliseconds(10)) : nil
            while !Inotify.sawName(watch, socketFile) {
                let timeout = deadline.pollTimeoutMilliseconds(now: monotonicNanoseconds())
                if timeout == 0 {
                    throw PKError(.nameNotFound, "no port was registered under \"\(name)\" in \(directory) before the deadline")
                }
                var wait = timeout
                if let retry {
                    let untilRetry = retry.pollTimeoutMilliseconds(now: monotonicNanoseconds())
                    if untilRetry == 0 { break }
                    wait = timeout < 0 ? untilRetry : min(timeout, untilRetry)
                }
                _ = try Descriptor.poll(watch, events: Int16(1), timeoutMilliseconds: wait)
            }
        }
    }

    /// A send right to the port registered under `name`, waiting at most `timeout`.
    ///
    /// - Throws: as `lookUp(_:waitingUntil:)`.
    public func lookUp(_ name: String, timeout: Duration) throws(PKError) -> PKSendPort {
        try lookUp(name, waitingUntil: .after(timeout))
    }

    /// Checks the owner's uid, writes the greeting, and wraps the socket as a send right.
    private static func finishConnection(_ fd: Int32, name: String) throws(PKError) -> PKSendPort {
        do throws(PKError) {
            let peer = try Socket.peerCredentials(fd)
            if peer.uid != Socket.effectiveUserID {
                throw PKError(.permissionDenied, "the port \"\(name)\" belongs to uid \(peer.uid), not to this user")
            }
            try ConnectionSetup.writeGreeting(fd)
        } catch {
            Descriptor.close(fd)
            // The owner died between accepting into its backlog and our greeting: no live owner.
            if Socket.isPeerGone(error.errno) {
                throw PKError(.nameNotFound, "the owner of \"\(name)\" went away while the connection was being made")
            }
            throw error
        }
        return PKSendPort(connection: SendConnection(takingOwnershipOf: fd))
    }
}

private struct RegistryKey: Hashable, Sendable {
    let directory: String
    let name: String
}

/// This process's registrations, for `unregister(name:)`.
private let registry = PKMutex<[RegistryKey: UncheckedBox<NameRegistration>]>([:])
