#if ZeroMQ
// Host names in tcp:// endpoints, looked up off the caller's thread.
//
// libzmq looks a name up on its I/O thread, which serves every ZeroMQ socket of the process, at
// every try to connect, and `getaddrinfo` has no deadline: a name whose DNS does not answer (a
// peer can put any name in a port component) would stall them all, for the resolver's timeouts
// at each try. PortKit looks names up itself, on threads of its own (`maxLookups` at a time), and
// gives libzmq the numeric address; a caller waits for the answer until its own deadline, and a
// lookup that outlives it goes on for the next caller. Answers are kept a while (`keepFound`,
// `keepFailed`); a found one that has expired is still used while it is looked up again. At
// most `maxPending` names wait for an answer at once, each with one eventfd: past that, a new
// name has no answer for now (its connection tries again a second later), so a peer that sends
// many names that never answer holds at most that many descriptors and threads.

import Glibc
import PortKit
import Synchronization

enum HostResolver {
    /// At most this many names are looked up at once; more wait their turn.
    static let maxLookups = 4
    /// At most this many names wait for an answer (looked up or queued).
    static let maxPending = 64
    /// How long a found address is used before the name is looked up again (and how long a
    /// connection to a name waits for its handshake before it follows the name to a new
    /// address).
    static var keepFound: Duration { .milliseconds(keepFoundMilliseconds.load(ordering: .relaxed)) }
    /// Tests: `keepFound` in milliseconds (a minute; the tests shorten it).
    static let keepFoundMilliseconds = Atomic<Int64>(60_000)
    /// How long a failed lookup's answer stands (a connection tries again after it).
    static let keepFailed = Duration.seconds(1)

    /// What a host of a `tcp://` endpoint to connect to is.
    enum Kind {
        /// A numeric address (IPv4, or IPv6 in brackets or not): libzmq takes it as it is.
        case address
        /// A name, to look up.
        case name
        /// Neither, yet libzmq would take it (a zone or interface suffix `%...`, brackets around
        /// a name) and look it up on its I/O thread: refused.
        case refused
    }

    /// What `host` is (see `Kind`).
    static func kind(of host: String) -> Kind {
        if host == "*" { return .address }  // every interface, for binding: never looked up
        var inside = Substring(host)
        if inside.hasPrefix("[") && inside.hasSuffix("]") && inside.count >= 2 { inside = inside.dropFirst().dropLast() }
        var ipv4 = in_addr()
        var ipv6 = in6_addr()
        if inet_pton(AF_INET, String(inside), &ipv4) == 1 || inet_pton(AF_INET6, String(inside), &ipv6) == 1 { return .address }
        return host.contains(where: { "[]:%".contains($0) }) ? .refused : .name
    }

    /// What a lookup came to.
    enum Answer: Equatable {
        /// The name's (first IPv4) address, or `host` itself when it is not a name.
        case address(String)
        /// The name has no IPv4 address (or its lookup failed, with none found before).
        case none
        /// No answer yet (by the caller's deadline, or the lookups are full).
        case unanswered
    }

    /// One name's lookup, from the moment it is queued to its answer. A caller that waits for
    /// it keeps it, and reads the answer from it (the table may have forgotten the name by
    /// then). Its mutable parts are read and written under the state's lock.
    private final class Lookup: @unchecked Sendable {
        /// Signalled once `answer` is set.
        let done: InterruptSignal
        /// The address found before, used meanwhile.
        let stale: String?
        /// Called with the answer, on the lookup thread.
        var waiters: [@Sendable (String?) -> Void] = []
        /// The answer, once there is one (`.some(nil)`: the name has no address).
        var answer: String?? = .none

        init(done: InterruptSignal, stale: String?) {
            self.done = done
            self.stale = stale
        }
    }

    private enum Entry {
        /// Being looked up, or waiting its turn.
        case pending(Lookup)
        /// Found (the IPv4 address; after a failed lookup, the one found before) or not
        /// (`nil`), until `until` (nanoseconds of uptime).
        case known(String?, until: UInt64)
    }

    private struct State {
        var entries: [String: Entry] = [:]
        var queue: [String] = []
        var lookups = 0
        var pending = 0
        /// The table is swept for expired answers when it holds this many entries (see
        /// `forgetExpired`).
        var sweepAt = HostResolver.firstSweep
    }

    private static let state = ZMQMutex(State())

    /// Tests: how many names wait for an answer.
    static var pendingCount: Int { state.withLock { $0.pending } }

    /// Tests: makes the answer known for `host` expire now (it is still used while the name is
    /// looked up again).
    static func expire(_ host: String) {
        state.withLock { state in
            if case .known(let address, _)? = state.entries[host] { state.entries[host] = .known(address, until: 0) }
        }
    }

    /// Tests: called on the lookup thread when a lookup's answer is in the table, before its
    /// waiters are woken.
    static let answeredForTests = ZMQMutex<(@Sendable (String) -> Void)?>(nil)

    /// Tests: forgets every answer known (not the lookups under way), as a sweep of a full
    /// table does.
    static func forgetAnswers() {
        state.withLock { state in
            state.entries = state.entries.filter { if case .pending = $1 { true } else { false } }
        }
    }

    /// Tests: answers for names of the tests' own (a lookup that does not answer for a while,
    /// say) while set; `.none` for any other name, which is looked up as usual.
    static let lookUpForTests = ZMQMutex<(@Sendable (String) -> String??)?>(nil)

    /// The address of `host`: itself if it is not a name; else the answer known (a found one
    /// that expired is used while it is looked up again), or one looked up now on a lookup
    /// thread, waited for until `deadline`.
    static func address(of host: String, before deadline: PKDeadline) -> Answer {
        guard kind(of: host) == .name else { return .address(host) }
        var next = state.withLock { state -> Step in step(for: host, &state) }
        // `maxPending` names wait already: look again every 10 ms until one is answered.
        while case .full = next, !deadline.hasPassed {
            _ = Descriptors.waitReadable([], until: min(deadline, .after(.milliseconds(10))))
            next = state.withLock { state -> Step in step(for: host, &state) }
        }
        switch next {
        case .known(let address?): return .address(address)
        case .known(nil): return .none
        case .full: return .unanswered
        case .wait(let lookup):
            // (The lookup, and its eventfd, live through the wait: `withExtendedLifetime`.)
            withExtendedLifetime(lookup) { _ = Descriptors.waitReadable([lookup.done.descriptor], until: deadline) }
            return state.withLock { _ in
                switch lookup.answer {
                case .some(let address?): .address(address)
                case .some(nil): .none
                case .none: .unanswered
                }
            }
        }
    }

    /// Calls `handler` with the address of the name `host` (`nil` if it has none, or if no
    /// answer can be waited for now): at once if an answer is known or none can be waited for,
    /// else on a lookup thread once it is.
    static func whenKnown(_ host: String, _ handler: @escaping @Sendable (String?) -> Void) {
        let now = state.withLock { state -> String?? in
            switch step(for: host, &state) {
            case .known(let address): return .some(address)
            case .full: return .some(nil)
            case .wait(let lookup):
                lookup.waiters.append(handler)
                return .none
            }
        }
        if case .some(let address) = now { handler(address) }
    }

    private enum Step {
        /// An answer to give now (a fresh one, or a stale address while it is looked up again).
        case known(String?)
        /// Wait for the lookup's answer.
        case wait(Lookup)
        /// No answer, and none can be waited for now (`maxPending` names wait already).
        case full
    }

    /// What a caller asking for `host` does: take a known answer, or wait for one (a lookup
    /// queued if none is, and a thread started for it if fewer than `maxLookups` run). Under
    /// the lock.
    private static func step(for host: String, _ state: inout State) -> Step {
        let now = PKDeadline.now.uptimeNanoseconds
        var stale: String?
        switch state.entries[host] {
        case .pending(let lookup)?:
            if let old = lookup.stale { return .known(old) }
            return .wait(lookup)
        case .known(let address, let until)?:
            if until > now { return .known(address) }
            stale = address
        case nil:
            break
        }
        guard state.pending < maxPending, let done = try? InterruptSignal() else {
            return stale.map { .known($0) } ?? .full
        }
        if state.entries.count >= state.sweepAt {
            forgetExpired(&state, now: now)
            state.sweepAt = min(max(firstSweep, 2 * state.entries.count), maxEntries)
        }
        let lookup = Lookup(done: done, stale: stale)
        state.entries[host] = .pending(lookup)
        state.pending += 1
        state.queue.append(host)
        if state.lookups < maxLookups {
            do throws(PKError) {
                _ = try SystemThread(name: "PortKit.resolve") { lookUpQueued() }
                state.lookups += 1
            } catch {
                // A lookup thread that runs takes it in its turn. With none, nothing would:
                // the name has no answer for now.
                if state.lookups == 0 {
                    state.queue.removeLast()
                    state.pending -= 1
                    state.entries[host] = stale.map { .known($0, until: PKDeadline.after(keepFailed).uptimeNanoseconds) }
                    return stale.map { .known($0) } ?? .full
                }
            }
        }
        return stale.map { .known($0) } ?? .wait(lookup)
    }

    /// The first sweep of the table of answers, at this many entries.
    static let firstSweep = 256
    /// The table never holds more entries than this (a sweep is due by then at the latest).
    static let maxEntries = 4096

    /// Keeps the table of answers small. Called when it holds `sweepAt` entries: from
    /// `firstSweep` (256), expired failures go; from 1,024, expired addresses too (a live
    /// connection to one looks it up again); and if more than half of `maxEntries` would stay
    /// (2,048 answers found within a minute: a peer whose DNS answers every name, at a high
    /// rate), every known answer. The next sweep is due once the table has doubled (at most
    /// `maxEntries`), so a sweep's work, every entry, is spread over at least half as many new
    /// names.
    private static func forgetExpired(_ state: inout State, now: UInt64) {
        let limits: [(count: Int, keep: (String?, UInt64) -> Bool)] = [
            (firstSweep, { address, until in address != nil || until > now }),
            (1024, { _, until in until > now }),
            (maxEntries / 2 + 1, { _, _ in false }),
        ]
        for (count, keep) in limits where state.entries.count >= count {
            state.entries = state.entries.filter { _, entry in
                if case .known(let address, let until) = entry { return keep(address, until) }
                return true
            }
        }
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
            let found = (lookUpForTests.withLock { $0 })?(host) ?? lookUp(host)
            let (lookup, waiters, address) = state.withLock { state -> (Lookup?, [@Sendable (String?) -> Void], String?) in
                guard case .pending(let lookup)? = state.entries[host] else { return (nil, [], found) }
                // A lookup that fails keeps the address found before (DNS down for a while must
                // not cut off a name that had one), and is tried again as a failure is.
                let address = found ?? lookup.stale
                let keep = found == nil ? keepFailed : keepFound
                state.entries[host] = .known(address, until: PKDeadline.after(keep).uptimeNanoseconds)
                state.pending -= 1
                lookup.answer = .some(address)
                defer { lookup.waiters = [] }
                return (lookup, lookup.waiters, address)
            }
            (answeredForTests.withLock { $0 })?(host)
            lookup?.done.signal()
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
