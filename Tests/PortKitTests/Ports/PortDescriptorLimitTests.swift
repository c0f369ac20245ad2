// Descriptors over the per-message cap, sent with one sendmsg: the kernel truncates the control
// data (MSG_CTRUNC), the reader treats it as a protocol error on that connection only, every
// descriptor it received is closed, and the port's other senders are untouched.

import Glibc
import Testing
@testable import PortKit

@Suite struct PortDescriptorLimitTests {
    /// A hostile sender: a connection `port` adopts, greeted; the test writes what it likes on
    /// the returned end (and closes it).
    static func greetedSender(to port: PKReceivePort) throws -> Int32 {
        let (readEnd, writeEnd) = try Socket.pair()
        port.adoptFromAnyThread(readEnd)
        _ = try Socket.send(writeEnd, ConnectionSetup.greeting, from: 0, descriptors: [])
        return writeEnd
    }

    /// Runs `loop` until the port closes its end of `sender`'s connection, 10 s at most;
    /// whether it did.
    static func portClosed(_ sender: Int32, running loop: PKRunLoop) -> Bool {
        let deadline = PKDeadline.after(patience(.seconds(10)))
        while !Socket.peerHasHungUp(sender) && !deadline.hasPassed {
            loop.run(in: .default, for: .milliseconds(10))
        }
        return Socket.peerHasHungUp(sender)
    }

    @Test func descriptorsOverTheCapDropOnlyThatConnection() throws {
        let outcome = try onLoopThread { loop -> (got: [UInt32], hungUp: Bool, stillOpen: Int) in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            // A well-behaved sender over a connection of its own.
            let good = PKSendPort(connection: SendConnection(takingOwnershipOf: try port.makeTransferDescriptor()))
            loop.run(in: .default, for: .milliseconds(20))

            // A hostile sender: a valid greeting, then a frame that claims no descriptor but
            // arrives with 20 of them (the cap is 16).
            let writeEnd = try Self.greetedSender(to: port)
            var frame: [UInt8] = []
            WireEncoder.append(WireFrame(msgid: 1), to: &frame)
            // One end each of 20 socketpairs: once every copy of an end is closed, the other end
            // (which we keep) reads end-of-file. That tells exactly whether the port closed
            // every descriptor it received, whatever other tests do with descriptors meanwhile.
            var readEnds: [Int32] = []
            var extra: [Int32] = []
            for _ in 0..<20 {
                let (kept, sent) = try Socket.pair()
                readEnds.append(kept)
                extra.append(sent)
            }
            _ = try Socket.send(writeEnd, frame, from: 0, descriptors: extra)
            for fd in extra { Descriptor.close(fd) }

            let hungUp = Self.portClosed(writeEnd, running: loop)
            let deadline = PKDeadline.after(patience(.seconds(10)))
            Descriptor.close(writeEnd)

            try good.send(PKPortMessage(msgid: 7), timeout: .seconds(5))
            while !got.contains(7) && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            loop.run(in: .default, for: .milliseconds(20))
            var byte: UInt8 = 0
            let stillOpen = readEnds.filter { read($0, &byte, 1) != 0 }.count
            for fd in readEnds { Descriptor.close(fd) }
            port.invalidate()
            return (got, hungUp, stillOpen)
        }
        #expect(outcome.hungUp, "the hostile connection was closed")
        #expect(outcome.got == [7], "only the good sender's message arrived")
        #expect(outcome.stillOpen == 0, "every received descriptor was closed")
    }

    /// Limits set to "no limit" (`Int.max`) mean as much as the wire can carry: the port is
    /// made, and a message with a port in it crosses a socket connection and the in-memory
    /// mailbox alike.
    @Test func unboundedLimitsMakeAWorkingPort() throws {
        let limits = {
            var limits = PKPortLimits()
            limits.maxDescriptors = .max
            limits.maxComponents = .max
            limits.maxMessageBytes = .max
            return limits
        }()
        #expect(limits.wire == WireLimits(maxMessageBytes: Int(UInt32.max) - 16 - 8 * 65535, maxDescriptors: 253, maxComponents: 65535))
        // Each message as (msgid, data, whether its port is a live right), read before the
        // carried port is invalidated.
        let got = try onLoopThread { loop -> [(UInt32, [UInt8]?, Bool)] in
            var got: [(UInt32, [UInt8]?, Bool)] = []
            let port = PKReceivePort(limits: limits) { message in
                let data: [UInt8]? = if case .data(let bytes) = message.components.first { bytes } else { nil }
                let live = if message.components.count == 2, case .port(let right) = message.components[1] { right.isValid } else { false }
                got.append((message.msgid, data, live))
            }
            try loop.add(port, forMode: .default)
            let carried = PKReceivePort()
            let message = PKPortMessage(msgid: 9, components: [.data([1, 2, 3]), .port(carried.makeSendRight())])
            // Through a socket connection, then through the in-memory mailbox.
            let socketSender = PKSendPort(connection: SendConnection(takingOwnershipOf: try port.makeTransferDescriptor()))
            try socketSender.send(message, timeout: .seconds(5))
            try port.makeSendRight().send(message, timeout: .seconds(5))
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while got.count < 2 && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            port.invalidate()
            carried.invalidate()
            return got
        }
        #expect(got.count == 2)
        for (msgid, data, live) in got {
            #expect(msgid == 9)
            #expect(data == [1, 2, 3])
            #expect(live, "the carried port arrived as a live send right")
        }
    }

    /// One write with one descriptor more than a message may carry (a frame of 16 ports and 17
    /// descriptors): a protocol error on that connection, as the cap says (the reader took the
    /// 17th into its queue of unclaimed descriptors, for a later frame of the connection).
    @Test func oneDescriptorMoreThanAWriteMayCarryDropsTheConnection() throws {
        let hungUp = try onLoopThread { loop -> Bool in
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            let writeEnd = try Self.greetedSender(to: port)
            defer { Descriptor.close(writeEnd) }
            let cap = PKPortLimits.default.wire.maxDescriptors
            var frame: [UInt8] = []
            WireEncoder.append(WireFrame(msgid: 1, components: Array(repeating: .port, count: cap)), to: &frame)
            var kept: [Int32] = []
            var sent: [Int32] = []
            defer { for fd in kept + sent { Descriptor.close(fd) } }
            for _ in 0...cap {
                let (keep, send) = try Socket.pair()
                kept.append(keep)
                sent.append(send)
            }
            _ = try Socket.send(writeEnd, frame, from: 0, descriptors: sent)
            return Self.portClosed(writeEnd, running: loop)
        }
        #expect(hungUp)
    }

    /// A descriptor that is not a Unix-domain stream socket (an `O_PATH` descriptor, on which
    /// epoll_ctl and recvmsg fail with EBADF; a pipe; a file; a datagram socket), sent as a
    /// new sender (ATTACH_SENDER) or as a message's port: a protocol error on that connection
    /// only, the descriptor closed; the port and its other senders go on.
    @Test(arguments: ["O_PATH", "pipe", "file", "datagram", "listening", "unconnected"], [true, false])
    func aDescriptorThatIsNoPortsConnectionDropsOnlyThatConnection(kind: String, asNewSender: Bool) throws {
        let outcome = try onLoopThread { loop -> (got: [UInt32], hungUp: Bool, valid: Bool) in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            let good = PKSendPort(connection: SendConnection(takingOwnershipOf: try port.makeTransferDescriptor()))
            loop.run(in: .default, for: .milliseconds(20))

            let foreign: Int32
            var other: Int32 = -1
            switch kind {
            case "O_PATH": foreign = open("/", 0o10_000_000 /* O_PATH, which Glibc does not export */ | O_CLOEXEC)
            case "pipe":
                var ends: [Int32] = [-1, -1]
                _ = pipe(&ends)
                foreign = ends[0]
                other = ends[1]
            case "file": foreign = open("/dev/null", O_RDONLY | O_CLOEXEC)
            case "listening", "unconnected":
                // A stream socket with no peer (listening on an address the kernel picks).
                foreign = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                if kind == "listening" {
                    // Bound to an abstract address of the kernel's choosing (an address of the
                    // family alone), then listening.
                    var address = sockaddr_un()
                    address.sun_family = sa_family_t(AF_UNIX)
                    let bound = withUnsafePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(foreign, $0, socklen_t(MemoryLayout<sa_family_t>.size)) }
                    }
                    try #require(bound == 0 && listen(foreign, 1) == 0)
                }
            default: foreign = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            }
            try #require(foreign >= 0)
            defer { if other >= 0 { Descriptor.close(other) } }
            let writeEnd = try Self.greetedSender(to: port)
            var frame: [UInt8] = []
            WireEncoder.append(asNewSender ? WireFrame.attachSender() : WireFrame(msgid: 1, components: [.port]), to: &frame)
            _ = try Socket.send(writeEnd, frame, from: 0, descriptors: [foreign])
            Descriptor.close(foreign)

            let hungUp = Self.portClosed(writeEnd, running: loop)
            let deadline = PKDeadline.after(patience(.seconds(10)))
            Descriptor.close(writeEnd)
            try good.send(PKPortMessage(msgid: 7), timeout: .seconds(5))
            while !got.contains(7) && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            defer { port.invalidate() }
            return (got, hungUp, port.isValid)
        }
        #expect(outcome.hungUp, "the connection that sent it was closed")
        #expect(outcome.got == [7], "only the good sender's message arrived")
        #expect(outcome.valid)
    }

    /// A new sender handed over in ATTACH_SENDER that never greets is dropped once the port's
    /// greeting timeout passes, as an accepted connection that never greets is (it stayed for
    /// as long as its peer held the other end); the connection that handed it over stays.
    @Test func anAttachedSenderThatNeverGreetsIsDropped() throws {
        let outcome = try onLoopThread { loop -> (silentClosed: Bool, senderOpen: Bool, got: [UInt32]) in
            var limits = PKPortLimits()
            limits.greetingTimeout = .milliseconds(200)
            var got: [UInt32] = []
            let port = PKReceivePort(limits: limits) { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            let writeEnd = try Self.greetedSender(to: port)
            defer { Descriptor.close(writeEnd) }
            let (silent, attached) = try Socket.pair()
            defer { Descriptor.close(silent) }
            var frames: [UInt8] = []
            WireEncoder.append(WireFrame.attachSender(), to: &frames)
            _ = try Socket.send(writeEnd, frames, from: 0, descriptors: [attached])
            Descriptor.close(attached)
            let silentClosed = Self.portClosed(silent, running: loop)
            // The connection that handed it over still delivers.
            var message: [UInt8] = []
            WireEncoder.append(WireFrame(msgid: 9), to: &message)
            _ = try Socket.send(writeEnd, message, from: 0, descriptors: [])
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while !got.contains(9) && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            return (silentClosed, !Socket.peerHasHungUp(writeEnd), got)
        }
        #expect(outcome.silentClosed, "the silent attached sender was dropped")
        #expect(outcome.senderOpen)
        #expect(outcome.got == [9])
    }

    /// Both ends of one socketpair, each greeted, handed over in ATTACH_SENDER by a peer that
    /// then closes its copies: each end kept the other from seeing the end of the stream, and
    /// the port held both for as long as it lived (two descriptors a round, at no cost to the
    /// peer). The second end is refused (its peer is a handed-over socket held here), the first
    /// then sees the end of its stream, and the port holds the original sender alone.
    @Test func bothEndsOfOnePairHandedOverAreNotKept() throws {
        let (count, got) = try onLoopThread { loop -> (Int, [UInt32]) in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            let sender = try Self.greetedSender(to: port)
            defer { Descriptor.close(sender) }
            let (x, y) = try Socket.pair()
            for fd in [x, y] { _ = try Socket.send(fd, ConnectionSetup.greeting, from: 0, descriptors: []) }
            var frame: [UInt8] = []
            WireEncoder.append(WireFrame.attachSender(), to: &frame)
            for fd in [x, y] { _ = try Socket.send(sender, frame, from: 0, descriptors: [fd]) }
            Descriptor.close(x)
            Descriptor.close(y)
            var message: [UInt8] = []
            WireEncoder.append(WireFrame(msgid: 5), to: &message)
            _ = try Socket.send(sender, message, from: 0, descriptors: [])
            let deadline = PKDeadline.after(patience(.seconds(5)))
            while (port.connectionCountForTests != 1 || got.isEmpty) && !deadline.hasPassed {
                loop.run(in: .default, for: .milliseconds(10))
            }
            return (port.connectionCountForTests, got)
        }
        #expect(count == 1, "the port holds \(count) connections")
        #expect(got == [5])
    }

    /// One socket handed over three times (three descriptors for it): the copies after the
    /// first are refused at once, each held until its greeting timeout before.
    @Test func oneSocketHandedOverTwiceIsKeptOnce() throws {
        let count = try onLoopThread { loop -> Int in
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            let sender = try Self.greetedSender(to: port)
            defer { Descriptor.close(sender) }
            let (kept, handed) = try Socket.pair()
            defer { Descriptor.close(kept) }
            _ = try Socket.send(kept, ConnectionSetup.greeting, from: 0, descriptors: [])
            var frame: [UInt8] = []
            WireEncoder.append(WireFrame.attachSender(), to: &frame)
            for _ in 0..<3 { _ = try Socket.send(sender, frame, from: 0, descriptors: [handed]) }
            Descriptor.close(handed)
            // Until the handed-over socket is adopted, then a few passes more.
            let deadline = PKDeadline.after(patience(.seconds(5)))
            var most = 0
            var after = 0
            while after < 5 && !deadline.hasPassed {
                loop.run(in: .default, for: .milliseconds(10))
                most = max(most, port.connectionCountForTests)
                if most >= 2 { after += 1 }
            }
            return most
        }
        #expect(count == 2, "the port held \(count) connections at most")
    }

    /// A sender handed over in ATTACH_SENDER whose greeting waits unread in its socket when the
    /// greeting timeout passes (the loop was held up: a pass fires due timers before it reads)
    /// is read, not dropped: a live sender was taken for a silent one.
    @Test func anAttachedSenderIsReadBeforeItsGreetingTimeoutDropsIt() throws {
        let got = try onLoopThread { loop -> [UInt32] in
            var limits = PKPortLimits()
            limits.greetingTimeout = .milliseconds(100)
            var got: [UInt32] = []
            let port = PKReceivePort(limits: limits) { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            let sender = try Self.greetedSender(to: port)
            defer { Descriptor.close(sender) }
            let (newSender, handedOver) = try Socket.pair()
            defer { Descriptor.close(newSender) }
            var greeted = ConnectionSetup.greeting
            WireEncoder.append(WireFrame(msgid: 12), to: &greeted)
            _ = try Socket.send(newSender, greeted, from: 0, descriptors: [])
            var frame: [UInt8] = []
            WireEncoder.append(WireFrame.attachSender(), to: &frame)
            _ = try Socket.send(sender, frame, from: 0, descriptors: [handedOver])
            Descriptor.close(handedOver)
            // Passes until the handed-over sender is adopted (it is read in a later pass).
            let adoptedBy = PKDeadline.after(patience(.seconds(10)))
            while port.connectionCountForTests < 2 && !adoptedBy.hasPassed { loop.runOnePass() }
            // The loop held up past the greeting timeout.
            var pause = timespec(tv_sec: 0, tv_nsec: 300_000_000)
            nanosleep(&pause, nil)
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while !got.contains(12) && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            return got
        }
        #expect(got == [12], "the message of the handed-over sender arrived")
    }

    /// A new sender handed over (ATTACH_SENDER) in the same read as a frame that breaks the
    /// protocol is adopted, as a message before the error is delivered (protocol.md 8); the
    /// connection that broke it goes. The sender was closed with it.
    @Test func aSenderHandedOverBeforeAnErrorIsAdopted() throws {
        let outcome = try onLoopThread { loop -> (got: [UInt32], hostileClosed: Bool) in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            defer { port.invalidate() }
            let hostile = try Self.greetedSender(to: port)
            defer { Descriptor.close(hostile) }
            let (newSender, handedOver) = try Socket.pair()
            defer { Descriptor.close(newSender) }
            var greeted = ConnectionSetup.greeting
            WireEncoder.append(WireFrame(msgid: 11), to: &greeted)
            _ = try Socket.send(newSender, greeted, from: 0, descriptors: [])
            var frames: [UInt8] = []
            WireEncoder.append(WireFrame.attachSender(), to: &frames)
            WireEncoder.append(WireFrame.control(.noReply, replyToken: 8), to: &frames)  // never towards a port
            _ = try Socket.send(hostile, frames, from: 0, descriptors: [handedOver])
            Descriptor.close(handedOver)
            let hostileClosed = Self.portClosed(hostile, running: loop)
            let deadline = PKDeadline.after(patience(.seconds(10)))
            while !got.contains(11) && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            return (got, hostileClosed)
        }
        #expect(outcome.hostileClosed)
        #expect(outcome.got == [11], "the message through the adopted sender arrived")
    }

    /// A send whose descriptors the kernel refuses for the moment (ETOOMANYREFS: this user's
    /// descriptors in flight, sent and not yet received, passed RLIMIT_NOFILE) fails alone,
    /// with `.limitExceeded`: the right and its connection stay valid, and once the receiver
    /// reads, sends with ports go on. It closed the connection for good. Run in a child
    /// process, as a user without CAP_SYS_RESOURCE (whose descriptors in flight the kernel does
    /// not count).
    @Test func descriptorsRefusedForNowFailOnlyThatSend() async {
        guard getuid() == 0 else {
            print("skipped: becoming uid 65534 needs root")
            return
        }
        await exitTestInTurn {
            await #expect(processExitsWith: .success) {
                var limit = rlimit(rlim_cur: 256, rlim_max: 256)
                guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, setgid(65534) == 0, setuid(65534) == 0 else {
                    endExitTest("cannot lower the limit and become nobody", failures: ["errno \(errno)"])
                }
                let outcome = Locked<[String]>([])
                let thread = TestThread(name: "in-flight") {
                    var failures: [String] = []
                    defer { outcome.value = failures }
                    let loop = PKRunLoop.current
                    var got = 0
                    let port = PKReceivePort { _ in got += 1 }
                    guard (try? loop.add(port, forMode: .default)) != nil, let descriptor = try? port.makeTransferDescriptor() else {
                        failures.append("no port")
                        return
                    }
                    let right = PKSendPort(connection: SendConnection(takingOwnershipOf: descriptor))
                    // The right itself in each message: a new connection to the port, whose one end
                    // goes to the port (ATTACH_SENDER) and the other with the message. Both stay
                    // in flight (the loop does not run), and this process closes its copies.
                    var sent = 0
                    var refusal: PKError?
                    while sent < 1000 && refusal == nil {
                        do {
                            try right.send(PKPortMessage(msgid: 1, components: [.port(right)]), before: .now)
                            sent += 1
                        } catch let error as PKError { refusal = error } catch { failures.append("\(error)") }
                    }
                    if refusal?.code != .limitExceeded { failures.append("after \(sent) sends: \(refusal.map { "\($0)" } ?? "no refusal")") }
                    if !right.isValid { failures.append("the right was invalidated") }
                    // Meanwhile a server answers a request with a port: refused for now, the
                    // right to answer stays, and its answer without a port reaches the requester.
                    let refusedAnswer = Locked<String?>(nil)
                    do {
                        let server = try PortServer { serverPort, serverLoop in
                            let carried = PKReceivePort()
                            try? serverLoop.add(carried, forMode: .default)
                            serverPort.handler = { message in
                                do {
                                    try message.replyPort?.send(PKPortMessage(msgid: 9, components: [.port(carried.makeSendRight())]), timeout: .seconds(5))
                                    refusedAnswer.value = "sent"
                                } catch { refusedAnswer.value = "\(error)" }
                                try? message.replyPort?.send(PKPortMessage(msgid: 10), timeout: .seconds(5))
                            }
                        }
                        let reply = try independentRight(to: server.port)
                            .sendRequest(PKPortMessage(msgid: 1), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
                        if reply?.msgid != 10 { failures.append("the request got \(reply.map { "\($0.msgid)" } ?? "nothing")") }
                        if refusedAnswer.value?.contains("limitExceeded") != true { failures.append("the answer with a port: \(refusedAnswer.value ?? "none")") }
                        try server.stop()
                    } catch { failures.append("the request: \(error)") }
                    // The receiver reads: what it held is received, and a send with a port goes.
                    let deadline = PKDeadline.after(.seconds(20))
                    while got < sent && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
                    do { try right.send(PKPortMessage(msgid: 2, components: [.port(right)]), before: .after(.seconds(5))) } catch {
                        failures.append("the send after the receiver read: \(error)")
                    }
                    while got < sent + 1 && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
                    if got != sent + 1 { failures.append("\(got) of \(sent + 1) arrived") }
                    port.invalidate()
                }
                do { try thread.joinPatiently(timeout: .seconds(60)) } catch { endExitTest("the thread did not end", failures: ["\(error)"]) }
                endExitTest("in flight", failures: outcome.value)
            }
        }
    }
}
