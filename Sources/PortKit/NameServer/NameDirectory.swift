// The name server's directory: where it is, the rules that make it safe to use, and how a
// name maps to its socket and lock file. Pure path logic plus the safety check.

/// The per-user directory that holds registered names (protocol.md section 1.1). `package`:
/// PortKitZeroMQ's `ipc://` endpoints of names live there too.
package struct NameDirectory: Sendable {
    package let path: String

    /// The directory at `path`, without trailing `/` and `/.` (through which `lstat` would
    /// follow a link: `link/` would pass for a real directory).
    package init(path: String) {
        var path = path
        while true {
            if path.utf8.count > 2, path.hasSuffix("/.") {
                path.removeLast(2)
            } else if path.utf8.count > 1, path.hasSuffix("/") {
                path.removeLast()
            } else {
                break
            }
        }
        self.path = path
    }

    /// The longest name: it keeps `<directory>/<name>.sock.new` far below `sun_path`'s limit
    /// in the usual directories.
    static let maxNameLength = 64

    /// The default directory: `$PORTKIT_NAME_DIRECTORY`, else `$XDG_RUNTIME_DIR/portkit`, else
    /// `/tmp/portkit-<uid>`.
    static func defaultPath() -> String {
        if let explicit = Files.environment("PORTKIT_NAME_DIRECTORY"), !explicit.isEmpty { return explicit }
        if let runtime = Files.environment("XDG_RUNTIME_DIR"), !runtime.isEmpty { return runtime + "/portkit" }
        return "/tmp/portkit-\(Socket.effectiveUserID)"
    }

    /// Checks a name: 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not starting with a dot.
    static func validate(_ name: String) throws(PKError) {
        if name.isEmpty { throw PKError(.badName, "a port name cannot be empty") }
        if name.utf8.count > maxNameLength {
            throw PKError(.badName, "the port name \"\(name.prefix(80))\" is \(name.utf8.count) bytes; the limit is \(maxNameLength)")
        }
        if name.hasPrefix(".") { throw PKError(.badName, "the port name \"\(name)\" starts with a dot") }
        for byte in name.utf8 {
            let ok = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
            if !ok {
                throw PKError(.badName, "the port name \"\(name)\" has a character outside A-Z a-z 0-9 . _ -")
            }
        }
    }

    func socketPath(_ name: String) -> String { "\(path)/\(name).sock" }
    func stagingPath(_ name: String) -> String { "\(path)/\(name).sock.new" }
    func lockPath(_ name: String) -> String { "\(path)/\(name).lock" }

    /// Validates `name` and checks that its paths fit in a socket address.
    func paths(for name: String) throws(PKError) -> (socket: String, staging: String, lock: String) {
        try Self.validate(name)
        let staging = stagingPath(name)
        if staging.utf8.count > Socket.maxPathLength {
            throw PKError(.badName, "the staging socket path for \"\(name)\" (\(staging)) would be \(staging.utf8.count) bytes; a Unix socket path holds at most \(Socket.maxPathLength)")
        }
        return (socketPath(name), staging, lockPath(name))
    }

    /// Makes the directory if it is missing (mode 0700), then refuses it unless it is a real
    /// directory (not a link), owned by this user, and closed to group and others.
    package func ensureSafe() throws(PKError) {
        var status = try Files.status(path)
        if status == nil {
            _ = try Files.makeDirectory(path, permissions: 0o700)
            status = try Files.status(path)
        }
        guard let status else {
            throw PKError(.unsafeDirectory, "the name directory \(path) vanished while being made")
        }
        switch status.kind {
        case .directory: break
        case .symbolicLink:
            throw PKError(.unsafeDirectory, "the name directory \(path) is a symbolic link; PortKit uses only a real directory")
        default:
            throw PKError(.unsafeDirectory, "the name directory \(path) is not a directory")
        }
        if status.owner != Socket.effectiveUserID {
            throw PKError(.unsafeDirectory, "the name directory \(path) belongs to uid \(status.owner), not to this user (uid \(Socket.effectiveUserID))")
        }
        if status.permissions & 0o077 != 0 {
            throw PKError(.unsafeDirectory, "the name directory \(path) has mode \(String(status.permissions, radix: 8)); it must be 700 (closed to group and others)")
        }
    }
}
