// The rules of `protocol.md` for greetings, frame headers and component lists, written once.
// The decoder applies them to bytes from a peer; the encoder's `check` applies the same rules to
// a frame about to be sent, so a writer never emits what a reader would reject.

/// The fields of a frame header, as numbers.
struct WireFrameHeader: Equatable, Sendable {
    var length: Int
    var msgid: UInt32
    var componentCount: Int
    var flags: UInt16
    var descriptorCount: Int
    var replyToken: UInt16

    var hasReplyPort: Bool { flags & WireFormat.replyPortFlag != 0 }
    var isControl: Bool { flags & WireFormat.controlFlag != 0 }
    var repliesBack: Bool { flags & WireFormat.replyBackFlag != 0 }

    /// Reads a header from the first 16 bytes of `raw`, which must hold them.
    @inline(__always)
    init(loadingFrom raw: UnsafeRawBufferPointer) {
        let first = raw.loadLittleEndian(UInt64.self, at: 0)
        let second = raw.loadLittleEndian(UInt64.self, at: 8)
        length = Int(truncatingIfNeeded: first & 0xFFFF_FFFF)
        msgid = UInt32(truncatingIfNeeded: first >> 32)
        componentCount = Int(truncatingIfNeeded: second & 0xFFFF)
        flags = UInt16(truncatingIfNeeded: second >> 16)
        descriptorCount = Int(truncatingIfNeeded: (second >> 32) & 0xFFFF)
        replyToken = UInt16(truncatingIfNeeded: second >> 48)
    }

    /// The header `frame` is encoded with.
    init(for frame: WireFrame) {
        length = WireEncoder.encodedSize(of: frame)
        msgid = frame.msgid
        componentCount = frame.components.count
        flags = (frame.hasReplyPort ? WireFormat.replyPortFlag : 0)
            | (frame.isControl ? WireFormat.controlFlag : 0)
            | (frame.repliesBack ? WireFormat.replyBackFlag : 0)
        descriptorCount = frame.descriptorCount
        replyToken = frame.replyToken
    }

    /// Checks every rule a header can be checked against on its own: lengths, counts, flags,
    /// the reply token, and the fixed shape of a control frame, for a frame travelling in
    /// `direction`. Run before any byte of the body is buffered for it, so nothing is ever
    /// allocated for a length that breaks a limit.
    func validate(limits: WireLimits, direction: WireDirection = .toPort) throws(WireError) {
        // The usual frame, one component towards a port with no flag, descriptor or token, of
        // a length a component header and at most `maxMessageBytes` of data fit, breaks no rule
        // below: the checks of rarer shapes are skipped.
        if componentCount == 1 && flags == 0 && descriptorCount == 0 && replyToken == 0 && direction == .toPort
            && length >= WireFormat.frameHeaderByteCount + WireFormat.componentHeaderByteCount
            && length <= limits.maxFrameBytes(componentCount: 1) {
            return
        }
        if length < WireFormat.frameHeaderByteCount {
            throw WireError(.frameTooShort,
                            "frame length \(length) is below the \(WireFormat.frameHeaderByteCount)-byte header")
        }
        if componentCount > limits.maxComponents {
            throw WireError(.tooManyComponents,
                            "frame has \(componentCount) components, over the limit \(limits.maxComponents)")
        }
        let ceiling = limits.maxFrameBytes(componentCount: componentCount)
        if length > ceiling {
            throw WireError(.frameTooLong,
                            "frame length \(length) exceeds the limit \(ceiling) for a frame of "
                                + "\(componentCount) component(s) (\(limits.maxMessageBytes) data bytes)")
        }
        let headersEnd = WireFormat.frameHeaderByteCount
            + WireFormat.componentHeaderByteCount * componentCount
        if length < headersEnd {
            throw WireError(.componentsExceedFrame,
                            "frame length \(length) cannot hold the headers of \(componentCount) components")
        }
        if flags & ~WireFormat.knownFrameFlags != 0 {
            throw WireError(.unknownFrameFlags,
                            "frame flags 0x\(String(flags, radix: 16)) set undefined bits")
        }
        if descriptorCount > limits.maxDescriptors {
            throw WireError(.tooManyDescriptors,
                            "frame claims \(descriptorCount) descriptors, over the limit \(limits.maxDescriptors)")
        }
        let replyPorts = hasReplyPort ? 1 : 0
        if descriptorCount < replyPorts || descriptorCount > componentCount + replyPorts {
            throw WireError(.descriptorCountMismatch,
                            "frame claims \(descriptorCount) descriptors but has \(componentCount) "
                                + "components and \(replyPorts) reply port")
        }
        if isControl {
            guard let code = WireControlCode(rawValue: msgid) else {
                throw WireError(.unknownControlCode, "unknown control code \(msgid)")
            }
            switch (code, direction) {
            case (.attachSender, _):
                let expected = WireFormat.frameHeaderByteCount + WireFormat.componentHeaderByteCount
                if componentCount != 1 || descriptorCount != 1 || hasReplyPort || length != expected {
                    throw WireError(.malformedControlFrame,
                                    "ATTACH_SENDER must be one port component and nothing else "
                                        + "(got length \(length), \(componentCount) components, "
                                        + "\(descriptorCount) descriptors, reply port \(hasReplyPort))")
                }
            case (.replyCancelled, .toPort), (.noReply, .toRequester):
                if componentCount != 0 || hasReplyPort || length != WireFormat.frameHeaderByteCount {
                    throw WireError(.malformedControlFrame,
                                    "control frame \(msgid) must be a bare header "
                                        + "(got length \(length), \(componentCount) components, reply port \(hasReplyPort))")
                }
            case (.replyCancelled, .toRequester), (.noReply, .toPort):
                throw WireError(.unknownControlCode,
                                "control code \(msgid) does not travel \(direction == .toPort ? "towards a port" : "on a reply channel")")
            }
        }
        try validateReplyToken(direction)
    }

    /// The reply token's rules: towards a port, only a REPLY_BACK request (which carries no
    /// reply port and is no control frame) and REPLY_CANCELLED carry one, and they must; on a
    /// reply channel every frame does, and REPLY_BACK is not used.
    private func validateReplyToken(_ direction: WireDirection) throws(WireError) {
        switch direction {
        case .toPort:
            if repliesBack && (hasReplyPort || isControl) {
                throw WireError(.replyBackMisused, "REPLY_BACK is set with \(isControl ? "CONTROL" : "REPLY_PORT")")
            }
            let needsToken = repliesBack || (isControl && msgid == WireControlCode.replyCancelled.rawValue)
            if needsToken && replyToken == 0 {
                throw WireError(.replyTokenMissing, "frame \(msgid) names no request: its reply token is 0")
            }
            if !needsToken && replyToken != 0 {
                throw WireError(.reservedFieldNotZero,
                                "frame header reply token is \(replyToken), not 0, on a frame that makes no request")
            }
        case .toRequester:
            if repliesBack {
                throw WireError(.replyBackMisused, "REPLY_BACK is set on a reply channel")
            }
            if replyToken == 0 {
                throw WireError(.replyTokenMissing, "frame \(msgid) on a reply channel names no request: its reply token is 0")
            }
        }
    }

    /// Checks the rules that need the components: that they are of the shape a control frame
    /// demands, and that the ports plus the reply port are `descriptorCount`.
    func validate(components: WireComponents) throws(WireError) {
        if isControl, components != (msgid == WireControlCode.attachSender.rawValue ? [.port] : []) {
            throw WireError(.malformedControlFrame,
                            "control frame \(msgid) has components of the wrong shape")
        }
        let portCount = components.portCount
        let claimed = portCount + (hasReplyPort ? 1 : 0)
        if claimed != descriptorCount {
            throw WireError(.descriptorCountMismatch,
                            "frame claims \(descriptorCount) descriptors but carries \(portCount) "
                                + "port component(s)" + (hasReplyPort ? " and a reply port" : ""))
        }
    }
}

extension WireGreeting {
    /// Reads and checks a greeting from the first 16 bytes of `raw`, which must hold them.
    static func decode(from raw: UnsafeRawBufferPointer) throws(WireError) -> WireGreeting {
        try checkMagic(raw)
        let version = raw.loadLittleEndian(UInt16.self, at: 4)
        let flags = raw.loadLittleEndian(UInt16.self, at: 6)
        if version != WireFormat.version {
            throw WireError(.unsupportedVersion,
                            "greeting version \(version) is not supported (this build speaks \(WireFormat.version))")
        }
        if flags != 0 {
            throw WireError(.greetingFlagsNotZero, "greeting flags are 0x\(String(flags, radix: 16)), not 0")
        }
        return WireGreeting(version: version,
                            pid: raw.loadLittleEndian(UInt32.self, at: 8),
                            uid: raw.loadLittleEndian(UInt32.self, at: 12))
    }

    /// Checks as much of the magic as `raw` holds, so a stranger is refused at its first bytes.
    static func checkMagic(_ raw: UnsafeRawBufferPointer) throws(WireError) {
        let count = min(raw.count, 4)
        for index in 0..<count where raw[index] != UInt8(truncatingIfNeeded: WireFormat.magic >> (8 * index)) {
            let seen = raw.prefix(count).map { String($0, radix: 16) }.joined(separator: " ")
            throw WireError(.badMagic, "greeting does not start with \"PKIT\" (bytes: \(seen))")
        }
    }
}
