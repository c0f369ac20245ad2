// A helper process for the ZeroMQ tests: each command plays one peer over PortKitZeroMQ.
//
//   PortKitZMQPeer echo ENDPOINT             bind ENDPOINT, print "ready ENDPOINT'", answer each
//                                            message on its reply port with the same msgid and
//                                            components; msgid 99 ends it
//   PortKitZMQPeer hold ENDPOINT             the same, until killed
//   PortKitZMQPeer bind ENDPOINT             try once to bind ENDPOINT; print "bound" or
//                                            "refused CODE", then wait for a line or EOF on stdin
//   PortKitZMQPeer flood ENDPOINT ID COUNT   send COUNT messages (msgid ID, data: the index as a
//                                            little-endian u32) to ENDPOINT; print "done"
//   PortKitZMQPeer burst ENDPOINT COUNT      send COUNT messages (msgid 1, data: the index as a
//                                            little-endian u32) to ENDPOINT as fast as it can,
//                                            print "sent" and exit at once: what a batch still
//                                            holds must go out at exit
//   PortKitZMQPeer checkin ENDPOINT          the guide's worker (Listings 3-14, 3-15) over
//                                            ZeroMQ: bind its own port, check in with msgid 100
//                                            carrying it, answer each msgid 1 with msgid 2 and
//                                            the text upper-cased; msgid 99 ends it
//   PortKitZMQPeer register SERVICE NAME     bind a port, register it as NAME with the name
//                                            service at SERVICE, print "registered", then echo
//                                            as "hold" does; or print "refused CODE"
//   PortKitZMQPeer lookup SERVICE NAME       look NAME up, send it a request, print
//                                            "found ENDPOINT MSGID"; or print "refused CODE"
//
// PORTKIT_ZMQ_HEARTBEAT_MS="INTERVAL,TIMEOUT" sets the heartbeats.

#if ZeroMQ
import Glibc
import PortKit
import PortKitZeroMQ

let arguments = Array(CommandLine.arguments.dropFirst())

/// Writes a line to standard output at once (the test reads it through a pipe).
func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

func fail(_ message: String) -> Never {
    let bytes = Array("PortKitZMQPeer: \(message)\n".utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    exit(2)
}

func argument(_ index: Int) -> String {
    guard index < arguments.count else { fail("missing argument \(index) for \(arguments.first ?? "nothing")") }
    return arguments[index]
}

if let setting = getenv("PORTKIT_ZMQ_HEARTBEAT_MS").map({ String(cString: $0) }) {
    let parts = setting.split(separator: ",").compactMap { Int($0) }
    if parts.count == 2 {
        PKZMQTransport.heartbeat = PKZMQHeartbeat(interval: .milliseconds(parts[0]), timeout: .milliseconds(parts[1]))
    }
}

let loop = PKRunLoop.current

switch arguments.first {
case "echo", "hold":
    let stopOn99 = arguments.first == "echo"
    let port: PKZMQReceivePort
    do {
        port = try PKZMQReceivePort(bindingTo: argument(1)) { message in
            if stopOn99 && message.msgid == 99 { loop.stop(); return }
            try? message.replyPort?.send(PKZMQMessage(msgid: message.msgid, components: message.components), timeout: .seconds(5))
        }
        try loop.add(port, forMode: .default)
    } catch { fail("bind \(argument(1)): \(error)") }
    say("ready \(port.endpoint)")
    while loop.run(in: .default, until: .distantFuture) != .stopped {}
    port.invalidate()
    exit(0)

case "bind":
    do {
        let port = try PKZMQReceivePort(bindingTo: argument(1))
        say("bound")
        var byte: UInt8 = 0
        while read(0, &byte, 1) > 0 && byte != 10 {}  // until a newline or the end of input
        port.invalidate()
    } catch {
        say("refused \(error.code)")
    }
    exit(0)

case "flood":
    guard let id = UInt32(argument(2)), let count = Int(argument(3)) else { fail("flood ENDPOINT ID COUNT") }
    do {
        let right = try PKZMQSendPort(connectingTo: argument(1))
        for index in 0..<count {
            var data: [UInt8] = []
            withUnsafeBytes(of: UInt32(index).littleEndian) { data.append(contentsOf: $0) }
            try right.send(PKZMQMessage(msgid: id, data: data), timeout: .seconds(60))
        }
        // A request waits until everything before it has arrived (one connection, in order).
        _ = try right.sendRequest(PKZMQMessage(msgid: 0), sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
    } catch { fail("flood: \(error)") }
    say("done")
    exit(0)

case "burst":
    guard let count = Int(argument(2)) else { fail("burst ENDPOINT COUNT") }
    do {
        let right = try PKZMQSendPort(connectingTo: argument(1))
        for index in 0..<count {
            var data: [UInt8] = []
            withUnsafeBytes(of: UInt32(index).littleEndian) { data.append(contentsOf: $0) }
            try right.send(PKZMQMessage(msgid: 1, data: data), timeout: .seconds(60))
        }
    } catch { fail("burst: \(error)") }
    say("sent")
    exit(0)

case "checkin":
    do {
        let mainPort = try PKZMQSendPort(connectingTo: argument(1))
        let myPort = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
            switch message.msgid {
            case 99: loop.stop()
            case 1:
                let answer = PKZMQMessage(msgid: 2, data: Array(message.text.uppercased().utf8))
                try? (message.replyPort ?? mainPort).send(answer, timeout: .seconds(5))
            default: break
            }
        }
        try loop.add(myPort, forMode: .default)
        // The main side dying ends the worker too.
        try mainPort.watchInvalidation(on: loop, forMode: .default) { loop.stop() }
        try mainPort.send(PKZMQMessage(msgid: 100, replyPort: myPort.makeSendRight()), timeout: .seconds(10))
        while loop.run(in: .default, until: .distantFuture) != .stopped {}
        myPort.invalidate()
    } catch { fail("checkin: \(error)") }
    exit(0)

case "register":
    do {
        let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
            try? message.replyPort?.send(PKZMQMessage(msgid: message.msgid, components: message.components), timeout: .seconds(5))
        }
        try loop.add(port, forMode: .default)
        do {
            try PKZMQNameService(endpoint: argument(1)).register(port, name: argument(2))
        } catch {
            say("refused \(error.code)")
            exit(0)
        }
        say("registered")
        while true { loop.run(in: .default, until: .distantFuture) }
    } catch { fail("register: \(error)") }

case "lookup":
    do {
        let right = try PKZMQNameService(endpoint: argument(1)).lookUp(argument(2))
        let reply = try right.sendRequest(PKZMQMessage(msgid: 21, data: [1]), sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        say("found \(right.endpoint) \(reply?.msgid ?? 0)")
    } catch {
        say("refused \(error.code)")
    }
    exit(0)

default:
    fail("unknown command \(arguments.first ?? "(none)")")
}
#else
import Glibc
let message = Array("PortKitZMQPeer: built without the ZeroMQ trait\n".utf8)
_ = message.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
exit(1)
#endif
