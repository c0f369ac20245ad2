// The guide's check-in constants.

/// The message identifiers of the guide's check-in handshake.
public enum PKCheckIn {
    /// The check-in message (`kCheckinMessage`, 100 in Listing 3-13).
    public static let messageID: UInt32 = 100
    /// Asks a worker launched by `PKWorkerThread` or `PKWorkerProcess` to leave its run loop
    /// and end (their `stop()` sends it; protocol.md section 6.2).
    public static let stopMessageID: UInt32 = 0xFFFF_FF01
    /// The default time a worker has to check in (`PKWorkerThread`'s and `PKWorkerProcess`'s
    /// `checkInTimeout`), and the send deadline of a worker's check-in message: 5 s.
    public static let defaultTimeout: Duration = .seconds(5)
}
