// Foundation's SocketPort with RunLoop, the only port API swift-corelibs-foundation offers on
// Linux. It is known to crash (docs/performance.md records it), so `pkbench` runs it in a child process and
// the report records a crash as a result.

import CBench
import Dispatch
import Foundation

private final class Counter: NSObject, PortDelegate, @unchecked Sendable {
    var count = 0
    let answer: SocketPort?
    let echo: Bool
    init(answer: SocketPort?, echo: Bool) {
        self.answer = answer
        self.echo = echo
    }
    func handle(_ message: PortMessage) {
        count += 1
        if echo, let answer {
            let components = NSMutableArray(array: message.components ?? [])
            _ = answer.send(before: .distantFuture, components: components, from: nil, reserved: 0)
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; SocketPort needs a number).
private func freeTCPPort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
    _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
    return UInt16(bigEndian: address.sin_port)
}

/// Round trips (`stream == false`) or a one-way stream between two threads, each with its own
/// `RunLoop` and `SocketPort`. Returns the median nanoseconds per operation over `samples`
/// batches of `batch`.
public func foundationSocketPort(_ placement: Placement, stream: Bool, size: Int = 64, batch: Int, samples: Int) throws -> Double {
    let serverNumber = freeTCPPort()
    var candidate = freeTCPPort()
    while candidate == serverNumber { candidate = freeTCPPort() }
    let clientNumber = candidate
    let cpus = placement.cpus
    let ready = DispatchSemaphore(value: 0)
    let server = Thread {
        cb_pin_self(cpus.second)
        guard let port = SocketPort(tcpPort: serverNumber) else { fatalError("SocketPort(tcpPort:) failed") }
        let answer = SocketPort(remoteWithTCPPort: clientNumber, host: "127.0.0.1")
        let delegate = Counter(answer: answer, echo: !stream)
        port.setDelegate(delegate)
        RunLoop.current.add(port, forMode: .default)
        ready.signal()
        withExtendedLifetime(delegate) { RunLoop.current.run() }
    }
    server.start()
    ready.wait()

    cb_pin_self(cpus.first)
    guard let mine = SocketPort(tcpPort: clientNumber) else { throw BenchError("SocketPort(tcpPort:) failed") }
    let counter = Counter(answer: nil, echo: false)
    mine.setDelegate(counter)
    RunLoop.current.add(mine, forMode: .default)
    guard let remote = SocketPort(remoteWithTCPPort: serverNumber, host: "127.0.0.1") else { throw BenchError("remote SocketPort failed") }
    let payload = Data(repeating: 0x5A, count: size)

    func roundTrip() {
        let target = counter.count + 1
        _ = remote.send(before: .distantFuture, components: NSMutableArray(array: [payload]), from: mine, reserved: 0)
        while counter.count < target { _ = RunLoop.current.run(mode: .default, before: .distantFuture) }
    }

    var results: [Double] = []
    if stream {
        // The receiver only counts; we time sending `batch` messages (there is no answer to
        // wait for: SocketPort drops the reply port), then let the receiver drain.
        for _ in 0..<samples {
            let start = cb_now_ns()
            for _ in 0..<batch {
                _ = remote.send(before: .distantFuture, components: NSMutableArray(array: [payload]), from: nil, reserved: 0)
            }
            results.append(Double(cb_now_ns() - start) / Double(batch))
            _ = RunLoop.current.run(mode: .default, before: Date(timeIntervalSinceNow: 0.05))
        }
    } else {
        for _ in 0..<100 { roundTrip() }
        for _ in 0..<samples {
            let start = cb_now_ns()
            for _ in 0..<batch { roundTrip() }
            results.append(Double(cb_now_ns() - start) / Double(batch))
        }
    }
    results.sort()
    return results[results.count / 2]
}
