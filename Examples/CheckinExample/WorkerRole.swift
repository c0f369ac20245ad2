// The worker's side of the conversation, whichever way the worker was launched: count the
// chunk a job carries and send the tally to the main thread's port.

import PortKit

/// What a worker does with the messages it gets once it has checked in.
///
/// It holds only a send right to the main port, so the same role serves a thread launched by
/// `PKWorkerThread`, a thread launched the guide's long way (`GuideWorker`), a worker process
/// that found the main port by name, and one launched by `PKWorkerProcess`.
struct WorkerRole {
    /// What the worker's run loop should do after a message.
    enum Next: Equatable {
        case carryOn
        /// Told to stop (msgid 300).
        case exit
        /// Something went wrong; the caller says why and stops.
        case giveUp(String)
    }

    let name: String
    /// Where tallies go: the main thread's port (the guide's `remotePort`).
    let mainPort: PKSendPort

    /// Handles one message on the worker's thread.
    func handle(_ message: PKPortMessage) -> Next {
        switch message.msgid {
        case ExampleMessage.count:
            guard let request = CountRequest(message) else {
                return .giveUp("a malformed job (\(message.components.count) components)")
            }
            let started = PKDeadline.now
            let tally = Tally(counting: request.chunk[...])
            let counting = PKDeadline.now.uptimeNanoseconds - started.uptimeNanoseconds
            let reply = CountReply(jobID: request.jobID, tally: tally, countingNanoseconds: counting)
            do {
                try mainPort.send(reply.message, before: .after(.seconds(5)))
            } catch {
                return .giveUp("cannot reply to the main thread: \(error.message)")
            }
            return .carryOn
        case ExampleMessage.exit:
            return .exit
        default:
            return .giveUp("an unexpected message (msgid \(message.msgid))")
        }
    }

    /// `handle(_:)` for a worker thread, which has no exit status to fail with: says on
    /// standard error why it gives up, if it does. The main thread learns it from the worker's
    /// port becoming invalid when the worker leaves its loop.
    ///
    /// - Returns: whether the worker should stay in its loop.
    func handleOnThread(_ message: PKPortMessage) -> Bool {
        switch handle(message) {
        case .carryOn:
            return true
        case .exit:
            return false
        case .giveUp(let reason):
            printError("\(name): \(reason); stopping")
            return false
        }
    }
}
