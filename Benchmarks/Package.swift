// swift-tools-version: 6.1
// PortKit's benchmark suite (issue #6): a nested package, so the main build stays light.
//
//   Benchmarks/run.sh --callgrind   every workload, PortKit and its baselines, one table
//   Benchmarks/run.sh --short       the same, a few samples each (CI: it must not rot)
//
// The libzmq baselines and the rows of PortKit's ZeroMQ transport sit behind this package's
// own `ZeroMQ` trait, which also enables the root package's `ZeroMQ` trait; without it nothing
// here needs libzmq. run.sh turns it on when pkg-config finds libzmq (`--no-zeromq` to skip).
// See docs/performance.md.
import PackageDescription

let package = Package(
    name: "PortKitBenchmarks",
    traits: [
        .trait(name: "ZeroMQ", description: "The libzmq baselines (needs libzmq: Debian's libzmq3-dev); enables PortKit's ZeroMQ trait."),
        .default(enabledTraits: []),
    ],
    dependencies: [
        .package(
            name: "PortKit", path: "..",
            traits: [.defaults, .trait(name: "ZeroMQ", condition: .when(traits: ["ZeroMQ"]))]),
        // Its default traits pull a package that is not in the mirror: name the one we use.
        .package(url: "https://github.com/ordo-one/benchmark.git", exact: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        // The raw baselines, written directly on system calls, and CPU pinning.
        .target(
            name: "CBench",
            cSettings: [.define("_GNU_SOURCE"), .unsafeFlags(["-O2"])],
            linkerSettings: [.linkedLibrary("pthread")]
        ),
        // libzmq, for the raw libzmq baselines.
        .systemLibrary(name: "CLibZMQ"),
        .target(
            name: "CZMQBench",
            dependencies: ["CBench", "CLibZMQ"],
            cSettings: [.define("_GNU_SOURCE"), .unsafeFlags(["-O2"])],
            linkerSettings: [.linkedLibrary("zmq")]
        ),
        // The workloads, PortKit's and the baselines' wrappers, shared by the benchmarks and by
        // the `pkbench` helper (peer processes, callgrind runs, memory, Foundation).
        .target(
            name: "BenchKit",
            dependencies: [
                "CBench",
                .target(name: "CZMQBench", condition: .when(traits: ["ZeroMQ"])),
                .product(name: "PortKit", package: "PortKit"),
                .product(name: "PortKitZeroMQ", package: "PortKit", condition: .when(traits: ["ZeroMQ"])),
            ]
        ),
        .executableTarget(
            name: "pkbench",
            dependencies: ["BenchKit"]
        ),
        .executableTarget(
            name: "PortKitBenchmarks",
            dependencies: [
                "BenchKit",
                .product(name: "Benchmark", package: "benchmark"),
            ],
            path: "Benchmarks/PortKitBenchmarks",
            plugins: [
                .plugin(name: "BenchmarkPlugin", package: "benchmark"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
