// A send right of its own to a port in this process, received in an in-process message: the
// counterpart of a connection, without a socket. It counts as a sender of the port (so the
// port learns when the last one goes) and can be invalidated on its own, as a Mach right can.

import Synchronization

final class LocalRight: Sendable {
    let port: PKReceivePort
    /// The port's sender epoch when the right was made: `PKReceivePort.revokeSenders()` (a
    /// reused reply port between two requests) ends every right of an earlier epoch.
    let epoch: UInt64
    private let invalidated = Atomic<Bool>(false)

    /// A right of the port's current epoch.
    convenience init(port: PKReceivePort) {
        self.init(port: port, epoch: port.currentSenderEpoch)
    }

    /// A right of `epoch`: if that epoch has ended, the right is born invalid.
    init(port: PKReceivePort, epoch: UInt64) {
        self.port = port
        self.epoch = epoch
        if !port.localSenderArrived(epoch: epoch) { invalidated.store(true, ordering: .releasing) }
    }

    deinit { if !invalidated.load(ordering: .acquiring) { port.localSenderLeft(epoch: epoch) } }

    /// Whether `invalidate()` was called (the port's state aside).
    var wasInvalidated: Bool { invalidated.load(ordering: .acquiring) }

    var isValid: Bool { !invalidated.load(ordering: .acquiring) && port.acceptsSenders(ofEpoch: epoch) }

    /// Hands `message` to the port in memory (`PKSendPort.send`).
    func send(_ message: consuming PKPortMessage, before deadline: PKDeadline) throws(PKError) {
        // The port's validity and the right's epoch are checked under the mailbox's lock.
        guard !wasInvalidated else { throw PKError(.invalidPort, "cannot send: the send right was invalidated") }
        try port.enqueueLocal(consume message, epoch: epoch, before: deadline)
    }

    func invalidate() {
        if !invalidated.exchange(true, ordering: .acquiringAndReleasing) { port.localSenderLeft(self, epoch: epoch) }
    }
}
