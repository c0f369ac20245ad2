// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "PortKit",
    products: [
        .library(name: "PortKit", targets: ["PortKit"]),
        .executable(name: "checkin-main", targets: ["CheckinMain"]),
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
    ],
    swiftLanguageModes: [.v6]
)
