// The main thread's side: one port on the main run loop (Listing 3-12), registered under a
// name (Listing 3-16), whose handler takes the check-ins and the replies (Listings 3-13 and
// 3-18); launching the workers (threads and processes), waiting for workers started by hand,
// handing out the jobs one per worker at a time, collecting the tallies, and stopping every
// worker.

import Foundation
import PortKit

/// The main thread's role. Main-thread only: everything here runs on the main run loop.
final class MainRole {
    private let loop = PKRunLoop.current
    /// The main thread's port: every check-in that comes by name or from a guide-launched
    /// thread, and every worker's tallies.
    private let myPort = PKReceivePort()
    /// The name the main port is registered under, which worker processes look up.
    let portName: String
    private let nameServer = PKNameServer.shared
    /// When the main port's name was registered: from then on a worker can find it.
    private var registeredAt = PKDeadline.now
    /// Signalled from Foundation's process-monitoring thread when a worker process started
    /// with `Process` ends, so that a loop waiting on that process wakes up (a custom input
    /// source: `CFRunLoopSourceSignal` + `CFRunLoopWakeUp`).
    private let processEnded = PKCustomSource {}
    /// How many workers started by hand may still check in; none once the work has begun.
    private var handStartedWanted: Int
    private(set) var job: Job
    private(set) var workers: [WorkerRecord] = []
    /// When the jobs went out and when the last reply came back.
    private(set) var workStarted: PKDeadline?
    private(set) var workEnded: PKDeadline?
    /// The first thing that went wrong in a handler (handlers cannot throw).
    private var failure: ExampleFailure?

    /// How long a worker process has to start and check in: starting a process, on a busy
    /// machine, takes longer than the 5 s `PKCheckIn.defaultTimeout` gives a thread.
    static let processCheckInTimeout: Duration = .seconds(20)
    /// How long a worker has to stop once told to.
    static let stopTimeout: Duration = .seconds(10)

    /// Makes the main thread's port, adds it to the main run loop and registers it under
    /// `portName`.
    ///
    /// - Parameter handStartedWorkers: how many workers started by hand may check in before
    ///   the work begins.
    init(job: Job, portName: String, handStartedWorkers: Int) throws(ExampleFailure) {
        self.job = job
        self.portName = portName
        self.handStartedWanted = handStartedWorkers
        // Listing 3-12: this object handles incoming port messages; install the port as an
        // input source on the current run loop.
        myPort.handler = { [unowned self] message in self.handlePortMessage(message) }
        do {
            try loop.add(myPort, forMode: .default)
        } catch {
            throw ExampleFailure("cannot put the main port on the run loop: \(error.message)")
        }
        loop.add(processEnded, forMode: .default)

        // Listing 3-16: register the port using a specific name, which must be unique.
        do {
            try nameServer.register(myPort, name: portName)
        } catch where error.code == .nameInUse {
            myPort.invalidate()
            throw ExampleFailure("the name \"\(portName)\" is taken in \(nameServer.directory): another checkin-main is running; give this one another --name")
        } catch {
            myPort.invalidate()
            throw ExampleFailure("cannot register the main port as \"\(portName)\": \(error.message)")
        }
        registeredAt = .now
    }

    /// The directory the main port's name is registered in.
    var nameDirectory: String { nameServer.directory }

    // MARK: - Launching threads

    /// Launches `count` worker threads, each checked in before the next starts: the first the
    /// guide's long way, the others with `PKWorkerThread`.
    func launchThreads(count: Int) throws(ExampleFailure) {
        for index in stride(from: 1, through: count, by: 1) {
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
        let worker = WorkerRecord(name: name, kind: "thread", transport: Transport.inProcessMailbox, launch: .guide)
        workers.append(worker)
        let started = PKDeadline.now
        let outPort = myPort.makeSendRight()
        Thread.detachNewThread {
            GuideWorker.launchThread(withPort: outPort, name: name)
        }
        try waitForCheckIn(of: worker, startedAt: started, timeout: PKCheckIn.defaultTimeout)
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
                    if !role.handleOnThread(message) { context.requestStop() }
                }
            }
        } catch {
            throw ExampleFailure("\(name) did not check in: \(error.message)")
        }
        let worker = WorkerRecord(name: name, kind: "thread", transport: Transport.inProcessMailbox, launch: .workerThread(thread))
        worker.checkInNanoseconds = nanoseconds(from: started)
        worker.port = thread.port
        workers.append(worker)
    }

    // MARK: - Launching processes

    /// Launches `count` worker processes running `executable`, each checked in before the next
    /// starts: the odd ones check in by name (Listings 3-17 to 3-19), the even ones are
    /// launched by `PKWorkerProcess`, which passes them ports instead.
    func launchProcesses(count: Int, executable: WorkerExecutable) throws(ExampleFailure) {
        let first = workers.count + 1
        for index in stride(from: 0, to: count, by: 1) {
            if index % 2 == 0 {
                try spawnProcessByName(executable)
            } else {
                try launchWorkerProcess(name: "worker-\(first + index)", executable)
            }
        }
    }

    /// Starts `checkin-worker --name <our name>` with Foundation's `Process`. It looks our port
    /// up by name, registers its own as `<our name>.worker-<its pid>`, and checks in with that
    /// name (handled in `checkIn(named:replyPort:)`); run the loop until it has.
    private func spawnProcessByName(_ executable: WorkerExecutable) throws(ExampleFailure) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable.path)
        process.arguments = executable.arguments + ["--name", portName, "--quiet"]
        let ended = processEnded
        let loop = self.loop
        process.terminationHandler = { _ in ended.signal(waking: loop) }
        let started = PKDeadline.now
        do {
            try process.run()
        } catch {
            throw ExampleFailure("cannot start \(executable.path): \(error.localizedDescription)")
        }
        let name = PortNames.worker(main: portName, pid: process.processIdentifier)
        let worker = WorkerRecord(name: name, kind: "process", transport: Transport.namedSocket, launch: .processByName(process))
        workers.append(worker)
        do {
            try waitForCheckIn(of: worker, startedAt: started, timeout: Self.processCheckInTimeout) {
                process.isRunning ? nil : "\(name) \(exitDescription(process)) before checking in"
            }
        } catch {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            throw error
        }
    }

    /// `PKWorkerProcess` starts the worker with a connection to a private check-in port on
    /// descriptor 3 and a send right to our port on descriptor 4, and returns once the worker
    /// has checked in.
    private func launchWorkerProcess(name: String, _ executable: WorkerExecutable) throws(ExampleFailure) {
        let started = PKDeadline.now
        let process: PKWorkerProcess
        do {
            process = try PKWorkerProcess(
                executable: executable.path, arguments: executable.arguments, name: name,
                mainPort: myPort.makeSendRight(), checkInTimeout: Self.processCheckInTimeout)
        } catch {
            throw ExampleFailure("\(name) did not check in: \(error.message)")
        }
        let worker = WorkerRecord(name: name, kind: "process", transport: Transport.passedPort, launch: .workerProcess(process))
        worker.checkInNanoseconds = nanoseconds(from: started)
        worker.port = process.port
        workers.append(worker)
    }

    /// Runs the loop until `worker` has checked in, `gone` says why it never will, or the
    /// timeout passes.
    private func waitForCheckIn(
        of worker: WorkerRecord, startedAt started: PKDeadline, timeout: Duration, gone: () -> String? = { nil }
    ) throws(ExampleFailure) {
        let deadline = PKDeadline.after(timeout)
        while worker.port == nil {
            if let failure { throw failure }
            if let reason = gone() { throw ExampleFailure(reason) }
            guard !deadline.hasPassed else {
                throw ExampleFailure("\(worker.name) did not check in within \(timeout)")
            }
            loop.runOnce(in: .default, before: deadline)
        }
        worker.checkInNanoseconds = nanoseconds(from: started)
    }

    // MARK: - Workers started by hand

    /// How many workers started by hand have checked in.
    var handStartedCount: Int {
        workers.count(where: { if case .byHand = $0.launch { true } else { false } })
    }

    /// Runs the loop until `handStartedWanted` workers started by hand have checked in (some
    /// may have already), printing `invitation` first if any is missing.
    func waitForHandStartedWorkers(timeout: Duration, invitation: [String]) throws(ExampleFailure) {
        let wanted = handStartedWanted
        guard handStartedCount < wanted else { return }
        for line in invitation { printLine(line) }
        let deadline = PKDeadline.after(timeout)
        while handStartedCount < wanted {
            if let failure { throw failure }
            guard !deadline.hasPassed else {
                throw ExampleFailure("\(handStartedCount) of \(wanted) \(wanted == 1 ? "worker" : "workers") started by hand checked in within \(timeout)")
            }
            loop.runOnce(in: .default, before: deadline)
        }
    }

    // MARK: - The main port's handler

    /// Listing 3-13, "Handling Mach port messages", and Listing 3-18, "Receiving the checkin
    /// message": a check-in carries the worker's name, and its port as the reply port;
    /// anything else is a worker's reply.
    private func handlePortMessage(_ portMessage: PKPortMessage) {
        switch portMessage.msgid {
        case ExampleMessage.checkIn:
            checkIn(named: portMessage.text, replyPort: portMessage.replyPort)
        case ExampleMessage.counted:
            guard let reply = CountReply(portMessage) else {
                return fail("a malformed reply arrived (\(portMessage.data.count) bytes)")
            }
            handle(reply)
        default:
            fail("an unexpected message arrived (msgid \(portMessage.msgid))")
        }
    }

    /// Stores the port of a worker that checked in (the guide's `storeDistantPort:` and
    /// `AddPortToListOfActiveThreads`).
    private func checkIn(named name: String, replyPort: PKSendPort?) {
        if let worker = workers.first(where: { $0.name == name }) {
            guard worker.port == nil else { return fail("\(name) checked in twice") }
            switch worker.launch {
            case .guide:
                // Listing 3-13: the worker thread's port is the message's reply port.
                guard let replyPort else { return fail("\(name) checked in without its port") }
                worker.port = replyPort
            case .processByName:
                // Listing 3-18: "You must obtain a remote message port by name."
                worker.port = lookUpWorker(named: name)
            case .workerThread, .workerProcess, .byHand:
                fail("an unexpected check-in arrived from \"\(name)\"")
            }
        } else if handStartedCount < handStartedWanted {
            // A checkin-worker someone started by hand: found by the name it sent.
            guard let port = lookUpWorker(named: name) else { return }
            let worker = WorkerRecord(name: name, kind: "process", transport: Transport.namedSocket, launch: .byHand)
            worker.port = port
            worker.checkInNanoseconds = nanoseconds(from: registeredAt)
            workers.append(worker)
            printLine("checkin-main: \(name) checked in (\(handStartedCount) of \(handStartedWanted) started by hand)")
        } else {
            // Not waiting for it: tell it to stop at once (it exits 0, having counted nothing).
            printLine("checkin-main: turned \(name) away: not waiting for workers started by hand now")
            try? replyPort?.send(PKPortMessage(msgid: ExampleMessage.exit), before: .after(.seconds(1)))
        }
    }

    private func lookUpWorker(named name: String) -> PKSendPort? {
        do {
            return try nameServer.lookUp(name)
        } catch {
            fail("\(name) checked in, but its name cannot be looked up: \(error.message)")
            return nil
        }
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
        // From now on a worker started by hand is turned away.
        handStartedWanted = handStartedCount
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

    /// Stops every worker that checked in and waits for its thread or process to end, then
    /// closes the main port, which also removes its name. Tries every worker even if one
    /// fails, and throws the first failure.
    func shutDown() throws(ExampleFailure) {
        handStartedWanted = 0
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
        loop.remove(processEnded, forMode: .default)
        if let firstFailure { throw firstFailure }
    }

    private func stop(_ worker: WorkerRecord) throws(ExampleFailure) {
        switch worker.launch {
        case .workerThread(let thread):
            // Sends PKWorkerThread's stop message and joins the thread.
            do { try thread.stop() } catch { throw ExampleFailure("cannot stop \(worker.name): \(error.message)") }
        case .guide, .byHand:
            // Ask the worker to leave its loop, then run ours until its port becomes invalid.
            try tellToStop(worker) { gone in gone }
        case .processByName(let process):
            // Ask the worker to leave its loop, then run ours until the process has exited.
            try tellToStop(worker) { _ in !process.isRunning }
            guard process.terminationReason == .exit else {
                throw ExampleFailure("\(worker.name) \(exitDescription(process))")
            }
            worker.exitStatus = process.terminationStatus
            guard process.terminationStatus == 0 else {
                throw ExampleFailure("\(worker.name) \(exitDescription(process))")
            }
        case .workerProcess(let process):
            // Sends PKWorkerProcess's stop message and waits for the process to exit.
            guard let status = process.stop(timeout: Self.stopTimeout) else {
                throw ExampleFailure("\(worker.name) (pid \(process.processID)) did not exit within \(Self.stopTimeout), or died of a signal")
            }
            worker.exitStatus = status
            guard status == 0 else { throw ExampleFailure("\(worker.name) (pid \(process.processID)) exited with status \(status)") }
        }
    }

    /// Sends the exit message (msgid 300) to `worker` and runs the loop until `done` holds,
    /// given whether the worker's port has become invalid.
    private func tellToStop(_ worker: WorkerRecord, until done: (Bool) -> Bool) throws(ExampleFailure) {
        guard let port = worker.port else { return }
        var gone = !port.isValid
        var watch: PKInvalidationWatch?
        if !gone {
            do {
                watch = try port.watchInvalidation(on: loop, forMode: .default) { gone = true }
                try port.send(PKPortMessage(msgid: ExampleMessage.exit), before: .after(.seconds(5)))
            } catch {
                watch?.cancel()
                throw ExampleFailure("cannot stop \(worker.name): \(error.message)")
            }
        }
        defer { watch?.cancel() }
        let deadline = PKDeadline.after(Self.stopTimeout)
        while !done(gone) {
            guard !deadline.hasPassed else {
                if case .processByName(let process) = worker.launch, process.isRunning {
                    kill(process.processIdentifier, SIGKILL)
                }
                throw ExampleFailure("\(worker.name) did not stop within \(Self.stopTimeout)")
            }
            loop.runOnce(in: .default, before: deadline)
        }
    }
}

/// How a process that ended did so: "exited with status 3", "died of signal 9".
func exitDescription(_ process: Process) -> String {
    let pid = "(pid \(process.processIdentifier))"
    switch process.terminationReason {
    case .exit: return "\(pid) exited with status \(process.terminationStatus)"
    case .uncaughtSignal: return "\(pid) died of signal \(process.terminationStatus)"
    @unknown default: return "\(pid) ended (status \(process.terminationStatus))"
    }
}

/// Nanoseconds from `start` to now.
func nanoseconds(from start: PKDeadline) -> UInt64 {
    let now = PKDeadline.now.uptimeNanoseconds
    return now > start.uptimeNanoseconds ? now - start.uptimeNanoseconds : 0
}
