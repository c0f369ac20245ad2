#if ZeroMQ
// The process's reply port for requests: one PULL socket on the background loop, bound lazily
// to one endpoint per kind of destination (an abstract `ipc://@...` for ipc destinations, a
// `tcp://ADDRESS:*` for each local address that tcp destinations are reached from). Each
// request gets a fresh random port id there; the reply names it in its header, and the service hands
// it to the request's waiter. A reply for an id nobody waits for any more (it came after its
// request's deadline) is dropped.

import Glibc
import Logging
import PortKit

final class ZMQReplyService: Sendable {
    /// Made on first use.
    static func shared() throws(PKError) -> ZMQReplyService {
        try sharedService.withLock { service throws(PKError) -> ZMQReplyService in
            if let service { return service }
            let made = try ZMQReplyService()
            service = made
            return made
        }
    }
    private static let sharedService = ZMQMutex<ZMQReplyService?>(nil)

    private let inbox: ZMQInbox
    /// The endpoints bound, by kind of destination: as libzmq resolved them, and parsed.
    private let endpoints = ZMQMutex<[String: (text: String, parsed: ZMQEndpoint)]>([:])
    private let waiters = ZMQMutex<[UInt64: ZMQReplyWaiter]>([:])

    private init() throws(PKError) {
        inbox = try ZMQInbox(limits: .default)
        let inbox = self.inbox
        PKRunLoop.background.perform(inModes: [.common]) { [self] in
            inbox.onMessages = { [self] next in
                while let reply = next() { self.deliver(reply) }
            }
            inbox.onViolation = { reason in
                Logger(label: "PortKitZeroMQ.replies").warning("dropped a reply: \(reason)")
            }
            do throws(PKError) { try inbox.schedule(on: PKRunLoop.current, forMode: .common) } catch {
                Logger(label: "PortKitZeroMQ.replies").error("cannot schedule the reply port: \(error)")
            }
        }
    }

    /// The endpoint a peer at `destination` can send replies to, bound on first need. A wildcard
    /// `replyHost` (`0.0.0.0`, `*`) is advertised as the local address toward `destination`, as
    /// a receive port bound to a wildcard is (protocol.md 10.1): a port component carries only
    /// endpoints a peer can connect to. A destination's host name is looked up until
    /// `deadline` at most.
    func endpoint(toward destination: ZMQEndpoint, before deadline: PKDeadline) throws(PKError) -> String {
        let key: String
        let bindTo: ZMQEndpoint
        switch destination {
        case .ipc:
            key = "ipc"
            let random = UInt64.random(in: 0 ... .max)
            bindTo = .ipc(path: "@portkit-zmq-reply-\(geteuid())-\(getpid())-\(String(random, radix: 16))")
        case .tcp(let host, _):
            let local: String
            switch PKZMQTransport.replyHost.map({ .local($0) }) ?? LocalAddress.toward(host: host, before: deadline) {
            case .local(let address): local = address
            case .noRoute: throw PKError(.transport, "no local address reaches \(host) for replies; set PKZMQTransport.replyHost")
            case .noAddress: throw PKError(.transport, "the host name \(host) has no IPv4 address; nothing was sent")
            case .unanswered:
                throw PKError(.sendTimedOut, "the address of \(host) was not found before the send deadline; nothing was sent")
            }
            key = local
            bindTo = .tcp(host: local, port: "*")
        }
        let bound = try endpoints.withLock { endpoints throws(PKError) -> (text: String, parsed: ZMQEndpoint) in
            if let bound = endpoints[key] { return bound }
            let text = try inbox.bind(bindTo)
            let bound = (text: text, parsed: (try? ZMQEndpoint(parsing: text)) ?? bindTo)
            endpoints[key] = bound
            return bound
        }
        return bound.parsed.isWildcard ? try bound.parsed.advertised(toward: destination, before: deadline) : bound.text
    }

    /// Registers a waiter; returns the port id its reply comes to: random, non-zero and not
    /// waited on already, so that a peer that can reach the reply endpoint cannot guess the id
    /// of a request it was not sent (protocol.md 10.1: any message to that id is the reply).
    func register(_ waiter: ZMQReplyWaiter) -> UInt64 {
        waiters.withLock { waiters in
            var id = UInt64.random(in: 1 ... .max)
            while waiters[id] != nil { id = UInt64.random(in: 1 ... .max) }
            waiters[id] = waiter
            return id
        }
    }

    func unregister(_ id: UInt64) {
        _ = waiters.withLock { $0.removeValue(forKey: id) }
    }

    /// On the background loop: a reply arrived.
    private func deliver(_ decoded: consuming ZMQDecoded<PKZMQComponent>) {
        guard let waiter = waiters.withLock({ $0.removeValue(forKey: decoded.destination) }) else { return }
        waiter.finish(.reply(PKZMQMessage(decoded)))
    }
}

/// One request's wait: filled once, from any thread, by the reply, the death of the remote
/// port, or nothing (the caller's deadline).
final class ZMQReplyWaiter: Sendable {
    enum Outcome: Sendable {
        case reply(PKZMQMessage)
        case died(String)
    }

    /// How long after the remote port's death a reply may still arrive and count.
    static let deathGrace: Duration = .milliseconds(250)

    private let state = ZMQMutex<Outcome?>(nil)
    private let wake: @Sendable () -> Void

    /// `wake` runs once, on the thread that finishes the wait.
    init(wake: @escaping @Sendable () -> Void) { self.wake = wake }

    var outcome: Outcome? { state.withLock { $0 } }

    func finish(_ outcome: Outcome) {
        let first = state.withLock { state -> Bool in
            guard state == nil else { return false }
            state = outcome
            return true
        }
        if first { wake() }
    }
}
#endif
