#if ZeroMQ
// A ZeroMQ receive port on its own thread that answers every message on its reply port with
// the same msgid and components.

import Foundation
import PortKit
import PortKitZeroMQ

final class ZMQEchoServer: @unchecked Sendable {
    let endpoint: String
    private let loop: PKRunLoop
    private let port: PKZMQReceivePort
    private let finished = Locked(false)

    /// A server on its own thread; `handler` replaces the echo.
    init(endpoint: String, limits: PKPortLimits = .default, handler: (@Sendable (PKZMQMessage) -> Void)? = nil) throws {
        let ready = Locked<Result<(PKRunLoop, PKZMQReceivePort), any Error>?>(nil)
        let finished = self.finished
        let thread = Thread {
            let loop = PKRunLoop.current
            do {
                let port = try PKZMQReceivePort(bindingTo: endpoint, limits: limits) { message in
                    if let handler { return handler(message) }
                    try? message.replyPort?.send(PKZMQMessage(msgid: message.msgid, components: message.components), timeout: .seconds(5))
                }
                try loop.add(port, forMode: .default)
                ready.value = .success((loop, port))
                while port.isValid { loop.run(in: .default, until: .after(.seconds(1))) }
            } catch {
                ready.value = .failure(error)
            }
            finished.value = true
        }
        thread.start()
        try waitUntil("the echo server") { ready.value != nil }
        (loop, port) = try ready.value!.get()
        self.endpoint = port.endpoint
    }

    func stop() {
        port.invalidate()
        loop.wakeUp()
        try? waitUntil("the echo server to stop") { finished.value }
    }
}
#endif
