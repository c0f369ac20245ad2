#if ZeroMQ
// Learning that a ZeroMQ send right became invalid (NSPortDidBecomeInvalidNotification for a
// remote port): the connection's death signals a custom source on the watching loop.

import PortKit

/// A registration made by `PKZMQSendPort.watchInvalidation(on:forMode:_:)`; cancel it to stop
/// watching.
public final class PKZMQInvalidationWatch: Sendable {
    private let source: PKCustomSource
    private let registration = ZMQMutex<(connection: ZMQConnection?, token: Int?)>((nil, nil))

    fileprivate init(source: PKCustomSource) { self.source = source }

    /// Stops watching: the handler will not be called. Safe from any thread; idempotent.
    public func cancel() {
        source.invalidate()
        let (connection, token) = registration.withLock { state in
            defer { state = (nil, nil) }
            return state
        }
        connection?.removeDeathHandler(token)
    }

    fileprivate func attach(_ connection: ZMQConnection, _ token: Int?) {
        registration.withLock { $0 = (connection, token) }
        if !source.isValid { cancel() }
    }
}

extension PKZMQSendPort {
    /// Calls `handler` once, on `loop`'s thread, when this right becomes invalid because its
    /// connection died: the port's owner invalidated it, its process died, or (over `tcp://`)
    /// it fell silent past the heartbeat bound. If the connection is already dead, the handler
    /// runs on the loop's next pass in `mode`. The watch is a source of `mode` until it fires or is
    /// cancelled. Loop-only (`loop` must be the calling thread's loop).
    ///
    /// - Parameters:
    ///   - loop: where the handler runs; the calling thread's loop.
    ///   - mode: the modes in which the watch is active; `.common` by default.
    ///   - handler: called once.
    /// - Returns: a watch to cancel.
    /// - Throws: `.invalidPort` if this right was invalidated with `invalidate()`; errors
    ///   making the connection.
    @discardableResult
    public func watchInvalidation(
        on loop: PKRunLoop = .current, forMode mode: PKRunLoopMode = .common, _ handler: @escaping () -> Void
    ) throws(PKError) -> PKZMQInvalidationWatch {
        try watchInvalidation(on: loop, forModes: [mode], handler)
    }

    /// `watchInvalidation(on:forMode:_:)` in several modes at once (the modes of a name server).
    func watchInvalidation(
        on loop: PKRunLoop, forModes modes: [PKRunLoopMode], _ handler: @escaping () -> Void
    ) throws(PKError) -> PKZMQInvalidationWatch {
        precondition(loop.isOwnedByCurrentThread, "PKZMQSendPort.watchInvalidation is loop-only: call it on the thread of the loop it watches on")
        let connection = try right.connectionEvenIfDead()
        var fired = false
        // Weak: a strong reference would hold the source (and the handler, and all it holds)
        // in a cycle that only the watch's firing broke, never its cancellation.
        weak var firing: PKCustomSource?
        let source = PKCustomSource {
            guard !fired else { return }
            fired = true
            firing?.invalidate()
            handler()
        }
        firing = source
        for mode in modes { loop.add(source, forMode: mode) }
        let watch = PKZMQInvalidationWatch(source: source)
        let token = connection.onDeath { _ in source.signal(waking: loop) }
        watch.attach(connection, token)
        return watch
    }
}
#endif
