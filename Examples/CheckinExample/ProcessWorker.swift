// A worker process, either way it can be started:
//
// - by name (Listings 3-17 to 3-19, the guide's CFMessagePort form): look the main port up by
//   its name, make a port of our own, register it under our own name, and send that name in the
//   check-in message. checkin-main spawns one this way, and this is how a worker started by hand
//   from another shell finds a running checkin-main;
// - by `PKWorkerProcess` (the pass-a-port form): the ports come on inherited descriptors and
//   `PKWorkerProcess.serve(setUp:)` does the check-in.
//
// Either way the work is `WorkerRole`'s, as in a worker thread.

import ArgumentParser
import Glibc
import PortKit

/// The worker process's main program.
enum ProcessWorker {
    /// Runs the worker role until told to stop; on failure prints one line to standard error
    /// and exits with 1.
    static func run(_ options: WorkerOptions) throws {
        do {
            if PKWorkerProcess.isLaunchedWorker {
                try serveLaunchedWorker()
            } else {
                try serveByName(options)
            }
        } catch {
            printError("checkin-worker: \(error.reason)")
            throw ExitCode.failure
        }
    }

    // MARK: - By name

    /// Listing 3-19, "Setting up the thread structures", as a process.
    private static func serveByName(_ options: WorkerOptions) throws(ExampleFailure) {
        let server = PKNameServer.shared
        let say: (String) -> Void = { line in if !options.quiet { printLine("checkin-worker: \(line)") } }

        // Create the remote port to the main thread: look its name up, waiting for it to be
        // registered if checkin-main has not started yet.
        let mainPort: PKSendPort
        do {
            mainPort = try server.lookUp(options.name)
        } catch where error.code == .nameNotFound {
            say("waiting up to \(options.waitTimeout) s for \"\(options.name)\" to be registered in \(server.directory)")
            do {
                mainPort = try server.lookUp(options.name, timeout: .seconds(options.waitTimeout))
            } catch where error.code == .nameNotFound {
                throw ExampleFailure("no port was registered as \"\(options.name)\" in \(server.directory) within \(options.waitTimeout) s (is checkin-main running, with the same --name and name directory?)")
            } catch {
                throw ExampleFailure("cannot look up \"\(options.name)\": \(error.message)")
            }
        } catch {
            throw ExampleFailure("cannot look up \"\(options.name)\": \(error.message)")
        }

        // Create a port for the worker, with a name of its own, and put it on the run loop.
        let myName = options.workerName ?? PortNames.worker(main: options.name, pid: getpid())
        let role = WorkerRole(name: myName, mainPort: mainPort)
        let loop = PKRunLoop.current
        let myPort = PKReceivePort()
        var next = WorkerRole.Next.carryOn
        var jobs = 0
        myPort.handler = { message in
            let result = role.handle(message)
            if result == .carryOn { jobs += 1 } else { next = result }
        }
        let watch: PKInvalidationWatch
        do {
            try loop.add(myPort, forMode: .default)
            try server.register(myPort, name: myName)
            // If checkin-main goes away without telling us to stop, stop with a failure.
            watch = try mainPort.watchInvalidation(on: loop, forMode: .default) {
                if next == .carryOn { next = .giveUp("\"\(options.name)\" went away before telling \(myName) to stop") }
            }
        } catch {
            throw ExampleFailure("cannot set up the port \"\(myName)\": \(error.message)")
        }
        defer {
            watch.cancel()
            myPort.invalidate()  // which also removes its name
        }

        // Package up the port name and send the check-in message. The port travels as the
        // reply port too: checkin-main looks the name up, as Listing 3-18 does, but could
        // equally use the reply port, as it does for its threads.
        let checkIn = PKPortMessage(msgid: ExampleMessage.checkIn, data: Array(myName.utf8), replyPort: myPort.makeSendRight())
        do {
            try mainPort.send(checkIn, before: .after(PKCheckIn.defaultTimeout))
        } catch {
            throw ExampleFailure("cannot check in with \"\(options.name)\": \(error.message)")
        }
        say("checked in with \"\(options.name)\" as \"\(myName)\"; counting until told to stop")

        // Let the run loop process things until told to stop.
        while next == .carryOn {
            loop.runOnce(in: .default, before: .distantFuture)
        }
        if case .giveUp(let reason) = next { throw ExampleFailure(reason) }
        say("\(myName) counted \(jobs) \(jobs == 1 ? "chunk" : "chunks"); told to stop, exiting")
    }

    // MARK: - Launched by PKWorkerProcess

    /// The pass-a-port form: `PKWorkerProcess.serve(setUp:)` checks in over descriptor 3 and
    /// serves until `PKWorkerProcess.stop()`; the main port came on descriptor 4.
    private static func serveLaunchedWorker() throws(ExampleFailure) {
        var outcome = WorkerRole.Next.carryOn
        var watch: PKInvalidationWatch?
        do {
            try PKWorkerProcess.serve { context in
                guard let mainPort = context.mainPort else {
                    outcome = .giveUp("PKWorkerProcess gave this worker no main port")
                    throw ExampleFailure("no main port")
                }
                let role = WorkerRole(name: context.name, mainPort: mainPort)
                let loop = context.loop
                context.checkInData = Array(context.name.utf8)
                context.port.handler = { [unowned context] message in
                    let result = role.handle(message)
                    if result != .carryOn {
                        outcome = result
                        context.requestStop()
                    }
                }
                watch = try mainPort.watchInvalidation(on: loop, forMode: .default) { [unowned context] in
                    if outcome == .carryOn { outcome = .giveUp("checkin-main went away before telling \(context.name) to stop") }
                    context.requestStop()
                    loop.stop()
                }
            }
        } catch {
            if case .giveUp(let reason) = outcome { throw ExampleFailure(reason) }
            throw ExampleFailure("cannot check in: \(error.message)")
        }
        watch?.cancel()
        // Stopped by PKWorkerProcess.stop() (outcome still .carryOn) or by msgid 300: success.
        if case .giveUp(let reason) = outcome { throw ExampleFailure(reason) }
    }
}
