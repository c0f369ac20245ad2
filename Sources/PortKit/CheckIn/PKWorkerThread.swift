// A worker thread with its own run loop and port, launched and checked in the guide's way
// (Listings 3-12 to 3-15) in one call; teardown asks it to stop and joins it.

import Synchronization

/// What a worker thread sees: its own loop and port, and where to send.
public final class PKWorkerContext: @unchecked Sendable {
    /// The worker thread's run loop.
    public let loop: PKRunLoop
    /// The worker's own port, scheduled in `.default` on `loop`. Set its `handler` in the
    /// set-up closure; its send right is what the launcher gets as `PKWorkerThread.port`.
    /// Once the worker has checked in, it ends when the port has no sender left, as when its
    /// launcher gave up on it (`onNoSenders`: a right made with `makeSendRight()` counts only
    /// once sent in a message, a registered name not at all). Set `onNoSenders` in the set-up
    /// closure to decide otherwise.
    public let port: PKReceivePort
    /// The port the launcher asked the worker to report to, if any.
    public let mainPort: PKSendPort?
    /// Bytes to send with the check-in message (the guide's CFMessagePort form sends the
    /// worker's port name here).
    public var checkInData: [UInt8] = []
    /// The worker's name.
    public let name: String

    var shouldExit = false
    let checkInPort: PKSendPort

    init(loop: PKRunLoop, port: PKReceivePort, mainPort: PKSendPort?, checkInPort: PKSendPort, name: String) {
        self.loop = loop
        self.port = port
        self.mainPort = mainPort
        self.checkInPort = checkInPort
        self.name = name
    }

    /// Makes the worker leave its loop after the current callback, as if told to stop.
    /// Loop-only (the worker's thread).
    public func requestStop() {
        shouldExit = true
        loop.stop()
    }
}

/// A worker thread that has checked in (czmq's `zactor` pattern on the guide's handshake).
///
/// `init` starts a thread, which makes its run loop and port, runs `setUp`, sends the check-in
/// message (msgid 100, its port as the reply port) and then runs its loop
/// (`runMode:beforeDate:` until told to exit, as Listing 3-14). `init` returns only once the
/// worker checked in, and throws if it does not in time or ends first. `stop` sends the stop
/// message and joins the thread.
public final class PKWorkerThread: @unchecked Sendable {
    /// The worker's name.
    public let name: String
    /// A send right to the worker's port.
    public let port: PKSendPort
    /// The data the worker sent with its check-in.
    public let checkInData: [UInt8]

    private let thread: SystemThread
    private let stopped = Atomic<Bool>(false)

    /// Launches a worker thread and waits for its check-in.
    ///
    /// While waiting, the calling thread's run loop runs in a private mode, so the caller's
    /// other handlers do not fire.
    ///
    /// - Parameters:
    ///   - name: the thread's name.
    ///   - mainPort: a port the worker can report to (`PKWorkerContext.mainPort`).
    ///   - checkInTimeout: how long the worker has to check in.
    ///   - setUp: runs on the worker thread before it checks in; set `context.port.handler`
    ///     here. Throwing ends the thread without checking in.
    /// - Throws: `PKError` with `.checkInTimedOut`, `.checkInFailed`, `.interrupted` (the
    ///   calling thread's loop was stopped while it waited; the stop is passed on to the run
    ///   the launch was made in), or `.system` if no thread could be started. A worker whose
    ///   launch failed ends by itself: its check-in fails, or, sent but never read, leaves
    ///   its port with no sender (unless `setUp` set the port's `onNoSenders`).
    public init(
        name: String = "PKWorker", mainPort: PKSendPort? = nil,
        checkInTimeout: Duration = PKCheckIn.defaultTimeout,
        setUp: @escaping @Sendable (PKWorkerContext) throws -> Void
    ) throws(PKError) {
        self.name = name
        let listener = try CheckInListener()
        let checkInRight = listener.makeWorkerRight()
        thread = try SystemThread(name: name) {
            try? WorkerRuntime.serve(name: name, mainPort: mainPort, checkInRight: checkInRight, setUp: setUp)
        }
        do throws(PKError) {
            let checkIn = try listener.wait(for: name, until: .after(checkInTimeout))
            (port, checkInData) = (checkIn.port, checkIn.data)
        } catch {
            thread.detach()
            throw error
        }
    }

    /// Asks the worker to stop, and waits for its thread to end, its run loop's teardown
    /// included. Frames its sends left waiting for room (their receivers behind) do not hold it
    /// up: PortKit's flusher thread writes them when their receivers read (without a flusher,
    /// which only a process out of threads lacks, the thread's end waits for them, 5 s at most).
    /// Called on the worker's own thread (from one of its handlers), it asks and returns: the
    /// worker ends when that handler returns.
    ///
    /// - Parameter timeout: how long to wait for the thread to end.
    /// - Throws: `PKError` with `.receiveTimedOut` if the thread did not end in time (it is
    ///   then left to end on its own).
    public func stop(timeout: Duration = .seconds(5)) throws(PKError) {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let deadline = PKDeadline.after(timeout)
        try? port.send(PKPortMessage(msgid: PKCheckIn.stopMessageID), before: deadline)
        if thread.isCurrent {
            thread.detach()
            return
        }
        guard thread.join(until: deadline) else {
            thread.detach()
            throw PKError(.receiveTimedOut, "worker \(name) did not stop within \(timeout)")
        }
    }

    deinit {
        if !stopped.load(ordering: .acquiring) { try? stop() }
    }
}

