// A worker thread launched the long way, as the guide spells it out in Listings 3-14 and 3-15
// (its `MyWorkerClass`). The main thread's half, Listings 3-12 and 3-13, is in MainRole.swift.
// `PKWorkerThread` does all of this in one call; this file shows what it does.

import PortKit

/// The worker object of Listings 3-14 and 3-15. It lives on its own thread.
final class GuideWorker {
    let name: String
    private(set) var shouldExit = false
    private var remotePort: PKSendPort?
    private var myPort: PKReceivePort?
    private var role: WorkerRole?

    private init(name: String) { self.name = name }

    /// Listing 3-14, "Launching the worker thread": the new thread's entry point. `distantPort`
    /// is the send right to the main thread's port that the launcher handed over.
    static func launchThread(withPort distantPort: PKSendPort, name: String) {
        // Set up the connection between this thread and the main thread.
        let workerObj = GuideWorker(name: name)
        do {
            try workerObj.sendCheckinMessage(distantPort)
        } catch {
            printError("\(name): cannot check in: \(error.message)")
            return
        }

        // Let the run loop process things.
        let loop = PKRunLoop.current
        repeat {
            loop.runOnce(in: .default, before: .distantFuture)
        } while !workerObj.shouldExit && workerObj.myPort?.isValid == true

        // Leaving: the main thread sees this port become invalid (and would, too, if the thread
        // simply ended, since a thread's ports die with it).
        workerObj.myPort?.invalidate()
    }

    /// Listing 3-15, "Sending the check-in message": make this thread's port, put it on the
    /// run loop, and send it to the main thread in a message with msgid 100.
    func sendCheckinMessage(_ outPort: PKSendPort) throws(PKError) {
        // Retain and save the remote port for future use.
        remotePort = outPort
        role = WorkerRole(name: name, mainPort: outPort)

        // Create and configure the worker thread port.
        let myPort = PKReceivePort()
        myPort.handler = { [unowned self] message in self.handlePortMessage(message) }
        try PKRunLoop.current.add(myPort, forMode: .default)
        self.myPort = myPort

        // Create the check-in message: our port travels as its reply port (the `receivePort:`
        // of `initWithSendPort:receivePort:components:`), our name as its data.
        let messageObj = PKPortMessage(
            msgid: ExampleMessage.checkIn, data: Array(name.utf8), replyPort: myPort.makeSendRight())

        // Send it. (The guide gives `[NSDate date]`, no wait at all; a short wait is kinder to
        // a busy main thread.)
        try outPort.send(messageObj, before: .after(PKCheckIn.defaultTimeout))
    }

    /// The port's handler (the delegate's `handlePortMessage:`): the jobs, then the exit.
    private func handlePortMessage(_ message: PKPortMessage) {
        if role?.handleOnThread(message) == false { shouldExit = true }
    }
}
