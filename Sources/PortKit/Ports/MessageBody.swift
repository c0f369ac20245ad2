// How a port message holds its components, shared by both transports' messages (PKPortMessage,
// and PKZMQMessage in PortKitZeroMQ): the usual message, one data component, as its bytes alone.

/// A component of a transport's port message: bytes, or a send right of that transport.
package protocol MessageComponent: Sendable {
    /// The transport's send right.
    associatedtype Port: Sendable
    /// A data component.
    static func data(_ bytes: [UInt8]) -> Self
    /// The bytes, if this is a data component.
    var data: [UInt8]? { get }
    /// The send right, if this is a port component.
    var port: Port? { get }
}

extension PKPortComponent: MessageComponent {}

/// A message's components. One data component (the usual message) is held as its bytes alone:
/// an array of components for it cost an allocation and its release on every received message.
/// `components` makes the one-element array when read; a message set to any other shape keeps
/// its array.
package enum MessageBody<Component: MessageComponent>: Sendable {
    /// Exactly one component, a data component: these bytes.
    case bytes([UInt8])
    /// Any other shape: none, several, or ports among them.
    case components([Component])

    /// `components`, the usual shape held as its bytes.
    @inlinable
    package init(_ components: [Component]) {
        if components.count == 1, let bytes = components[0].data {
            self = .bytes(bytes)
        } else {
            self = .components(components)
        }
    }

    /// The components, in order. Changed in place (`append`, a subscript), the array is moved
    /// out of the body and back, so it stays uniquely referenced and is not copied for every
    /// change (which made building a message one component at a time quadratic).
    @inlinable
    package var components: [Component] {
        get {
            switch self {
            case .bytes(let bytes): [.data(bytes)]
            case .components(let all): all
            }
        }
        set { self = MessageBody(newValue) }
        _modify {
            var all: [Component]
            switch self {
            case .bytes(let bytes): all = [.data(bytes)]
            case .components(let existing): all = existing
            }
            self = .components([])
            defer { self = MessageBody(all) }
            yield &all
        }
    }

    /// Moves out the bytes of the usual shape, leaving no components; `nil`, and nothing
    /// changed, for any other shape. Moved, not copied: no retain of the bytes. For a receiver
    /// that reuses a delivered message's bytes (`SpareBytes`). (The ZeroMQ module has a copy
    /// for its own messages: this one, generic, ran unspecialized there, about 100
    /// instructions a message.)
    package mutating func takeBytes() -> [UInt8]? {
        guard case .bytes = self else { return nil }
        var taken = MessageBody.components([])
        swap(&taken, &self)
        guard case .bytes(let bytes) = consume taken else { preconditionFailure("unreachable: checked above") }
        return bytes
    }

    /// How many components there are (without making the array).
    @inlinable
    package var count: Int {
        switch self {
        case .bytes: 1
        case .components(let all): all.count
        }
    }

    /// The bytes of every data component, concatenated (one data component's bytes are handed
    /// out as they are, with no copy).
    @inlinable
    package var data: [UInt8] {
        switch self {
        case .bytes(let bytes):
            return bytes
        case .components(let all):
            var bytes: [UInt8] = []
            for component in all {
                if let chunk = component.data { bytes.append(contentsOf: chunk) }
            }
            return bytes
        }
    }

    /// The port components, in order.
    @inlinable
    package var ports: [Component.Port] {
        switch self {
        case .bytes: []
        case .components(let all): all.compactMap(\.port)
        }
    }
}
