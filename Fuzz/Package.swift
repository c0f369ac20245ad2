// swift-tools-version: 6.1
// The libFuzzer targets of PortKit (see run.sh). A package of its own so that the root package
// never builds an object without `main`: a fuzzer links only with `-sanitize=fuzzer`.
//
// One fuzzer per decoder a peer can reach:
//   wire-fuzzer     the greeting and frame codec (protocol.md sections 2 to 8)
//   checkin-fuzzer  a worker's check-in, from its bytes to the launcher's decision; the worker's
//                   launch environment
//   names-fuzzer    the name server's names: validation and the paths made from them
//   zmq-fuzzer      the ZeroMQ mapping (protocol.md section 10) and the ZeroMQ name service's
//                   requests and replies; needs libzmq (run.sh builds it only when pkg-config
//                   finds it)
//
// The fuzzers reach internal code without any of it becoming public API: the wire fuzzer
// compiles `Sources/PortKit/Wire` into its own module through a symlink
// (`Sources/WireFuzzer/Wire -> ../../../Sources/PortKit/Wire`); the others import PortKit and
// PortKitZeroMQ built here from the root's sources (symlinks `Sources/PortKit`, `Sources/CPortKit`,
// `Sources/PortKitZeroMQ`, `Sources/CZeroMQ`) with `-enable-testing`, so `@testable import` works
// in a release build. The properties live in the modules (`*Fuzzing.exercise`), where the corpus
// replay tests of `swift test` run the same code.
import PackageDescription

let package = Package(
    name: "PortKitFuzz",
    products: [
        .executable(name: "wire-fuzzer", targets: ["WireFuzzer"]),
        .executable(name: "checkin-fuzzer", targets: ["CheckInFuzzer"]),
        .executable(name: "names-fuzzer", targets: ["NameFuzzer"]),
        .executable(name: "zmq-fuzzer", targets: ["ZMQFuzzer"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
    ],
    targets: [
        .executableTarget(
            name: "WireFuzzer",
            swiftSettings: [.unsafeFlags(["-parse-as-library"])]
        ),
        // The root package's modules, from its sources, built for testing.
        .target(
            name: "CPortKit",
            cSettings: [.define("_GNU_SOURCE")]
        ),
        .target(
            name: "PortKit",
            dependencies: ["CPortKit", .product(name: "Logging", package: "swift-log")],
            swiftSettings: [.unsafeFlags(["-enable-testing"])]
        ),
        .systemLibrary(name: "CZeroMQ"),
        .target(
            name: "PortKitZeroMQ",
            dependencies: ["PortKit", "CZeroMQ", .product(name: "Logging", package: "swift-log")],
            swiftSettings: [.define("ZeroMQ"), .unsafeFlags(["-enable-testing"])]
        ),
        .executableTarget(
            name: "CheckInFuzzer",
            dependencies: ["PortKit"],
            swiftSettings: [.unsafeFlags(["-parse-as-library"])]
        ),
        .executableTarget(
            name: "NameFuzzer",
            dependencies: ["PortKit"],
            swiftSettings: [.unsafeFlags(["-parse-as-library"])]
        ),
        .executableTarget(
            name: "ZMQFuzzer",
            dependencies: ["PortKit", "PortKitZeroMQ"],
            swiftSettings: [.define("ZeroMQ"), .unsafeFlags(["-parse-as-library"])]
        ),
    ],
    swiftLanguageModes: [.v6]
)
