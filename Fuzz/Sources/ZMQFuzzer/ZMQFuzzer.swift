// libFuzzer's entry point for the ZeroMQ mapping: the multipart messages a peer sends to a
// ZeroMQ port, and the name service's requests and replies in them. The input format and the
// properties checked are documented on `ZMQFuzzing.exercise`
// (Sources/PortKitZeroMQ/Wire/ZMQFuzzing.swift).

@testable import PortKitZeroMQ

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    ZMQFuzzing.exercise(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
