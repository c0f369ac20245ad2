// The sockets that ports of this process took from ATTACH_SENDER frames, by inode, for the
// whole process: a peer that handed over both ends of one socketpair (or one socket several
// times) had them kept for ever, each end keeping the other from ever seeing the end of the
// stream, while the peer, having closed its copies, paid nothing (protocol.md 7).

/// The handed-over sockets ports of this process hold (ATTACH_SENDER), by inode.
enum AttachedSockets {
    private static let held = PKMutex<Set<UInt64>>([])

    /// Why a handed-over socket is refused.
    enum Refusal: Error, CustomStringConvertible {
        case alreadyHeld, peerHeld, unknown(Int32)

        var description: String {
            switch self {
            case .alreadyHeld: "the same socket was handed over before and is held still"
            case .peerHeld: "its peer is a handed-over socket this process holds (both ends of one pair)"
            case .unknown(let errno): "its inode could not be read (errno \(errno))"
            }
        }
    }

    /// Lists `fd`, a socket handed over in ATTACH_SENDER, and returns its inode; or refuses it
    /// if this process holds it already (under another descriptor) or holds its peer. The
    /// peer is asked of the kernel (`sock_diag(7)`); where the kernel will not say, only the
    /// first check is made. The corresponding calls are `fstat(2)` and a `NETLINK_SOCK_DIAG`
    /// query.
    static func admit(_ fd: Int32) -> Result<UInt64, Refusal> {
        let inode: UInt64
        do throws(PKError) { inode = try Files.status(of: fd).inode } catch { return .failure(.unknown(error.errno ?? 0)) }
        let peer = Socket.peerInode(ofSocketInode: inode)
        return held.withLock { held in
            if held.contains(inode) { return .failure(.alreadyHeld) }
            if let peer, held.contains(peer) { return .failure(.peerHeld) }
            held.insert(inode)
            return .success(inode)
        }
    }

    /// Unlists a socket `admit` listed, as its connection closes.
    static func release(_ inode: UInt64) {
        held.withLock { _ = $0.remove(inode) }
    }
}
