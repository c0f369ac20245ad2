// The property the check-in fuzzer checks, in the module so that the libFuzzer target (`Fuzz/`,
// checkin-fuzzer) and the corpus replay test (`CheckInCorpusReplayTests`) run exactly the same
// code. Nothing else calls it.

/// Drives the launcher's side of a check-in with bytes a fuzzer chose, and traps when a property
/// breaks. What a worker process can make its launcher interpret is what it writes on its
/// check-in connection: a greeting and frames, read by `WireDecoder` and turned into the events
/// of `CheckInStateMachine` the way `CheckInListener` and its port do. A worker process also
/// reads one thing its launcher wrote: `PORTKIT_WORKER` (`PKWorkerProcess.parseEnvironmentValue`).
///
/// ```
/// byte 0        bits 0-4: N, the number of script bytes that follow
///               bit 5:    generated mode: the rest describes messages to encode (see below)
///               bit 6:    once the stream is read, before its end, the check-in deadline
///                         passes, or the launcher's loop is stopped: by the parity of the
///                         script's length (N, or what the input holds if shorter), even
///                         or odd
///               bit 7:    environment mode: the rest is a PORTKIT_WORKER value (UTF-8,
///                         repaired); the other bits and the script are ignored
/// bytes 1...N   the script, used cyclically, one byte per read (as `WireFuzzing`'s):
///               bits 0-5: the read's size minus 1 (1...63), or 63: the whole rest
///               bits 6-7: fake descriptors appended just before the read (0...3)
/// the rest      what the worker writes on its connection: a greeting and frames, or anything
/// ```
///
/// The launcher sees: each message frame (its msgid, whether it has a reply port, and its data
/// components concatenated, as `PKPortMessage.data`); ATTACH_SENDER, which gives the check-in
/// port another sender, so that the worker's connection closing no longer means the worker is
/// gone; a protocol error or the end of the stream, which close the worker's connection (the
/// worker is gone, unless a sender was attached); and last, the check-in deadline, which every
/// wait has. Bit 6 makes the deadline pass, or a stop of the launcher's loop come, before the
/// connection closes too.
///
/// In generated mode the rest describes the worker's messages, one operation per byte (its low
/// 2 bits; the 6 bits above are its operand L):
/// 0: a check-in (msgid 100, a reply port) with L data bytes taken from the bytes that follow
///    (missing ones read as zeros), in two components when L is odd; 1: the same without a reply
///    port; 2: a message of msgid L (never 100) with a reply port; 3: ATTACH_SENDER.
/// They are encoded after a greeting and read in the script's chunk sizes, each frame's
/// descriptors arriving with its first byte; they must decode to exactly themselves.
///
/// The properties, each checked with `precondition`:
/// - The launcher follows the check-in rules (README, "The guide's check-in"; protocol.md
///   section 6.2): the first event decides; a message with msgid 100 and a reply port is the check-in,
///   and the launcher keeps exactly that message's data; any other message, the worker's end,
///   the deadline and a stop fail it (`.checkInFailed`, `.checkInFailed`, `.checkInTimedOut`,
///   `.interrupted`).
/// - Decided once: after its decision the state machine answers `.wait` and keeps its state.
/// - It always ends: after the deadline nothing is still waiting.
/// - Round trip: an accepted check-in, sent again the way `WorkerRuntime` sends it (msgid 100,
///   one data component, the worker's port as the reply port) after a greeting, decodes in a
///   fresh decoder to a check-in a fresh launcher accepts with the same data.
/// - Generated mode: decode(encode(messages)) == messages, and the stream ends cleanly.
/// - Environment: a value that parses is canonical (`environmentValue` of what it parses to
///   gives back its very bytes); a value that does not has no colon, or not exactly 0 or 1
///   after its last one; and every name, with either flag, parses back to itself.
enum CheckInFuzzing {
    /// Runs one fuzz input and checks every property; traps on a violation.
    static func exercise(_ input: UnsafeRawBufferPointer) {
        guard let header = input.first else { return }
        if header & 0x80 != 0 {
            exerciseEnvironment(UnsafeRawBufferPointer(rebasing: input[1...]))
            return
        }
        let scriptCount = min(Int(header & 0x1F), input.count - 1)
        let script = UnsafeRawBufferPointer(rebasing: input[1..<1 + scriptCount])
        let rest = UnsafeRawBufferPointer(rebasing: input[(1 + scriptCount)...])
        var launcher = Launcher()
        if header & 0x20 != 0 {
            let frames = frames(describedBy: rest)
            var bytes: [UInt8] = []
            WireEncoder.appendGreeting(.current(pid: 7, uid: 8), to: &bytes)
            var starts: [(offset: Int, descriptors: Int)] = []
            for frame in frames {
                starts.append((bytes.count, frame.descriptorCount))
                WireEncoder.append(frame, to: &bytes)
            }
            let (decoded, clean) = bytes.withUnsafeBytes {
                read($0, script: script, descriptorsAt: starts, into: &launcher)
            }
            precondition(clean, "CheckInFuzzing: encoded messages do not end cleanly")
            precondition(decoded == frames, "CheckInFuzzing: \(frames) decode as \(decoded)")
        } else {
            _ = read(rest, script: script, descriptorsAt: nil, into: &launcher)
        }
        launcher.end(first: header & 0x40 == 0 ? nil : scriptCount % 2 == 0 ? .deadlinePassed : .interrupted)
    }

    /// Reads `stream` in the script's chunk sizes and hands every frame to `launcher`, as the
    /// check-in port does; stops at a protocol error (the port closes the connection).
    /// Descriptors come from the script, or with the first byte of each frame at `starts`.
    ///
    /// - Returns: the frames decoded, and whether the stream ended cleanly.
    private static func read(
        _ stream: UnsafeRawBufferPointer, script: UnsafeRawBufferPointer,
        descriptorsAt starts: [(offset: Int, descriptors: Int)]?, into launcher: inout Launcher
    ) -> (frames: [WireFrame], clean: Bool) {
        var decoder = WireDecoder(limits: .default)
        var frames: [WireFrame] = []
        var offset = 0
        var step = 0
        var startIndex = 0
        var nextDescriptor: Int32 = 1000
        repeat {
            var size = stream.count - offset
            var fresh = 0
            if !script.isEmpty {
                let byte = script[step % script.count]
                step += 1
                if byte & 0x3F != 0x3F { size = min(size, Int(byte & 0x3F) + 1) }
                fresh = Int(byte >> 6)
            }
            if let starts {
                fresh = 0
                while startIndex < starts.count && starts[startIndex].offset < offset + size {
                    fresh += starts[startIndex].descriptors
                    startIndex += 1
                }
            }
            if fresh > 0 {
                decoder.append(descriptors: (0..<Int32(fresh)).map { nextDescriptor + $0 })
                nextDescriptor += Int32(fresh)
            }
            decoder.append(bytes: UnsafeRawBufferPointer(rebasing: stream[offset..<offset + size]))
            offset += size
            do throws(WireError) {
                while let event = try decoder.next() {
                    guard case .frame(let frame, _) = event else { continue }
                    frames.append(frame)
                    if frame.isControl { launcher.senderAttached() } else { launcher.handle(message: frame) }
                }
            } catch {
                return (frames, false)
            }
        } while offset < stream.count
        return (frames, (try? decoder.finish()) != nil)
    }

    /// The launcher's side as `CheckInListener` runs it, beside what the rules say it must do.
    private struct Launcher {
        enum Outcome: Equatable {
            case waiting
            case accepted(data: [UInt8])
            case failed(PKError.Code)
        }

        private var machine = CheckInStateMachine()
        /// What the rules say, so far.
        private var expected = Outcome.waiting
        /// What the listener holds: the machine's first decision, and the data it keeps.
        private var actual = Outcome.waiting
        /// Senders the worker gave the check-in port with ATTACH_SENDER (never closed here).
        private var attachedSenders = 0
        /// Whether an accepted check-in is sent again (not by the launcher that does that).
        private var checksRoundTrip = true

        mutating func senderAttached() { attachedSenders += 1 }

        mutating func handle(message frame: WireFrame) {
            var data: [UInt8] = []
            for case .data(let bytes) in frame.components { data += bytes }
            handle(.message(msgid: frame.msgid, hasReplyPort: frame.hasReplyPort), data: data)
        }

        /// The stream is over: maybe the deadline or a stop first, then the connection's end
        /// (the worker is gone unless another sender holds the port), then the deadline every
        /// wait has.
        mutating func end(first: CheckInStateMachine.Event?) {
            if let first { handle(first) }
            if attachedSenders == 0 { handle(.workerGone) }
            handle(.deadlinePassed)
            precondition(expected != .waiting && machine.state != .waiting,
                         "CheckInFuzzing: the check-in is still waiting after its deadline")
        }

        private mutating func handle(_ event: CheckInStateMachine.Event, data: [UInt8] = []) {
            let before = machine.state
            let action = machine.handle(event)
            guard expected == .waiting else {
                precondition(action == .wait && machine.state == before,
                             "CheckInFuzzing: after its decision the check-in answered \(event) with \(action)")
                return
            }
            switch event {
            case .message(let msgid, let hasReplyPort):
                expected = msgid == PKCheckIn.messageID && hasReplyPort
                    ? .accepted(data: data) : .failed(.checkInFailed)
            case .workerGone: expected = .failed(.checkInFailed)
            case .deadlinePassed: expected = .failed(.checkInTimedOut)
            case .interrupted: expected = .failed(.interrupted)
            }
            switch action {
            case .wait: actual = .waiting
            case .acceptWorker: actual = .accepted(data: data)
            case .fail(let code, _): actual = .failed(code)
            }
            precondition(actual == expected, "CheckInFuzzing: \(event) gave \(actual), the rules say \(expected)")
            let state: CheckInStateMachine.State = if case .accepted = expected { .checkedIn } else { .failed }
            precondition(machine.state == state, "CheckInFuzzing: \(event) left the machine \(machine.state)")
            if checksRoundTrip, case .accepted(let data) = actual { checkRoundTrip(data) }
        }

        /// The check-in, sent again as `WorkerRuntime` sends it, is accepted again with its data.
        private func checkRoundTrip(_ data: [UInt8]) {
            let frame = WireFrame(msgid: PKCheckIn.messageID, hasReplyPort: true, components: [.data(data)])
            var bytes: [UInt8] = []
            WireEncoder.appendGreeting(.current(pid: 1, uid: 2), to: &bytes)
            WireEncoder.append(frame, to: &bytes)
            var decoder = WireDecoder(limits: .default)
            decoder.append(descriptors: [7])
            bytes.withUnsafeBytes { decoder.append(bytes: $0) }
            var again = Launcher()
            again.checksRoundTrip = false
            var frames: [WireFrame] = []
            do throws(WireError) {
                while let event = try decoder.next() {
                    if case .frame(let frame, _) = event {
                        frames.append(frame)
                        again.handle(message: frame)
                    }
                }
                try decoder.finish()
            } catch {
                preconditionFailure("CheckInFuzzing: a re-encoded check-in fails to decode: \(error)")
            }
            precondition(frames == [frame] && again.actual == .accepted(data: data),
                         "CheckInFuzzing: a check-in with \(data.count) data bytes round-trips to \(again.actual)")
        }
    }

    /// The worker's messages described by `bytes` (see `exercise`).
    private static func frames(describedBy bytes: UnsafeRawBufferPointer) -> [WireFrame] {
        var frames: [WireFrame] = []
        var index = 0
        while index < bytes.count {
            let op = bytes[index]
            index += 1
            let operand = Int(op >> 2)
            switch op & 3 {
            case 0, 1:
                let available = min(operand, bytes.count - index)
                let data = Array(bytes[index..<index + available]) + [UInt8](repeating: 0, count: operand - available)
                index += available
                let components: [WireComponent] = operand % 2 == 1
                    ? [.data(Array(data[..<(operand / 2)])), .data(Array(data[(operand / 2)...]))]
                    : [.data(data)]
                frames.append(WireFrame(msgid: PKCheckIn.messageID, hasReplyPort: op & 3 == 0, components: components))
            case 2:
                frames.append(WireFrame(msgid: UInt32(operand), hasReplyPort: true))
            default:
                frames.append(.attachSender())
            }
        }
        return frames
    }

    /// The environment mode: `PORTKIT_WORKER` parses canonically and round-trips.
    private static func exerciseEnvironment(_ bytes: UnsafeRawBufferPointer) {
        let text = String(decoding: bytes, as: UTF8.self)
        if let parsed = PKWorkerProcess.parseEnvironmentValue(text) {
            let again = PKWorkerProcess.environmentValue(name: parsed.name, hasMainPort: parsed.hasMainPort)
            precondition(again.utf8.elementsEqual(text.utf8),
                         "CheckInFuzzing: PORTKIT_WORKER \"\(text)\" parses to \(parsed), which is written \"\(again)\"")
        } else {
            let parts = text.utf8.split(separator: UInt8(ascii: ":"), omittingEmptySubsequences: false)
            let flag = parts.last.map(Array.init) ?? []
            precondition(parts.count < 2 || (flag != [UInt8(ascii: "0")] && flag != [UInt8(ascii: "1")]),
                         "CheckInFuzzing: PORTKIT_WORKER \"\(text)\" was refused")
        }
        for hasMainPort in [false, true] {
            let value = PKWorkerProcess.environmentValue(name: text, hasMainPort: hasMainPort)
            guard let parsed = PKWorkerProcess.parseEnvironmentValue(value),
                  parsed.name.utf8.elementsEqual(text.utf8), parsed.hasMainPort == hasMainPort else {
                preconditionFailure("CheckInFuzzing: the worker name \"\(text)\" does not round-trip through \"\(value)\"")
            }
        }
    }
}
