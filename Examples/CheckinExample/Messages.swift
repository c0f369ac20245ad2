// The example's messages: the guide's check-in (msgid 100) and three of its own. Every number
// is little-endian.
//
//     msgid  name      direction        components
//     100    check-in  worker -> main   data: the worker's name (a worker process's registered
//                                             port name); reply port: the worker's port
//     200    count     main -> worker   data: job id (4 bytes); data: the chunk's bytes
//     201    counted   worker -> main   data: job id (4), words (8), bytes (8), FNV-1a (8),
//                                             nanoseconds spent counting (8)
//     300    exit      main -> worker   none: leave the run loop and end (a process exits 0)
//
// A worker launched by PKWorkerThread or PKWorkerProcess checks in with that type's own
// private check-in port and is stopped with its stop() (PKCheckIn.stopMessageID).

import PortKit

/// The message identifiers of the example.
enum ExampleMessage {
    /// The guide's check-in (`kCheckinMessage`, Listing 3-13).
    static let checkIn: UInt32 = PKCheckIn.messageID
    /// A job: count the words of a chunk.
    static let count: UInt32 = 200
    /// A job's result.
    static let counted: UInt32 = 201
    /// Leave the run loop (the guide's `shouldExit`).
    static let exit: UInt32 = 300
}

/// A job for a worker: one chunk of the text (msgid 200).
struct CountRequest {
    var jobID: UInt32
    var chunk: [UInt8]

    var message: PKPortMessage {
        var header: [UInt8] = []
        header.appendLittleEndian(jobID)
        return PKPortMessage(msgid: ExampleMessage.count, components: [.data(header), .data(chunk)])
    }

    init(jobID: UInt32, chunk: [UInt8]) {
        self.jobID = jobID
        self.chunk = chunk
    }

    /// Decodes a request; `nil` if the message is not a well-formed one.
    init?(_ message: PKPortMessage) {
        guard message.msgid == ExampleMessage.count, message.components.count == 2,
              let header = message.components[0].data, header.count == 4,
              let chunk = message.components[1].data
        else { return nil }
        self.jobID = header.littleEndian(at: 0)
        self.chunk = chunk
    }
}

/// A worker's answer to a job (msgid 201).
struct CountReply {
    static let size = 36

    var jobID: UInt32
    var tally: Tally
    /// How long the worker spent counting, to tell work from messaging in the round trip.
    var countingNanoseconds: UInt64

    var message: PKPortMessage {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Self.size)
        bytes.appendLittleEndian(jobID)
        bytes.appendLittleEndian(tally.words)
        bytes.appendLittleEndian(tally.bytes)
        bytes.appendLittleEndian(tally.hash)
        bytes.appendLittleEndian(countingNanoseconds)
        return PKPortMessage(msgid: ExampleMessage.counted, data: bytes)
    }

    init(jobID: UInt32, tally: Tally, countingNanoseconds: UInt64) {
        self.jobID = jobID
        self.tally = tally
        self.countingNanoseconds = countingNanoseconds
    }

    /// Decodes a reply; `nil` if the message is not a well-formed one.
    init?(_ message: PKPortMessage) {
        let bytes = message.data
        guard message.msgid == ExampleMessage.counted, bytes.count == Self.size else { return nil }
        jobID = bytes.littleEndian(at: 0)
        tally = Tally(words: bytes.littleEndian(at: 4), bytes: bytes.littleEndian(at: 12), hash: bytes.littleEndian(at: 20))
        countingNanoseconds = bytes.littleEndian(at: 28)
    }
}

extension [UInt8] {
    mutating func appendLittleEndian<T: FixedWidthInteger>(_ value: T) {
        for shift in stride(from: 0, to: T.bitWidth, by: 8) { append(UInt8(truncatingIfNeeded: value >> shift)) }
    }

    /// The integer stored little-endian at `offset`; the caller checked the length.
    func littleEndian<T: FixedWidthInteger>(at offset: Int) -> T {
        var value: T = 0
        for index in (0..<MemoryLayout<T>.size).reversed() {
            value = value << 8 | T(self[offset + index])
        }
        return value
    }
}
