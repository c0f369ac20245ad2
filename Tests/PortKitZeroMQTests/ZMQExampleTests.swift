#if ZeroMQ
// The example pair over ZeroMQ on tcp://127.0.0.1: checkin-main --transport zmq with the
// workers it starts, and with a checkin-worker --transport zmq --connect started separately.

import Testing
import PortKit

@Suite(.serialized) struct ZMQExampleTests {
    /// Every line the process prints until it exits.
    func output(of peer: ZMQPeerProcess, timeout: Duration = .seconds(60)) throws -> [String] {
        var lines: [String] = []
        while true {
            do { lines.append(try peer.readLine(timeout: timeout)) } catch { break }
        }
        return lines
    }

    @Test func checkinMainOverZeroMQWithTheWorkersItStarts() throws {
        let main = try ZMQPeerProcess(
            ["--transport", "zmq", "--listen", "tcp://127.0.0.1:*", "--workers", "1", "--processes", "2", "--rounds", "1"],
            executable: "checkin-main")
        let lines = try output(of: main)
        #expect(try main.waitForExit() == 0, "\(lines.joined(separator: "\n"))")
        #expect(lines.contains { $0.hasPrefix("main port: listening on tcp://127.0.0.1:") })
        #expect(lines.contains { $0.hasPrefix("verified:") }, "\(lines.joined(separator: "\n"))")
        #expect(lines.contains("shut down: 3 of 3 workers stopped; 2 of 2 spawned processes exited with status 0"), "\(lines.joined(separator: "\n"))")
    }

    @Test func checkinMainAndACheckinWorkerStartedSeparately() throws {
        let main = try ZMQPeerProcess(
            ["--transport", "zmq", "--listen", "tcp://127.0.0.1:*", "--workers", "0", "--processes", "0",
             "--wait-for-workers", "1", "--wait-timeout", "30", "--rounds", "1"],
            executable: "checkin-main")
        var endpoint: String?
        var lines: [String] = []
        while endpoint == nil {
            let line = try main.readLine()
            lines.append(line)
            if line.hasPrefix("main port: listening on ") { endpoint = String(line.dropFirst("main port: listening on ".count)) }
        }
        let worker = try ZMQPeerProcess(["--transport", "zmq", "--connect", endpoint!], executable: "checkin-worker")
        lines += try output(of: main)
        #expect(try main.waitForExit() == 0, "\(lines.joined(separator: "\n"))")
        #expect(try worker.waitForExit() == 0)
        #expect(lines.contains { $0.hasPrefix("verified:") }, "\(lines.joined(separator: "\n"))")
        #expect(lines.contains("shut down: 1 of 1 workers stopped"), "\(lines.joined(separator: "\n"))")
    }
}
#endif
