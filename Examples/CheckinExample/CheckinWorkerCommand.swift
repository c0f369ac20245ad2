// `checkin-worker`: a worker process. It finds checkin-main's port by name (waiting for it up
// to a deadline), makes its own port, registers it under its own name and checks in with that
// name (Listings 3-17 to 3-19), counts what it is given, and exits 0 when told to stop. Started
// by `PKWorkerProcess` instead, it checks in over the descriptors it inherited.

import ArgumentParser
import PortKit

/// The options of `checkin-worker` (and of `checkin-main worker`, the same role).
struct WorkerOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The name checkin-main registered its port under.", valueName: "name"))
    var name = PortNames.defaultMain

    @Option(help: ArgumentHelp("The name to register this worker's port under (default: <name>.worker-<pid>).", valueName: "name"))
    var workerName: String?

    @Option(help: ArgumentHelp("How long to wait for checkin-main's name to appear, in seconds.", valueName: "seconds"))
    var waitTimeout = 60

    @Flag(help: "Print nothing but a failure (checkin-main passes this to the workers it spawns).")
    var quiet = false

    @Option(help: ArgumentHelp("unix (find checkin-main by --name, the default) or zmq (connect to it with --connect; needs the ZeroMQ trait).", valueName: "transport"))
    var transport = "unix"

    @Option(help: ArgumentHelp("With --transport zmq (which it implies): checkin-main's --listen endpoint, tcp://HOST:PORT.", valueName: "endpoint"))
    var connect: String?

    init() {}

    func validate() throws {
        guard !name.isEmpty, name.count <= PortNames.maxMainLength || workerName != nil else {
            throw ValidationError("--name must be 1 to \(PortNames.maxMainLength) characters, or give --worker-name too")
        }
        guard waitTimeout >= 0 else { throw ValidationError("--wait-timeout must not be negative") }
        guard transport == "unix" || transport == "zmq" else { throw ValidationError("--transport must be unix or zmq") }
        guard connect != nil || transport != "zmq" else { throw ValidationError("--transport zmq goes with --connect tcp://HOST:PORT") }
    }
}

/// The `checkin-worker` command. Its executable's `main.swift` only calls `main()`.
public struct CheckinWorkerCommand: ParsableCommand {
    /// The command's name and help.
    public static let configuration = CommandConfiguration(
        commandName: "checkin-worker",
        abstract: "A worker process: check in with checkin-main by name, count what it sends, exit when told to.",
        discussion: """
            Looks up the port checkin-main registered under --name (waiting up to \
            --wait-timeout seconds for it to appear), registers its own port as \
            <name>.worker-<pid>, and sends that name in the check-in message (msgid 100), as \
            Listings 3-17 to 3-19 of Apple's Threading Programming Guide do with \
            CFMessagePort. Then it counts the chunks it is sent until checkin-main tells it to \
            stop, and exits 0. Start checkin-main with --wait-for-workers N to have it wait \
            for workers started by hand. On failure it prints one line to standard error and \
            exits 1.
            """
    )

    @OptionGroup var options: WorkerOptions

    /// The command with its default options (ArgumentParser fills them in).
    public init() {}

    /// Runs the worker; on failure prints one line to standard error and exits with 1.
    public func run() throws {
        try runWorker(options)  // ZeroMQCheckin.swift: ProcessWorker, or the ZeroMQ worker
    }
}

/// `checkin-main worker`: the same role, for when checkin-main finds no `checkin-worker` next
/// to it (a fresh clone, after `swift run checkin-main` built only checkin-main). Hidden from
/// the help.
struct WorkerRoleCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "worker",
        abstract: "Play checkin-worker (checkin-main runs itself this way when checkin-worker is not built).",
        shouldDisplay: false
    )

    @OptionGroup var options: WorkerOptions

    func run() throws {
        try runWorker(options)
    }
}
