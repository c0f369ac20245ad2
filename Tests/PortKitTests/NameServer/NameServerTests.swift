import Testing
import Foundation
@testable import PortKit
import CPortKit

/// A private name directory for one test, removed afterwards.
final class TemporaryNameDirectory: Sendable {
    let path: String
    var server: PKNameServer { PKNameServer(directory: path) }

    init() {
        path = "/tmp/pk-ns-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

@Suite struct NameServerTests {
    @Test func registerLookUpAndSendBetweenThreads() throws {
        let dir = TemporaryNameDirectory()
        let server = dir.server
        let got = Locked<[String]>([])
        let registered = TestLatch<Bool>()
        let owner = TestThread {
            let loop = PKRunLoop.current
            let port = PKReceivePort { message in
                got.withLock { $0.append(message.text) }
                try? message.replyPort?.send(PKPortMessage(msgid: 2, data: Array("ack".utf8)), timeout: .seconds(5))
                if message.msgid == 9 { loop.stop() }
            }
            try? loop.add(port, forMode: .default)
            do { try server.register(port, name: "owner.port") } catch { registered.set(false); return }
            registered.set(true)
            loop.run(in: .default, until: .after(.seconds(20)))
            port.invalidate()
        }
        #expect(try registered.wait())
        let right = try server.lookUp("owner.port")
        try onLoopThread { _ in
            let reply = try right.sendRequest(PKPortMessage(msgid: 1, data: Array("hi".utf8)), sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
            #expect(reply?.text == "ack")
        }
        try right.send(PKPortMessage(msgid: 9, data: Array("bye".utf8)), timeout: .seconds(5))
        try owner.join()
        #expect(got.value == ["hi", "bye"])
        // The port's invalidation removed the name.
        #expect(throws: PKError.self) { _ = try server.lookUp("owner.port") }
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/owner.port.sock"))
    }

    @Test func secondRegistrantOfLiveNameFails() throws {
        let dir = TemporaryNameDirectory()
        try onLoopThread { loop in
            let a = PKReceivePort()
            let b = PKReceivePort()
            try loop.add(a, forMode: .default)
            try loop.add(b, forMode: .default)
            try dir.server.register(a, name: "taken")
            #expect { try dir.server.register(b, name: "taken") } throws: { ($0 as? PKError)?.code == .nameInUse }
            try dir.server.unregister(name: "taken")
            try dir.server.register(b, name: "taken")
            a.invalidate(); b.invalidate()
        }
    }

    /// A live owner whose lock file was removed from outside (a cleaner of `/tmp`, an `rm`)
    /// keeps its name: a second registrant finds its socket accepting and is refused, and the
    /// name still reaches the first owner's port. The first owner's end leaves the second's
    /// lock file, should there be one, alone.
    @Test func aLiveOwnerWhoseLockFileWasRemovedKeepsItsName() throws {
        let dir = TemporaryNameDirectory()
        let got = try onLoopThread { loop -> [UInt32] in
            var got: [UInt32] = []
            let a = PKReceivePort { got.append($0.msgid) }
            let b = PKReceivePort()
            try loop.add(a, forMode: .default)
            try loop.add(b, forMode: .default)
            defer { a.invalidate(); b.invalidate() }
            try dir.server.register(a, name: "kept")
            #expect(unlink(dir.path + "/kept.lock") == 0)
            #expect { try dir.server.register(b, name: "kept") } throws: { ($0 as? PKError)?.code == .nameInUse }
            let right = try dir.server.lookUp("kept")
            try right.send(PKPortMessage(msgid: 5), timeout: .seconds(5))
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while got.isEmpty && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
            try dir.server.unregister(name: "kept")
            return got
        }
        #expect(got == [5])
    }

    /// Something other than a regular file at a name's lock path (a FIFO) is refused as an
    /// unsafe directory, at once (it was taken for a lock file changing hands, 16 times over).
    /// So are a link, a directory and a socket there (they failed the lock file's open, and
    /// were reported as `.system`).
    @Test func aLockPathThatIsNoRegularFileIsRefused() throws {
        let dir = TemporaryNameDirectory()
        #expect(mkdir(dir.path, 0o700) == 0)
        #expect(mkfifo(dir.path + "/piped.lock", 0o600) == 0)
        #expect(symlink("/nonexistent", dir.path + "/linked.lock") == 0)
        #expect(mkdir(dir.path + "/folder.lock", 0o700) == 0)
        let listening = try Socket.listen(at: dir.path + "/socket.lock")
        defer { Descriptor.close(listening) }
        try onLoopThread { loop in
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            for name in ["piped", "linked", "folder", "socket"] {
                #expect { try dir.server.register(port, name: name) } throws: { ($0 as? PKError)?.code == .unsafeDirectory }
            }
        }
    }

    /// A registered port that leaves its modes and is released gives up its name, as it closes
    /// its connections: the name could be looked up (into a backlog no one accepted) and not be
    /// registered again (`.nameInUse`) until the process ended.
    @Test func aPortReleasedOutOfItsModesGivesUpItsName() throws {
        let dir = TemporaryNameDirectory()
        try onLoopThread { loop in
            do {
                let port = PKReceivePort()
                try loop.add(port, forMode: .default)
                try dir.server.register(port, name: "dropped")
                loop.remove(port, forMode: .default)
            }
            #expect { _ = try dir.server.lookUp("dropped") } throws: { ($0 as? PKError)?.code == .nameNotFound }
            let next = PKReceivePort()
            try loop.add(next, forMode: .default)
            defer { next.invalidate() }
            try dir.server.register(next, name: "dropped")
            _ = try dir.server.lookUp("dropped")
        }
    }

    /// `unregister` on a thread other than the port's loop's traps, as `register` does (the
    /// registration's listener belongs to that loop).
    @Test func unregisteringFromAnotherThreadTraps() async {
        var result: ExitTest.Result?
        await exitTestInTurn {
            result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
                let dir = TemporaryNameDirectory()
                let registered = TestLatch<Bool>()
                let release = TestLatch<Bool>()
                let owner = TestThread {
                    let port = PKReceivePort()
                    try? PKRunLoop.current.add(port, forMode: .default)
                    registered.set((try? dir.server.register(port, name: "elsewhere")) != nil)
                    _ = try? release.wait(timeout: .seconds(30))
                }
                guard (try? registered.wait()) == true else { exit(0) }
                try? dir.server.unregister(name: "elsewhere")
                release.set(true)
                try? owner.join()
                exit(0)  // reached only if the call did not trap
            }
        }
        // Before it changes anything: not a trap deeper in, once the name was half removed.
        let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("PKRunLoop.PKNameServer.unregister(name:) is loop-only"), "\(message)")
    }

    /// A port's invalidation removes only the name it still holds: A registers a name and gives
    /// it up, B registers it; A's invalidation leaves B's name, which B can still unregister.
    /// (A's old hook removed B's entry: the unregister failed with `.nameNotFound`.) Names
    /// registered and unregistered over and over leave the port no hooks.
    @Test func anInvalidatedPortLeavesItsOldNameToTheNextOwner() throws {
        let dir = TemporaryNameDirectory()
        try onLoopThread { loop in
            let a = PKReceivePort()
            let b = PKReceivePort()
            try loop.add(a, forMode: .default)
            try loop.add(b, forMode: .default)
            for _ in 0..<100 {
                try dir.server.register(a, name: "handed.on")
                try dir.server.unregister(name: "handed.on")
            }
            #expect(a.anchor.invalidationHooks.count == 0)
            try dir.server.register(b, name: "handed.on")
            a.invalidate()
            _ = try dir.server.lookUp("handed.on")
            try dir.server.unregister(name: "handed.on")
            #expect { _ = try dir.server.lookUp("handed.on") } throws: { ($0 as? PKError)?.code == .nameNotFound }
            #expect(b.anchor.invalidationHooks.count == 0)
            b.invalidate()
        }
    }

    /// A handler that invalidates its port while the name's listener accepts (the first
    /// message of a connection is delivered as it is accepted), then registers another name
    /// and sends to it: the new name's client reaches its port. (The listener went on
    /// accepting on its closed descriptor, which the new name's listening socket had taken:
    /// it took that client and closed it.)
    @Test func aListenerWhosePortWasInvalidatedStopsAccepting() throws {
        let dir = TemporaryNameDirectory()
        let server = dir.server
        try onLoopThread { loop in
            var second: [UInt32] = []
            var failure: String?
            let next = PKReceivePort { second.append($0.msgid) }
            try loop.add(next, forMode: .default)
            var first: PKReceivePort!
            first = PKReceivePort { _ in
                first.invalidate()
                do {
                    try server.register(next, name: "second")
                    try server.lookUp("second").send(PKPortMessage(msgid: 2), timeout: .seconds(5))
                } catch { failure = "\(error)" }
            }
            try loop.add(first, forMode: .default)
            try server.register(first, name: "first")
            try server.lookUp("first").send(PKPortMessage(msgid: 1), timeout: .seconds(5))
            try runLoop(loop, "the message to the second name") { second == [2] || failure != nil }
            #expect(failure == nil)
            next.invalidate()
        }
    }

    /// A waiting lookup of a live owner whose backlog is full gets its right once the owner
    /// accepts again. (No file event comes for that: the lookup waited for its deadline.) With
    /// `churn`, other names' files come and go in the directory all the while (their events
    /// kept the lookup from trying again: it tried only after a quiet 10 ms).
    @Test(arguments: [false, true])
    func aWaitingLookUpOutlastsAFullBacklog(churn: Bool) throws {
        let dir = TemporaryNameDirectory()
        let server = dir.server
        let churning = Locked(churn)
        let churner = TestThread {
            while churning.value {
                let path = dir.path + "/churn.lock"
                let fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
                if fd >= 0 { close(fd) }
                unlink(path)
                sleepFor(.milliseconds(2))
            }
        }
        defer {
            churning.value = false
            try? churner.join()
        }
        try onLoopThread(timeout: .seconds(90)) { loop in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            try server.register(port, name: "full")
            // Connections the loop does not accept yet, until the kernel refuses one.
            var waiting: [Int32] = []
            defer { for fd in waiting { Descriptor.close(fd) } }
            var full = false
            for _ in 0..<10_000 where !full {
                switch Socket.connect(to: dir.path + "/full.sock") {
                case .success(let fd): waiting.append(fd)
                case .failure(.busy): full = true
                case .failure(let other): throw other
                }
            }
            try #require(full)
            #expect { _ = try server.lookUp("full") } throws: { ($0 as? PKError)?.code == .nameNotFound }
            let thread = Locked<pid_t>(0)
            let failure = Locked<String?>(nil)
            // The lookup sends through the right it gets; a failure stops the loop.
            let looker = TestThread {
                thread.value = pk_gettid()
                do {
                    try server.lookUp("full", timeout: patience(.seconds(30))).send(PKPortMessage(msgid: 5), timeout: .seconds(5))
                } catch {
                    failure.value = "\(error)"
                    loop.stop()
                }
            }
            // Once the lookup waits (in poll(2), system call 7), the owner accepts again.
            try waitUntil("the lookup to wait") {
                thread.value != 0 && (try? String(contentsOfFile: "/proc/self/task/\(thread.value)/syscall", encoding: .utf8))?.hasPrefix("7 ") == true
            }
            try runLoop(loop, timeout: .seconds(40), "the message sent through the right") { got == [5] || failure.value != nil }
            try looker.join()
            #expect(failure.value == nil)
            #expect(got == [5])
            port.invalidate()
        }
    }

    /// A name unregistered while its port is out of every mode leaves nothing in the port that
    /// breaks its return to the loop (its listener was invalidated then, not detached).
    @Test func unregisteringWhileThePortIsUnscheduledThenSchedulingAgain() throws {
        let dir = TemporaryNameDirectory()
        try onLoopThread { loop in
            var received: [UInt32] = []
            let port = PKReceivePort { received.append($0.msgid) }
            try loop.add(port, forMode: .default)
            try dir.server.register(port, name: "away")
            loop.remove(port, forMode: .default)
            try dir.server.unregister(name: "away")
            // Registered and unregistered over and over out of every mode, it keeps no hook
            // (an unregister there could not reach the port to remove its hook: 100 stayed).
            for _ in 0..<100 {
                try dir.server.register(port, name: "away")
                try dir.server.unregister(name: "away")
            }
            #expect(port.anchor.invalidationHooks.count == 0)
            try loop.add(port, forMode: .default)
            #expect { _ = try dir.server.lookUp("away") } throws: { ($0 as? PKError)?.code == .nameNotFound }
            try port.makeSendRight().send(PKPortMessage(msgid: 4), timeout: .seconds(5))
            try runLoop(loop, "the message") { received == [4] }
            port.invalidate()
        }
    }

    @Test(arguments: ["", ".hidden", "has space", "slash/name", String(repeating: "x", count: 65), "ünicode"])
    func badNamesAreRejected(name: String) throws {
        let dir = TemporaryNameDirectory()
        #expect { _ = try dir.server.lookUp(name) } throws: { ($0 as? PKError)?.code == .badName }
    }

    @Test func lookUpWaitsForNameToAppear() throws {
        let dir = TemporaryNameDirectory()
        let server = dir.server
        let registerer = TestThread {
            sleepFor(.milliseconds(100))
            let loop = PKRunLoop.current
            let port = PKReceivePort { _ in loop.stop() }
            try? loop.add(port, forMode: .default)
            try? server.register(port, name: "late")
            loop.run(in: .default, until: .after(.seconds(20)))
            port.invalidate()
        }
        let right = try server.lookUp("late", timeout: .seconds(10))
        try right.send(PKPortMessage(msgid: 1), timeout: .seconds(5))
        try registerer.join()
        #expect { _ = try server.lookUp("never", timeout: .milliseconds(100)) } throws: { ($0 as? PKError)?.code == .nameNotFound }
    }

    @Test func unsafeDirectoriesAreRefused() throws {
        let base = TemporaryNameDirectory()
        try FileManager.default.createDirectory(atPath: base.path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        // Open to others.
        let open = base.path + "/open"
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o777])
        chmod(open, 0o777)
        #expect { _ = try PKNameServer(directory: open).lookUp("x") } throws: { ($0 as? PKError)?.code == .unsafeDirectory }
        // A symbolic link to a good directory.
        let good = base.path + "/good"
        try FileManager.default.createDirectory(atPath: good, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        let link = base.path + "/link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: good)
        #expect { _ = try PKNameServer(directory: link).lookUp("x") } throws: { ($0 as? PKError)?.code == .unsafeDirectory }
        // ... named with a trailing slash or dot, through which lstat follows the link.
        for spelling in [link + "/", link + "//", link + "/.", link + "/./"] {
            #expect { _ = try PKNameServer(directory: spelling).lookUp("x") } throws: { ($0 as? PKError)?.code == .unsafeDirectory }
        }
        // Owned by someone else (needs root to make).
        if getuid() == 0 {
            let foreign = base.path + "/foreign"
            try FileManager.default.createDirectory(atPath: foreign, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
            chown(foreign, 65534, 65534)
            #expect { _ = try PKNameServer(directory: foreign).lookUp("x") } throws: { ($0 as? PKError)?.code == .unsafeDirectory }
        }
    }
}

@Suite struct GreetingTimeoutTests {
    /// A burst of real clients, more than the pending-greeting limit, connecting before the
    /// owner's loop runs (all accepted in one pass): every one is served, none is taken for a
    /// silent connection, since each one's greeting is read as it is accepted.
    @Test func aBurstOfRealClientsBeyondThePendingLimitIsServed() throws {
        let dir = TemporaryNameDirectory()
        let got = try onLoopThread { loop -> [UInt32] in
            var limits = PKPortLimits()
            limits.maxPendingGreetings = 3
            var got: [UInt32] = []
            let port = PKReceivePort(limits: limits) { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            try dir.server.register(port, name: "busy")
            // Twenty clients connect, greet and send while the loop does not run.
            let rights = try (0..<20).map { _ in try dir.server.lookUp("busy") }
            for (index, right) in rights.enumerated() { try right.send(PKPortMessage(msgid: UInt32(index)), timeout: .seconds(5)) }
            try runLoop(loop, "every client's message") { got.count == rights.count }
            port.invalidate()
            return got
        }
        #expect(got.sorted() == Array(0..<20))
    }

    @Test func silentConnectionsAreDroppedAndRealClientsStillServed() throws {
        let dir = TemporaryNameDirectory()
        let outcome = try onLoopThread { loop -> (silentClosed: [Bool], got: [UInt32], oldestEvicted: Bool) in
            var limits = PKPortLimits()
            limits.greetingTimeout = .milliseconds(200)
            limits.maxPendingGreetings = 3
            var got: [UInt32] = []
            let port = PKReceivePort(limits: limits) { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            try dir.server.register(port, name: "greeter")
            let path = dir.path + "/greeter.sock"
            // Three connections that never greet fill the pending slots; a fourth evicts the oldest.
            var silent: [Int32] = []
            for _ in 0..<4 {
                guard case .success(let fd) = Socket.connect(to: path) else { throw PeerError(description: "connect failed") }
                silent.append(fd)
                loop.run(in: .default, for: .milliseconds(10))
            }
            let oldestEvicted = Socket.peerHasHungUp(silent[0]) && !Socket.peerHasHungUp(silent[3])
            // A real client is served meanwhile.
            let right = try dir.server.lookUp("greeter")
            try right.send(PKPortMessage(msgid: 5), timeout: .seconds(5))
            // After the greeting timeout the silent ones are gone.
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while !(silent.allSatisfy { Socket.peerHasHungUp($0) }) && !deadline.hasPassed {
                loop.run(in: .default, for: .milliseconds(20))
            }
            let closed = silent.map { Socket.peerHasHungUp($0) }
            for fd in silent { Descriptor.close(fd) }
            while !got.contains(5) && !deadline.hasPassed { loop.run(in: .default, for: .milliseconds(20)) }
            port.invalidate()
            return (closed, got, oldestEvicted)
        }
        #expect(outcome.oldestEvicted, "a connection beyond maxPendingGreetings evicts the one that waited longest")
        #expect(outcome.silentClosed.allSatisfy { $0 }, "silent connections are dropped at the greeting timeout")
        #expect(outcome.got == [5], "a real client is still served")
    }

    /// A connection accepted before its greeting arrived, which then greets, no longer holds a
    /// pending slot: later silent connections fill the slots and evict one another, and the
    /// greeting timeout drops them, never it.
    @Test func aClientThatGreetsLateLeavesThePendingSlots() throws {
        let dir = TemporaryNameDirectory()
        let outcome = try onPortLoopThread { loop -> (lateOpen: Bool, evicted: [Bool], silentClosed: [Bool]) in
            var limits = PKPortLimits()
            limits.greetingTimeout = .seconds(3)  // the evictions are checked long before
            limits.maxPendingGreetings = 2
            let port = PKReceivePort(limits: limits)
            try loop.add(port, forMode: .default)
            try dir.server.register(port, name: "late")
            let path = dir.path + "/late.sock"
            func connect() throws -> Int32 {
                guard case .success(let fd) = Socket.connect(to: path) else { throw PeerError(description: "connect failed") }
                loop.run(in: .default, for: .milliseconds(10))  // accepted, its greeting not there
                return fd
            }
            let late = try connect()
            try ConnectionSetup.writeGreeting(late)
            loop.run(in: .default, for: .milliseconds(10))
            // Two slots: the second silent one fits, the third evicts the first.
            let silent = try (0..<3).map { _ in try connect() }
            let evicted = silent.map { Socket.peerHasHungUp($0) }
            let deadline = PKDeadline.after(patience(.seconds(20)))
            while !silent.allSatisfy({ Socket.peerHasHungUp($0) }) && !deadline.hasPassed {
                loop.run(in: .default, for: .milliseconds(20))
            }
            let outcome = (!Socket.peerHasHungUp(late), evicted, silent.map { Socket.peerHasHungUp($0) })
            for fd in silent + [late] { Descriptor.close(fd) }
            port.invalidate()
            return outcome
        }
        #expect(outcome.evicted == [true, false, false], "only the oldest silent connection is evicted")
        #expect(outcome.silentClosed == [true, true, true], "the greeting timeout drops the silent ones")
        #expect(outcome.lateOpen, "the client that greeted late is kept")
    }
}
