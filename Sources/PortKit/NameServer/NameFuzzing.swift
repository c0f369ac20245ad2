// The property the names fuzzer checks, in the module so that the libFuzzer target (`Fuzz/`,
// names-fuzzer) and the corpus replay test (`NameCorpusReplayTests`) run exactly the same code.
// Nothing else calls it.
//
// The name server has no byte decoder of its own: a connection to a registered name is an
// ordinary port connection (its greeting and frames are the wire fuzzer's), and the owner's
// credentials are the kernel's (`SO_PEERCRED`). What it parses is names, and names reach it from
// peers: a worker checks in with its name as data (Listing 3-18; `checkin-main` looks that name
// up), and a name becomes file paths in the name directory. So this fuzzer checks the name rule
// and the paths made from names.

/// Checks a name a peer could send, as bytes, against the name rule and the paths made from it,
/// and traps when a property breaks.
///
/// ```
/// byte 0        bits 0-2: the name directory, one of `directories` (a usual one, the root, a
///                         relative one, one with a trailing slash or a `..`, and two long ones
///                         that leave room for 57 and for no name)
///               bit 3:    two names: byte 1 is the first name's length, the rest the second
/// the rest      the name's bytes (as a peer sent them: any bytes, not necessarily UTF-8)
/// ```
///
/// Each name is taken as `checkin-main` takes a worker's name (`String(decoding:as: UTF8.self)`,
/// invalid sequences repaired) and as a strict reader would (`String(validating:)`). The
/// properties, each checked with `precondition`:
/// - The rule: `NameDirectory.validate` accepts exactly the names of 1 to 64 bytes from
///   `A-Z a-z 0-9 . _ -` that do not start with a dot (checked byte by byte here, apart from the
///   code); repairing invalid UTF-8 never makes a name valid; a refusal is always `.badName`.
/// - No escape: a valid name holds no `/` and no NUL, is not `.` or `..`, and each of its paths
///   is the directory, a `/`, and one more path component: the name and a suffix (`.sock`,
///   `.sock.new`, `.lock`), never `.` or `..`.
/// - Round trip: the name read back from each of its paths (the directory and the suffix
///   stripped) is the name, byte for byte.
/// - `paths(for:)` succeeds exactly for valid names whose staging path fits in a socket address
///   (`Socket.maxPathLength`), and then the other two paths fit too.
/// - Two names: distinct valid names share no file; equal ones have the same files.
enum NameFuzzing {
    /// The name directories the fuzzer picks from.
    static let directories: [String] = [
        "/tmp/portkit-1000",
        "/run/user/1000/portkit",
        "/",
        "relative/names",
        "/tmp/trailing/",
        "/tmp/a/../b",
        "/tmp/" + String(repeating: "d", count: 35),  // 40 bytes: room for names of 57 bytes
        "/tmp/" + String(repeating: "e", count: 92),  // 97 bytes: room for no name
    ]

    /// Runs one fuzz input and checks every property; traps on a violation.
    static func exercise(_ input: UnsafeRawBufferPointer) {
        guard let header = input.first else { return }
        let directory = NameDirectory(path: directories[Int(header & 7)])
        let rest = Array(input.dropFirst())
        guard header & 8 != 0, let length = rest.first else {
            _ = check(rest, in: directory)
            return
        }
        let split = min(Int(length), rest.count - 1)
        let first = Array(rest[1..<1 + split])
        let second = Array(rest[(1 + split)...])
        guard let firstFiles = check(first, in: directory), let secondFiles = check(second, in: directory) else { return }
        if first == second {
            precondition(firstFiles == secondFiles, "NameFuzzing: one name, two sets of files")
        } else {
            let a = Set(firstFiles.map { Array($0.utf8) })
            let b = Set(secondFiles.map { Array($0.utf8) })
            precondition(a.isDisjoint(with: b), "NameFuzzing: two names share a file: \(firstFiles) and \(secondFiles)")
        }
    }

    /// The name rule, byte by byte (README and `PKNameServer`'s documentation).
    static func followsRule(_ bytes: [UInt8]) -> Bool {
        guard (1...NameDirectory.maxNameLength).contains(bytes.count), bytes[0] != UInt8(ascii: ".") else { return false }
        return bytes.allSatisfy { byte in
            (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
        }
    }

    /// Checks one name given as bytes; returns its files (socket, staging, lock) when it is valid.
    private static func check(_ bytes: [UInt8], in directory: NameDirectory) -> [String]? {
        let valid = followsRule(bytes)
        let repaired = String(decoding: bytes, as: UTF8.self)
        precondition(accepts(repaired) == valid,
                     "NameFuzzing: validate(\"\(repaired)\") disagrees with the rule, which says \(valid)")
        if let strict = String(validating: bytes, as: UTF8.self) {
            precondition(accepts(strict) == valid, "NameFuzzing: validate(\"\(strict)\") disagrees with the rule")
        }
        let fits = directory.path.utf8.count + 1 + bytes.count + ".sock.new".utf8.count <= Socket.maxPathLength
        do throws(PKError) {
            let paths = try directory.paths(for: repaired)
            precondition(valid && fits, "NameFuzzing: paths(for: \"\(repaired)\") succeeded in \(directory.path)")
            precondition(paths.socket == directory.socketPath(repaired) && paths.staging == directory.stagingPath(repaired)
                             && paths.lock == directory.lockPath(repaired),
                         "NameFuzzing: paths(for:) and the path functions disagree")
            precondition(paths.socket.utf8.count <= Socket.maxPathLength && paths.lock.utf8.count <= Socket.maxPathLength,
                         "NameFuzzing: the staging path fits but another does not")
        } catch {
            precondition(error.code == .badName, "NameFuzzing: paths(for:) threw \(error.code), not badName")
            precondition(!valid || !fits, "NameFuzzing: paths(for: \"\(repaired)\") refused a valid name that fits: \(error)")
        }
        guard valid else { return nil }

        precondition(!bytes.contains(UInt8(ascii: "/")) && !bytes.contains(0) && bytes != [0x2E] && bytes != [0x2E, 0x2E],
                     "NameFuzzing: the valid name \"\(repaired)\" could name another directory")
        let files = [directory.socketPath(repaired), directory.stagingPath(repaired), directory.lockPath(repaired)]
        for (path, suffix) in zip(files, [".sock", ".sock.new", ".lock"]) {
            checkInside(path, directory: directory.path, name: bytes, suffix: suffix)
        }
        return files
    }

    /// Whether `NameDirectory.validate` accepts `name`; a refusal must be `.badName`.
    private static func accepts(_ name: String) -> Bool {
        do throws(PKError) {
            try NameDirectory.validate(name)
            return true
        } catch {
            precondition(error.code == .badName, "NameFuzzing: validate threw \(error.code), not badName")
            return false
        }
    }

    /// `path` is `directory`, a slash, and the one component `name` + `suffix`.
    private static func checkInside(_ path: String, directory: String, name: [UInt8], suffix: String) {
        let bytes = Array(path.utf8)
        let prefix = Array(directory.utf8) + [UInt8(ascii: "/")]
        precondition(bytes.starts(with: prefix), "NameFuzzing: \(path) is not in \(directory)")
        let last = Array(bytes[prefix.count...])
        precondition(!last.contains(UInt8(ascii: "/")) && !last.contains(0),
                     "NameFuzzing: \(path) adds more than one component to \(directory)")
        precondition(last != [0x2E] && last != [0x2E, 0x2E], "NameFuzzing: \(path) ends in . or ..")
        precondition(last.count > suffix.utf8.count && last.suffix(suffix.utf8.count).elementsEqual(suffix.utf8),
                     "NameFuzzing: \(path) does not end in \(suffix)")
        precondition(Array(last.dropLast(suffix.utf8.count)) == name, "NameFuzzing: \(path) does not read back as its name")
        let components = { (bytes: [UInt8]) in bytes.split(separator: UInt8(ascii: "/")).map(Array.init) }
        precondition(components(bytes) == components(Array(directory.utf8)) + [last],
                     "NameFuzzing: \(path) is not one component below \(directory)")
    }
}
