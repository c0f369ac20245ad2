// One registered name: the name's claim (`SocketFileClaim`: its lock file, held for the
// owner's whole life) and the listening socket whose connections become senders of the port.
//
// Registering: claim the name (which removes a dead owner's socket); bind a staging socket,
// listen, and rename it into place, so a name appears only when it already accepts
// connections. Unregistering undoes it in reverse: the claim removes the socket and the lock
// file only if they are still its own.

final class NameRegistration {
    let name: String
    private let claim: SocketFileClaim
    private let listenFD: Int32
    private var listener: PKDescriptorSource?
    /// Resumes accepting after descriptors ran out.
    private var resumeTimer: PKTimer?
    /// The port, while its loop keeps it (no weak reference: see `PKReceivePort.anchor`), and
    /// the port's invalidation hooks, among them the one that ends this registration.
    private let anchor: PortAnchor
    private var port: PKReceivePort? { anchor.port }
    /// The port's loop, whose thread the registration's state belongs to (even while the port
    /// is out of every mode).
    private weak var loop: PKRunLoop?
    private(set) var isActive = true
    /// The port's invalidation hook that ends this registration, removed when it ends first.
    var invalidationHook: Int?

    /// Registers `name` for `port`, whose loop is the calling thread's. Loop-only.
    init(name: String, port: PKReceivePort, directory: NameDirectory) throws(PKError) {
        let paths = try directory.paths(for: name)
        try directory.ensureSafe()
        let claim = try SocketFileClaim(socketPath: paths.socket, lockPath: paths.lock, subject: "the port name \"\(name)\"")
        do throws(PKError) {
            try claim.removeStale(paths.staging)
            let listenFD = try Socket.listen(at: paths.staging)
            do throws(PKError) {
                try Files.rename(paths.staging, paths.socket)
                claim.recordSocket()
                self.listenFD = listenFD
            } catch {
                Descriptor.close(listenFD)
                _ = try? Files.unlink(paths.staging)
                throw error
            }
        } catch {
            claim.release()
            throw error
        }
        self.name = name
        self.claim = claim
        self.anchor = port.anchor
        self.loop = port.runLoop
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
    /// thread's). A loop that is gone has no thread to check.
    func assertOwner(_ function: StaticString) {
        loop?.assertOwner(function)
    }

    /// Removes the name: the listening socket, then the claim (the socket file and the lock
    /// file, each if it is still ours, then the lock). Loop-only; idempotent.
    func end() {
        guard isActive else { return }
        isActive = false
        if let invalidationHook { anchor.removeInvalidationHook(invalidationHook) }
        invalidationHook = nil
        resumeTimer?.invalidate()
        resumeTimer = nil
        if let listener, let port { port.detachCompanion(listener) } else { listener?.invalidate() }
        listener = nil
        Descriptor.close(listenFD)
        claim.release()
    }
}
