// libFuzzer's entry point for the name server's names: the rule and the paths made from a name
// a peer could send. The input format and the properties checked are documented on
// `NameFuzzing.exercise` (Sources/PortKit/NameServer/NameFuzzing.swift).

@testable import PortKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    NameFuzzing.exercise(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
