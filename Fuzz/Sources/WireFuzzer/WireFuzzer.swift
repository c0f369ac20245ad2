// libFuzzer's entry point for the wire codec: the greeting and frame decoder a peer reaches
// with every byte it sends. The input format and the properties checked are documented on
// `WireFuzzing.exercise` (Sources/PortKit/Wire/WireFuzzing.swift, compiled into this module).

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    WireFuzzing.exercise(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
