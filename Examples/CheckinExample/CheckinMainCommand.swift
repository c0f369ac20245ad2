// `checkin-main`: the main thread launches worker threads, each checks in the guide's way
// (msgid 100 carrying its own port), hands them the chunks of a text to count, collects the
// tallies while its run loop runs, checks them, stops every worker and prints a summary.

import ArgumentParser
import PortKit

/// The `checkin-main` command. Its executable's `main.swift` only calls `main()`.
public struct CheckinMainCommand: ParsableCommand {
    /// The command's name and help.
    public static let configuration = CommandConfiguration(
        commandName: "checkin-main",
        abstract: "Launch worker threads that check in, hand them work, and print the round trips.",
        discussion: """
            The first worker is launched as Listings 3-12 to 3-15 of Apple's Threading \
            Programming Guide spell it out; the others with PKWorkerThread, which does the \
            same in one call. Each job is a chunk of text: the worker counts its words, hashes \
            it (FNV-1a) and replies; the main thread checks every tally against a \
            single-threaded pass.
            """
    )

    @Option(help: "How many worker threads to launch (1 to 64).")
    var workers = 4

    @Option(help: ArgumentHelp("A text file to count (default: a built-in text of about 1 MiB).", valueName: "path"))
    var input: String?

    @Option(help: "How many times to count the whole text.")
    var rounds = 2

    @Option(help: ArgumentHelp("About how many bytes each job carries (chunks end at white space).", valueName: "bytes"))
    var chunkSize = 8192

    @Option(help: ArgumentHelp("How long the work may take, in seconds.", valueName: "seconds"))
    var timeout = 60

    /// The command with its default options (ArgumentParser fills them in).
    public init() {}

    /// Rejects options out of range; ArgumentParser then prints the usage and exits with 64.
    public func validate() throws {
        guard (1...64).contains(workers) else { throw ValidationError("--workers must be from 1 to 64") }
        guard rounds >= 1 else { throw ValidationError("--rounds must be at least 1") }
        guard chunkSize >= 1 else { throw ValidationError("--chunk-size must be at least 1") }
        guard timeout >= 1 else { throw ValidationError("--timeout must be at least 1") }
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
        // The work: a text cut into chunks at white space, counted `rounds` times.
        let text = try input.map { path throws(ExampleFailure) in try Corpus.read(path: path) } ?? Corpus.builtIn()
        let job = Job(text: text, chunkSize: chunkSize, rounds: rounds)
        guard job.count <= Int(UInt32.max) else { throw ExampleFailure("too many jobs: use a larger --chunk-size") }
        print("checkin-main: \(workers) worker \(workers == 1 ? "thread" : "threads"), \(input ?? "built-in text"): "
            + "\(grouped(text.count)) bytes in \(grouped(job.chunks.count)) chunks of about \(grouped(chunkSize)) bytes, "
            + "\(rounds) \(rounds == 1 ? "round" : "rounds")")
        print("")

        // The main thread's port on the main run loop, then the workers, each checked in.
        let main = try MainRole(job: job)
        var failure: ExampleFailure?
        do {
            try main.launchWorkers(count: workers)
            // Hand out the jobs and collect the tallies while the main run loop runs.
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
        Summary(workers: main.workers, job: main.job, whole: whole, workNanoseconds: work).print()
    }
}
