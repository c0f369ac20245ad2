// The main thread's side: one port on the main run loop (Listing 3-12) whose handler takes the
// check-ins and the replies (Listing 3-13); launching the workers, handing out the jobs one
// per worker at a time, collecting the tallies, and stopping every worker.

import Foundation
import PortKit

/// The main thread's role. Main-thread only: everything here runs on the main run loop.
final class MainRole {
    private let loop = PKRunLoop.current
    /// The main thread's port: check-ins from guide-launched workers and every worker's tallies.
    private let myPort = PKReceivePort()
    private(set) var job: Job
    private(set) var workers: [WorkerRecord] = []
    /// When the jobs went out and when the last reply came back.
    private(set) var workStarted: PKDeadline?
    private(set) var workEnded: PKDeadline?
    /// The first thing that went wrong in a handler (handlers cannot throw).
    private var failure: ExampleFailure?

    /// Makes the main thread's port and adds it to the main run loop.
    init(job: Job) throws(ExampleFailure) {
        self.job = job
        // Listing 3-12: this object handles incoming port messages; install the port as an
        // input source on the current run loop.
        myPort.handler = { [unowned self] message in self.handlePortMessage(message) }
        do {
            try loop.add(myPort, forMode: .default)
        } catch {
            throw ExampleFailure("cannot put the main port on the run loop: \(error.message)")
        }
    }

    // MARK: - Launching

    /// Launches `count` worker threads, each checked in before the next starts: the first the
    /// guide's long way, the others with `PKWorkerThread`.
    func launchWorkers(count: Int) throws(ExampleFailure) {
        for index in 1...count {
            if index == 1 {
                try launchThread(name: "worker-\(index)")
            } else {
                try launchWorkerThread(name: "worker-\(index)")
            }
        }
    }

    /// Listing 3-12, "Main thread launch method", spelled out: the port is already on this
    /// thread's run loop (see `init`); detach a thread and hand it a send right. The worker's
    /// check-in arrives in `handlePortMessage` (Listing 3-13); run the loop until it has.
    private func launchThread(name: String) throws(ExampleFailure) {
        let worker = WorkerRecord(name: name, kind: "thread", transport: "socketpair", launch: .guide)
        workers.append(worker)
        let started = PKDeadline.now
        let outPort = myPort.makeSendRight()
        Thread.detachNewThread {
            GuideWorker.launchThread(withPort: outPort, name: name)
        }

        let deadline = PKDeadline.after(PKCheckIn.defaultTimeout)
        while worker.port == nil {
            if let failure { throw failure }
            guard !deadline.hasPassed else {
                throw ExampleFailure("\(name) did not check in within \(PKCheckIn.defaultTimeout)")
            }
            loop.runOnce(in: .default, before: deadline)
        }
        worker.checkInNanoseconds = nanoseconds(from: started)
    }

    /// The same handshake in one call: `PKWorkerThread` returns once the worker checked in.
    private func launchWorkerThread(name: String) throws(ExampleFailure) {
        let started = PKDeadline.now
        let thread: PKWorkerThread
        do {
            thread = try PKWorkerThread(name: name, mainPort: myPort.makeSendRight()) { context in
                // On the worker thread, before it checks in.
                guard let mainPort = context.mainPort else { return }
                let role = WorkerRole(name: context.name, mainPort: mainPort)
                context.checkInData = Array(context.name.utf8)
                context.port.handler = { [unowned context] message in
                    if role.handle(message) == .exit { context.requestStop() }
                }
            }
        } catch {
            throw ExampleFailure("\(name) did not check in: \(error.message)")
        }
        let worker = WorkerRecord(name: name, kind: "thread", transport: "socketpair", launch: .workerThread(thread))
        worker.checkInNanoseconds = nanoseconds(from: started)
        worker.port = thread.port
        workers.append(worker)
    }

    // MARK: - The main port's handler

    /// Listing 3-13, "Handling Mach port messages": a check-in carries the worker's port as its
    /// reply port (the guide's `sendPort`), which the main thread keeps; anything else is a
    /// worker's reply.
    private func handlePortMessage(_ portMessage: PKPortMessage) {
        switch portMessage.msgid {
        case ExampleMessage.checkIn:
            // Get the worker thread's communications port.
            guard let distantPort = portMessage.replyPort else {
                return fail("a check-in arrived without the worker's port")
            }
            // Save the worker port for later use.
            storeDistantPort(distantPort, of: portMessage.text)
        case ExampleMessage.counted:
            guard let reply = CountReply(portMessage) else {
                return fail("a malformed reply arrived (\(portMessage.data.count) bytes)")
            }
            handle(reply)
        default:
            fail("an unexpected message arrived (msgid \(portMessage.msgid))")
        }
    }

    private func storeDistantPort(_ port: PKSendPort, of name: String) {
        guard let worker = workers.first(where: { $0.name == name }), worker.port == nil else {
            return fail("an unexpected check-in arrived from \"\(name)\"")
        }
        worker.port = port
    }

    private func fail(_ reason: String) {
        if failure == nil { failure = ExampleFailure(reason) }
    }

    // MARK: - The work

    /// Hands out every job and collects every reply, keeping one job in flight per worker,
    /// while the main run loop runs.
    ///
    /// - Parameter timeout: how long the whole work may take.
    func runJobs(timeout: Duration) throws(ExampleFailure) {
        // A worker that goes away now is a failure (NSPortDidBecomeInvalidNotification).
        for worker in workers {
            guard let port = worker.port else { continue }
            do {
                worker.watch = try port.watchInvalidation(on: loop, forMode: .default) { [unowned self, unowned worker] in
                    self.fail("\(worker.name) went away before the work was done")
                }
            } catch {
                throw ExampleFailure("cannot watch \(worker.name)'s port: \(error.message)")
            }
        }
        defer {
            for worker in workers {
                worker.watch?.cancel()
                worker.watch = nil
            }
        }

        workStarted = .now
        for worker in workers { sendNextJob(to: worker) }
        let deadline = PKDeadline.after(timeout)
        while !job.isFinished {
            if let failure { throw failure }
            guard !deadline.hasPassed else {
                let waiting = workers.filter { $0.inFlight != nil }.map(\.name).joined(separator: ", ")
                throw ExampleFailure("the work did not finish within \(timeout); still waiting for \(waiting)")
            }
            loop.runOnce(in: .default, before: deadline)
        }
        if let failure { throw failure }
        workEnded = .now
    }

    private func sendNextJob(to worker: WorkerRecord) {
        guard failure == nil, let port = worker.port, let request = job.next() else { return }
        worker.inFlight = (request.jobID, .now)
        do {
            try port.send(request.message, before: .after(.seconds(5)))
        } catch {
            fail("cannot send a job to \(worker.name): \(error.message)")
        }
    }

    private func handle(_ reply: CountReply) {
        guard let worker = workers.first(where: { $0.inFlight?.jobID == reply.jobID }),
              let (_, sentAt) = worker.inFlight
        else { return fail("a reply arrived for job \(reply.jobID), which no worker has") }
        worker.inFlight = nil
        worker.roundTrips.append(nanoseconds(from: sentAt))
        worker.countingTimes.append(reply.countingNanoseconds)
        guard job.record(reply.tally, forJob: reply.jobID, by: worker.name) else {
            return fail("\(worker.name) answered job \(reply.jobID) twice")
        }
        sendNextJob(to: worker)
    }

    // MARK: - Shutting down

    /// Stops every worker that checked in and waits for its thread to end, then closes the
    /// main port. Tries every worker even if one fails, and throws the first failure.
    func shutDown() throws(ExampleFailure) {
        var firstFailure: ExampleFailure?
        for worker in workers where worker.port != nil && !worker.stopped {
            do {
                try stop(worker)
                worker.stopped = true
            } catch {
                if firstFailure == nil { firstFailure = error }
            }
        }
        myPort.invalidate()
        if let firstFailure { throw firstFailure }
    }

    private func stop(_ worker: WorkerRecord) throws(ExampleFailure) {
        switch worker.launch {
        case .workerThread(let thread):
            // Sends PKWorkerThread's stop message and joins the thread.
            do { try thread.stop() } catch { throw ExampleFailure("cannot stop \(worker.name): \(error.message)") }
        case .guide:
            // Ask the worker to leave its loop, then run ours until its port becomes invalid.
            guard let port = worker.port, port.isValid else { return }  // it already left
            var gone = false
            let watch: PKInvalidationWatch
            do {
                watch = try port.watchInvalidation(on: loop, forMode: .default) { gone = true }
                try port.send(PKPortMessage(msgid: ExampleMessage.exit), before: .after(.seconds(5)))
            } catch {
                throw ExampleFailure("cannot stop \(worker.name): \(error.message)")
            }
            defer { watch.cancel() }
            let deadline = PKDeadline.after(.seconds(5))
            while !gone {
                guard !deadline.hasPassed else { throw ExampleFailure("\(worker.name) did not stop within 5 seconds") }
                loop.runOnce(in: .default, before: deadline)
            }
        }
    }
}

/// Nanoseconds from `start` to now.
func nanoseconds(from start: PKDeadline) -> UInt64 {
    let now = PKDeadline.now.uptimeNanoseconds
    return now > start.uptimeNanoseconds ? now - start.uptimeNanoseconds : 0
}
