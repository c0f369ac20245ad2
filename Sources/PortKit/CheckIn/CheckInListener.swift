// The launcher's side of a check-in, shared by worker threads and processes: a private port in a
// private mode, one right to it for the worker (in-process for a thread, a connection for a
// process), and a wait driven by CheckInStateMachine.

import Synchronization

final class CheckInListener {
    private let loop: PKRunLoop
    private let mode: PKRunLoopMode
    private let port: PKReceivePort
    private var machine = CheckInStateMachine()
    private var action = CheckInStateMachine.Action.wait
    private var workerPort: PKSendPort?
    private var data: [UInt8] = []
    /// Whether this listener still counts in the loop's check-in depth (until its wait ends).
    private var holdsDepth = true

    /// A listener on the calling thread's loop. Loop-only.
    init() throws(PKError) {
        loop = PKRunLoop.current
        // One private mode per nesting depth, reused by every check-in on this loop.
        mode = PKRunLoopMode("PKCheckInMode-\(loop.checkInDepth)")
        loop.checkInDepth += 1
        port = PKReceivePort()
        port.handler = { [weak self] message in
            guard let self, action == .wait else { return }
            // A right to answer a request (REPLY_BACK) is no port to reach the worker: it
            // answers once, and the check-in's end closes it.
            let hasPort = message.replyPort.map { !$0.isReplyRight } ?? false
            action = machine.handle(.message(msgid: message.msgid, hasReplyPort: hasPort))
            if action == .acceptWorker {
                workerPort = message.replyPort
                data = message.data
            }
        }
        port.onNoSenders = { [weak self] in
            if let self, action == .wait { action = machine.handle(.workerGone) }
        }
        try loop.add(port, forMode: mode)
    }

    deinit {
        port.invalidate()
        if loop.isOwnedByCurrentThread {
            releaseDepth()
        } else {
            // Released on another thread (its launchers hold it on their own, until their wait
            // ends; kept for safety): the port's sources sit in the private mode, which may
            // never run again, so its invalidation is finished on the loop's next pass, in
            // whatever mode it runs.
            let port = port
            loop.performHousekeeping { port.invalidate() }
        }
    }

    /// Gives the private mode's depth back once the wait is over. Loop-only.
    private func releaseDepth() {
        guard holdsDepth else { return }
        holdsDepth = false
        loop.checkInDepth -= 1
    }

    /// A worker thread's right to the check-in port, in memory: its check-in message arrives
    /// with the worker's port as an in-process right, and when the worker ends without
    /// checking in (its right released) the port has no senders left: the worker is gone.
    func makeWorkerRight() -> PKSendPort { PKSendPort(localRight: LocalRight(port: port)) }

    /// A connection of the worker's own to the check-in port, as a descriptor: when the worker
    /// (thread or process) ends, it closes and the listener learns the worker is gone.
    func makeWorkerConnection() throws(PKError) -> Int32 {
        try port.makeTransferDescriptor()
    }

    /// Runs the loop in the private mode until the worker checks in, ends, or `deadline` passes.
    ///
    /// - Parameter keepOpen: keep the worker's connection to the check-in port open after the
    ///   check-in: a worker process watches it to learn that its launcher died. The port itself
    ///   is invalidated here, on its loop, either way; the connection is kept by copies of its
    ///   descriptor, which the caller closes, from any thread (a port kept instead had to be
    ///   invalidated on its loop, which, released from another thread, waited for a pass that
    ///   might never come: a launcher on a thread of Swift concurrency's pool runs none).
    /// - Returns: the worker's port, its check-in data, and the kept descriptors.
    /// - Throws: `PKError` with `.checkInTimedOut`, `.checkInFailed` or `.interrupted` (the
    ///   loop was stopped; the stop is passed on to the run the wait was made in); `.system` if
    ///   the connection could not be kept (out of descriptors).
    func wait(
        for name: String, until deadline: PKDeadline, keepOpen: Bool = false
    ) throws(PKError) -> (port: PKSendPort, data: [UInt8], kept: [Int32]) {
        while action == .wait {
            switch loop.runPrivately(in: mode, until: deadline, returnAfterSourceHandled: true) {
            case .timedOut:
                if action == .wait { action = machine.handle(.deadlinePassed) }
            case .stopped:  // passed on to the caller's run by runPrivately
                if action == .wait { action = machine.handle(.interrupted) }
            case .handledSource, .finished:
                break
            }
        }
        // The nested wait is over: a later check-in on this loop may use the mode again.
        releaseDepth()
        var kept: [Int32] = []
        if keepOpen && action == .acceptWorker {
            do throws(PKError) { kept = try port.duplicateConnectionDescriptors() } catch {
                port.invalidate()
                throw error
            }
        }
        port.invalidate()
        guard action == .acceptWorker, let workerPort else {
            if case .fail(let code, let reason) = action { throw PKError(code, "worker \(name): \(reason)") }
            throw PKError(.checkInFailed, "worker \(name) did not check in")
        }
        return (workerPort, data, kept)
    }
}


/// The worker's side of a check-in, shared by threads and processes: Listings 3-14 and 3-15.
enum WorkerRuntime {
    /// Makes the worker's port, runs `setUp`, checks in over `checkInRight` (msgid 100, the
    /// worker's port as the reply port), then runs the loop until told to stop.
    ///
    /// - Parameter watchLauncher: keep the check-in connection and end the loop when it breaks
    ///   (the launcher died); for worker processes, whose launcher keeps its end open.
    /// - Throws: `PKError` with `.checkInFailed` if the worker could not check in (the reason
    ///   `setUp` gave included).
    static func serve(
        name: String, mainPort: PKSendPort?, checkInRight: PKSendPort,
        watchLauncher: Bool = false, setUp: (PKWorkerContext) throws -> Void
    ) throws(PKError) {
        let loop = PKRunLoop.current
        let port = PKReceivePort()
        defer {
            port.invalidate()
            checkInRight.invalidate()
        }
        try loop.add(port, forMode: .default)
        let context = PKWorkerContext(loop: loop, port: port, mainPort: mainPort, checkInPort: checkInRight, name: name)
        do { try setUp(context) } catch {
            throw PKError(.checkInFailed, "worker \(name): set-up failed before the check-in: \(error)")
        }

        let userHandler = port.handler
        port.handler = { [unowned context] message in
            if message.msgid == PKCheckIn.stopMessageID { context.shouldExit = true; return }
            userHandler(message)
        }
        // Listing 3-15: send the check-in message, the worker's port as the reply port.
        let checkIn = PKPortMessage(msgid: PKCheckIn.messageID, data: context.checkInData, replyPort: port.makeSendRight())
        do { try checkInRight.send(checkIn, before: .after(PKCheckIn.defaultTimeout)) } catch {
            throw PKError(.checkInFailed, "worker \(name): the check-in message could not be sent: \(error.message)")
        }
        // A worker whose port has no sender left (no right in a message, a connection, or a
        // right received in one) is out of its launcher's reach: the launcher let the
        // check-in's right go (after stopping it), or gave up before it read the check-in (its
        // deadline passed, or its loop was stopped), which dropped the message and the right
        // in it. It ends then rather than serve on a thread nobody joins, unless its set-up
        // chose what no-senders means to it.
        if port.onNoSenders == nil {
            port.onNoSenders = { [unowned context] in context.requestStop() }
        }
        var launcherWatch: PKInvalidationWatch?
        if watchLauncher {
            launcherWatch = try? checkInRight.watchInvalidation(on: loop, forMode: .default) { context.requestStop() }
        } else {
            checkInRight.invalidate()
        }
        defer { launcherWatch?.cancel() }
        // Listing 3-14: let the run loop process things until told to exit.
        repeat {
            loop.run(in: .default, until: .distantFuture, returnAfterSourceHandled: true)
        } while !context.shouldExit && port.isValid
    }
}
