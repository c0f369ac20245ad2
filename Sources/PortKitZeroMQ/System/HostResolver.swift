#if ZeroMQ
// Host names in tcp:// endpoints, looked up off the caller's thread.
//
// libzmq looks a name up on its I/O thread, which serves every ZeroMQ socket of the process, at
// every try to connect, and `getaddrinfo` has no deadline: a name whose DNS does not answer (a
// peer can put any name in a port component) would stall them all, for the resolver's timeouts
// at each try. PortKit looks names up itself, on threads of its own (`maxLookups` at a time), and
// gives libzmq the numeric address; a caller waits for the answer until its own deadline, and a
// lookup that outlives it goes on for the next caller. Answers are kept a while (`keepFound`,
// `keepFailed`), so a name is not looked up for every message or every try.

import Glibc
import PortKit

enum HostResolver {
    /// At most this many names are looked up at once; more wait their turn.
    static let maxLookups = 4
    /// How long a found address is used before the name is looked up again.
    static let keepFound = Duration.seconds(60)
    /// How long a failed lookup's answer stands (a connection tries again after it).
    static let keepFailed = Duration.seconds(1)

    private enum Answer {
        /// Being looked up, or waiting its turn: `done` is signalled with the answer.
        case pending(done: InterruptSignal, waiters: [@Sendable (String?) -> Void])
        /// Found (the IPv4 address) or not (`nil`), until `until` (nanoseconds of uptime).
        case known(String?, until: UInt64)
    }

    private struct State {
        var answers: [String: Answer] = [:]
        var queue: [String] = []
        var lookups = 0
    }

    private static let state = ZMQMutex(State())

    /// Tests: answers for names of the tests' own (a lookup that does not answer for a while,
    /// say) while set; `.none` for any other name, which is looked up as usual.
    static let lookUpForTests = ZMQMutex<(@Sendable (String) -> String??)?>(nil)

    /// Whether `host` (of a `tcp://` endpoint) is a name to look up: not an IPv4 address, and
    /// not an IPv6 address or an interface, which libzmq takes as they are.
    static func isName(_ host: String) -> Bool {
        guard host != "*", !host.contains(":"), !host.contains("["), !host.contains("%") else { return false }
        var address = in_addr()
        return inet_pton(AF_INET, host, &address) != 1
    }

    /// The IPv4 address of `host`: `host` itself if it is not a name (`isName`); else the
    /// answer known, or one looked up now, on a lookup thread, waited for until `deadline`.
    /// `nil` if the name has no IPv4 address, or no answer came in time (the lookup goes on).
    static func address(of host: String, before deadline: PKDeadline) -> String? {
        guard isName(host) else { return host }
        let pending = state.withLock { state -> InterruptSignal? in
            switch answer(for: host, &state) {
            case .known: return nil
            case .pending(let done, _): return done
            }
        }
        if let pending { _ = Descriptors.waitReadable([pending.descriptor], until: deadline) }
        return state.withLock { state in
            if case .known(let address, _)? = state.answers[host] { return address }
            return nil
        }
    }

    /// Calls `handler` with the IPv4 address of the name `host` (`nil` if it has none): at once
    /// if a fresh answer is known, else on a lookup thread once it is.
    static func whenKnown(_ host: String, _ handler: @escaping @Sendable (String?) -> Void) {
        let known = state.withLock { state -> String?? in
            switch answer(for: host, &state) {
            case .known(let address, _):
                return .some(address)
            case .pending(let done, var waiters):
                waiters.append(handler)
                state.answers[host] = .pending(done: done, waiters: waiters)
                return .none
            }
        }
        if case .some(let address) = known { handler(address) }
    }

    /// The answer for `host`: a fresh one, or a lookup queued (and a thread started for it, if
    /// fewer than `maxLookups` run). Under the lock.
    private static func answer(for host: String, _ state: inout State) -> Answer {
        let now = PKDeadline.now.uptimeNanoseconds
        if let answer = state.answers[host] {
            switch answer {
            case .pending: return answer
            case .known(_, let until) where until > now: return answer
            case .known: break
            }
        }
        guard let done = try? InterruptSignal() else {
            // Out of descriptors: no wait can be made, and the caller is told now.
            return .known(nil, until: now)
        }
        // Forgets stale answers now and then, so that names seen once do not pile up.
        if state.answers.count >= 256 {
            state.answers = state.answers.filter { _, answer in
                if case .known(_, let until) = answer { return until > now }
                return true
            }
        }
        let answer = Answer.pending(done: done, waiters: [])
        state.answers[host] = answer
        state.queue.append(host)
        if state.lookups < maxLookups {
            do throws(PKError) {
                _ = try SystemThread(name: "PortKit.resolve") { lookUpQueued() }
                state.lookups += 1
            } catch {
                // No thread: a lookup thread already running takes it, or the next caller
                // starts one; meanwhile it waits in the queue.
            }
        }
        return answer
    }

    /// On a lookup thread: looks up queued names until there are none.
    private static func lookUpQueued() {
        while true {
            let next = state.withLock { state -> String? in
                guard !state.queue.isEmpty else {
                    state.lookups -= 1
                    return nil
                }
                return state.queue.removeFirst()
            }
            guard let host = next else { return }
            let address = (lookUpForTests.withLock { $0 })?(host) ?? lookUp(host)
            let keep = address == nil ? keepFailed : keepFound
            let (done, waiters) = state.withLock { state -> (InterruptSignal?, [@Sendable (String?) -> Void]) in
                let until = PKDeadline.after(keep).uptimeNanoseconds
                defer { state.answers[host] = .known(address, until: until) }
                guard case .pending(let done, let waiters)? = state.answers[host] else { return (nil, []) }
                return (done, waiters)
            }
            done?.signal()
            for waiter in waiters { waiter(address) }
        }
    }

    /// The first IPv4 address of `host`. The corresponding call is `getaddrinfo(3)`.
    private static func lookUp(_ host: String) -> String? {
        var hints = addrinfo()
        hints.ai_family = AF_INET
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, nil, &hints, &found) == 0, let found else { return nil }
        defer { freeaddrinfo(found) }
        guard let address = found.pointee.ai_addr, found.pointee.ai_family == AF_INET else { return nil }
        var text = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
        let written = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { inet in
            inet_ntop(AF_INET, &inet.pointee.sin_addr, &text, socklen_t(text.count))
        }
        guard written != nil else { return nil }
        return text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }
}
#endif
