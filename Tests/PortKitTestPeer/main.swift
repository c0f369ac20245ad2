// A helper process for PortKit's cross-process tests: each command plays one peer.
//
//   PortKitTestPeer echo DIR NAME          register NAME, answer each message on its reply port
//                                         with the same msgid and data; msgid 99 ends it
//   PortKitTestPeer hold DIR NAME          register NAME and serve until killed
//   PortKitTestPeer relay DIR NAME TARGET  register NAME; forward every port it receives to the
//                                         port registered as TARGET (msgid 7), then echo
//   PortKitTestPeer race DIR NAME          try once to register NAME; print "won" or "lost",
//                                         then wait for a line on stdin (or EOF) and exit
//   PortKitTestPeer flood DIR NAME SELF [SIZE]
//                                         register SELF, look NAME up and send messages of SIZE
//                                         bytes (1024 by default, each byte 7) until killed
//                                         (each send waits up to 60 s for room)
//   PortKitTestPeer whoami DIR NAME        register NAME, answer each message on its reply port
//                                         with this process's pid as text; serve until killed
//   PortKitTestPeer racer DIR NAME         for each line "go" on stdin, try to register NAME
//                                         with a new port and print "won" or "lost"; for each
//                                         "release", invalidate that port and print "released";
//                                         exit at "end" or EOF
//   PortKitTestPeer stall-send DIR NAME COUNT MAXSIZE
//                                         look NAME up and send msgid 1...COUNT, each of a
//                                         random size in 1...MAXSIZE filled with the byte msgid
//                                         mod 256, each waiting up to 60 s for room; print
//                                         "sent N" after each and "done COUNT BYTES" at the end
//   PortKitTestPeer burst DIR NAME COUNT SIZE
//                                         look NAME up, send msgid 0..<COUNT of SIZE bytes (each
//                                         byte the msgid mod 256) from this thread, which runs no
//                                         loop, and exit at once: frames still pending (coalesced
//                                         writes) must go out at exit
//   PortKitTestPeer exhaust DIR LIMIT      lower RLIMIT_NOFILE to LIMIT, then make named ports
//                                         and connections to them until one fails; print each
//                                         failure and the CPU the loop uses at the limit, release
//                                         half of what it made, print how many connections that
//                                         waited were then accepted, and show that a new port
//                                         can be registered, looked up and used
//   PortKitTestPeer as-nobody DIR NAME     drop to uid 65534, connect to NAME's socket by hand,
//                                         greet and send a frame; print "closed" when the
//                                         server closes the connection, "open" if it does not
//   PortKitTestPeer inherit DIR PEER SELF  open what PortKit opens (register SELF, a connection to
//                                         it carrying a port, a connection to PEER with a watch,
//                                         a worker thread), start /bin/sleep 30 by posix_spawn and
//                                         print "child PID"; print "noticed" when PEER dies, then
//                                         give SELF up, re-register it ("name free"), kill the
//                                         child and exit
//   PortKitTestPeer worker                 serve as a PKWorkerProcess (echo)
//   PortKitTestPeer launch-worker          launch this program as a PKWorkerProcess ("worker"),
//                                         print "worker PID", then wait to be killed
//   PortKitTestPeer checkin-by-name DIR MAIN SELF
//                                         the guide's CFMessagePort check-in (Listings 3-17 to
//                                         3-19): register SELF, send its name to MAIN as the
//                                         check-in data (msgid 100), echo until msgid 99

import Glibc
import PortKit

let arguments = Array(CommandLine.arguments.dropFirst())

/// Writes a line to standard output at once (the test reads it through a pipe).
func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

func fail(_ message: String) -> Never {
    let bytes = Array("PortKitTestPeer: \(message)\n".utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    exit(2)
}

/// Answers every message that has a reply port with its own msgid and data.
func echo(_ message: PKPortMessage, loop: PKRunLoop) {
    if message.msgid == 99 { loop.stop(); return }
    try? message.replyPort?.send(PKPortMessage(msgid: message.msgid, components: message.components), timeout: .seconds(5))
}

func registerOrFail(_ port: PKReceivePort, _ server: PKNameServer, _ name: String) {
    do { try server.register(port, name: name) } catch { fail("register \(name): \(error)") }
}

if arguments.first == "inherit" {
    // Start clean, before PortKit opens anything: close what this process inherited beyond 0, 1
    // and 2 (the test process's Foundation leaves some descriptors inheritable), so that every
    // other descriptor it holds is PortKit's.
    for fd in Int32(3)..<4096 { close(fd) }
}

let loop = PKRunLoop.current
switch arguments.first {
case "echo", "hold":
    guard arguments.count == 3 else { fail("usage: echo|hold DIR NAME") }
    let server = PKNameServer(directory: arguments[1])
    let port = PKReceivePort { echo($0, loop: loop) }
    try loop.add(port, forMode: .default)
    registerOrFail(port, server, arguments[2])
    say("ready")
    loop.run(in: .default, until: .after(.seconds(120)))
    port.invalidate()

case "relay":
    guard arguments.count == 4 else { fail("usage: relay DIR NAME TARGET") }
    let server = PKNameServer(directory: arguments[1])
    let port = PKReceivePort()
    port.handler = { message in
        if message.ports.isEmpty { echo(message, loop: loop); return }
        do {
            let target = try server.lookUp(arguments[3], timeout: .seconds(10))
            try target.send(PKPortMessage(msgid: 7, components: message.ports.map { .port($0) }), timeout: .seconds(5))
            try message.replyPort?.send(PKPortMessage(msgid: message.msgid), timeout: .seconds(5))
        } catch { fail("relay: \(error)") }
    }
    try loop.add(port, forMode: .default)
    registerOrFail(port, server, arguments[2])
    say("ready")
    loop.run(in: .default, until: .after(.seconds(120)))
    port.invalidate()

case "race":
    guard arguments.count == 3 else { fail("usage: race DIR NAME") }
    let server = PKNameServer(directory: arguments[1])
    let port = PKReceivePort()
    try loop.add(port, forMode: .default)
    do {
        try server.register(port, name: arguments[2])
        say("won")
    } catch where error.code == .nameInUse {
        say("lost")
    } catch {
        fail("race: \(error)")
    }
    _ = readLine()
    port.invalidate()

case "flood":
    guard arguments.count == 4 || arguments.count == 5 else { fail("usage: flood DIR NAME SELF [SIZE]") }
    let server = PKNameServer(directory: arguments[1])
    let own = PKReceivePort()
    try loop.add(own, forMode: .default)
    registerOrFail(own, server, arguments[3])
    let right = try server.lookUp(arguments[2], timeout: .seconds(10))
    say("ready")
    let size = arguments.count > 4 ? Int(arguments[4]) ?? 1024 : 1024
    var sequence: UInt32 = 0
    while true {
        sequence &+= 1
        do { try right.send(PKPortMessage(msgid: sequence, data: [UInt8](repeating: 7, count: size)), timeout: .seconds(60)) } catch { break }
    }

case "whoami":
    guard arguments.count == 3 else { fail("usage: whoami DIR NAME") }
    let server = PKNameServer(directory: arguments[1])
    let port = PKReceivePort { message in
        try? message.replyPort?.send(PKPortMessage(msgid: message.msgid, data: Array("\(getpid())".utf8)), timeout: .seconds(5))
    }
    try loop.add(port, forMode: .default)
    registerOrFail(port, server, arguments[2])
    say("ready")
    loop.run(in: .default, until: .after(.seconds(120)))
    port.invalidate()

case "racer":
    guard arguments.count == 3 else { fail("usage: racer DIR NAME") }
    let server = PKNameServer(directory: arguments[1])
    var held: PKReceivePort?
    lines: while let line = readLine() {
        switch line {
        case "go":
            let port = PKReceivePort()
            try loop.add(port, forMode: .default)
            do {
                try server.register(port, name: arguments[2])
                held = port
                say("won")
            } catch where error.code == .nameInUse {
                port.invalidate()
                say("lost")
            } catch {
                fail("racer: \(error)")
            }
        case "release":
            held?.invalidate()
            held = nil
            say("released")
        case "end":
            break lines
        default:
            fail("racer: unknown line \(line)")
        }
    }
    held?.invalidate()

case "stall-send":
    guard arguments.count == 5, let count = UInt32(arguments[3]), let maxSize = Int(arguments[4]) else {
        fail("usage: stall-send DIR NAME COUNT MAXSIZE")
    }
    let right = try PKNameServer(directory: arguments[1]).lookUp(arguments[2], timeout: .seconds(10))
    var bytes = 0
    for sequence in UInt32(1)...count {
        let data = [UInt8](repeating: UInt8(truncatingIfNeeded: sequence), count: Int.random(in: 1...maxSize))
        do { try right.send(PKPortMessage(msgid: sequence, data: data), timeout: .seconds(60)) } catch { fail("stall-send: \(error)") }
        bytes += data.count
        say("sent \(sequence)")
    }
    say("done \(count) \(bytes)")

case "burst":
    guard arguments.count == 5, let count = UInt32(arguments[3]), let size = Int(arguments[4]) else {
        fail("usage: burst DIR NAME COUNT SIZE")
    }
    let right = try PKNameServer(directory: arguments[1]).lookUp(arguments[2], timeout: .seconds(10))
    for sequence in UInt32(0)..<count {
        let message = PKPortMessage(msgid: sequence, data: [UInt8](repeating: UInt8(truncatingIfNeeded: sequence), count: size))
        do { try right.send(message, timeout: .seconds(60)) } catch { fail("burst: \(error)") }
    }
    exit(0)

case "exhaust":
    guard arguments.count == 3, let limit = rlim_t(arguments[2]) else { fail("usage: exhaust DIR LIMIT") }
    var rl = rlimit(rlim_cur: limit, rlim_max: limit)
    guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl) == 0 else { fail("setrlimit: errno \(errno)") }
    let server = PKNameServer(directory: arguments[1])
    var ports: [PKReceivePort] = []
    var rights: [PKSendPort] = []
    /// Runs one step; prints its PKError (every error PortKit throws is one) and says whether it worked.
    func attempt(_ what: String, _ body: () throws(PKError) -> Void) -> Bool {
        do throws(PKError) {
            try body()
            return true
        } catch {
            say("failed \(what): \(error.code): \(error)")
            return false
        }
    }
    // Named ports and a connection to each until descriptors run out.
    var index = 0
    var delivered = Set<Int>()
    while index < 10_000 {
        let port = PKReceivePort { [index] _ in delivered.insert(index) }
        guard attempt("schedule \(index)", { () throws(PKError) in try loop.add(port, forMode: .default) }) else { break }
        ports.append(port)
        guard attempt("register \(index)", { () throws(PKError) in try server.register(port, name: "x-\(index)") }) else { break }
        guard attempt("look up \(index)", { () throws(PKError) in rights.append(try server.lookUp("x-\(index)")) }) else { break }
        guard attempt("send \(index)", { () throws(PKError) in try rights.last!.send(PKPortMessage(msgid: 1), timeout: .seconds(1)) }) else { break }
        index += 1
    }
    // At the limit, each kind of call fails cleanly (or works, if the failure freed a slot).
    _ = attempt("register at the limit", { () throws(PKError) in try server.register(ports[0], name: "at-limit") })
    _ = attempt("look up at the limit", { () throws(PKError) in rights.append(try server.lookUp("x-0")) })
    _ = attempt("pass a port at the limit", { () throws(PKError) in
        try rights[0].send(PKPortMessage(msgid: 2, components: [.port(ports[0].makeSendRight())]), timeout: .seconds(1))
    })
    // The loop keeps running with connections waiting that it cannot accept: it must not crash;
    // report how much CPU it burns meanwhile.
    func cpuMilliseconds() -> Int {
        var usage = rusage()
        getrusage(Int32(RUSAGE_SELF.rawValue), &usage)
        return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000 + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000
    }
    let cpuBefore = cpuMilliseconds()
    loop.run(in: .default, until: .after(.milliseconds(200)))
    say("made \(index) named ports before the limit; the loop used \(cpuMilliseconds() - cpuBefore) ms of CPU in 200 ms at the limit")
    // Release half, then a new port must work end to end.
    for right in rights.prefix(rights.count / 2) { right.invalidate() }
    for port in ports.prefix(ports.count / 2) { port.invalidate() }
    // The connections to the ports still open, which waited in their backlogs, are accepted
    // now and their messages delivered.
    let waiting = Set((ports.count / 2)..<index)
    let acceptDeadline = PKDeadline.after(.seconds(10))
    while !waiting.isSubset(of: delivered) && !acceptDeadline.hasPassed {
        loop.run(in: .default, until: acceptDeadline, returnAfterSourceHandled: true)
    }
    say("accepted after the limit: \(waiting.intersection(delivered).count) of \(waiting.count)")
    var got: [UInt32] = []
    let fresh = PKReceivePort { got.append($0.msgid) }
    let recovered = attempt("recover", { () throws(PKError) in
        try loop.add(fresh, forMode: .default)
        try server.register(fresh, name: "recovered")
        try server.lookUp("recovered").send(PKPortMessage(msgid: 42), timeout: .seconds(5))
    })
    let deadline = PKDeadline.after(.seconds(10))
    while recovered && got.isEmpty && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
    say(got == [42] ? "recovered" : "not recovered")
    for port in ports + [fresh] { port.invalidate() }

case "inherit":
    guard arguments.count == 4 else { fail("usage: inherit DIR PEER SELF") }
    let server = PKNameServer(directory: arguments[1])
    var got = 0
    let port = PKReceivePort { _ in got += 1 }
    try loop.add(port, forMode: .default)
    registerOrFail(port, server, arguments[3])
    try server.lookUp(arguments[3]).send(PKPortMessage(msgid: 1, components: [.port(port.makeSendRight())]), timeout: .seconds(5))
    let deadline = PKDeadline.after(.seconds(30))
    while got == 0 && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
    var died = false
    let watch = try server.lookUp(arguments[2]).watchInvalidation(on: loop, forMode: .default) { died = true }
    let worker = try PKWorkerThread(name: "inherit") { _ in }
    let argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/sleep"), strdup("30"), nil]
    var child: pid_t = 0
    guard posix_spawn(&child, "/bin/sleep", nil, nil, argv, environ) == 0 else { fail("posix_spawn failed") }
    say("child \(child)")
    while !died && !deadline.hasPassed { loop.run(in: .default, until: deadline, returnAfterSourceHandled: true) }
    say(died ? "noticed" : "not noticed")
    watch.cancel()
    port.invalidate()
    let successor = PKReceivePort()
    try loop.add(successor, forMode: .default)
    registerOrFail(successor, server, arguments[3])
    say("name free")
    successor.invalidate()
    _ = try? worker.stop()
    kill(child, SIGKILL)
    var status: Int32 = 0
    _ = waitpid(child, &status, 0)

case "worker":
    do {
        try PKWorkerProcess.serve { context in
            // The launcher's variable is gone by now: programs the worker starts do not see it.
            let inherited = getenv("PORTKIT_WORKER").map { " PORTKIT_WORKER=\(String(cString: $0))" } ?? ""
            context.checkInData = Array("pid \(getpid())\(inherited)".utf8)
            let loop = context.loop
            context.port.handler = { echo($0, loop: loop) }
        }
    } catch { fail("worker: \(error)") }

case "launch-worker":
    var path = [UInt8](repeating: 0, count: 4096)
    let length = readlink("/proc/self/exe", &path, path.count - 1)
    guard length > 0 else { fail("launch-worker: no /proc/self/exe") }
    do {
        let worker = try PKWorkerProcess(
            executable: String(decoding: path[..<length], as: UTF8.self), arguments: ["worker"], name: "grandchild", checkInTimeout: .seconds(60))
        say("worker \(worker.processID)")
        while true { pause() }  // until killed: the worker must then notice its launcher's death
    } catch { fail("launch-worker: \(error)") }

case "checkin-by-name":
    guard arguments.count == 4 else { fail("usage: checkin-by-name DIR MAIN SELF") }
    let server = PKNameServer(directory: arguments[1])
    // Listing 3-17/3-18: look up the main port by name, make and register our own named port,
    // and send our name as the check-in data.
    let main = try server.lookUp(arguments[2], timeout: .seconds(10))
    let port = PKReceivePort { echo($0, loop: loop) }
    try loop.add(port, forMode: .default)
    registerOrFail(port, server, arguments[3])
    try main.send(PKPortMessage(msgid: PKCheckIn.messageID, data: Array(arguments[3].utf8)), timeout: .seconds(5))
    loop.run(in: .default, until: .after(.seconds(120)))
    port.invalidate()

case "as-nobody":
    guard arguments.count == 3 else { fail("usage: as-nobody DIR NAME") }
    guard setgid(65534) == 0, setuid(65534) == 0 else { fail("cannot drop to uid 65534") }
    let path = "\(arguments[1])/\(arguments[2]).sock"
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (i, byte) in path.utf8.enumerated() where i < raw.count - 1 { raw[i] = byte }
    }
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard connected == 0 else { fail("connect as nobody failed: errno \(errno)") }
    // A greeting ("PKIT", version 1, flags 0, pid, uid) and an empty frame with msgid 5.
    var bytes: [UInt8] = Array("PKIT".utf8) + [1, 0, 0, 0]
    for value in [UInt32(bitPattern: getpid()), getuid()] { withUnsafeBytes(of: value.littleEndian) { bytes += $0 } }
    bytes += [16, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    _ = send(fd, bytes, bytes.count, Int32(MSG_NOSIGNAL))
    var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    _ = poll(&pfd, 1, 10_000)
    var buffer = [UInt8](repeating: 0, count: 16)
    let n = recv(fd, &buffer, 16, Int32(MSG_DONTWAIT))
    say(n == 0 || (n < 0 && errno == ECONNRESET) ? "closed" : "open")

default:
    fail("unknown command \(arguments.first ?? "(none)")")
}
exit(0)
