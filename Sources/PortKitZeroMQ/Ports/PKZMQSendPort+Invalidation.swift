#if ZeroMQ
// Learning that a ZeroMQ send right became invalid (NSPortDidBecomeInvalidNotification for a
// remote port): a watch on its connection's death, delivered on a chosen loop.

import PortKit
import Synchronization

/// A registration made by `PKZMQSendPort.watchInvalidation(on:forMode:_:)`; cancel it to stop
/// watching. Safe from any thread.
public final class PKZMQInvalidationWatch: Sendable {
    private let state = Mutex<(active: Bool, connection: ZMQConnection?, token: Int?)>((true, nil, nil))

    init() {}

    /// Stops watching: the handler will not be called (if it is already queued on its loop, it
    /// is skipped there). Safe from any thread; idempotent.
    public func cancel() {
        let (connection, token) = state.withLock { state -> (ZMQConnection?, Int?) in
            state.active = false
            defer { state.connection = nil }
            return (state.connection, state.token)
        }
        connection?.removeDeathHandler(token)
    }

    fileprivate func attach(_ connection: ZMQConnection, _ token: Int?) {
        let stillActive = state.withLock { state -> Bool in
            guard state.active else { return false }
            state.connection = connection
            state.token = token
            return true
        }
        if !stillActive { connection.removeDeathHandler(token) }
    }

    /// Marks the watch fired; true only the first time, and only if not cancelled.
    fileprivate func fire() -> Bool {
        state.withLock { state in
            guard state.active else { return false }
            state.active = false
            state.connection = nil
            return true
        }
    }
}

/// A handler that is only ever called on its loop's thread.
private struct LoopBound<T>: @unchecked Sendable {
    let value: T
}

extension PKZMQSendPort {
    /// Calls `handler` once on `loop`'s thread, in `mode`, when this right becomes invalid
    /// because its connection died (the port's owner invalidated it, died, or fell silent past
    /// the heartbeat bound). If the connection is already dead, the handler is queued at once.
    /// Safe from any thread.
    ///
    /// - Throws: `.invalidPort` if this right was invalidated with `invalidate()`; errors
    ///   making the connection.
    public func watchInvalidation(
        on loop: PKRunLoop, forMode mode: PKRunLoopMode = .default, _ handler: @escaping () -> Void
    ) throws(PKError) -> PKZMQInvalidationWatch {
        let connection = try right.connectionEvenIfDead()
        let watch = PKZMQInvalidationWatch()
        let bound = LoopBound(value: handler)
        let token = connection.onDeath { _ in
            loop.perform(inModes: [mode]) {
                if watch.fire() { bound.value() }
            }
        }
        watch.attach(connection, token)
        return watch
    }
}
#endif
