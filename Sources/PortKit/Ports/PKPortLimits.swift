// The limits every port enforces (protocol.md section 7), configurable per port.

/// The limits a port enforces on what it receives.
///
/// Every length a peer announces is checked against these before anything is allocated. A peer
/// that breaks one gets its connection closed; nothing else is affected.
///
/// A limit above what the wire can carry means that maximum (so `.max` reads as "as much as
/// the wire allows"): 65,535 components, 253 ports through a socket (Linux's `SCM_MAX_FD`),
/// and data that keeps a frame within a `u32` length (protocol.md, "Limits"). A count below 1,
/// a negative byte limit or a negative greeting timeout is a programmer error: the port's
/// initializer traps.
public struct PKPortLimits: Sendable, Equatable {
    /// The most data bytes in one message (all data components together). Default 16 MiB.
    public var maxMessageBytes: Int = 16 << 20
    /// The most ports in one message, the reply port included. Default 16; at least 1.
    public var maxDescriptors: Int = 16
    /// The most components in one message. Default 1024; at least 1.
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

    /// Traps on a queue or greeting limit below its least (a count below 1, a negative byte
    /// limit or timeout): the ports' initializers call it, with the wire's own checks.
    package func checkQueueAndGreetingLimits() {
        precondition(maxQueuedMessages >= 1, "PKPortLimits.maxQueuedMessages must be at least 1, not \(maxQueuedMessages)")
        precondition(maxQueuedBytes >= 0, "PKPortLimits.maxQueuedBytes must not be negative")
        precondition(maxPendingGreetings >= 1, "PKPortLimits.maxPendingGreetings must be at least 1, not \(maxPendingGreetings)")
        precondition(greetingTimeout >= .zero, "PKPortLimits.greetingTimeout must not be negative")
    }

    /// The limits as the wire applies them: each capped at what the wire can carry.
    var wire: WireLimits {
        let components = min(maxComponents, Int(UInt16.max))
        let frameRoom = Int(UInt32.max) - WireFormat.frameHeaderByteCount - WireFormat.componentHeaderByteCount * max(components, 0)
        return WireLimits(maxMessageBytes: min(maxMessageBytes, frameRoom),
                          maxDescriptors: min(maxDescriptors, WireLimits.kernelMaxDescriptors),
                          maxComponents: components)
    }
}
