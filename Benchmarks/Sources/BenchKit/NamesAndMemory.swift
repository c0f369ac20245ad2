// Name lookup with many names registered, and user-space memory per idle port.

import CBench
import Dispatch
import Glibc
import PortKit

/// `lookUp` of a registered name (and dropping the right), with `count` names registered in the
/// directory by `ownerCount` helper processes, the names split evenly between them (at most
/// `namesPerOwner` each). The owners run on the second CPU of `placement`.
///
/// The lookups walk `lookupSlots` slots with a stride, the slots split between the owners as
/// evenly as the names: a slot is looked up as a name of the owner its share falls to. So
/// rows with the same owners wake them in the same order, whatever their names: the 10,000
/// names' row and its baseline, one name in each of the same owners, differ only by the
/// names. (Which owner a lookup wakes moves the figure by itself: with 9,000 names in one
/// owner a lookup took 1.5 x one name's; in two owners, 2.1 to 2.2 x. docs/performance-history.md.)
public final class PortKitNameLookup: Workload {
    private let driver: PinnedDriver
    private let owners: [Int32]
    private let directory: String

    /// A name holds two descriptors (its socket and its lock) and the descriptor limit here is
    /// 20,000, which a process cannot raise.
    public static let namesPerOwner = 5_000
    /// The slots the lookups walk (see above).
    static let lookupSlots = 10_000

    /// The owner processes `count` names need.
    public static func owners(for count: Int) -> Int { (count + namesPerOwner - 1) / namesPerOwner }

    public init(_ placement: Placement, names count: Int, owners ownerCount: Int) throws {
        precondition(ownerCount >= 1 && count >= ownerCount && count <= ownerCount * Self.namesPerOwner)
        let directory = try makeScratchDirectory("pkbench-names")
        self.directory = directory
        var owners: [Int32] = []
        // Owner k holds the names firstName[k] ..< firstName[k + 1].
        let firstName = (0...ownerCount).map { $0 * count / ownerCount }
        for index in 0..<ownerCount {
            let start = firstName[index]
            let chunk = firstName[index + 1] - start
            var argv: [UnsafeMutablePointer<CChar>?] = [helperExecutable, "names", directory, "\(start)", "\(chunk)", "\(index)", "\(placement.cpus.second)"].map { (text: String) in strdup(text) }
            argv.append(nil)
            let pid = cb_spawn_process(helperExecutable, argv)
            for pointer in argv { free(pointer) }
            guard pid > 0 else { throw BenchError("could not spawn a name owner") }
            owners.append(pid)
        }
        self.owners = owners
        let server = PKNameServer(directory: directory)
        do {
            // Each owner registers "ready-K" after its names.
            for k in 0..<owners.count { _ = try server.lookUp("ready-\(k)", timeout: .seconds(300)) }
        } catch {
            for pid in owners { kill(pid, SIGKILL); _ = cb_reap(pid, 5000) }
            removeScratchDirectory(directory)
            throw BenchError("the name owners did not get ready: \(error)")
        }
        // Slot s falls to owner s * ownerCount / lookupSlots, and names that owner's name
        // number s % (its names).
        let names = (0..<Self.lookupSlots).map { slot in
            let owner = slot * ownerCount / Self.lookupSlots
            let held = firstName[owner + 1] - firstName[owner]
            return "n\(firstName[owner] + slot % held)"
        }
        do {
            driver = try PinnedDriver(cpu: placement.cpus.first) {
                var next = 0
                return DriverBody(work: { n in
                    var total: UInt64 = 0
                    for _ in 0..<n {
                        next = (next + 7919) % names.count
                        let name = names[next]
                        var attempts = 0
                        while true {
                            let start = nowNanoseconds()
                            let found = try lookUpOnce(server, name)
                            total += nowNanoseconds() - start
                            if found { break }
                            // The owner's backlog is full: let it accept, and try again (the
                            // failed attempt's time counts).
                            attempts += 1
                            if attempts > 1000 { throw BenchError("\(name) stays unreachable") }
                            usleep(100)
                        }
                    }
                    return total
                })
            }
        } catch {
            for pid in owners { kill(pid, SIGKILL); _ = cb_reap(pid, 5000) }
            removeScratchDirectory(directory)
            throw error
        }
    }

    public func run(_ n: Int) throws -> UInt64 { try driver.run(n) }

    public func close() {
        driver.close()
        for pid in owners { kill(pid, SIGTERM) }
        for pid in owners { _ = cb_reap(pid, 10_000) }
        removeScratchDirectory(directory)
    }
}

/// Looks `name` up and drops the right; false if it is not (yet) reachable.
private func lookUpOnce(_ server: PKNameServer, _ name: String) throws(PKError) -> Bool {
    guard let right = try lookUpUnlessBusy(server, name) else { return false }
    right.invalidate()
    return true
}

/// A right to `name`, or nil while it is not reachable (not yet registered, or its owner's
/// backlog is full: both say `.nameNotFound`).
func lookUpUnlessBusy(_ server: PKNameServer, _ name: String) throws(PKError) -> PKSendPort? {
    do {
        return try server.lookUp(name)
    } catch {
        if error.code == .nameNotFound { return nil }
        throw error
    }
}

/// `pkbench names DIR START COUNT INDEX CPU`: registers names nSTART..., one port each, then
/// "ready-INDEX"; serves until killed.
public func serveNames(directory: String, start: Int, count: Int, index: Int, cpu: Int32) throws -> Never {
    _ = cb_raise_fd_limit()
    if cpu >= 0 { cb_pin_self(cpu) }
    let server = PKNameServer(directory: directory)
    let loop = PKRunLoop.current
    var ports: [PKReceivePort] = []
    ports.reserveCapacity(count + 1)
    for i in start..<(start + count) {
        let port = PKReceivePort()
        try loop.add(port, forMode: .default)
        try server.register(port, name: "n\(i)")
        ports.append(port)
    }
    let ready = PKReceivePort()
    try loop.add(ready, forMode: .default)
    try server.register(ready, name: "ready-\(index)")
    ports.append(ready)
    while true { loop.run(in: .default, until: .distantFuture) }
}

/// User-space memory (malloc's bytes in use) per idle port, measured on a fresh thread.
public struct PortMemory: Sendable {
    /// A port scheduled on a loop, no sender yet.
    public var bareBytes: Double
    /// A port scheduled on a loop with one in-process sender (`makeSendRight()`, the mailbox),
    /// one message delivered.
    public var localBytes: Double
    /// A port scheduled on a loop with one connected sender (a socket: the receiving side's
    /// connection, decoder and source, and the send right), one message delivered.
    public var connectedBytes: Double
    /// Kernel descriptors per connected port (not user-space memory: a socketpair).
    public var descriptorsPerConnected: Int
}

public func measurePortMemory(count: Int = 1000) throws -> PortMemory {
    final class Result: @unchecked Sendable { var value: PortMemory?; var error: String? }
    let result = Result()
    let thread = try startThread {
        do {
            let loop = PKRunLoop.current
            // Warm up: the loop, the adopter paths, the allocator's pools.
            try makeIdlePorts(64, on: loop).invalidate()
            _ = loop.run(in: .default, until: .after(.milliseconds(10)))

            var before = cb_malloc_in_use()
            var ports: [PKReceivePort] = []
            ports.reserveCapacity(count)
            for _ in 0..<count {
                let port = PKReceivePort()
                try loop.add(port, forMode: .default)
                ports.append(port)
            }
            let bareBytes = Double(Int(cb_malloc_in_use()) - Int(before)) / Double(count)
            for port in ports { port.invalidate() }
            ports = []
            _ = loop.run(in: .default, until: .after(.milliseconds(10)))

            before = cb_malloc_in_use()
            var delivered = 0
            var rights: [PKSendPort] = []
            rights.reserveCapacity(count)
            ports.reserveCapacity(count)
            for _ in 0..<count {
                let port = PKReceivePort { _ in delivered += 1 }
                try loop.add(port, forMode: .default)
                let right = port.makeSendRight()
                try right.send(PKPortMessage(msgid: BenchMessage.idle), before: .after(.seconds(10)))
                ports.append(port)
                rights.append(right)
            }
            while delivered < count {
                if loop.run(in: .default, until: .after(.seconds(30)), returnAfterSourceHandled: true) == .timedOut { break }
            }
            let localBytes = Double(Int(cb_malloc_in_use()) - Int(before)) / Double(count)
            for port in ports { port.invalidate() }
            ports = []
            rights = []
            _ = loop.run(in: .default, until: .after(.milliseconds(10)))

            let fdsBefore = countOpenDescriptors()
            before = cb_malloc_in_use()
            let connected = try makeIdlePorts(count, on: loop)
            let connectedBytes = Double(Int(cb_malloc_in_use()) - Int(before)) / Double(count)
            let fds = (countOpenDescriptors() - fdsBefore) / count
            connected.invalidate()
            result.value = PortMemory(bareBytes: bareBytes, localBytes: localBytes, connectedBytes: connectedBytes, descriptorsPerConnected: fds)
        } catch {
            result.error = "\(error)"
        }
    }
    pthread_join(thread, nil)
    guard let value = result.value else { throw BenchError(result.error ?? "no result") }
    return value
}

/// The number of entries of /proc/self/fd.
public func countOpenDescriptors() -> Int {
    guard let dir = opendir("/proc/self/fd") else { return 0 }
    defer { closedir(dir) }
    var count = 0
    while readdir(dir) != nil { count += 1 }
    return count
}
