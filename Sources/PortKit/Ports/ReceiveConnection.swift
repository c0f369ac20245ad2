// The reading end of one connection to a receive port: its socket, its decoder, and the queue
// of messages read but not yet delivered (bounded by the port's limits: past them reading
// pauses, while hang-up stays watched).

import Logging

/// A scratch area for `recvmsg`'s control data and the descriptors it carries, one per port,
/// so that a read allocates nothing.
struct ReadScratch {
    let control: UnsafeMutableRawBufferPointer
    let descriptors: UnsafeMutableBufferPointer<Int32>
    /// The bytes of a message the port delivered, for the next message's bytes (see
    /// `SpareBytes`).
    var spare: [UInt8] = []

    init(maxDescriptors: Int) {
        // The control area has room for one more descriptor than allowed, so that an excess
        // arrives (and shows as "too many", closed) rather than being lost to MSG_CTRUNC; at
        // most `maxDescriptors` are taken (the area for them is that long).
        let space = Socket.controlSpace(descriptors: maxDescriptors + 1)
        control = UnsafeMutableRawBufferPointer.allocate(byteCount: space, alignment: 8)
        descriptors = UnsafeMutableBufferPointer<Int32>.allocate(capacity: maxDescriptors)
        descriptors.initialize(repeating: -1)
    }

    func deallocate() {
        control.deallocate()
        descriptors.deallocate()
    }

    /// One `recvmsg` from `fd` straight into `decoder` (up to `limit` bytes), the descriptors
    /// appended to its queue. Returns `nil` when the socket would block; otherwise the bytes
    /// read (0 at the end of the stream) and whether descriptors were lost or over the limit.
    func receive(_ fd: Int32, into decoder: inout WireDecoder, upTo limit: Int) throws(PKError) -> (count: Int, truncated: Bool)? {
        var received: [Int32] = []
        var truncated = false
        var wouldBlock = false
        let control = control
        let descriptorArea = descriptors
        let count = try decoder.appendBytes(upTo: limit) { buffer throws(PKError) -> Int in
            switch try Socket.receive(fd, into: buffer, descriptors: descriptorArea, control: control) {
            case .wouldBlock:
                wouldBlock = true
                return 0
            case .done(let got):
                received = got.descriptors
                truncated = got.truncated
                return got.byteCount
            }
        }
        if wouldBlock { return nil }
        decoder.append(descriptors: received)
        return (count, truncated)
    }
}

/// Loop-only: a connection is made, read, drained and closed on its port's loop thread, so its
/// state skips the run-time exclusivity checks (as the loop's own state does).
final class ReceiveConnection {
    let fd: Int32
    @exclusivity(unchecked) var decoder: WireDecoder
    @exclusivity(unchecked) var source: PKDescriptorSource!
    @exclusivity(unchecked) private var queue = MessageQueue()
    @exclusivity(unchecked) private var queuedBytes = 0
    private let maxQueuedMessages: Int
    private let maxQueuedBytes: Int
    /// Read ends announced by ATTACH_SENDER control frames, for the port to adopt.
    @exclusivity(unchecked) var attached: [Int32] = []
    /// Handed over in ATTACH_SENDER: its inode, listed in `AttachedSockets` until it closes.
    @exclusivity(unchecked) var attachedInode: UInt64?
    /// Writes this connection's reply channel: made for its first REPLY_BACK request.
    @exclusivity(unchecked) private var replyWriter: SendConnection?
    /// The latest REPLY_BACK request's answer: voided when the requester cancels it, or makes
    /// the next request.
    @exclusivity(unchecked) private var pendingReply: ReplyTicket?
    /// Accepted from a named socket: the greeting's claim is checked against SO_PEERCRED.
    let accepted: Bool
    /// When the connection must have greeted by (accepted, or handed over in ATTACH_SENDER).
    @exclusivity(unchecked) var greetingDeadline: PKDeadline?
    /// On its port's list of connections awaiting their greeting. Loop-only, the port's.
    @exclusivity(unchecked) var isListedAwaitingGreeting = false
    /// The kernel's view of the peer (accepted connections only).
    @exclusivity(unchecked) var peer: (pid: Int32, uid: UInt32, gid: UInt32)?
    @exclusivity(unchecked) var readingPaused = false
    @exclusivity(unchecked) var finished = false
    /// The peer broke the protocol: deliver what arrived before, then drop.
    @exclusivity(unchecked) var failed = false
    @exclusivity(unchecked) private var closed = false
    /// Closed: dropped by its port, which reads it no more.
    var isClosed: Bool { closed }
    /// In its port's list of connections with messages to deliver.
    @exclusivity(unchecked) var isListedReady = false

    static let readChunk = 64 * 1024
    private static let logger = Logger(label: "PortKit.ReceiveConnection")

    enum ReadOutcome {
        case more
        /// Nothing to read just now (the socket would block).
        case idle
        case paused
        case endOfStream
        case failed(String)

        var failure: String? { if case .failed(let text) = self { text } else { nil } }
    }

    /// Takes ownership of `fd`, the read end of a connection.
    init(takingOwnershipOf fd: Int32, limits: WireLimits, accepted: Bool = false,
         maxQueuedMessages: Int = PKPortLimits.default.maxQueuedMessages,
         maxQueuedBytes: Int = PKPortLimits.default.maxQueuedBytes) {
        self.fd = fd
        self.accepted = accepted
        self.decoder = WireDecoder(limits: limits)
        self.maxQueuedMessages = maxQueuedMessages
        self.maxQueuedBytes = maxQueuedBytes
    }

    deinit { assert(closed, "PortKit bug: a ReceiveConnection was dropped without close()") }

    /// Removes the source from its loop and closes the socket and every descriptor not yet handed out.
    func close() {
        guard !closed else { return }
        closed = true
        source?.invalidate()
        for fd in decoder.takeAllDescriptors() { Descriptor.close(fd) }
        for fd in attached { Descriptor.close(fd) }
        attached = []
        // The right to answer goes first, so that the rights in undelivered messages released
        // next say nothing on a channel that is ending.
        pendingReply?.void()
        queue.removeAll()
        replyWriter?.abandon(reason: "the connection the request came in on has ended")
        replyWriter = nil
        Descriptor.close(fd)
        if let attachedInode { AttachedSockets.release(attachedInode) }
    }

    func leave(_ loop: PKRunLoop, mode: PKRunLoopMode) {
        loop.remove(source, forMode: mode)
    }

    /// Reads once (up to `readChunk` bytes) and decodes what arrived into the queue. At the end
    /// of the stream `finished` is set; on a protocol error, `failed`.
    func read(into scratch: inout ReadScratch, on loop: PKRunLoop) -> ReadOutcome {
        let outcome = readOnce(into: &scratch, on: loop)
        switch outcome {
        case .endOfStream: finished = true
        case .failed: failed = true
        case .more, .idle, .paused: break
        }
        return outcome
    }

    private func readOnce(into scratch: inout ReadScratch, on loop: PKRunLoop) -> ReadOutcome {
        guard !closed, !finished, !failed else { return .endOfStream }
        // An idle connection keeps no read buffer of its own: it reads into its loop's.
        var outcome = ReadOutcome.idle
        loop.withReadStorage { storage in
            let borrowed = decoder.borrowStorage(&storage)
            outcome = readOnceInPlace(into: &scratch)
            if borrowed { decoder.reclaimStorage(&storage) }
        }
        return outcome
    }

    private func readOnceInPlace(into scratch: inout ReadScratch) -> ReadOutcome {
        var got: (count: Int, truncated: Bool)?
        do throws(PKError) { got = try scratch.receive(fd, into: &decoder, upTo: Self.readChunk) } catch {
            // A reset: the peer closed with bytes of ours unread (a requester gone with a late
            // answer or NO_REPLY unread). The kernel reports it once everything the peer sent
            // has been read: its end of stream, no protocol error.
            guard Socket.isPeerGone(error.errno) else { return .failed("reading failed: \(error)") }
            got = (0, false)
        }
        guard let (count, truncated) = got else { return .idle }
        if truncated {
            return .failed("the peer sent more descriptors than a message may carry, or one that is not a Unix-domain stream socket, or the kernel truncated them (MSG_CTRUNC)")
        }
        if count == 0 {
            // End of stream: clean only at a frame boundary with no stray descriptors.
            if let failure = decodeAvailable(reusing: &scratch.spare).failure { return .failed(failure) }
            do throws(WireError) { try decoder.finish() } catch {
                return .failed(error.description)
            }
            return .endOfStream
        }
        return decodeAvailable(reusing: &scratch.spare)
    }

    private func decodeAvailable(reusing spare: inout [UInt8]) -> ReadOutcome {
        while true {
            // The usual frame skips the general decoding (the same message either way), and a
            // read that held only usual frames ends here.
            if let usual = decoder.nextUsualFrame(reusing: &spare) {
                if usual.replyToken == 0 {
                    enqueue(PKPortMessage(msgid: usual.msgid, data: usual.bytes))
                } else {
                    enqueueRequest(msgid: usual.msgid, bytes: usual.bytes, token: usual.replyToken)
                }
                continue
            }
            if decoder.isDrained { break }
            let other = decodeOther(reusing: &spare)
            if case .failed(let failure) = other { return .failed(failure) }
            if case .needsBytes = other { break }
        }
        if queue.count >= maxQueuedMessages || queuedBytes >= maxQueuedBytes {
            pauseReading()
            return .paused
        }
        return .more
    }

    /// Queues a request made with REPLY_BACK, with the right to answer it. Out of line, as
    /// `decodeOther` is: the usual message's code stays among its own.
    @inline(never)
    private func enqueueRequest(msgid: UInt32, bytes: [UInt8], token: UInt16) {
        enqueue(PKPortMessage(msgid: msgid, data: bytes, replyPort: replyRight(token: token)))
    }

    /// What `decodeOther` did.
    private enum OtherOutcome {
        /// Decoded a greeting or a frame (and acted on it).
        case decoded
        /// The buffer holds no complete greeting or frame.
        case needsBytes
        /// The peer broke the protocol.
        case failed(String)
    }

    /// Decodes the next greeting or frame that is not the usual one, through the general
    /// decoding: the greeting, control frames, ports, reply ports, requests. Out of line: the
    /// usual message never comes here, and this code would sit among its.
    @inline(never)
    private func decodeOther(reusing spare: inout [UInt8]) -> OtherOutcome {
        // The frame is decoded into these, and its payload moved out of them into its message.
        var frame = WireFrame(msgid: 0)
        var descriptors: [Int32] = []
        let found: WireDecoder.Found?
        do throws(WireError) { found = try decoder.next(frame: &frame, descriptors: &descriptors, reusing: &spare) } catch {
            return .failed(error.description)
        }
        switch found {
        case nil:
            return .needsBytes
        case .greeting(let greeting):
            greetingDeadline = nil
            if let peer, greeting.uid != peer.uid || greeting.pid != UInt32(bitPattern: peer.pid) {
                return .failed(Self.credentialsMismatch(greeting, peer))
            }
        case .frame:
            switch frame.controlCode {
            case .attachSender:
                // The one descriptor is a new sender for this port.
                attached.append(contentsOf: descriptors)
            case .replyCancelled:
                if let ticket = pendingReply, ticket.token == frame.replyToken { ticket.void() }
            case .noReply:
                break  // the decoder admits none towards a port
            case nil:
                var message = Self.message(taking: &frame, descriptors: descriptors)
                if frame.repliesBack { message.replyPort = replyRight(token: frame.replyToken) }
                enqueue(message)
            }
        }
        return .decoded
    }

    /// Why a greeting whose claim the kernel contradicts is refused. Out of line: its string
    /// interpolation would sit among the decoding loop's code, which every message runs.
    @inline(never)
    private static func credentialsMismatch(_ greeting: WireGreeting, _ peer: (pid: Int32, uid: UInt32, gid: UInt32)) -> String {
        "the greeting claims pid \(greeting.pid) uid \(greeting.uid), but the kernel says pid \(peer.pid) uid \(peer.uid)"
    }

    /// The right to answer request `token`, on this connection's reply channel. `nil` when
    /// the channel cannot be opened (out of descriptors): the requester then times out.
    private func replyRight(token: UInt16) -> PKSendPort? {
        pendingReply?.void()
        pendingReply = nil
        if replyWriter == nil {
            do throws(PKError) {
                let copy = try Descriptor.duplicate(fd)
                do throws(PKError) { try ConnectionSetup.writeGreeting(copy) } catch {
                    Descriptor.close(copy)
                    throw error
                }
                replyWriter = SendConnection(takingOwnershipOf: copy)
            } catch {
                Self.logger.warning("cannot open a reply channel; a request goes unanswered: \(error)")
                return nil
            }
        }
        let ticket = ReplyTicket(token: token)
        pendingReply = ticket
        return PKSendPort(reply: ReplyRight(writer: replyWriter!, ticket: ticket))
    }

    /// The message `frame` carries, its payload moved out of `frame` (which keeps its header
    /// fields); its ports and reply port become send rights over `descriptors`.
    static func message(taking frame: inout WireFrame, descriptors: [Int32]) -> PKPortMessage {
        var next = 0
        let reply = frame.hasReplyPort ? right(descriptors, &next) : nil
        // One data component (the usual message) is held as its bytes, with no array.
        if let bytes = frame.components.takeOnlyData() {
            return PKPortMessage(msgid: frame.msgid, data: bytes, replyPort: reply)
        }
        // One port component as an array literal: allocated at its size, where
        // `reserveCapacity` on an empty array takes the generic growth path (~200 instructions).
        let components: [PKPortComponent]
        if frame.components.count == 1 {
            components = [component(frame.components[0], descriptors, &next)]
        } else {
            var all: [PKPortComponent] = []
            all.reserveCapacity(frame.components.count)
            for wire in frame.components { all.append(component(wire, descriptors, &next)) }
            components = all
        }
        return PKPortMessage(msgid: frame.msgid, components: components, replyPort: reply)
    }

    /// A message's component; a port takes the next of the frame's descriptors (the decoder
    /// guarantees one per port component).
    @inline(__always)
    private static func component(_ wire: WireComponent, _ descriptors: [Int32], _ next: inout Int) -> PKPortComponent {
        switch wire {
        case .data(let bytes): .data(bytes)
        case .port: .port(right(descriptors, &next))
        }
    }

    @inline(__always)
    private static func right(_ descriptors: [Int32], _ next: inout Int) -> PKSendPort {
        defer { next += 1 }
        return PKSendPort(connection: SendConnection(takingOwnershipOf: descriptors[next]))
    }

    private func enqueue(_ message: consuming PKPortMessage) {
        queuedBytes += message.dataByteCount
        queue.append(message)
    }

    func dequeue() -> PKPortMessage? {
        guard let message = queue.popFirst() else { return nil }
        queuedBytes -= message.dataByteCount
        return message
    }

    var hasQueuedMessages: Bool { !queue.isEmpty }
    /// How many messages wait (for tests).
    var queuedCount: Int { queue.count }

    private func pauseReading() {
        guard !readingPaused else { return }
        readingPaused = true
        // Still watch hang-up while paused; a hang-up seen then stops watching until resumed.
        source.events = [.hangUp]
    }

    @inline(__always)
    func resumeIfDrained() {
        if readingPaused { resumeIfBelowLimits() }
    }

    /// Resumes reading once the queue is below both limits, unless the connection failed. Out
    /// of line: a connection pauses only when its receiver falls behind, and this code would
    /// sit among the delivery's, which runs for every message.
    @inline(never)
    private func resumeIfBelowLimits() {
        guard !failed, queue.count < maxQueuedMessages, queuedBytes < maxQueuedBytes else { return }
        readingPaused = false
        source.events = .readable
    }

    /// Reads the peer's credentials and refuses another user: only the same user may connect.
    /// Returns the reason for refusing, or nil.
    func checkPeer() -> String? {
        guard let credentials = try? Socket.peerCredentials(fd) else { return "cannot read the peer's credentials" }
        peer = credentials
        if credentials.uid != Socket.effectiveUserID {
            return "the peer runs as uid \(credentials.uid), not \(Socket.effectiveUserID): only the same user may connect"
        }
        return nil
    }
}
