// libFuzzer's entry point for the check-in: what a worker process writes on its check-in
// connection, through the wire decoder to the launcher's decision, and the PORTKIT_WORKER value a
// worker reads. The input format and the properties checked are documented on
// `CheckInFuzzing.exercise` (Sources/PortKit/CheckIn/CheckInFuzzing.swift).

@testable import PortKit

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    CheckInFuzzing.exercise(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
