// The worker's side of the conversation, whichever way the worker was launched: count the
// chunk a job carries and send the tally to the main thread's port.

import PortKit

/// What a worker does with the messages it gets once it has checked in.
///
/// It holds only a send right to the main port, so the same role serves a thread launched by
/// `PKWorkerThread`, a thread launched the guide's long way (`GuideWorker`), and, later, a
/// worker process that found the main port by name.
struct WorkerRole {
    /// What the worker's run loop should do after a message.
    enum Next {
        case carryOn
        case exit
    }

    let name: String
    /// Where tallies go: the main thread's port (the guide's `remotePort`).
    let mainPort: PKSendPort

    /// Handles one message on the worker's thread.
    func handle(_ message: PKPortMessage) -> Next {
        switch message.msgid {
        case ExampleMessage.count:
            guard let request = CountRequest(message) else {
                return giveUp("a malformed job (\(message.components.count) components)")
            }
            let started = PKDeadline.now
            let tally = Tally(counting: request.chunk[...])
            let counting = PKDeadline.now.uptimeNanoseconds - started.uptimeNanoseconds
            let reply = CountReply(jobID: request.jobID, tally: tally, countingNanoseconds: counting)
            do {
                try mainPort.send(reply.message, before: .after(.seconds(5)))
            } catch {
                return giveUp("cannot reply to the main thread: \(error.message)")
            }
            return .carryOn
        case ExampleMessage.exit:
            return .exit
        default:
            return giveUp("an unexpected message (msgid \(message.msgid))")
        }
    }

    /// Says why the worker stops. The main thread learns it from the worker's port becoming
    /// invalid when the worker leaves its loop.
    private func giveUp(_ reason: String) -> Next {
        printError("\(name): \(reason); stopping")
        return .exit
    }
}
