// A send right of its own to a port in this process, received in an in-process message: the
// counterpart of a connection, without a socket. It counts as a sender of the port (so the
// port learns when the last one goes) and can be invalidated on its own, as a Mach right can.

import Synchronization

final class LocalRight: Sendable {
    let port: PKReceivePort
    private let invalidated = Atomic<Bool>(false)

    init(port: PKReceivePort) {
        self.port = port
        port.localSenderArrived()
    }

    deinit { if !invalidated.load(ordering: .acquiring) { port.localSenderLeft() } }

    var isValid: Bool { !invalidated.load(ordering: .acquiring) && port.isValid }

    func invalidate() {
        if !invalidated.exchange(true, ordering: .acquiringAndReleasing) { port.localSenderLeft(self) }
    }
}
