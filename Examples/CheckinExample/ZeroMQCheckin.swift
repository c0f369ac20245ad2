// `--transport zmq`: the same check-in and work over ZeroMQ, for workers on other hosts.
//
//     checkin-main --transport zmq --listen tcp://HOST:PORT [--wait-for-workers N] ...
//     checkin-worker --transport zmq --connect tcp://HOST:PORT
//
// checkin-main binds its port at the --listen endpoint; each worker (a thread or a process
// it starts, or a checkin-worker started by hand on any host) binds a port of its own, and
// checks in with msgid 100 carrying its name and, as the reply port, its own port: the guide's
// handshake, with ports that travel as endpoints. The jobs and tallies are the messages of
// Messages.swift; the summary is the same. Built without the `ZeroMQ` trait, both commands say
// how to build with it.

import ArgumentParser
import Glibc
import PortKit

#if ZeroMQ
import Foundation
import PortKitZeroMQ

extension CheckinMainCommand {
    /// `checkin-main --transport zmq`.
    func runZeroMQ() throws(ExampleFailure) {
        let text = try input.map { path throws(ExampleFailure) in try Corpus.read(path: path) } ?? Corpus.builtIn()
        let job = try Job(text: text, chunkSize: chunkSize, rounds: rounds)
        let main = try ZMQMainRole(listen: listen ?? "tcp://127.0.0.1:*", job: job)
        printLine("checkin-main: over ZeroMQ, \(workers) worker \(workers == 1 ? "thread" : "threads"), "
            + "\(processes) worker \(processes == 1 ? "process" : "processes")"
            + (waitForWorkers > 0 ? ", \(waitForWorkers) started by hand" : "")
            + "; \(grouped(text.count)) bytes in \(grouped(job.chunks.count)) chunks, \(rounds) \(rounds == 1 ? "round" : "rounds")")
        printLine("main port: listening on \(main.endpoint)")
        printLine("")

        var failure: ExampleFailure?
        do {
            try main.launchThreads(count: workers)
            try main.launchProcesses(count: processes, executable: WorkerExecutable.find())
            if waitForWorkers > 0 {
                printLine("checkin-main: waiting up to \(waitTimeout) s for \(waitForWorkers) \(waitForWorkers == 1 ? "worker" : "workers") started by hand; on any host that reaches this one, run:")
                printLine("    swift run --traits ZeroMQ checkin-worker --transport zmq --connect \(shellQuoted(main.endpoint))")
            }
            try main.waitForCheckIns(timeout: .seconds(waitTimeout), byHand: waitForWorkers)
            try main.runJobs(timeout: .seconds(timeout))
        } catch {
            failure = error
        }
        do { try main.shutDown() } catch { failure = failure ?? error }
        if let failure { throw failure }

        let whole = try main.job.verify()
        let work = main.workEnded!.uptimeNanoseconds - main.workStarted!.uptimeNanoseconds
        if waitForWorkers > 0 { printLine("") }
        Summary(workers: main.workers, job: main.job, whole: whole, workNanoseconds: work).print()
    }
}

/// The main thread over ZeroMQ: its port, the workers that checked in, the work. Main-thread
/// only.
final class ZMQMainRole {
    static let transport = "zeromq tcp"
    private let loop = PKRunLoop.current
    private let port: PKZMQReceivePort
    private let processEnded = PKCustomSource {}
    private(set) var job: Job
    private(set) var workers: [WorkerRecord] = []
    /// Each worker's port (its check-in's reply port), by name.
    private var ports: [String: PKZMQSendPort] = [:]
    private var watches: [String: PKZMQInvalidationWatch] = [:]
    private var startedAt: [String: PKDeadline] = [:]
    private var acceptingByHand = 0
    private var failure: ExampleFailure?
    private(set) var workStarted: PKDeadline?
    private(set) var workEnded: PKDeadline?

    var endpoint: String { port.endpoint }

    init(listen: String, job: Job) throws(ExampleFailure) {
        self.job = job
        do {
            port = try PKZMQReceivePort(bindingTo: listen)
            try loop.add(port, forMode: .default)
        } catch {
            throw ExampleFailure("cannot listen on \(listen): \(error.message)")
        }
        loop.add(processEnded, forMode: .default)
        port.handler = { [unowned self] message in self.handle(message) }
    }

    // MARK: - Launching and checking in

    /// Starts `count` threads that check in over ZeroMQ as a worker process would.
    func launchThreads(count: Int) throws(ExampleFailure) {
        let endpoint = port.endpoint
        for index in 0..<count {
            let name = "zmq-thread-\(index + 1)"
            startedAt[name] = .now
            workers.append(WorkerRecord(name: name, kind: "thread", transport: Self.transport, launch: .guide))
            Thread.detachNewThread {
                do throws(ExampleFailure) {
                    try ZMQWorker.serve(connect: endpoint, name: name, waitTimeout: .seconds(20)) { _ in }
                } catch {
                    printError("\(name): \(error.reason)")
                }
            }
        }
    }

    /// Starts `count` worker processes with `--transport zmq --connect <our endpoint>`.
    func launchProcesses(count: Int, executable: WorkerExecutable) throws(ExampleFailure) {
        for _ in 0..<count {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: executable.path)
            let name = "zmq-process-\(workers.count + 1)"
            process.arguments = executable.arguments + ["--connect", port.endpoint, "--worker-name", name, "--quiet"]
            let ended = processEnded
            let loop = self.loop
            process.terminationHandler = { _ in ended.signal(waking: loop) }
            startedAt[name] = .now
            do { try process.run() } catch {
                throw ExampleFailure("cannot start \(executable.path): \(error.localizedDescription)")
            }
            workers.append(WorkerRecord(name: name, kind: "process", transport: Self.transport, launch: .processByName(process)))
        }
    }

    /// Runs the loop until every worker launched here, and `byHand` more, have checked in.
    func waitForCheckIns(timeout: Duration, byHand: Int) throws(ExampleFailure) {
        acceptingByHand = byHand
        let deadline = PKDeadline.after(timeout)
        while workers.contains(where: { ports[$0.name] == nil }) || acceptingByHand > 0 {
            if let failure { throw failure }
            for worker in workers where ports[worker.name] == nil {
                if case .processByName(let process) = worker.launch, !process.isRunning {
                    throw ExampleFailure("\(worker.name) \(exitDescription(process)) before checking in")
                }
            }
            guard !deadline.hasPassed else {
                let missing = workers.filter { ports[$0.name] == nil }.map(\.name) + (acceptingByHand > 0 ? ["\(acceptingByHand) started by hand"] : [])
                throw ExampleFailure("no check-in within \(timeout) from \(missing.joined(separator: ", "))")
            }
            loop.runOnce(in: .default, before: deadline)
        }
        acceptingByHand = 0
    }

    private func handle(_ message: PKZMQMessage) {
        switch message.msgid {
        case ExampleMessage.checkIn:
            checkIn(named: message.text, port: message.replyPort)
        case ExampleMessage.counted:
            guard let reply = CountReply(PKPortMessage(dataOf: message)) else {
                return fail("a malformed reply (\(message.data.count) bytes)")
            }
            handle(reply)
        default:
            fail("an unexpected message (msgid \(message.msgid))")
        }
    }

    /// The guide's check-in: store the worker's port (`[portMessage sendPort]`).
    private func checkIn(named name: String, port: PKZMQSendPort?) {
        guard let port else { return fail("\(name) checked in without its port") }
        if workers.contains(where: { $0.name == name }) {
            guard ports[name] == nil else { return fail("\(name) checked in twice") }
        } else {
            guard acceptingByHand > 0 else {
                // Too late, or one too many: tell it to go.
                try? port.send(PKZMQMessage(msgid: ExampleMessage.exit), timeout: .seconds(1))
                return
            }
            acceptingByHand -= 1
            startedAt[name] = .now
            workers.append(WorkerRecord(name: name, kind: "process", transport: Self.transport, launch: .byHand))
            printLine("checkin-main: \(name) checked in from \(port.endpoint)")
        }
        let worker = workers.first { $0.name == name }!
        ports[name] = port
        worker.checkInNanoseconds = nanoseconds(from: startedAt[name] ?? .now)
    }

    private func fail(_ reason: String) {
        if failure == nil { failure = ExampleFailure(reason) }
    }

    // MARK: - The work

    /// Hands out every job and collects every reply, one job in flight per worker.
    func runJobs(timeout: Duration) throws(ExampleFailure) {
        for worker in workers {
            guard let port = ports[worker.name] else { continue }
            do {
                watches[worker.name] = try port.watchInvalidation(on: loop, forMode: .default) { [unowned self] in
                    self.fail("\(worker.name) went away before the work was done")
                }
            } catch {
                throw ExampleFailure("cannot watch \(worker.name)'s port: \(error.message)")
            }
        }
        defer {
            for watch in watches.values { watch.cancel() }
            watches = [:]
        }
        workStarted = .now
        for worker in workers { sendNextJob(to: worker) }
        let deadline = PKDeadline.after(timeout)
        while !job.isFinished {
            if let failure { throw failure }
            guard !deadline.hasPassed else { throw ExampleFailure("the work did not finish within \(timeout)") }
            loop.runOnce(in: .default, before: deadline)
        }
        if let failure { throw failure }
        workEnded = .now
    }

    private func sendNextJob(to worker: WorkerRecord) {
        guard failure == nil, let port = ports[worker.name], let request = job.next() else { return }
        worker.inFlight = (request.jobID, .now)
        do {
            try port.send(PKZMQMessage(dataOf: request.message), before: .after(.seconds(5)))
        } catch {
            fail("cannot send a job to \(worker.name): \(error.message)")
        }
    }

    private func handle(_ reply: CountReply) {
        guard let worker = workers.first(where: { $0.inFlight?.jobID == reply.jobID }), let (_, sentAt) = worker.inFlight else {
            return fail("a reply arrived for job \(reply.jobID), which no worker has")
        }
        worker.inFlight = nil
        worker.roundTrips.append(nanoseconds(from: sentAt))
        worker.countingTimes.append(reply.countingNanoseconds)
        guard job.record(reply.tally, forJob: reply.jobID, by: worker.name) else {
            return fail("\(worker.name) answered job \(reply.jobID) twice")
        }
        sendNextJob(to: worker)
    }

    // MARK: - Shutting down

    /// Tells every worker that checked in to exit (msgid 300), and runs the loop until its port
    /// is gone and, for a process it started, until the process exited with status 0.
    func shutDown() throws(ExampleFailure) {
        var firstFailure: ExampleFailure?
        for worker in workers {
            guard let port = ports[worker.name] else {
                if case .processByName(let process) = worker.launch, process.isRunning { kill(process.processIdentifier, SIGKILL) }
                continue
            }
            var gone = !port.isValid
            let watch = try? port.watchInvalidation(on: loop, forMode: .default) { gone = true }
            try? port.send(PKZMQMessage(msgid: ExampleMessage.exit), timeout: .seconds(5))
            let deadline = PKDeadline.after(.seconds(10))
            func done() -> Bool {
                if case .processByName(let process) = worker.launch { return !process.isRunning }
                return gone
            }
            while !done() && !deadline.hasPassed { loop.runOnce(in: .default, before: deadline) }
            watch?.cancel()
            if case .processByName(let process) = worker.launch {
                if process.isRunning { kill(process.processIdentifier, SIGKILL) }
                process.waitUntilExit()
                worker.exitStatus = process.terminationReason == .exit ? process.terminationStatus : nil
                if worker.exitStatus != 0 {
                    if firstFailure == nil { firstFailure = ExampleFailure("\(worker.name) \(exitDescription(process))") }
                    continue
                }
            } else if !gone {
                if firstFailure == nil { firstFailure = ExampleFailure("\(worker.name) did not stop within 10 s") }
                continue
            }
            worker.stopped = true
        }
        port.invalidate()
        processEnded.invalidate()
        if let firstFailure { throw firstFailure }
    }
}

/// A worker over ZeroMQ, in a process or a thread.
enum ZMQWorker {
    /// Connects to the main port at `connect`, binds a port of its own (on the local address
    /// that reaches `connect`), checks in, counts until told to stop (msgid 300).
    static func serve(connect: String, name: String, waitTimeout: Duration, say: (String) -> Void) throws(ExampleFailure) {
        let loop = PKRunLoop.current
        let mainPort: PKZMQSendPort
        let myPort: PKZMQReceivePort
        do {
            mainPort = try PKZMQSendPort(connectingTo: connect)
            myPort = try PKZMQReceivePort(bindingTo: PKZMQEndpoint.localTCP(toward: connect) ?? "tcp://*:*")
        } catch {
            throw ExampleFailure("cannot set up over ZeroMQ (\(connect)): \(error.message)")
        }
        var next = WorkerRole.Next.carryOn
        var jobs = 0
        myPort.handler = { message in
            switch message.msgid {
            case ExampleMessage.count:
                guard let request = CountRequest(PKPortMessage(dataOf: message)) else {
                    next = .giveUp("a malformed job")
                    return
                }
                let started = PKDeadline.now
                let tally = Tally(counting: request.chunk[...])
                let reply = CountReply(jobID: request.jobID, tally: tally, countingNanoseconds: nanoseconds(from: started))
                do throws(PKError) {
                    try mainPort.send(PKZMQMessage(dataOf: reply.message), before: .after(.seconds(5)))
                    jobs += 1
                } catch {
                    next = .giveUp("cannot reply to checkin-main: \(error.message)")
                }
            case ExampleMessage.exit:
                next = .exit
            default:
                next = .giveUp("an unexpected message (msgid \(message.msgid))")
            }
        }
        defer { myPort.invalidate() }
        do {
            try loop.add(myPort, forMode: .default)
            // The guide's check-in: our name, and our port as the reply port. The send waits
            // for checkin-main to be there, up to the timeout.
            let checkIn = PKZMQMessage(msgid: ExampleMessage.checkIn, data: Array(name.utf8), replyPort: myPort.makeSendRight())
            try mainPort.send(checkIn, before: .after(waitTimeout))
        } catch {
            throw ExampleFailure("cannot check in with checkin-main at \(connect): \(error.message)")
        }
        let watch = try? mainPort.watchInvalidation(on: loop, forMode: .default) {
            if next == .carryOn { next = .giveUp("checkin-main went away before telling \(name) to stop") }
        }
        defer { watch?.cancel() }
        say("checked in with \(connect) as \"\(name)\" (port \(myPort.endpoint)); counting until told to stop")
        while next == .carryOn { loop.runOnce(in: .default, before: .distantFuture) }
        if case .giveUp(let reason) = next { throw ExampleFailure(reason) }
        say("\(name) counted \(jobs) \(jobs == 1 ? "chunk" : "chunks"); told to stop, exiting")
    }
}

extension PKPortMessage {
    /// The data of a ZeroMQ message as a core message, to reuse Messages.swift's decoders.
    init(dataOf message: PKZMQMessage) {
        self.init(msgid: message.msgid, components: message.components.compactMap { $0.data.map(PKPortComponent.data) })
    }
}
#else
extension CheckinMainCommand {
    /// Without the trait there is no ZeroMQ: say how to get it.
    func runZeroMQ() throws(ExampleFailure) { throw ZeroMQUnavailable.failure }
}

enum ZMQWorker {
    static func serve(connect: String, name: String, waitTimeout: Duration, say: (String) -> Void) throws(ExampleFailure) {
        throw ZeroMQUnavailable.failure
    }
}

private enum ZeroMQUnavailable {
    static let failure = ExampleFailure("this program was built without ZeroMQ; build it with `swift build --traits ZeroMQ` (needs libzmq3-dev)")
}
#endif

/// `checkin-worker --transport zmq --connect ENDPOINT` (and `checkin-main worker --connect
/// ENDPOINT`), or the Unix-socket worker.
func runWorker(_ options: WorkerOptions) throws {
    // --connect implies --transport zmq (`checkin-main worker` cannot take --transport: its
    // parent command's option of that name takes it).
    guard let connect = options.connect else { return try ProcessWorker.run(options) }
    let name = options.workerName ?? "zmq-worker-\(getpid())"
    do {
        try ZMQWorker.serve(connect: connect, name: name, waitTimeout: .seconds(options.waitTimeout)) { line in
            if !options.quiet { printLine("checkin-worker: \(line)") }
        }
    } catch {
        printError("checkin-worker: \(error.reason)")
        throw ExitCode.failure
    }
}
