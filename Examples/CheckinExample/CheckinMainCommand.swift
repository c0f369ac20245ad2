// `checkin-main`: the main thread registers its port under a name, launches worker threads
// and worker processes, each checks in the guide's way (msgid 100 carrying its own port or
// its port's name), hands them the chunks of a text to count, collects the tallies while its
// run loop runs, checks them, stops every worker and prints a summary.

import ArgumentParser
import PortKit

/// The `checkin-main` command. Its executable's `main.swift` only calls `main()`.
public struct CheckinMainCommand: ParsableCommand {
    /// The command's name and help.
    public static let configuration = CommandConfiguration(
        commandName: "checkin-main",
        abstract: "Launch worker threads and processes that check in, hand them work, and print the round trips.",
        // Said here because the hidden `worker` subcommand would otherwise add `<subcommand>`.
        usage: """
            checkin-main [--workers <count>] [--processes <count>] [--name <name>] \
            [--wait-for-workers <count>] [--wait-timeout <seconds>] [--input <path>] [--rounds <rounds>] \
            [--chunk-size <bytes>] [--timeout <seconds>] [--transport unix|zmq] [--listen <endpoint>]
            """,
        discussion: """
            The main port is registered under --name. The first worker thread is launched as \
            Listings 3-12 to 3-15 of Apple's Threading Programming Guide spell it out; the \
            others with PKWorkerThread, which does the same in one call. Of the worker \
            processes (checkin-worker, or this program in the worker role when checkin-worker \
            is not built next to it), the first, third, ... look the main port up by name and \
            check in with their own port's name (Listings 3-17 to 3-19); the others are \
            launched by PKWorkerProcess, which passes them ports instead. With \
            --wait-for-workers N it also waits for N checkin-worker processes started by hand \
            from another shell. Each job is a chunk of text: the worker counts its words, \
            hashes it (FNV-1a) and replies; the main thread checks every tally against a \
            single-threaded pass.
            """,
        subcommands: [WorkerRoleCommand.self]
    )

    @Option(help: ArgumentHelp("How many worker threads to launch (0 to 64).", valueName: "count"))
    var workers = 4

    @Option(help: ArgumentHelp("How many worker processes to spawn (0 to 16).", valueName: "count"))
    var processes = 2

    @Option(help: ArgumentHelp("The name to register the main port under; checkin-worker takes the same --name.", valueName: "name"))
    var name = PortNames.defaultMain

    @Option(help: ArgumentHelp("Also wait for this many checkin-worker processes started by hand before handing out work.", valueName: "count"))
    var waitForWorkers = 0

    @Option(help: ArgumentHelp("How long to wait for the workers started by hand, in seconds.", valueName: "seconds"))
    var waitTimeout = 60

    @Option(help: ArgumentHelp("A text file to count (default: a built-in text of about 1 MiB).", valueName: "path"))
    var input: String?

    @Option(help: "How many times to count the whole text.")
    var rounds = 2

    @Option(help: ArgumentHelp("About how many bytes each job carries (chunks end at white space).", valueName: "bytes"))
    var chunkSize = 8192

    @Option(help: ArgumentHelp("How long the work may take, in seconds.", valueName: "seconds"))
    var timeout = 60

    @Option(help: ArgumentHelp("unix (named Unix sockets, the default) or zmq (ZeroMQ, for workers on other hosts; needs the ZeroMQ trait).", valueName: "transport"))
    var transport = "unix"

    @Option(help: ArgumentHelp("With --transport zmq: the endpoint to listen on (default tcp://127.0.0.1:*); workers on other hosts need tcp://ADDRESS:PORT.", valueName: "endpoint"))
    var listen: String?

    /// The command with its default options (ArgumentParser fills them in).
    public init() {}

    /// Rejects options out of range; ArgumentParser then prints the usage and exits with 64.
    public func validate() throws {
        guard (0...64).contains(workers) else { throw ValidationError("--workers must be from 0 to 64") }
        guard (0...16).contains(processes) else { throw ValidationError("--processes must be from 0 to 16") }
        guard (0...64).contains(waitForWorkers) else { throw ValidationError("--wait-for-workers must be from 0 to 64") }
        guard workers + processes + waitForWorkers >= 1 else {
            throw ValidationError("there must be at least one worker: --workers, --processes or --wait-for-workers")
        }
        guard (1...PortNames.maxMainLength).contains(name.count) else {
            throw ValidationError("--name must be 1 to \(PortNames.maxMainLength) characters (workers register <name>.worker-<pid>)")
        }
        guard waitTimeout >= 1 else { throw ValidationError("--wait-timeout must be at least 1") }
        guard (1...Job.maxJobs).contains(rounds) else { throw ValidationError("--rounds must be from 1 to \(Job.maxJobs)") }
        guard chunkSize >= 1 else { throw ValidationError("--chunk-size must be at least 1") }
        guard timeout >= 1 else { throw ValidationError("--timeout must be at least 1") }
        guard transport == "unix" || transport == "zmq" else { throw ValidationError("--transport must be unix or zmq") }
        guard listen == nil || transport == "zmq" else { throw ValidationError("--listen goes with --transport zmq") }
    }

    /// Runs the example; on failure prints one line to standard error and exits with 1.
    public func run() throws {
        do {
            try runExample()
        } catch {
            printError("checkin-main: \(error.reason)")
            throw ExitCode.failure
        }
    }

    private func runExample() throws(ExampleFailure) {
        if transport == "zmq" { return try runZeroMQ() }  // ZeroMQCheckin.swift
        // The work: a text cut into chunks at white space, counted `rounds` times.
        let text = try input.map { path throws(ExampleFailure) in try Corpus.read(path: path) } ?? Corpus.builtIn()
        let job = try Job(text: text, chunkSize: chunkSize, rounds: rounds)
        let executable = WorkerExecutable.find()
        var who = ["\(workers) worker \(workers == 1 ? "thread" : "threads")", "\(processes) worker \(processes == 1 ? "process" : "processes")"]
        if waitForWorkers > 0 { who.append("\(waitForWorkers) started by hand") }
        printLine("checkin-main: \(who.joined(separator: ", ")), \(input ?? "built-in text"): "
            + "\(grouped(text.count)) bytes in \(grouped(job.chunks.count)) chunks of about \(grouped(chunkSize)) bytes, "
            + "\(rounds) \(rounds == 1 ? "round" : "rounds")")

        // The main thread's port on the main run loop, registered under its name.
        let main = try MainRole(job: job, portName: name, handStartedWorkers: waitForWorkers)
        printLine("main port: registered as \"\(name)\" in \(main.nameDirectory)")
        if processes > 0 {
            printLine("worker processes run: "
                + (executable.isCheckinWorker ? executable.path : "\(executable.path) worker (checkin-worker is not built next to it)"))
        }
        printLine("")

        // The workers, each checked in; then the work, while the main run loop runs.
        var failure: ExampleFailure?
        do {
            try main.launchThreads(count: workers)
            try main.launchProcesses(count: processes, executable: executable)
            if waitForWorkers > 0 {
                try main.waitForHandStartedWorkers(timeout: .seconds(waitTimeout), invitation: invitation(executable))
            }
            try main.runJobs(timeout: .seconds(timeout))
        } catch {
            failure = error
        }

        // Stop every worker that checked in, whatever happened.
        do { try main.shutDown() } catch { failure = failure ?? error }
        if let failure { throw failure }

        // Check every tally against a single-threaded pass, then print the figures.
        let whole = try main.job.verify()
        let work = main.workEnded!.uptimeNanoseconds - main.workStarted!.uptimeNanoseconds
        if waitForWorkers > 0 { printLine("") }
        Summary(workers: main.workers, job: main.job, whole: whole, workNanoseconds: work).print()
    }

    /// What to tell the user when waiting for workers started by hand: the exact command.
    private func invitation(_ executable: WorkerExecutable) -> [String] {
        // Another shell needs the same name directory; say so when it was chosen explicitly.
        let directory = environment("PORTKIT_NAME_DIRECTORY").map { "PORTKIT_NAME_DIRECTORY=\(shellQuoted($0)) " } ?? ""
        let built = executable.isCheckinWorker ? shellQuoted(executable.path) : "\(shellQuoted(executable.path)) worker"
        return [
            "checkin-main: waiting up to \(waitTimeout) s for \(waitForWorkers) \(waitForWorkers == 1 ? "worker" : "workers") started by hand; from another shell, in this package, run:",
            "    \(directory)swift run checkin-worker --name \(shellQuoted(name))",
            "  or, without building:",
            "    \(directory)\(built) --name \(shellQuoted(name))",
        ]
    }
}
