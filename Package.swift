// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "PortKit",
    products: [
        .library(name: "PortKit", targets: ["PortKit"]),
    ],
    traits: [
        .trait(name: "ZeroMQ", description: "The ZeroMQ transport (needs libzmq: Debian's libzmq3-dev)."),
        .default(enabledTraits: []),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
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
        .testTarget(
            name: "PortKitTests",
            dependencies: ["PortKit"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
