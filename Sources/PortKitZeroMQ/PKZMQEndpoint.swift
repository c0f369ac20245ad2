#if ZeroMQ
// Endpoints: the `tcp://` and `ipc://` addresses ZeroMQ ports bind and connect to, checked in
// one place, and the `ipc://` endpoint of a name in the name server's directory.

import PortKit

/// Endpoints of ZeroMQ ports.
///
/// PortKit accepts two kinds, written as libzmq writes them:
///
/// - `tcp://HOST:PORT`: `HOST` an IPv4 address or a host name (`*` binds every interface),
///   written as libzmq takes it (ASCII letters, digits and `. - _ : [ ] %`, starting with a
///   letter, a digit, `[` or `:`); `PORT` a number, or `*` to bind an ephemeral port (read
///   the result from the port's `endpoint`). A `*` host or port is for binding only.
/// - `ipc://PATH`: a Unix socket at an absolute `PATH` (claimed with a lock file next to it,
///   `PATH.lock`, so a second binder of a live endpoint fails with `.nameInUse`), or
///   `ipc://@NAME` in Linux's abstract namespace (the kernel itself refuses a second binder).
public enum PKZMQEndpoint {
    /// The longest endpoint a message may carry, in bytes.
    public static let maxLength = 255

    /// The `ipc://` endpoint for `name` in the name server's directory: the socket
    /// `<directory>/<name>`, claimed under `<directory>/<name>.lock`, the very lock
    /// `PKNameServer` takes for that name. A ZeroMQ port bound there and a Unix-socket port
    /// registered under the same name therefore exclude each other.
    ///
    /// A name may not end in `.sock`, `.sock.new` or `.lock`: its socket would be a file of
    /// another name of the name server's (`x.sock` is the socket of the name `x`), which binding
    /// would remove.
    ///
    /// - Parameters:
    ///   - name: 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not starting with a dot, not ending
    ///     in `.sock`, `.sock.new` or `.lock`.
    ///   - directory: the name directory (a trailing `/` or `/.` dropped, as `PKNameServer`
    ///     drops it); `PKNameServer`'s default when `nil`.
    /// - Throws: `.badName`, or `.unsafeDirectory` if the directory breaks the name server's rules.
    public static func ipc(name: String, directory: String? = nil) throws(PKError) -> String {
        let directory = NameDirectory(path: directory ?? PKNameServer.shared.directory)
        let path = try ipcSocketPath(name: name, directory: directory.path)
        try directory.ensureSafe()
        let endpoint = "ipc://\(path)"
        _ = try ZMQEndpoint(parsing: endpoint)
        return endpoint
    }

    /// The files the name server's own names take in its directory, after the name.
    static let nameServerSuffixes = [".sock", ".sock.new", ".lock"]

    /// The socket file of `name` in the name directory `directory`: `<directory>/<name>` (its
    /// lock, `<directory>/<name>.lock`, is the name server's lock for `name`). Pure: no file is
    /// touched.
    ///
    /// - Throws: `.badName` for a name that breaks the name rule or ends in one of
    ///   `nameServerSuffixes` (its socket would be another name's file).
    static func ipcSocketPath(name: String, directory: String) throws(PKError) -> String {
        try validate(name: name)
        if let suffix = nameServerSuffixes.first(where: { name.utf8.count > $0.utf8.count && name.hasSuffix($0) }) {
            throw PKError(.badName, "the name \"\(name)\" ends in \(suffix): its socket would be the file \(suffix) of the name server's name \"\(name.dropLast(suffix.count))\"")
        }
        return "\(directory)/\(name)"
    }

    /// `tcp://ADDRESS:*`, where ADDRESS is the local address the kernel uses toward `endpoint`'s
    /// host (127.0.0.1 for a local one): what to bind so that the peer at `endpoint`, and
    /// nobody on another interface, can reach a port. `nil` for an `ipc://` endpoint, an
    /// unreachable host, or a host name whose address was not found within `timeout`.
    public static func localTCP(toward endpoint: String, timeout: Duration = .seconds(5)) -> String? {
        guard case .tcp(let host, _)? = try? ZMQEndpoint(parsing: endpoint),
              case .local(let local) = LocalAddress.toward(host: host == "*" ? "127.0.0.1" : host, before: .after(timeout))
        else { return nil }
        return "tcp://\(local):*"
    }

    /// Whether PortKit accepts `endpoint` (see the type's documentation).
    public static func isValid(_ endpoint: String) -> Bool {
        (try? ZMQEndpoint(parsing: endpoint)) != nil
    }

    /// The name server's rule for names.
    static func validate(name: String) throws(PKError) {
        guard !name.isEmpty, name.utf8.count <= 64 else {
            throw PKError(.badName, "a port name has 1 to 64 characters; \"\(name.prefix(80))\" has \(name.utf8.count)")
        }
        guard !name.hasPrefix(".") else { throw PKError(.badName, "the port name \"\(name)\" starts with a dot") }
        for byte in name.utf8 {
            let ok = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
            guard ok else { throw PKError(.badName, "the port name \"\(name)\" has a character outside A-Z a-z 0-9 . _ -") }
        }
    }
}

/// A checked endpoint.
enum ZMQEndpoint: Hashable, Sendable, CustomStringConvertible {
    case tcp(host: String, port: String)
    /// A file path, or `@name` in the abstract namespace.
    case ipc(path: String)

    /// The longest `ipc://` path: a Unix socket address holds 107 bytes and a NUL.
    static let maxPathLength = 107

    init(parsing text: String) throws(PKError) {
        guard text.utf8.count <= PKZMQEndpoint.maxLength else {
            throw PKError(.badName, "the endpoint \"\(text.prefix(60))...\" is \(text.utf8.count) bytes; the limit is \(PKZMQEndpoint.maxLength)")
        }
        guard !text.utf8.contains(0) else { throw PKError(.badName, "an endpoint cannot contain a NUL byte") }
        if text.hasPrefix("tcp://") {
            let rest = text.dropFirst(6)
            guard let colon = rest.lastIndex(of: ":") else {
                throw PKError(.badName, "the endpoint \(text) has no port: write tcp://HOST:PORT")
            }
            let host = String(rest[..<colon])
            let port = String(rest[rest.index(after: colon)...])
            guard !host.isEmpty, !host.contains("/") else { throw PKError(.badName, "the endpoint \(text) has no host") }
            guard host == "*" || Self.isHostLibzmqAccepts(host) else {
                throw PKError(.badName, "the endpoint \(text) has a host libzmq refuses: a letter, digit, [ or : first, then letters, digits and . - _ : [ ] %")
            }
            let portOK = port == "*" || (!port.isEmpty && port.count <= 5 && port.allSatisfy(\.isASCII) && port.allSatisfy(\.isNumber) && Int(port)! <= 65535)
            guard portOK else { throw PKError(.badName, "the endpoint \(text) has a bad port \"\(port)\": a number up to 65535, or *") }
            self = .tcp(host: host, port: port)
        } else if text.hasPrefix("ipc://") {
            let path = String(text.dropFirst(6))
            guard path.hasPrefix("/") || (path.hasPrefix("@") && path.count > 1) else {
                throw PKError(.badName, "the endpoint \(text) needs an absolute path (ipc:///dir/name) or an abstract name (ipc://@name)")
            }
            guard path.utf8.count <= Self.maxPathLength else {
                throw PKError(.badName, "the socket path of \(text) is \(path.utf8.count) bytes; a Unix socket path holds at most \(Self.maxPathLength)")
            }
            self = .ipc(path: path)
        } else {
            throw PKError(.badName, "the endpoint \"\(text)\" is neither tcp:// nor ipc://")
        }
    }

    /// Whether libzmq's `zmq_connect` takes `host` (it checks the syntax, and fails with
    /// EINVAL, before it resolves anything): an ASCII letter, digit, `[` or `:` first, then
    /// letters, digits and `. - _ : [ ] %`. Refused here first, because a connect that fails
    /// after a socket monitor started is a hazard (`ZMQConnection.init`); the source-address
    /// form (`;`) and `*` inside a host are not PortKit's either.
    static func isHostLibzmqAccepts(_ host: String) -> Bool {
        func isAlphanumeric(_ byte: UInt8) -> Bool {
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
        }
        guard let first = host.utf8.first,
              isAlphanumeric(first) || first == UInt8(ascii: "[") || first == UInt8(ascii: ":") else { return false }
        return host.utf8.allSatisfy { byte in
            isAlphanumeric(byte) || ".-_:[]%".utf8.contains(byte)
        }
    }

    /// Whether libzmq's `zmq_connect` takes this endpoint: not a `*` host or port (which only
    /// binding resolves). Unlike `isConnectable`, the any-address and port 0 pass: libzmq
    /// takes them (and connects in the background, or keeps trying).
    var isLibzmqConnectable: Bool {
        guard case .tcp(let host, let port) = self else { return true }
        return host != "*" && port != "*"
    }

    var description: String {
        switch self {
        case .tcp(let host, let port): "tcp://\(host):\(port)"
        case .ipc(let path): "ipc://\(path)"
        }
    }

    /// Whether the host is a wildcard, which a peer cannot connect to.
    var isWildcard: Bool {
        if case .tcp(let host, _) = self { return host == "*" || host == "0.0.0.0" }
        return false
    }

    /// Whether a peer can connect to this endpoint as written: not a wildcard host or a
    /// wildcard or zero port (which only binding resolves). A port component carries only such
    /// endpoints (protocol.md 10.3).
    var isConnectable: Bool {
        guard case .tcp(_, let port) = self else { return true }
        return !isWildcard && port != "*" && Int(port) != 0
    }

    /// The file this endpoint binds, if any (not for tcp, nor for the abstract namespace).
    var socketFile: String? {
        if case .ipc(let path) = self, path.hasPrefix("/") { return path }
        return nil
    }

    /// How a peer reaching `destination` can reach this endpoint: a wildcard host becomes the
    /// local address the kernel would use toward the destination (127.0.0.1 for a local one,
    /// or one the kernel has no route to). A destination's host name is looked up until
    /// `deadline` at most.
    ///
    /// - Throws: `.sendTimedOut` if the name's address was not found by `deadline`;
    ///   `.transport` if it has none.
    func advertised(toward destination: ZMQEndpoint, before deadline: PKDeadline) throws(PKError) -> String {
        guard case .tcp(_, let port) = self, isWildcard else { return description }
        let local: String
        switch destination {
        case .tcp(let host, _):
            switch LocalAddress.toward(host: host, before: deadline) {
            case .local(let address): local = address
            case .noRoute: local = "127.0.0.1"
            case .noAddress: throw PKError(.transport, "the host name \(host) has no IPv4 address; nothing was sent")
            case .unanswered:
                throw PKError(.sendTimedOut, "the address of \(host) was not found before the send deadline; nothing was sent")
            }
        case .ipc: local = "127.0.0.1"
        }
        return "tcp://\(local):\(port)"
    }
}
#endif
