// What the main thread knows about one worker: how it was launched and reached, its port once
// it checked in, and its figures for the summary.

import Foundation
import PortKit

/// What carries a worker's messages, as the summary says it.
enum Transport {
    /// Between threads: in-process rights, whose messages go into the receiving port's
    /// in-memory mailbox (no socket).
    static let inProcessMailbox = "in-process mailbox"
    /// A port looked up by name: a connection to the owner's named Unix socket.
    static let namedSocket = "named unix socket"
    /// `PKWorkerProcess`: ports handed over on inherited descriptors and inside the check-in.
    static let passedPort = "port passed over fd"
}

/// The main thread's record of one worker. Main-thread only.
final class WorkerRecord {
    /// How the worker was launched, and so how its port is found and how it is stopped.
    enum Launch {
        /// A thread, Listings 3-12 to 3-15 spelled out: its port is the check-in's reply port;
        /// stopped with an exit message and a wait for its port to become invalid.
        case guide
        /// A thread launched by `PKWorkerThread`: stopped and joined by `stop()`.
        case workerThread(PKWorkerThread)
        /// A `checkin-worker` process started with Foundation's `Process`, that found the main
        /// port by name and sent its own port's name (Listings 3-17 to 3-19): its port is looked
        /// up by that name; stopped with an exit message and a wait for the process to exit 0.
        case processByName(Process)
        /// A `checkin-worker` process started by `PKWorkerProcess`, that got its ports over
        /// inherited descriptors: stopped by `stop()`, which waits for it to exit.
        case workerProcess(PKWorkerProcess)
        /// A `checkin-worker` someone started by hand, that checked in by name: stopped with
        /// an exit message and a wait for its port to become invalid (its exit status goes to
        /// the shell that started it).
        case byHand
    }

    let name: String
    /// "thread" or "process".
    let kind: String
    /// What carries the messages (see `Transport`).
    let transport: String
    var launch: Launch

    /// The worker's port, from its check-in (the guide's `storeDistantPort:`).
    var port: PKSendPort?
    /// From launch to check-in (for a worker started by hand: from the main port's
    /// registration, when it could first be found).
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
    /// Whether the worker was stopped and its thread or process is gone.
    var stopped = false
    /// A spawned process's exit status, once it exited.
    var exitStatus: Int32?

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
        case .processByName: "Listings 3-17..3-19"
        case .workerProcess: "PKWorkerProcess"
        case .byHand: "by hand, 3-17..3-19"
        }
    }

    /// Whether main spawned this worker as a process (and so waits for its exit status).
    var isSpawnedProcess: Bool {
        switch launch {
        case .processByName, .workerProcess: true
        case .guide, .workerThread, .byHand: false
        }
    }
}
