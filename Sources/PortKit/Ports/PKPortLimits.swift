// The limits every port enforces (design section 7), configurable per port.

/// The limits a port enforces on what it receives.
///
/// Every length a peer announces is checked against these before anything is allocated. A peer
/// that breaks one gets its connection closed; nothing else is affected.
public struct PKPortLimits: Sendable, Equatable {
    /// The most data bytes in one message (all data components together). Default 16 MiB.
    public var maxMessageBytes: Int = 16 << 20
    /// The most ports in one message, the reply port included. Default 16.
    public var maxDescriptors: Int = 16
    /// The most components in one message. Default 1024.
    public var maxComponents: Int = 1024
    /// The most received messages a connection may hold undelivered before PortKit stops
    /// reading it (the sender then blocks, and its send deadline can pass). Default 1000.
    public var maxQueuedMessages: Int = 1000
    /// The most undelivered bytes a connection may hold before PortKit stops reading it.
    /// Default 64 MiB.
    public var maxQueuedBytes: Int = 64 << 20

    /// How long a connection accepted from a named socket has to send its greeting. Default 5 s.
    public var greetingTimeout: Duration = .seconds(5)
    /// The most accepted connections that may wait for their greeting at once; a new one
    /// beyond that makes the port drop the one that has waited longest. Default 64.
    public var maxPendingGreetings: Int = 64

    /// The defaults.
    public init() {}

    /// The default limits.
    public static let `default` = PKPortLimits()

    var wire: WireLimits {
        WireLimits(maxMessageBytes: maxMessageBytes, maxDescriptors: maxDescriptors, maxComponents: maxComponents)
    }
}
