// Scheduling receive ports on a run loop (`-[NSRunLoop addPort:forMode:]`).

extension PKRunLoop {
    /// Adds a receive port to `mode` as an input source (`-[NSRunLoop addPort:forMode:]`,
    /// `CFRunLoopAddSource` with a port's source). Loop-only.
    ///
    /// A port belongs to the loop it is first added to; adding it to another loop traps.
    ///
    /// - Throws: `PKError` with `.invalidPort` if the port was invalidated.
    public func add(_ port: PKReceivePort, forMode mode: PKRunLoopMode) throws(PKError) {
        assertOwner("add(_:forMode:)")
        try port.schedule(on: self, mode: mode)
    }

    /// Removes a receive port from `mode` (`-[NSRunLoop removePort:forMode:]`). Loop-only.
    public func remove(_ port: PKReceivePort, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        port.unschedule(from: self, mode: mode)
    }
}
