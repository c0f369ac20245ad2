// The summary a person reads at a glance: who checked in, over what, how many round trips and
// how long they took, then the totals and the verification.

/// The figures of a finished run, and their printing.
struct Summary {
    let workers: [WorkerRecord]
    let job: Job
    let whole: Tally
    let workNanoseconds: UInt64

    /// The summary's lines.
    var lines: [String] {
        var rows: [[String]] = [[
            "worker", "kind", "transport", "launched with", "checked in after", "round trips",
            "rtt median", "rtt min", "rtt max", "counting",
        ]]
        for worker in workers {
            let trips = worker.roundTrips.sorted()
            rows.append([
                worker.name, worker.kind, worker.transport, worker.launchedWith,
                worker.checkInNanoseconds.map(elapsed) ?? "-", grouped(trips.count),
                median(trips).map(micros) ?? "-", trips.first.map(micros) ?? "-", trips.last.map(micros) ?? "-",
                median(worker.countingTimes.sorted()).map(micros) ?? "-",
            ])
        }
        var lines = table(rows, rightAligned: [4, 5, 6, 7, 8, 9])
        lines.append("rtt: one job's round trip, from sending it to handling the reply on the main thread;")
        lines.append("counting: the median time the worker spent counting a chunk, part of that round trip.")
        lines.append("")

        let all = workers.flatMap(\.roundTrips).sorted()
        let perSecond = workNanoseconds > 0 ? UInt64(all.count) * 1_000_000_000 / workNanoseconds : 0
        let threads = workers.count(where: { $0.kind == "thread" })
        let processes = workers.count - threads
        let kinds = "\(threads) \(threads == 1 ? "thread" : "threads"), \(processes) \(processes == 1 ? "process" : "processes")"
        lines.append("totals: \(workers.count) \(workers.count == 1 ? "worker" : "workers") (\(kinds)), \(grouped(all.count)) round trips in \(millis(workNanoseconds)) (\(grouped(Int(perSecond))) a second)"
            + (all.isEmpty ? "" : "; median \(micros(median(all)!)), min \(micros(all.first!)), max \(micros(all.last!))"))
        lines.append("text: \(grouped(Int(whole.bytes))) bytes, \(grouped(Int(whole.words))) words, \(job.chunks.count) chunks, counted \(job.rounds) \(job.rounds == 1 ? "time" : "times")")
        lines.append("verified: every chunk's words and FNV-1a hash, in every round, match a single-threaded pass (\(grouped(Int(whole.words))) words)")
        var shutDown = "shut down: \(workers.filter(\.stopped).count) of \(workers.count) workers stopped"
        let spawned = workers.filter(\.isSpawnedProcess)
        if !spawned.isEmpty {
            let clean = spawned.count(where: { $0.exitStatus == 0 })
            shutDown += "; \(clean) of \(spawned.count) spawned \(spawned.count == 1 ? "process" : "processes") exited with status 0"
        }
        lines.append(shutDown)
        return lines
    }

    func print() {
        for line in lines { Swift.print(line) }
    }
}

/// Rows as aligned columns, two spaces apart.
func table(_ rows: [[String]], rightAligned: Set<Int>) -> [String] {
    let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
    return rows.map { row in
        row.indices.map { column in
            let padding = String(repeating: " ", count: widths[column] - row[column].count)
            return rightAligned.contains(column) ? padding + row[column] : row[column] + padding
        }
        .joined(separator: "  ")
        .trimmingTrailingSpaces()
    }
}

extension String {
    func trimmingTrailingSpaces() -> String {
        var text = self
        while text.last == " " { text.removeLast() }
        return text
    }
}

/// The median of sorted values (the lower middle one of an even count).
func median(_ sorted: [UInt64]) -> UInt64? {
    sorted.isEmpty ? nil : sorted[(sorted.count - 1) / 2]
}

/// Nanoseconds as whole microseconds: "412 µs".
func micros(_ nanoseconds: UInt64) -> String {
    "\(grouped(Int((nanoseconds + 500) / 1000))) µs"
}

/// A span that may be long (a process's start, a wait for someone to start a worker by
/// hand): microseconds below 10 ms, then milliseconds.
func elapsed(_ nanoseconds: UInt64) -> String {
    nanoseconds < 10_000_000 ? micros(nanoseconds) : millis(nanoseconds)
}

/// Nanoseconds as milliseconds with one decimal: "14.2 ms".
func millis(_ nanoseconds: UInt64) -> String {
    let tenths = (nanoseconds + 50_000) / 100_000
    return "\(grouped(Int(tenths / 10))).\(tenths % 10) ms"
}

/// An integer with thousands separators: "1,048,576".
func grouped(_ value: Int) -> String {
    let digits = String(value.magnitude)
    var result = ""
    for (index, digit) in digits.enumerated() {
        if index > 0 && (digits.count - index) % 3 == 0 { result.append(",") }
        result.append(digit)
    }
    return value < 0 ? "-" + result : result
}
