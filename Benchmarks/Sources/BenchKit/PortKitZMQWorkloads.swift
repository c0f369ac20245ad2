// PortKit's ZeroMQ transport (PortKitZeroMQ, trait ZeroMQ) between two processes, against raw
// libzmq on the same endpoint type. The main side binds a PKZMQReceivePort; the worker process
// binds its own, connects a send right to the main one and says hello with its port as the
// reply port; then the two exchange messages as PortKitPair's sides do.

#if ZeroMQ
import CBench
import Glibc
import PortKit
import PortKitZeroMQ

public final class PortKitZMQPair: Workload {
    private let driver: PinnedDriver

    /// - Parameter endpoint: `.ipc` or `.tcp` (loopback).
    public init(_ endpoint: ZMQEndpoint, _ pattern: PortKitPattern, _ placement: Placement, size: Int = 64) throws {
        precondition(pattern != .request, "request/reply over ZeroMQ is not part of the suite")
        let workerCPU = placement.cpus.second
        let role: WorkerRole = pattern == .stream ? .sink : .echo
        driver = try PinnedDriver(cpu: placement.cpus.first) {
            let loop = PKRunLoop.current
            let directory = try makeScratchDirectory("pkbench-zmq")
            var answers = 0
            var workerRight: PKZMQSendPort?
            let mainEndpoint = endpoint == .ipc ? try PKZMQEndpoint.ipc(name: "main", directory: directory) : "tcp://127.0.0.1:*"
            let workerEndpoint = endpoint == .ipc ? try PKZMQEndpoint.ipc(name: "worker", directory: directory) : "tcp://127.0.0.1:*"
            let mine = try PKZMQReceivePort(bindingTo: mainEndpoint) { message in
                if message.msgid == BenchMessage.hello { workerRight = message.replyPort }
                answers += 1
            }
            try loop.add(mine, forMode: .default)
            var argv: [UnsafeMutablePointer<CChar>?] = [helperExecutable, "pkzmq-worker", role.rawValue, "\(workerCPU)", mine.endpoint, workerEndpoint]
                .map { (text: String) in strdup(text) }
            argv.append(nil)
            let pid = cb_spawn_process(helperExecutable, argv)
            for pointer in argv { free(pointer) }
            guard pid > 0 else { throw BenchError("could not spawn pkbench pkzmq-worker") }
            func cleanUp() {
                // SIGTERM, so that a worker under callgrind writes its counts (cb_reap kills it
                // if it has not ended within 30 s).
                kill(pid, SIGTERM)
                _ = cb_reap(pid, 30_000)
                mine.invalidate()
                removeScratchDirectory(directory)
            }
            func awaitAnswers(_ target: Int, _ deadline: PKDeadline) throws {
                while answers < target {
                    let result = loop.run(in: .default, until: deadline, returnAfterSourceHandled: true)
                    if result == .timedOut || result == .finished { throw BenchError("no answer from the ZeroMQ worker (\(result))") }
                }
            }
            do { try awaitAnswers(1, .after(.seconds(120))) } catch { cleanUp(); throw error }
            guard let worker = workerRight else { cleanUp(); throw BenchError("the ZeroMQ worker's hello had no reply port") }
            answers = 0

            let payload = [UInt8](repeating: 0x5A, count: size)
            let message = PKZMQMessage(msgid: BenchMessage.data, data: payload)
            let last = PKZMQMessage(msgid: BenchMessage.last, data: payload)
            let work: (Int) throws -> UInt64
            switch pattern {
            case .roundTrip, .request:
                work = { n in
                    let deadline = PKDeadline.after(.seconds(60))
                    let start = nowNanoseconds()
                    for _ in 0..<n {
                        let target = answers + 1
                        try worker.send(message, before: deadline)
                        try awaitAnswers(target, deadline)
                    }
                    return nowNanoseconds() - start
                }
            case .stream:
                work = { n in
                    let deadline = PKDeadline.after(.seconds(120))
                    let target = answers + 1
                    let start = nowNanoseconds()
                    for _ in 0..<(n - 1) { try worker.send(message, before: deadline) }
                    try worker.send(last, before: deadline)
                    try awaitAnswers(target, deadline)
                    return nowNanoseconds() - start
                }
            }
            return DriverBody(work: work, tearDown: {
                worker.invalidate()
                cleanUp()
            })
        }
    }

    public func run(_ n: Int) throws -> UInt64 { try driver.run(n) }
    public func close() { driver.close() }
}

/// `pkbench pkzmq-worker ROLE CPU MAIN_ENDPOINT OWN_ENDPOINT`: binds OWN_ENDPOINT, says hello to
/// MAIN_ENDPOINT with its port as the reply port, then echoes or counts as a worker does.
public func serveZMQWorker(role: WorkerRole, cpu: Int32, mainEndpoint: String, ownEndpoint: String) throws -> Never {
    if cpu >= 0 { cb_pin_self(cpu) }
    let loop = PKRunLoop.current
    let main = try PKZMQSendPort(connectingTo: mainEndpoint)
    let deadline = PKDeadline.distantFuture
    let port: PKZMQReceivePort
    switch role {
    case .echo:
        port = try PKZMQReceivePort(bindingTo: ownEndpoint) { message in try? main.send(message, before: deadline) }
    case .sink:
        let ack = PKZMQMessage(msgid: BenchMessage.last)
        port = try PKZMQReceivePort(bindingTo: ownEndpoint) { message in
            if message.msgid == BenchMessage.last { try? main.send(ack, before: deadline) }
        }
    }
    try loop.add(port, forMode: .default)
    try main.send(PKZMQMessage(msgid: BenchMessage.hello, replyPort: port.makeSendRight()), before: .after(.seconds(60)))
    while true { loop.run(in: .default, until: .distantFuture, returnAfterSourceHandled: true) }
}
#endif
