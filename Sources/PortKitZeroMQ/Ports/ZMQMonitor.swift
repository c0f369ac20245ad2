#if ZeroMQ
// Reading a socket's connection events (zmq_socket_monitor) on the process's background loop:
// how a connection learns that its peer has gone (closed, killed, or, over tcp://, silent past
// the heartbeat timeout). The reader ends itself when libzmq reports that monitoring stopped,
// which it does when the monitored socket closes.

import Logging
import PortKit
import Synchronization

private let monitorCounter = Atomic<UInt64>(0)

/// The reading end of one socket's monitor. Its PAIR socket belongs to the background loop's
/// thread once `start` has handed it over.
final class ZMQMonitor: @unchecked Sendable {
    /// The events a connection watches.
    static let watchedEvents = ZMQMonitorEvent.handshakeSucceeded | ZMQMonitorEvent.disconnected
        | ZMQMonitorEvent.handshakeRefused | ZMQMonitorEvent.monitorStopped

    private let socket: ZMQSocket
    private var source: PKDescriptorSource?
    /// Reads the reader when `source` could not be added to the loop.
    private var timer: PKTimer?
    private var handler: (@Sendable (Int32) -> Void)?

    /// Starts monitoring `monitored`: connects a PAIR to its monitor endpoint, then binds that
    /// endpoint (libzmq lets an `inproc://` connect come first). Call before `monitored`
    /// connects, so that no event is missed.
    ///
    /// Once this returns, monitoring runs, and the reader must outlive it: if the owner gives
    /// up before `start`, it calls `cancel(monitoring:)` first. libzmq sends the last event
    /// (`monitorStopped`) with a blocking send when the monitored socket is destroyed, on its
    /// reaper thread; a reader that is gone by then blocks that thread for good, and no socket
    /// of the process is closed again (libzmq issue #3575). Hence the reader is made and
    /// connected first: nothing can fail after monitoring has started.
    init(monitoring monitored: ZMQSocket) throws(PKError) {
        let address = "inproc://portkit-zmq-monitor-\(monitorCounter.add(1, ordering: .relaxed).newValue)"
        socket = try ZMQSocket(.pair)
        try socket.connect(address)
        try monitored.monitor(address, events: Self.watchedEvents)
    }

    /// Stops monitoring `monitored` (the socket given to `init`) and closes the reader, for an
    /// owner that gives up before `start`. libzmq sends `monitorStopped` at once, to the reader
    /// still connected (it has room: nothing was read yet, and a new socket's monitor has sent
    /// little), so nothing is left to send later.
    func cancel(monitoring monitored: ZMQSocket) {
        try? monitored.monitor(nil, events: 0)
        socket.close()
    }

    /// Hands the reader to the background loop; `handler` gets each event there, in order.
    func start(_ handler: @escaping @Sendable (Int32) -> Void) {
        PKRunLoop.background.perform(inModes: [.common]) { self.schedule(handler) }
    }

    private func schedule(_ handler: @escaping @Sendable (Int32) -> Void) {
        self.handler = handler
        let source = PKDescriptorSource(descriptor: socket.pollDescriptor, events: .readable) { _ in self.drain() }
        do throws(PKError) {
            try PKRunLoop.current.add(source, forMode: .common)
            self.source = source
        } catch {
            // The reader stays (monitoring runs: libzmq's next event for a reader that is gone
            // would block its I/O thread or reaper for good, libzmq issue #3575) and is read on
            // a timer instead, which needs no descriptor and no epoll entry of its own.
            Logger(label: "PortKitZeroMQ").error("cannot watch a ZeroMQ socket monitor (\(error)): reading it every \(Self.pollInterval) instead")
            let timer = PKTimer(fireDate: .after(Self.pollInterval), interval: Self.pollInterval) { _ in self.drain() }
            PKRunLoop.current.add(timer, forMode: .common)
            self.timer = timer
        }
        drain()
    }

    /// How often a reader that the loop cannot watch is read.
    static let pollInterval = Duration.milliseconds(100)

    /// The edge rule: read events until `ZMQ_EVENTS` shows no input.
    private func drain() {
        while socket.isOpen && socket.events.canReceive {
            var event: Int32?
            var frames = 0
            repeat {
                var more = false
                let got = (try? socket.receiveFrame { bytes, hasMore in
                    more = hasMore
                    if frames == 0 && bytes.count >= 2 {
                        event = Int32(bytes.loadUnaligned(fromByteOffset: 0, as: UInt16.self))
                    }
                }) ?? false
                guard got else { break }
                frames += 1
                if !more { break }
            } while true
            guard let event else { continue }
            handler?(event)
            if event == ZMQMonitorEvent.monitorStopped { stop(); return }
        }
    }

    private func stop() {
        source?.invalidate()
        source = nil
        timer?.invalidate()
        timer = nil
        handler = nil
        socket.close()
    }
}
#endif
