// A helper process for PortKit's cross-process tests: each command plays one peer.
//
//   PortKitTestPeer echo DIR NAME          register NAME, answer each message on its reply port
//                                         with the same msgid and data; msgid 99 ends it
//   PortKitTestPeer hold DIR NAME          register NAME and serve until killed
//   PortKitTestPeer relay DIR NAME TARGET  register NAME; forward every port it receives to the
//                                         port registered as TARGET (msgid 7), then echo
//   PortKitTestPeer race DIR NAME          try once to register NAME; print "won" or "lost",
//                                         then wait for a line on stdin (or EOF) and exit
//   PortKitTestPeer flood DIR NAME SELF    register SELF, look NAME up and send messages until
//                                         killed (each send waits up to 60 s for room)
//   PortKitTestPeer as-nobody DIR NAME     drop to uid 65534, connect to NAME's socket by hand,
//                                         greet and send a frame; print "closed" when the
//                                         server closes the connection, "open" if it does not
//   PortKitTestPeer worker                 serve as a PKWorkerProcess (echo)
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
    guard arguments.count == 4 else { fail("usage: flood DIR NAME SELF") }
    let server = PKNameServer(directory: arguments[1])
    let own = PKReceivePort()
    try loop.add(own, forMode: .default)
    registerOrFail(own, server, arguments[3])
    let right = try server.lookUp(arguments[2], timeout: .seconds(10))
    say("ready")
    var sequence: UInt32 = 0
    while true {
        sequence &+= 1
        do { try right.send(PKPortMessage(msgid: sequence, data: [UInt8](repeating: 7, count: 1024)), timeout: .seconds(60)) } catch { break }
    }

case "worker":
    do {
        try PKWorkerProcess.serve { context in
            context.checkInData = Array("pid \(getpid())".utf8)
            let loop = context.loop
            context.port.handler = { echo($0, loop: loop) }
        }
    } catch { fail("worker: \(error)") }

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
