#if ZeroMQ
// A peer on plain libzmq (PortKitZMQCPeer, written in C from protocol.md alone) exchanging
// messages with PortKit ports, both ways.

import Testing
import PortKit
import PortKitZeroMQ

@Suite struct ZMQPlainPeerTests {
    @Test func plainLibzmqPeerSendsARequestAndReadsTheReply() throws {
        try onLoopThread { loop in
            var asked: [PKZMQMessage] = []
            let port = try PKZMQReceivePort(bindingTo: "tcp://127.0.0.1:*") { message in
                asked.append(message)
                let answer = PKZMQMessage(msgid: message.msgid + 1, data: Array(message.text.uppercased().utf8))
                try? message.replyPort?.send(answer, timeout: .seconds(5))
            }
            try loop.add(port, forMode: .default)
            let peer = try ZMQPeerProcess(["request", port.endpoint, "hello from C"], executable: "PortKitZMQCPeer")
            try run(loop, until: "the C peer's request", timeout: .seconds(20)) { !asked.isEmpty }
            #expect(asked[0].msgid == 7)
            #expect(asked[0].text == "hello from C")
            #expect(asked[0].replyPort?.portID == 42)
            #expect(asked[0].replyPort?.endpoint.hasPrefix("tcp://127.0.0.1:") == true)
            #expect(try peer.readLine() == "reply 8 42 HELLO FROM C")
            #expect(try peer.waitForExit() == 0)
            port.invalidate()
        }
    }

    @Test func portKitRequestIsServedByAPlainLibzmqPeer() throws {
        let peer = try ZMQPeerProcess(["serve"], executable: "PortKitZMQCPeer")
        let endpoint = try peer.expectLine(startingWith: "ready")
        try onLoopThread { _ in
            let right = try PKZMQSendPort(connectingTo: endpoint)
            let reply = try right.sendRequest(PKZMQMessage(msgid: 30, data: Array("from swift".utf8)), sendTimeout: .seconds(10), receiveTimeout: .seconds(10))
            #expect(reply?.msgid == 31)
            #expect(reply?.text == "FROM SWIFT")
        }
        #expect(try peer.readLine() == "served 30 FROM SWIFT")
        #expect(try peer.waitForExit() == 0)
    }
}
#endif
