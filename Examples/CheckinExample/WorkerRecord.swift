// What the main thread knows about one worker: how it was launched and reached, its port once
// it checked in, and its figures for the summary.

import PortKit

/// The main thread's record of one worker. Main-thread only.
final class WorkerRecord {
    /// How the worker was launched, and so how it is stopped. A worker process (the
    /// `checkin-worker` issue) will be another case.
    enum Launch {
        /// Listings 3-12 to 3-15 spelled out: stopped with an exit message and a wait for its
        /// port to become invalid.
        case guide
        /// `PKWorkerThread`: stopped and joined by `stop()`.
        case workerThread(PKWorkerThread)
    }

    let name: String
    /// "thread" (and later "process").
    let kind: String
    /// What carries the messages: "socketpair" between threads.
    let transport: String
    var launch: Launch

    /// The worker's port, from its check-in (the guide's `storeDistantPort:`).
    var port: PKSendPort?
    /// From launch to check-in.
    var checkInNanoseconds: UInt64?
    /// The job in flight and when it was sent; one at a time, so a round trip is never spent
    /// waiting in a queue.
    var inFlight: (jobID: UInt32, sentAt: PKDeadline)?
    /// Each job's round trip: from send to reply handled on the main thread.
    var roundTrips: [UInt64] = []
    /// Each job's counting time, as the worker measured it.
    var countingTimes: [UInt64] = []
    /// Told when the worker's port becomes invalid.
    var watch: PKInvalidationWatch?
    /// Whether the worker was stopped and its thread is gone.
    var stopped = false

    init(name: String, kind: String, transport: String, launch: Launch) {
        self.name = name
        self.kind = kind
        self.transport = transport
        self.launch = launch
    }

    /// How the worker was launched, for the summary.
    var launchedWith: String {
        switch launch {
        case .guide: "Listings 3-12..3-15"
        case .workerThread: "PKWorkerThread"
        }
    }
}
