#if ZeroMQ
// The `ipc://` endpoints of names in the name server's directory never take another name's
// files: a ZeroMQ port bound at the name `x.sock` would otherwise remove the socket of the name
// server's live name `x` (a socket of this user's in the way of a bind is treated as stale).

import Testing
import PortKit
@testable import PortKitZeroMQ

@Suite struct ZMQEndpointNameTests {
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
