// swift-tools-version: 6.1
// The libFuzzer targets of PortKit (see run.sh). A package of its own so that the root package
// never builds an object without `main`: a fuzzer links only with `-sanitize=fuzzer`.
//
// Each fuzzer compiles the PortKit sources it exercises into its own module, through a symlink
// (`Sources/WireFuzzer/Wire -> ../../../Sources/PortKit/Wire`), so it can reach the internal
// codec and its `WireFuzzing` property without any of it becoming public API.
import PackageDescription

let package = Package(
    name: "PortKitFuzz",
    products: [
        .executable(name: "wire-fuzzer", targets: ["WireFuzzer"]),
    ],
    targets: [
        .executableTarget(
            name: "WireFuzzer",
            swiftSettings: [.unsafeFlags(["-parse-as-library"])]
        ),
    ],
    swiftLanguageModes: [.v6]
)
