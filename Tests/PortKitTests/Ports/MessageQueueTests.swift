// A connection's queue of messages: first in, first out across its ring's wrap and growth, and
// every message it holds destroyed exactly once (by popFirst's caller, removeAll, or its end).

import Testing
@testable import PortKit

@Suite("Message queue")
struct MessageQueueTests {
    @Test("messages come out in the order they went in, across wraps and growth")
    func order() {
        var queue = MessageQueue()
        let none = queue.popFirst()
        let startsEmpty = queue.isEmpty
        #expect(startsEmpty && none == nil)
        var next: UInt32 = 0
        var expected: UInt32 = 0
        // Push more than pop in each round, so the ring wraps with messages in it and then grows.
        for round in 0..<40 {
            for _ in 0..<(round % 5 + 2) {
                queue.append(PKPortMessage(msgid: next, data: [UInt8(truncatingIfNeeded: next)]))
                next += 1
            }
            for _ in 0..<(round % 3 + 1) {
                let message = queue.popFirst()
                #expect(message?.msgid == expected)
                #expect(message?.data == [UInt8(truncatingIfNeeded: expected)])
                expected += 1
            }
            let count = queue.count
            #expect(count == Int(next - expected))
        }
        while let message = queue.popFirst() {
            #expect(message.msgid == expected)
            expected += 1
        }
        let endsEmpty = queue.isEmpty
        #expect(expected == next && endsEmpty)
    }

    @Test("what it holds is released by removeAll and by its end")
    func releases() {
        var watched: [UInt8] = [1, 2, 3]
        do {
            var queue = MessageQueue()
            for index in 0..<20 { queue.append(PKPortMessage(msgid: UInt32(index), data: watched)) }
            queue.removeAll()
            let emptied = queue.isEmpty
            #expect(emptied)
            #expect(Self.isUnshared(&watched), "removeAll released every message")
            // Wrapped, then dropped with messages in it.
            for index in 0..<6 { queue.append(PKPortMessage(msgid: UInt32(index), data: [])) }
            for _ in 0..<5 { _ = queue.popFirst() }
            for index in 0..<7 { queue.append(PKPortMessage(msgid: UInt32(index), data: watched)) }
            let count = queue.count
            #expect(count == 8)
        }
        #expect(Self.isUnshared(&watched), "the queue's end released what it held")
    }

    /// Whether no one else holds `array`'s storage: writing an element then copies nothing.
    private static func isUnshared(_ array: inout [UInt8]) -> Bool {
        let before = array.withUnsafeBufferPointer { $0.baseAddress }
        array[0] = array[0]
        return array.withUnsafeBufferPointer { $0.baseAddress } == before
    }
}
