// Learning that a send right became invalid (NSPortDidBecomeInvalidNotification for a remote
// port): a watch on the connection's hang-up, delivered on a chosen loop.

/// A registration made by `PKSendPort.watchInvalidation(on:forMode:_:)`; cancel it to stop
/// watching. Loop-only (the loop the watch was made on).
public final class PKInvalidationWatch: @unchecked Sendable {
    private var source: PKDescriptorSource?
    private var connection: SendConnection?
    /// The watch's own duplicate of the connection's descriptor, closed when the watch ends.
    private var descriptor: Int32?
    private let localToken: (PKReceivePort, Int)?
    /// For an in-process right: closed by `cancel()`. The port's report of its death (or the
    /// right's) is a block queued on the loop, which may be on its way when the watch is
    /// cancelled; it looks here first.
    private let gate: Gate?

    /// Whether a watch was cancelled. Loop-only.
    final class Gate: @unchecked Sendable {
        var isOpen = true
    }

    init(source: PKDescriptorSource, connection: SendConnection, descriptor: Int32) {
        self.source = source
        self.connection = connection
        self.descriptor = descriptor
        self.localToken = nil
        self.gate = nil
    }

    init(port: PKReceivePort, token: Int, gate: Gate) {
        self.localToken = (port, token)
        self.gate = gate
    }

    /// Stops watching; the handler will not be called. Loop-only.
    public func cancel() {
        fired()
        gate?.isOpen = false
        if let (port, token) = localToken { port.removeInvalidationWatcher(token) }
    }

    func fired() {
        source?.invalidate()
        source = nil
        if let descriptor { Descriptor.close(descriptor) }
        descriptor = nil
        connection = nil
    }
}

extension PKSendPort {
    /// Calls `handler` once, on `loop`'s thread, when this send right becomes invalid: its
    /// receive port was invalidated, its owner (thread or process) went away, or the
    /// connection broke. If the right is already invalid, the handler runs on the loop's next
    /// pass in `mode`. Loop-only (`loop` must be the calling thread's loop).
    ///
    /// - Parameters:
    ///   - loop: where the handler runs; the calling thread's loop.
    ///   - mode: the modes in which the watch is active; `.common` by default.
    ///   - handler: called once.
    /// - Returns: a watch to cancel.
    @discardableResult
    public func watchInvalidation(
        on loop: PKRunLoop = .current, forMode mode: PKRunLoopMode = .common,
        _ handler: @escaping () -> Void
    ) throws(PKError) -> PKInvalidationWatch {
        switch storage {
        case .local(let port):
            let gate = PKInvalidationWatch.Gate()
            let token = port.addInvalidationWatcher(loop: loop, mode: mode, { if gate.isOpen { handler() } })
            return PKInvalidationWatch(port: port, token: token, gate: gate)
        case .localRight(let right):
            // The port's death, or this right's own invalidation (which the port reports too).
            let gate = PKInvalidationWatch.Gate()
            let token = right.port.addInvalidationWatcher(loop: loop, mode: mode, { if gate.isOpen { handler() } }, right: right)
            return PKInvalidationWatch(port: right.port, token: token, gate: gate)
        case .connection, .reply:
            // A loop's epoll registers a descriptor once: each watch (several watches, or a
            // watch and a request's, on one right) watches a duplicate of its own.
            let connection = watchableConnection!
            let descriptor = try Descriptor.duplicate(connection.fd)
            var watch: PKInvalidationWatch?
            let source = PKDescriptorSource(descriptor: descriptor, events: .hangUp, handler: { events in
                guard !events.intersection([.hangUp, .error]).isEmpty else { return }
                watch?.fired()
                watch = nil
                handler()
            }, cancel: {
                // The source left its loop for good (cancelled, or the thread ended): close.
                watch?.fired()
                watch = nil
            })
            let made = PKInvalidationWatch(source: source, connection: connection, descriptor: descriptor)
            watch = made
            do throws(PKError) { try loop.add(source, forMode: mode) } catch {
                watch = nil
                made.cancel()
                throw error
            }
            return made
        }
    }
}
