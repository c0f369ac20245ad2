// The check-in handshake's logic, apart from any I/O: what the launcher does with each event
// while it waits for a worker (thread or process) to check in.

/// The launcher's side of the check-in: waiting -> checked in | failed.
struct CheckInStateMachine {
    enum State: Equatable {
        case waiting
        case checkedIn
        case failed
    }

    enum Event {
        /// A message arrived on the check-in port.
        case message(msgid: UInt32, hasReplyPort: Bool)
        /// The worker's connection to the check-in port closed: it ended.
        case workerGone
        /// The check-in deadline passed.
        case deadlinePassed
        /// The launcher's run loop was stopped while it waited.
        case interrupted
    }

    enum Action: Equatable {
        /// Keep waiting.
        case wait
        /// The worker checked in: keep its reply port as its port.
        case acceptWorker
        /// Give up with this error code and reason.
        case fail(PKError.Code, String)
    }

    private(set) var state: State = .waiting
    let checkInMessageID: UInt32

    init(checkInMessageID: UInt32 = PKCheckIn.messageID) {
        self.checkInMessageID = checkInMessageID
    }

    mutating func handle(_ event: Event) -> Action {
        guard state == .waiting else { return .wait }
        switch event {
        case .message(let msgid, let hasReplyPort):
            guard msgid == checkInMessageID else {
                state = .failed
                return .fail(.checkInFailed, "the worker sent msgid \(msgid) before checking in (expected \(checkInMessageID))")
            }
            guard hasReplyPort else {
                state = .failed
                return .fail(.checkInFailed, "the check-in message carried no port to reach the worker")
            }
            state = .checkedIn
            return .acceptWorker
        case .workerGone:
            state = .failed
            return .fail(.checkInFailed, "the worker ended before checking in")
        case .deadlinePassed:
            state = .failed
            return .fail(.checkInTimedOut, "the worker did not check in before the deadline")
        case .interrupted:
            state = .failed
            return .fail(.interrupted, "the run loop was stopped while waiting for the worker to check in")
        }
    }
}
