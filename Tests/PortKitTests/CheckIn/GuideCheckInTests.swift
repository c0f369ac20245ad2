// The Threading Programming Guide's "Configuring a Port-Based Input Source", Listings 3-12 to
// 3-15, line for line in Swift on PortKit: the main thread makes a port, sets its handler,
// adds it to its run loop and launches a worker with a send right to it; the worker makes its
// own port, adds it to its run loop, sends the check-in message (msgid 100) with its port as
// the reply port, and runs its loop until told to exit. Then the two exchange messages.

import Testing
@testable import PortKit

/// `#define kCheckinMessage 100`
private let kCheckinMessage: UInt32 = 100
/// The messages the two threads exchange after the check-in (not in the guide).
private let kWorkMessage: UInt32 = 200
private let kWorkDoneMessage: UInt32 = 201
private let kExitMessage: UInt32 = 300

/// The main thread's side: Listings 3-12 and 3-13.
private final class MainThreadController {
    var distantPort: PKSendPort?
    var results: [String] = []
    var handledMessageIDs: [UInt32] = []
    var workerThread: TestThread?

    // Listing 3-12  Main thread launch method
    //
    //     - (void)launchThread
    //     {
    func launchThread() throws {
        //     NSPort* myPort = [NSMachPort port];
        //     if (myPort)
        //     {
        // (As in the guide, no variable keeps the port: its run loop does.)
        let myPort = PKReceivePort()
        //         // This class handles incoming port messages.
        //         [myPort setDelegate:self];
        myPort.handler = { [unowned self] message in self.handlePortMessage(message) }
        //
        //         // Install the port as an input source on the current run loop.
        //         [[NSRunLoop currentRunLoop] addPort:myPort forMode:NSDefaultRunLoopMode];
        try PKRunLoop.current.add(myPort, forMode: .default)
        //
        //         // Detach the thread. Let the worker release the port.
        //         [NSThread detachNewThreadSelector:@selector(LaunchThreadWithPort:)
        //                toTarget:[MyWorkerClass class] withObject:myPort];
        let portForWorker = myPort.makeSendRight()
        workerThread = TestThread(name: "guide-worker") { MyWorkerClass.launchThread(withPort: portForWorker) }
        //     }
    }
    //     }

    // Listing 3-13  Handling Mach port messages
    //
    //     #define kCheckinMessage 100
    //
    //     // Handle responses from the worker thread.
    //     - (void)handlePortMessage:(NSPortMessage *)portMessage
    //     {
    func handlePortMessage(_ portMessage: PKPortMessage) {
        //     unsigned int message = [portMessage msgid];
        let message = portMessage.msgid
        //     NSPort* distantPort = nil;
        var distantPort: PKSendPort? = nil
        handledMessageIDs.append(message)
        //
        //     if (message == kCheckinMessage)
        //     {
        if message == kCheckinMessage {
            //         // Get the worker thread's communications port.
            //         distantPort = [portMessage sendPort];
            distantPort = portMessage.replyPort
            //
            //         // Retain and save the worker port for later use.
            //         [self storeDistantPort:distantPort];
            storeDistantPort(distantPort)
        }
        //     }
        //     else
        //     {
        else {
            //         // Handle other messages.
            if message == kWorkDoneMessage { results.append(portMessage.text) }
        }
        //     }
    }
    //     }

    func storeDistantPort(_ port: PKSendPort?) { distantPort = port }
}

/// The worker's side: Listings 3-14 and 3-15.
private final class MyWorkerClass {
    var remotePort: PKSendPort?
    var shouldExit = false

    // Listing 3-14  Launching the worker thread using Mach ports
    //
    //     +(void)LaunchThreadWithPort:(id)inData
    //     {
    static func launchThread(withPort inData: PKSendPort) {
        //     NSAutoreleasePool*  pool = [[NSAutoreleasePool  alloc] init];
        //
        //     // Set up the connection between this thread and the main thread.
        //     NSPort* distantPort = (NSPort*)inData;
        let distantPort = inData
        //
        //     MyWorkerClass*  workerObj = [[self alloc] init];
        let workerObj = MyWorkerClass()
        //     [workerObj sendCheckinMessage:distantPort];
        workerObj.sendCheckinMessage(distantPort)
        //     [distantPort release];
        //
        //     // Let the run loop process things.
        //     do
        //     {
        //         [[NSRunLoop currentRunLoop] runMode:NSDefaultRunLoopMode
        //                             beforeDate:[NSDate distantFuture]];
        //     }
        //     while (![workerObj shouldExit]);
        repeat {
            PKRunLoop.current.runOnce(in: .default, before: .distantFuture)
        } while !workerObj.shouldExit
        //
        //     [workerObj release];
        //     [pool release];
        // (The worker's port, kept by its run loop, is invalidated when this thread ends.)
    }
    //     }

    // Listing 3-15  Sending the check-in message using Mach ports
    //
    //     // Worker thread check-in method
    //     - (void)sendCheckinMessage:(NSPort*)outPort
    //     {
    func sendCheckinMessage(_ outPort: PKSendPort) {
        //     // Retain and save the remote port for future use.
        //     [self setRemotePort:outPort];
        remotePort = outPort
        //
        //     // Create and configure the worker thread port.
        //     NSPort* myPort = [NSMachPort port];
        // (As in the guide, no variable keeps the port once this method returns: its run
        // loop does.)
        let myPort = PKReceivePort()
        //     [myPort setDelegate:self];
        myPort.handler = { [unowned self] message in self.handlePortMessage(message) }
        //     [[NSRunLoop currentRunLoop] addPort:myPort forMode:NSDefaultRunLoopMode];
        try? PKRunLoop.current.add(myPort, forMode: .default)
        //
        //     // Create the check-in message.
        //     NSPortMessage* messageObj = [[NSPortMessage alloc] initWithSendPort:outPort
        //                                          receivePort:myPort components:nil];
        var messageObj = PKPortMessage(msgid: 0, components: [], replyPort: myPort.makeSendRight())
        //
        //     if (messageObj)
        //     {
        //         // Finish configuring the message and send it immediately.
        //         [messageObj setMsgId:setMsgid:kCheckinMessage];
        messageObj.msgid = kCheckinMessage
        //         [messageObj sendBeforeDate:[NSDate date]];
        try? outPort.send(messageObj, before: .now)
        //     }
    }
    //     }

    /// The worker's delegate method (not in the guide's listings): does the work it is asked
    /// to do and answers on the remote port it saved at check-in.
    func handlePortMessage(_ portMessage: PKPortMessage) {
        switch portMessage.msgid {
        case kWorkMessage:
            let answer = String(portMessage.text.reversed())
            try? remotePort?.send(PKPortMessage(msgid: kWorkDoneMessage, data: Array(answer.utf8)), before: .after(.seconds(5)))
        case kExitMessage:
            shouldExit = true
        default:
            break
        }
    }
}

@Suite struct GuideCheckInTests {
    @Test func listings3_12to3_15CheckInThenExchangeMessages() throws {
        try onPortLoopThread(timeout: .seconds(60)) { loop in
            let controller = MainThreadController()
            try controller.launchThread()

            // The main thread's run loop serves the check-in.
            try runLoop(loop, "the worker's check-in") { controller.distantPort != nil }
            #expect(controller.handledMessageIDs == [kCheckinMessage])
            let worker = try #require(controller.distantPort)
            #expect(worker.isValid)

            // From now on the two exchange messages.
            let words = ["port", "message", "run loop", "check-in", "worker"]
            for word in words {
                try worker.send(PKPortMessage(msgid: kWorkMessage, data: Array(word.utf8)), before: .after(.seconds(5)))
            }
            try runLoop(loop, "the worker's answers") { controller.results.count == words.count }
            #expect(controller.results == words.map { String($0.reversed()) })

            // Tell the worker to exit; its thread ends and its port with it.
            try worker.send(PKPortMessage(msgid: kExitMessage), before: .after(.seconds(5)))
            try #require(controller.workerThread).joinPatiently(timeout: .seconds(20))
            try waitPatiently("the worker's port to become invalid") { !worker.isValid }
            #expect {
                try worker.send(PKPortMessage(msgid: kWorkMessage), before: .after(.seconds(1)))
            } throws: { ($0 as? PKError)?.code == .invalidPort }
            // The main thread's port, kept by its run loop, goes when this thread ends.
        }
    }

    /// The same handshake with several workers at once: each checks in with its own port, and
    /// the main thread tells their answers apart.
    @Test func severalWorkersCheckInToOnePort() throws {
        try onPortLoopThread(timeout: .seconds(60)) { loop in
            var workers: [PKSendPort] = []
            var answers: [String] = []
            let myPort = PKReceivePort { message in
                if message.msgid == kCheckinMessage, let port = message.replyPort { workers.append(port) }
                if message.msgid == kWorkDoneMessage { answers.append(message.text) }
            }
            try loop.add(myPort, forMode: .default)
            let threads = (0..<4).map { _ in
                let right = myPort.makeSendRight()
                return TestThread(name: "guide-worker") { MyWorkerClass.launchThread(withPort: right) }
            }
            try runLoop(loop, "four check-ins") { workers.count == 4 }
            #expect(Set(workers).count == 4)
            for (index, worker) in workers.enumerated() {
                try worker.send(PKPortMessage(msgid: kWorkMessage, data: Array("w\(index)".utf8)), before: .after(.seconds(5)))
            }
            try runLoop(loop, "four answers") { answers.count == 4 }
            #expect(Set(answers) == ["0w", "1w", "2w", "3w"])
            for worker in workers { try worker.send(PKPortMessage(msgid: kExitMessage), before: .after(.seconds(5))) }
            for thread in threads { try thread.joinPatiently(timeout: .seconds(20)) }
            myPort.invalidate()
        }
    }
}
