#if ZeroMQ
// The `ipc://` endpoints of names in the name server's directory never take another name's
// files: a ZeroMQ port bound at the name `x.sock` would otherwise remove the socket of the name
// server's live name `x` (a socket of this user's in the way of a bind is treated as stale).

import Testing
import Glibc
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQEndpointNameTests {
    /// A live owner of an `ipc://` endpoint whose lock file was removed from outside (a
    /// cleaner of `/tmp`, an `rm`) keeps it: a second binder finds its socket accepting and is
    /// refused (libzmq's bind would have unlinked the live socket), and the endpoint still
    /// reaches the first owner. The first owner's release leaves a lock file that is not its
    /// own alone.
    @Test func aLiveOwnerWhoseLockFileWasRemovedKeepsItsEndpoint() throws {
        let directory = TemporaryDirectory()
        let endpoint = directory.endpoint("kept")
        let lockPath = directory.path + "/kept.lock"
        try onLoopThread { loop in
            var got: [UInt32] = []
            let owner = try PKZMQReceivePort(bindingTo: endpoint) { got.append($0.msgid) }
            try loop.add(owner, forMode: .default)
            defer { owner.invalidate() }
            #expect(unlink(lockPath) == 0)
            expectPKError(.nameInUse) { _ = try PKZMQReceivePort(bindingTo: endpoint) }
            try PKZMQSendPort(connectingTo: endpoint).send(PKZMQMessage(msgid: 5), timeout: .seconds(5))
            try run(loop, until: "the message through the kept endpoint") { got == [5] }
            // Another's lock file at the path now: the owner's release leaves it.
            let other = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            #expect(other >= 0)
            owner.invalidate()
            #expect(access(lockPath, F_OK) == 0, "the other lock file was left alone")
            if other >= 0 { close(other) }
            _ = unlink(lockPath)
        }
    }

    /// Something other than a regular file at an endpoint's lock path (a FIFO) is refused as
    /// an unsafe directory, at once, as the name server refuses it for a name (it was taken
    /// for a lock file changing hands, 16 times over, and reported as in use).
    @Test func aLockPathThatIsNoRegularFileIsRefused() throws {
        let directory = TemporaryDirectory()
        #expect(mkfifo(directory.path + "/piped.lock", 0o600) == 0)
        expectPKError(.unsafeDirectory) { _ = try PKZMQReceivePort(bindingTo: directory.endpoint("piped")) }
        #expect(access(directory.path + "/piped", F_OK) != 0, "nothing was bound")
    }

    /// A name directory given with a trailing `/` is checked as the name server checks it:
    /// without following a link (`lstat` of `link/` follows the link, and passed it for a
    /// real directory).
    @Test func aNameDirectoryThatIsALinkIsRefusedWithATrailingSlash() throws {
        let directory = TemporaryDirectory()
        let real = directory.path + "/real", link = directory.path + "/link"
        #expect(mkdir(real, 0o700) == 0)
        #expect(symlink(real, link) == 0)
        for given in [link, link + "/", link + "/."] {
            expectPKError(.unsafeDirectory) { _ = try PKZMQEndpoint.ipc(name: "x", directory: given) }
        }
        #expect(try PKZMQEndpoint.ipc(name: "x", directory: real + "/") == "ipc://\(real)/x")
    }

    @Test func ipcNamesCannotTakeTheNameServersFiles() throws {
        let directory = TemporaryDirectory()
        for name in ["x.sock", "x.sock.new", "x.lock", "worker-1.sock"] {
            #expect(throws: PKError.self) { _ = try PKZMQEndpoint.ipc(name: name, directory: directory.path) }
        }
        for name in ["x", "x.socket", "x.new", "sock", "x.locks", "x.sock.old"] {
            #expect(try PKZMQEndpoint.ipc(name: name, directory: directory.path) == directory.endpoint(name))
        }
    }
}
#endif
