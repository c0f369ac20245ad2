#if ZeroMQ
// Which local address a peer can reach this process at: the source address the kernel would
// use toward that peer. A reply port and a port bound to a wildcard address are advertised
// under it.

import Glibc
import PortKit

enum LocalAddress {
    /// Answers already found, by remote address: the route toward one is found once per process.
    private static let known = ZMQMutex<[String: String]>([:])

    /// What `toward(host:before:)` found.
    enum Route: Equatable {
        /// The local address.
        case local(String)
        /// The kernel has no route toward the host's address (or it is not an IPv4 address).
        case noRoute
        /// The host is a name with no IPv4 address.
        case noAddress
        /// The name's address was not known by the caller's deadline.
        case unanswered
    }

    /// The local IPv4 address the kernel routes toward `host` (an IPv4 literal or a name; a
    /// name is looked up off this thread, `HostResolver`, until `deadline`). Sends nothing: a
    /// UDP `connect` only picks the route. Remembered per remote address for the life of the
    /// process.
    static func toward(host: String, before deadline: PKDeadline) -> Route {
        let remote: String
        switch HostResolver.address(of: host, before: deadline) {
        // A bracketed address (`[10.0.0.5]`, as an endpoint may write one) without its brackets.
        case .address(let address): remote = address.hasPrefix("[") && address.hasSuffix("]") ? String(address.dropFirst().dropLast()) : address
        case .none: return .noAddress
        case .unanswered: return .unanswered
        }
        if let address = known.withLock({ $0[remote] }) { return .local(address) }
        guard let address = route(toward: remote) else { return .noRoute }
        known.withLock { $0[remote] = address }
        return .local(address)
    }

    /// Toward a numeric address: no lookup. The corresponding system calls are
    /// `getaddrinfo(3)` (with `AI_NUMERICHOST`), `connect(2)` and `getsockname(2)`.
    private static func route(toward host: String) -> String? {
        var hints = addrinfo()
        hints.ai_family = AF_INET
        hints.ai_flags = AI_NUMERICHOST
        hints.ai_socktype = Int32(SOCK_DGRAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, "9", &hints, &found) == 0, let found else { return nil }
        defer { freeaddrinfo(found) }
        guard let target = found.pointee.ai_addr else { return nil }
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { _ = close(fd) }
        guard connect(fd, target, found.pointee.ai_addrlen) == 0 else { return nil }
        var local = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { return nil }
        var text = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
        guard inet_ntop(AF_INET, &local.sin_addr, &text, socklen_t(text.count)) != nil else { return nil }
        return text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }
}
#endif
