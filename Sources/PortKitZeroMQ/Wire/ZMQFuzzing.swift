#if ZeroMQ
// The property the ZeroMQ fuzzer checks, in the module so that the libFuzzer target (`Fuzz/`,
// zmq-fuzzer) and the corpus replay test (`ZMQCorpusReplayTests`, `swift test --traits ZeroMQ`)
// run exactly the same code. Nothing else calls it.

import PortKit

/// Drives a `ZMQMessageDecoder` with the frames of messages a fuzzer chose (one frame each, as
/// PortKit sends them, or multipart, as a confused or hostile peer may), as libzmq hands them to
/// a receive port, reading each frame's messages one at a time as a receive port does (a frame
/// may be a batch), and traps when a property of the mapping (protocol.md section 10) or of the
/// name service's messages (10.10) breaks.
///
/// ```
/// byte 0        bit 0: small limits (64 data bytes, 8 components, 4 ports), so that the limit
///                      checks are reachable with short inputs
///               bit 1: generated mode: the rest describes messages to encode (see below)
///               bit 2: name mode: the rest is a name (UTF-8, repaired), checked as the names
///                      of requests are (the other bits are ignored)
/// the rest      frames, each a length byte and then that many bytes (fewer at the end):
///               bits 0-6: the length, 0...126, or 127: the next 2 bytes (little-endian) are it
///               bit 7:    "more" is clear: the frame ends its multipart message
///               The last frame always ends its message (libzmq delivers messages whole).
/// ```
///
/// In generated mode the rest describes messages, one operation per byte (its low 2 bits; the 6
/// bits above are its operand L): 0: a new message (msgid and destination port id: the next
/// 2 bytes; with a reply port at `endpoints[L / 2]` when L is odd); 1: a data component of L
/// bytes taken from the bytes that follow; 2: a port component at `endpoints[L]` (port id L);
/// 3: a data component of 64 * L bytes. Missing bytes read as zeros; a component before any
/// message starts one. `endpoints` holds valid endpoints and invalid ones. Each message that the
/// wire can carry (every endpoint at most 255 bytes) is encoded with `ZMQMessageEncoder` and
/// decoded: one that `ZMQMessageEncoder.measure` accepts under the decoder's limits and whose
/// endpoints PortKit accepts decodes to exactly itself; any other is dropped as a violation.
/// Then all of them go in one frame, as a batch: it decodes to the valid ones up to the first
/// invalid one, which drops the rest of the frame.
///
/// The properties, each checked with `precondition`:
/// - Boundaries: a message is delivered only from a message of one frame, and after a frame
///   without "more" the decoder is between messages whatever came before (one message never
///   spoils the next frame). Each message read from a frame takes bytes; a violation ends the
///   frame. `consume(_:more:)`, which the tests use, reads the same messages.
/// - A delivered message is valid by the sender's rules (`ZMQMessageEncoder.measure`), and each of
///   its endpoints is one PortKit accepts, written canonically (`ZMQEndpoint`'s `description`
///   gives back its very bytes).
/// - Canonical: re-encoding a delivered message gives exactly its bytes in the frame it came
///   from, FOLLOWED aside (set exactly when it is not the frame's last).
/// - Round trip: those bytes, through a fresh decoder, give the same message.
/// - The name service: a delivered message that the server reads as a request
///   (`ZMQNameProtocol.request`, on the message the receive port makes of it) is exactly the
///   request a client writes for that name and port; one the client reads as a reply
///   (`ZMQNameProtocol.check`) fails only with the documented codes, and, unless it is refused as
///   unreadable, is exactly the reply the server writes for that status and port.
/// - Names (of requests, and in name mode): `PKZMQEndpoint.validate(name:)` accepts exactly the
///   name server's rule (checked byte by byte here); the `ipc://` socket of a name in the name
///   directory (`PKZMQEndpoint.ipcSocketPath`) is the directory, a slash and the name, and
///   neither it nor its lock is a file of another name of the name server's (`<n>.sock`,
///   `<n>.sock.new`, `<n>.lock` for a valid name n other than the name itself).
enum ZMQFuzzing {
    /// Endpoints for generated messages: valid ones first, then ones PortKit refuses.
    static let endpoints: [String] = [
        "tcp://127.0.0.1:5556", "ipc://@portkit-fuzz", "ipc:///tmp/portkit-1000/name", "tcp://host.example:65535",
        "tcp://[::1]:1",
        "tcp://*:*", "tcp://0.0.0.0:1", "tcp://h:0", "tcp://h:*", "", "tcp://nohost", "udp://h:1", "ipc://relative", "tcp://h:65536", "tcp://h:0x10", "ipc://@a\u{0}b",
        "ipc:///" + String(repeating: "p", count: 107), "tcp://" + String(repeating: "h", count: 250) + ":1",
    ]

    /// Runs one fuzz input and checks every property; traps on a violation.
    static func exercise(_ input: UnsafeRawBufferPointer) {
        guard let header = input.first else { return }
        var limits = ZMQWireLimits(.default)
        if header & 1 != 0 {
            limits.maxMessageBytes = 64
            limits.maxComponents = 8
            limits.maxPorts = 4
        }
        let rest = UnsafeRawBufferPointer(rebasing: input[1...])
        if header & 4 != 0 {
            checkName(String(decoding: rest, as: UTF8.self))
            return
        }
        if header & 2 != 0 {
            exerciseEncoded(description: rest, limits: limits)
            return
        }
        var decoder = ZMQMessageDecoder(limits: limits)
        for frames in messages(in: rest) {
            consume(frames, with: &decoder, limits: limits)
        }
    }

    /// The multipart messages of a raw input, each a list of frames.
    private static func messages(in bytes: UnsafeRawBufferPointer) -> [[[UInt8]]] {
        var messages: [[[UInt8]]] = []
        var current: [[UInt8]] = []
        var index = 0
        while index < bytes.count {
            let lead = bytes[index]
            index += 1
            var length = Int(lead & 0x7F)
            if length == 0x7F {
                let low = index < bytes.count ? Int(bytes[index]) : 0
                let high = index + 1 < bytes.count ? Int(bytes[index + 1]) : 0
                index = min(index + 2, bytes.count)
                length = low | high << 8
            }
            let end = min(index + length, bytes.count)
            current.append(Array(bytes[index..<end]))
            index = end
            if lead & 0x80 != 0 || index >= bytes.count {
                messages.append(current)
                current = []
            }
        }
        return messages
    }

    /// Feeds one multipart message, "more" on every frame but the last, reads each message of
    /// a frame as a receive port does, and checks what comes out; returns the messages
    /// delivered.
    @discardableResult
    private static func consume(_ frames: [[UInt8]], with decoder: inout ZMQMessageDecoder,
                                limits: ZMQWireLimits) -> [ZMQDecodedMessage] {
        precondition(decoder.isIdle, "ZMQFuzzing: the decoder is not between messages at a message's start")
        var delivered: [ZMQDecodedMessage] = []
        for (index, frame) in frames.enumerated() {
            let more = index < frames.count - 1
            if decoder.begin(frameWithMore: more) != nil { continue }
            precondition(frames.count == 1, "ZMQFuzzing: messages were read from a message of \(frames.count) frames")
            frame.withUnsafeBytes { raw in
                var offset = 0
                var none: [UInt8] = []
                repeat {
                    let start = offset
                    switch decoder.next(in: raw, at: &offset, reusing: &none) {
                    case .message(let message):
                        precondition(offset > start, "ZMQFuzzing: a message was read from no bytes")
                        delivered.append(message)
                        check(message, from: Array(raw[start..<offset]), followed: offset < raw.count, limits: limits)
                    case .violation:
                        precondition(offset == raw.count, "ZMQFuzzing: reading went on after a violation")
                    case .needMore:
                        preconditionFailure("ZMQFuzzing: reading a frame's message answered needMore")
                    }
                } while offset < raw.count
            }
            // The convenience that the tests use reads the same.
            let outputs = frame.withUnsafeBytes { var fresh = ZMQMessageDecoder(limits: limits); return fresh.consume($0, more: false) }
            let messages = outputs.compactMap { output -> ZMQDecodedMessage? in if case .message(let m) = output { m } else { nil } }
            precondition(messages == delivered, "ZMQFuzzing: consume(_:more:) reads another list of messages")
        }
        precondition(decoder.isIdle, "ZMQFuzzing: the decoder is not between messages after a frame without \"more\"")
        return delivered
    }

    /// Checks a delivered message against its bytes in the frame it came from (`followed`: it is
    /// not the frame's last, so its header carries FOLLOWED).
    private static func check(_ message: ZMQDecodedMessage, from bytes: [UInt8], followed: Bool, limits: ZMQWireLimits) {
        var addresses: [ZMQPortAddress] = message.reply.map { [$0] } ?? []
        for case .port(let address) in message.components { addresses.append(address) }
        let encoded: [UInt8]
        do throws(PKError) {
            encoded = try ZMQMessageEncoder.frame(
                msgid: message.msgid, destination: message.destination, components: message.components, reply: message.reply,
                limits: limits)
        } catch {
            preconditionFailure("ZMQFuzzing: the decoder delivered a message the encoder refuses: \(error)")
        }
        for address in addresses {
            guard let endpoint = try? ZMQEndpoint(parsing: address.endpoint),
                  endpoint.description.utf8.elementsEqual(address.endpoint.utf8) else {
                preconditionFailure("ZMQFuzzing: the decoder delivered the endpoint \"\(address.endpoint)\"")
            }
        }

        // Canonical (FOLLOWED aside), and round trip through a fresh decoder.
        var own = bytes
        if followed { ZMQMessageEncoder.clearFollowed(&own) }
        precondition(encoded == own, "ZMQFuzzing: \(message) re-encodes to other bytes than it came from")
        var fresh = ZMQMessageDecoder(limits: limits)
        let again = encoded.withUnsafeBytes { fresh.consume($0, more: false) }
        var same = false
        if again.count == 1, case .message(let decoded) = again[0] { same = decoded == message }
        precondition(same, "ZMQFuzzing: \(message) round-trips to \(again)")

        checkNameService(message, bytes: own)
    }

    /// The name service's reading of a delivered message, as a request and as a reply.
    private static func checkNameService(_ decoded: ZMQDecodedMessage, bytes: [UInt8]) {
        let message = PKZMQMessage(decoded)  // as the receive port delivers it; connects nothing
        if let request = ZMQNameProtocol.request(message) {
            let (msgid, name, port, key): (UInt32, String, PKZMQSendPort?, [UInt8]?) = switch request {
            case .register(let name, let port, let key): (ZMQNameProtocol.register, name, port, key)
            case .lookUp(let name): (ZMQNameProtocol.lookUp, name, nil, nil)
            case .unregister(let name, let port, let key): (ZMQNameProtocol.unregister, name, port, key)
            }
            // The request a client writes (PKZMQNameService): the name, then the port, then the
            // registration's key.
            var components: [ZMQWireComponent] = [.data(Array(name.utf8))]
            if let port { components.append(.port(port.right.address)) }
            if let key { components.append(.data(key)) }
            let written = encode(msgid, decoded.destination, components, decoded.reply)
            precondition(written == bytes, "ZMQFuzzing: the request \(request) is not what a client writes for it")
            checkName(name)
        }

        let status: ZMQNameProtocol.Status?
        var port: PKZMQSendPort?
        do throws(PKError) {
            port = try ZMQNameProtocol.check(message, name: "fuzz", service: "fuzz")
            status = .ok
        } catch {
            switch error.code {
            case .nameInUse: status = .nameInUse
            case .nameNotFound: status = .nameNotFound
            case .badName: status = .badName
            case .transport: status = .unreachable
            case .protocolViolation:
                // A bad-request reply, or one the client cannot read.
                let badRequest = message.components.count == 1
                    && message.components[0].data == [ZMQNameProtocol.Status.badRequest.rawValue]
                status = badRequest ? .badRequest : nil
            default: preconditionFailure("ZMQFuzzing: reading a reply threw \(error.code)")
            }
        }
        guard let status else { return }
        // The reply the server writes for that status and port (ZMQNameProtocol.reply).
        let reply = ZMQNameProtocol.reply(to: decoded.msgid, status, port: port)
        var components: [ZMQWireComponent] = []
        for component in reply.components {
            switch component {
            case .data(let bytes): components.append(.data(bytes))
            case .port(let port): components.append(.port(port.right.address))
            }
        }
        let written = encode(reply.msgid, decoded.destination, components, decoded.reply)
        precondition(written == bytes, "ZMQFuzzing: a reply read as \(status) is not what the server writes for it")
    }

    /// The name rule, byte by byte: 1 to 64 bytes from `A-Z a-z 0-9 . _ -`, the first not a dot.
    private static func followsRule<C: Collection<UInt8>>(_ bytes: C) -> Bool {
        guard (1...64).contains(bytes.count), bytes.first != UInt8(ascii: ".") else { return false }
        return bytes.allSatisfy { byte in
            (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
        }
    }

    /// A name's validation and the `ipc://` files made from it.
    private static func checkName(_ name: String) {
        let bytes = Array(name.utf8)
        let valid = followsRule(bytes)
        do throws(PKError) {
            try PKZMQEndpoint.validate(name: name)
            precondition(valid, "ZMQFuzzing: the name \"\(name)\" was accepted")
        } catch {
            precondition(!valid && error.code == .badName, "ZMQFuzzing: the name \"\(name)\" was refused: \(error)")
        }
        let directory = "/tmp/portkit-1000"
        let path: String
        do throws(PKError) { path = try PKZMQEndpoint.ipcSocketPath(name: name, directory: directory) } catch {
            precondition(error.code == .badName, "ZMQFuzzing: ipcSocketPath threw \(error.code)")
            return
        }
        precondition(valid && path.utf8.elementsEqual((directory + "/").utf8 + bytes),
                     "ZMQFuzzing: the name \"\(name)\" has the socket \(path)")
        // The ZeroMQ name's files are <name> and <name>.lock; the name server's for a name n are
        // <n>.sock, <n>.sock.new and <n>.lock. <name>.lock is <n>.lock only for n == name (the
        // lock they share on purpose), and never <n>.sock or <n>.sock.new.
        for suffix in PKZMQEndpoint.nameServerSuffixes.map({ Array($0.utf8) })
        where bytes.count > suffix.count && bytes.suffix(suffix.count).elementsEqual(suffix) {
            precondition(!followsRule(bytes.dropLast(suffix.count)),
                         "ZMQFuzzing: the socket of the ZeroMQ name \"\(name)\" is a file of a name server's name")
        }
    }

    /// The frame `ZMQMessageEncoder` writes, or nil if the wire cannot carry the message (an
    /// endpoint over 255 bytes); checked against the widest limits the wire has, so that the
    /// decoder's own limits are what drops the rest.
    private static func encode(_ msgid: UInt32, _ destination: UInt64, _ components: [ZMQWireComponent],
                               _ reply: ZMQPortAddress?) -> [UInt8]? {
        var wide = ZMQWireLimits(.default)
        wide.maxComponents = Int(UInt16.max)
        wide.maxMessageBytes = .max
        wide.maxPorts = .max
        return try? ZMQMessageEncoder.frame(msgid: msgid, destination: destination, components: components, reply: reply, limits: wide)
    }

    /// The generated mode: messages described by `description`, encoded and decoded one by one.
    private static func exerciseEncoded(description bytes: UnsafeRawBufferPointer, limits: ZMQWireLimits) {
        struct Described {
            var msgid: UInt32
            var destination: UInt64
            var components: [ZMQWireComponent] = []
            var reply: ZMQPortAddress?
        }
        var messages: [Described] = []
        var index = 0
        var budget = 64 << 10
        func take(_ count: Int) -> [UInt8] {
            let available = min(count, bytes.count - index)
            let taken = Array(bytes[index..<index + available])
            index += available
            return taken + [UInt8](repeating: 0, count: count - available)
        }
        while index < bytes.count {
            let op = bytes[index]
            index += 1
            let operand = Int(op >> 2)
            if op & 3 == 0 {
                let ids = take(2)
                let reply = operand % 2 == 1
                    ? ZMQPortAddress(endpoint: endpoints[(operand / 2) % endpoints.count], portID: UInt64(ids[1]))
                    : nil
                messages.append(Described(msgid: UInt32(ids[0]), destination: UInt64(ids[1]), reply: reply))
                continue
            }
            if messages.isEmpty { messages.append(Described(msgid: 0, destination: 0)) }
            switch op & 3 {
            case 1: messages[messages.count - 1].components.append(.data(take(operand)))
            case 2:
                let address = ZMQPortAddress(endpoint: endpoints[operand % endpoints.count], portID: UInt64(operand))
                messages[messages.count - 1].components.append(.port(address))
            default:
                let length = min(64 * operand, budget)
                budget -= length
                messages[messages.count - 1].components.append(.data([UInt8](repeating: op, count: length)))
            }
        }

        var decoder = ZMQMessageDecoder(limits: limits)
        var batch: [UInt8] = []
        var expectedInBatch: [ZMQDecodedMessage] = []
        var batchBroken = false
        var lastLength = 0
        for described in messages {
            guard let frame = encode(described.msgid, described.destination, described.components, described.reply) else {
                continue
            }
            var valid = (try? ZMQMessageEncoder.measure(components: described.components, reply: described.reply,
                                                        limits: limits)) != nil
            for case .port(let address) in described.components + (described.reply.map { [ZMQWireComponent.port($0)] } ?? [])
            where (try? ZMQEndpoint(parsing: address.endpoint))?.isConnectable != true || address.endpoint.isEmpty {
                valid = false
            }
            let delivered = consume([frame], with: &decoder, limits: limits)
            let expected = ZMQDecodedMessage(
                msgid: described.msgid, destination: described.destination, components: described.components,
                reply: described.reply)
            if valid {
                precondition(delivered == [expected], "ZMQFuzzing: a valid message decodes as \(delivered)")
            } else {
                precondition(delivered.isEmpty, "ZMQFuzzing: an invalid message was delivered: \(delivered)")
            }
            // The same messages in one frame, as a batch (protocol.md 10.2): read up to the first
            // invalid one, which drops the rest of the frame.
            if !batch.isEmpty { ZMQMessageEncoder.setFollowed(&batch, headerAt: batch.count - lastLength) }
            lastLength = frame.count
            batch += frame
            if !valid { batchBroken = true }
            if !batchBroken { expectedInBatch.append(expected) }
        }
        guard !batch.isEmpty else { return }
        let delivered = consume([batch], with: &decoder, limits: limits)
        precondition(delivered == expectedInBatch, "ZMQFuzzing: a batch decodes as \(delivered), not \(expectedInBatch)")
    }
}
#endif
