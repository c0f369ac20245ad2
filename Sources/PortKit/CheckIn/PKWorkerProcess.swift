// A worker process checked in by passing a port: the launcher hands the child a connection to
// a private check-in port as an inherited descriptor; the child sends its own port back in the
// check-in message (an anonymous port crosses the process boundary; protocol.md section 6.2).

import Synchronization

/// A worker process that has checked in (the guide's check-in, between processes, by passing a
/// port rather than a name).
///
/// `init` spawns the executable (with `posix_spawn`, never `fork`) and gives it a connection to
/// a private check-in port on descriptor 3 (and, if given, a send right to `mainPort` on
/// descriptor 4); the child calls `PKWorkerProcess.serve(setUp:)`, which checks in the way a
/// worker thread does. `init` returns once the child checked in, or throws if it does not in
/// time or dies first. `stop` asks it to stop and waits for it to exit. The child starts with
/// no signal blocked and none ignored, whatever the launching thread blocks; it lives while
/// its launcher keeps this object (and the launcher's process) alive: the check-in connection
/// stays open until then, and the child's loop ends when it closes.
public final class PKWorkerProcess: @unchecked Sendable {
    /// The child's process id.
    public var processID: Int32 { child.pid }
    /// A send right to the child's port.
    public let port: PKSendPort
    /// The data the child sent with its check-in.
    public let checkInData: [UInt8]
    /// The worker's name.
    public let name: String

    private let child: ChildProcess
    /// The launcher's end of the child's check-in connection, kept open while the child runs
    /// (copies of its descriptor): the child learns of the launcher's death when it closes.
    private let checkInConnection: [Int32]
    private let stopped = Atomic<Bool>(false)

    static let checkInDescriptor: Int32 = 3
    static let mainPortDescriptor: Int32 = 4
    static let environmentKey = "PORTKIT_WORKER"

    /// Spawns `executable` and waits for it to check in.
    ///
    /// - Parameters:
    ///   - executable: the program's path; it must call `PKWorkerProcess.serve(setUp:)`.
    ///   - arguments: its arguments.
    ///   - name: the worker's name (the child sees it as `PKWorkerContext.name`).
    ///   - mainPort: a port the child can report to (`PKWorkerContext.mainPort`).
    ///   - checkInTimeout: how long the child has to check in.
    /// - Throws: `PKError` with `.checkInTimedOut`, `.checkInFailed` (the child exited first),
    ///   `.interrupted` (the calling thread's loop was stopped while it waited; the child is
    ///   killed and the stop passed on to the run the launch was made in), or `.system` if it
    ///   could not be started, or its check-in connection not kept (out of descriptors: the
    ///   child is killed).
    public init(
        executable: String, arguments: [String] = [], name: String = "PKWorkerProcess",
        mainPort: PKSendPort? = nil, checkInTimeout: Duration = PKCheckIn.defaultTimeout
    ) throws(PKError) {
        self.name = name
        let listener = try CheckInListener()
        // The child gets a connection to the check-in port (and maybe to mainPort); our copies
        // close as soon as it is started, or the listener would never see the child die.
        var inherit = [(try listener.makeWorkerConnection(), Self.checkInDescriptor)]
        defer { for (fd, _) in inherit { Descriptor.close(fd) } }
        if let mainPort {
            inherit.append((try mainPort.makeTransferDescriptor(before: .after(checkInTimeout)), Self.mainPortDescriptor))
        }
        child = try ChildProcess(
            path: executable, arguments: arguments,
            environment: [Self.environmentKey: Self.environmentValue(name: name, hasMainPort: mainPort != nil)],
            inherit: inherit)
        for (fd, _) in inherit { Descriptor.close(fd) }
        inherit = []
        do throws(PKError) {
            let checkIn = try listener.wait(for: name, until: .after(checkInTimeout), keepOpen: true)
            (port, checkInData) = (checkIn.port, checkIn.data)
            checkInConnection = checkIn.kept
        } catch {
            child.kill(SIGKILL_VALUE)
            _ = child.waitUntilExit(until: .after(.seconds(5)))
            throw error
        }
    }

    /// Whether this process was started by `PKWorkerProcess` and should call `serve(setUp:)`.
    public static var isLaunchedWorker: Bool { Files.environment(environmentKey) != nil }

    /// In a process started by `PKWorkerProcess`: checks in with the launcher (msgid 100, this
    /// process's port as the reply port) and serves messages on the main thread's loop until
    /// told to stop, or until the launcher dies (its end of the check-in connection closes).
    /// The counterpart of `PKWorkerThread`'s thread body. It removes `PORTKIT_WORKER` from the
    /// environment first, so that a PortKit program the worker starts is not taken for a
    /// worker (call it before starting threads that read the environment).
    ///
    /// - Parameter setUp: runs before the check-in; set `context.port.handler` here.
    /// - Throws: `PKError` with `.checkInFailed` if this process was not launched as a worker or
    ///   could not check in (with the reason `setUp` threw, if it did).
    public static func serve(setUp: (PKWorkerContext) throws -> Void) throws(PKError) {
        guard let value = Files.environment(environmentKey) else {
            throw PKError(.checkInFailed, "this process was not started by PKWorkerProcess (\(environmentKey) is not set)")
        }
        guard let parsed = parseEnvironmentValue(value) else {
            throw PKError(.checkInFailed, "\(environmentKey) is \"\(value.prefix(80))\", not NAME:0 or NAME:1")
        }
        let (name, hasMain) = parsed
        // Programs this worker starts are not workers of the launcher's: they must not see it.
        Files.removeEnvironment(environmentKey)
        // Each must be what the launcher gave: a connected Unix stream socket (run by hand, with
        // the variable set and the descriptor missing, the adoption's fcntl trapped on EBADF).
        for (fd, role) in [(checkInDescriptor, "the check-in connection")] + (hasMain ? [(mainPortDescriptor, "the right to the main port")] : []) {
            guard Socket.isUnixStream(fd) else {
                throw PKError(.checkInFailed, "\(environmentKey) is set, but descriptor \(fd), \(role), is not an inherited Unix stream socket (this process was not started by PKWorkerProcess)")
            }
        }
        let checkInRight = PKSendPort(connection: SendConnection(takingOwnershipOf: try Descriptor.adoptInherited(checkInDescriptor)))
        let mainPort = hasMain ? PKSendPort(connection: SendConnection(takingOwnershipOf: try Descriptor.adoptInherited(mainPortDescriptor))) : nil
        try WorkerRuntime.serve(name: name, mainPort: mainPort, checkInRight: checkInRight, watchLauncher: true, setUp: setUp)
    }

    /// What the launcher puts in `PORTKIT_WORKER`: the worker's name, a colon, and 1 if the
    /// child gets a send right to `mainPort` on descriptor 4, else 0.
    static func environmentValue(name: String, hasMainPort: Bool) -> String {
        "\(name):\(hasMainPort ? 1 : 0)"
    }

    /// Reads `PORTKIT_WORKER`: the name is everything before the last colon (it may hold
    /// colons), and what follows must be exactly 0 or 1; anything else is nil. The inverse of
    /// `environmentValue(name:hasMainPort:)` (`CheckInFuzzing` checks both ways).
    static func parseEnvironmentValue(_ value: String) -> (name: String, hasMainPort: Bool)? {
        guard let colon = value.utf8.lastIndex(of: UInt8(ascii: ":")) else { return nil }
        let flag = value.utf8[value.utf8.index(after: colon)...]
        guard flag.count == 1, let digit = flag.first, digit == UInt8(ascii: "0") || digit == UInt8(ascii: "1") else {
            return nil
        }
        return (String(value[..<colon]), digit == UInt8(ascii: "1"))
    }

    /// Asks the child to stop and waits for it to exit; kills it (SIGKILL) if it has not
    /// exited by the deadline.
    ///
    /// - Returns: the child's exit code, or nil if it had to be killed or died of a signal.
    @discardableResult
    public func stop(timeout: Duration = .seconds(5)) -> Int32? {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return nil }
        let deadline = PKDeadline.after(timeout)
        try? port.send(PKPortMessage(msgid: PKCheckIn.stopMessageID), before: deadline)
        if let status = child.waitUntilExit(until: deadline) { return status.signal == 0 ? status.code : nil }
        child.kill(SIGKILL_VALUE)
        _ = child.waitUntilExit(until: .after(.seconds(5)))
        return nil
    }

    /// Tests: the descriptors that keep the child's check-in connection open.
    var checkInConnectionForTests: [Int32] { checkInConnection }

    /// Sends `signal` to the child (for example `SIGKILL`, to test a dying peer).
    public func kill(signal: Int32) { child.kill(signal) }

    /// Waits for the child to exit on its own, up to `deadline`.
    ///
    /// - Returns: the exit code and terminating signal (0 when it exited), or nil if it runs.
    public func waitUntilExit(until deadline: PKDeadline) -> (code: Int32, signal: Int32)? {
        child.waitUntilExit(until: deadline)
    }

    deinit {
        if !stopped.load(ordering: .acquiring) { stop(timeout: .seconds(2)) }
        // After the stop message: the child sees its launcher leave only then.
        for fd in checkInConnection { Descriptor.close(fd) }
    }
}
