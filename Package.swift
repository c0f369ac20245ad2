// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "PortKit",
    products: [
        .library(name: "PortKit", targets: ["PortKit"]),
        .executable(name: "checkin-main", targets: ["CheckinMain"]),
        .executable(name: "checkin-worker", targets: ["CheckinWorker"]),
        // The ZeroMQ transport: empty unless the `ZeroMQ` trait is enabled.
        .library(name: "PortKitZeroMQ", targets: ["PortKitZeroMQ"]),
    ],
    traits: [
        .trait(name: "ZeroMQ", description: "The ZeroMQ transport (needs libzmq: Debian's libzmq3-dev)."),
        .default(enabledTraits: []),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
    ],
    targets: [
        // Only what Swift cannot import from Glibc: epoll, eventfd, timerfd, accept4,
        // struct ucred and the CMSG_* macros.
        .target(
            name: "CPortKit",
            cSettings: [.define("_GNU_SOURCE")]
        ),
        .target(
            name: "PortKit",
            dependencies: [
                "CPortKit",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The examples: thin executables over one shared target that holds their logic.
        .target(
            name: "CheckinExample",
            dependencies: [
                "PortKit",
                "PortKitZeroMQ",  // --transport zmq; an empty module without the ZeroMQ trait
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Examples/CheckinExample",
            exclude: ["README.md"]
        ),
        .executableTarget(
            name: "CheckinMain",
            dependencies: ["CheckinExample"],
            path: "Examples/checkin-main",
            exclude: ["README.md"]
        ),
        .executableTarget(
            name: "CheckinWorker",
            dependencies: ["CheckinExample"],
            path: "Examples/checkin-worker",
            exclude: ["README.md"]
        ),
        .testTarget(
            name: "PortKitTests",
            dependencies: ["PortKit"]
        ),
        // A peer process for the cross-process tests (spawned by them, never forked).
        .executableTarget(
            name: "PortKitTestPeer",
            dependencies: ["PortKit"],
            path: "Tests/PortKitTestPeer"
        ),
        // The ZeroMQ transport (trait `ZeroMQ`): libzmq from the system's include and library paths
        // (Debian's libzmq3-dev; not through pkg-config, whose libzmq.pc gives flags that SwiftPM
        // refuses with a warning at every build), a module that depends
        // on the core (never the reverse), and its tests and peer processes. Without the trait
        // every file of these targets compiles to nothing and nothing needs libzmq.
        .systemLibrary(name: "CZeroMQ", path: "Sources/CZeroMQ"),
        .target(
            name: "PortKitZeroMQ",
            dependencies: [
                "PortKit",
                .target(name: "CZeroMQ", condition: .when(traits: ["ZeroMQ"])),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "PortKitZeroMQTests",
            dependencies: [
                "PortKit",
                "PortKitZeroMQ",
                .target(name: "CZeroMQ", condition: .when(traits: ["ZeroMQ"])),
            ]
        ),
        // Peer processes for the ZeroMQ tests: one on PortKitZeroMQ, one in plain C on libzmq.
        .executableTarget(
            name: "PortKitZMQPeer",
            dependencies: [
                "PortKit",
                "PortKitZeroMQ",
            ],
            path: "Tests/PortKitZMQPeer"
        ),
        .executableTarget(
            name: "PortKitZMQCPeer",
            dependencies: [
                .target(name: "CZeroMQ", condition: .when(traits: ["ZeroMQ"])),
            ],
            path: "Tests/PortKitZMQCPeer",
            cSettings: [.define("PORTKIT_ZEROMQ", .when(traits: ["ZeroMQ"]))],
            // A C target includes CZeroMQ's header; the module's `link "zmq"` is for importers.
            linkerSettings: [.linkedLibrary("zmq", .when(traits: ["ZeroMQ"]))]
        ),
    ],
    swiftLanguageModes: [.v6]
)
