// PortKit's benchmark suite under ordo-one/benchmark: one benchmark per row of the catalogue
// (BenchKit/Catalogue.swift). Each sample runs `batch` operations on the workload's own pinned
// threads; the time is taken on the thread that does the work and recorded as the custom metric
// `psPerOp` (picoseconds per operation). `wallClock` (per sample, including the hand-off to the
// workload's thread) is recorded too. Run everything through `Benchmarks/run.sh`.

import Benchmark
import BenchKit
import Synchronization

/// The live workload of the benchmark being run, made by its setup hook.
private let live = Mutex<[String: UncheckedWorkload]>([:])

private struct UncheckedWorkload: @unchecked Sendable {
    let workload: Workload
}

private let psPerOp = BenchmarkMetric.custom("psPerOp", polarity: .prefersSmaller, useScalingFactor: false)

let benchmarks: @Sendable () -> Void = {
    let short = isShortMode
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, psPerOp],
        timeUnits: .microseconds,
        warmupIterations: short ? 1 : 3,
        maxDuration: short ? .milliseconds(300) : .seconds(2),
        maxIterations: short ? 3 : 300
    )
    for spec in catalogue(short: short) {
        let name = spec.name
        Benchmark(name) { benchmark in
            guard let workload = live.withLock({ $0[name] })?.workload else {
                benchmark.error("\(name): no workload (its set-up failed)")
                return
            }
            do {
                let nanoseconds = try workload.run(spec.batch)
                benchmark.measurement(psPerOp, Int(nanoseconds * 1000 / UInt64(spec.batch)))
            } catch {
                benchmark.error("\(name): \(error)")
            }
        } setup: {
            let workload = try spec.make()
            live.withLock { $0[name] = UncheckedWorkload(workload: workload) }
        } teardown: {
            let workload = live.withLock { $0.removeValue(forKey: name) }
            workload?.workload.close()
        }
    }
}
