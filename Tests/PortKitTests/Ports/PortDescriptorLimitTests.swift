// Descriptors over the per-message cap, sent with one sendmsg: the kernel truncates the control
// data (MSG_CTRUNC), the reader treats it as a protocol error on that connection only, every
// descriptor it received is closed, and the port's other senders are untouched.

import Testing
@testable import PortKit

@Suite struct PortDescriptorLimitTests {
    @Test func descriptorsOverTheCapDropOnlyThatConnection() throws {
        let outcome = try onLoopThread { loop -> (got: [UInt32], hungUp: Bool, leaked: Int) in
            var got: [UInt32] = []
            let port = PKReceivePort { got.append($0.msgid) }
            try loop.add(port, forMode: .default)
            // A well-behaved sender over a connection of its own.
            let good = PKSendPort(connection: SendConnection(takingOwnershipOf: try port.makeTransferDescriptor()))
            loop.run(in: .default, for: .milliseconds(20))
            let before = openDescriptorCount()

            // A hostile sender: a valid greeting, then a frame that claims no descriptor but
            // arrives with 20 of them (the cap is 16).
            let (readEnd, writeEnd) = try Socket.pair()
            port.adoptFromAnyThread(readEnd)
            _ = try Socket.send(writeEnd, ConnectionSetup.greeting, from: 0, descriptors: [])
            var frame: [UInt8] = []
            WireEncoder.append(WireFrame(msgid: 1), to: &frame)
            let extra = try (0..<20).map { _ in try EventFD.create() }
            _ = try Socket.send(writeEnd, frame, from: 0, descriptors: extra)
            for fd in extra { Descriptor.close(fd) }

            let deadline = PKDeadline.after(.seconds(10))
            while !Socket.peerHasHungUp(writeEnd) && !deadline.hasPassed {
                loop.run(in: .default, for: .milliseconds(10))
            }
            let hungUp = Socket.peerHasHungUp(writeEnd)
            Descriptor.close(writeEnd)

            try good.send(PKPortMessage(msgid: 7), timeout: .seconds(5))
            while !got.contains(7) && !deadline.hasPassed {
                loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
            }
            loop.run(in: .default, for: .milliseconds(20))
            let leaked = openDescriptorCount() - before
            port.invalidate()
            return (got, hungUp, leaked)
        }
        #expect(outcome.hungUp, "the hostile connection was closed")
        #expect(outcome.got == [7], "only the good sender's message arrived")
        #expect(outcome.leaked <= 0, "every received descriptor was closed")
    }
}
