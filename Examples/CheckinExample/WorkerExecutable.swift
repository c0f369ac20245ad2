// Which program a worker process runs, and the names worker processes register.
//
// `swift run checkin-main` builds only checkin-main, so on a fresh clone there may be no
// checkin-worker to spawn. Both executables are thin over this target, so
// checkin-main runs the checkin-worker next to it when there is one, and else itself with the
// hidden `worker` subcommand, which is the same code.

import Glibc

/// The program and arguments that play `checkin-worker`.
struct WorkerExecutable {
    /// The executable's path.
    let path: String
    /// The arguments that put it in the worker role: none for `checkin-worker`, `worker` for
    /// `checkin-main` itself.
    let arguments: [String]

    /// Whether `path` is a separate `checkin-worker` rather than this executable.
    var isCheckinWorker: Bool { arguments.isEmpty }

    /// `checkin-worker` in this executable's directory if it is there, else this executable in
    /// the worker role.
    static func find() -> WorkerExecutable {
        let own = ownPath()
        if let slash = own.lastIndex(of: "/") {
            let sibling = String(own[..<slash]) + "/checkin-worker"
            if access(sibling, X_OK) == 0 { return WorkerExecutable(path: sibling, arguments: []) }
        }
        return WorkerExecutable(path: own, arguments: ["worker"])
    }

    /// This process's executable: `/proc/self/exe`, or the first argument if that cannot be
    /// read.
    static func ownPath() -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard count > 0 else { return CommandLine.arguments[0] }
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// The names of the example's ports.
enum PortNames {
    /// The main port's default name.
    static let defaultMain = "checkin-main"

    /// The longest main name that leaves room for `.worker-<pid>` within the name server's 64
    /// characters (a pid has at most 7 digits).
    static let maxMainLength = 64 - ".worker-".count - 7

    /// The name a worker process registers its port under, unless told otherwise (the guide's
    /// `com.MyApp.Thread-%d` in Listing 3-19).
    static func worker(main: String, pid: Int32) -> String { "\(main).worker-\(pid)" }
}

/// Whether the environment variable `name` is set, and its value.
func environment(_ name: String) -> String? {
    getenv(name).map { String(cString: $0) }
}

/// `text` quoted for a POSIX shell, when it needs quoting.
func shellQuoted(_ text: String) -> String {
    let plain = text.utf8.allSatisfy { byte in
        (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
            || "/._-+=:,@%".utf8.contains(byte)
    }
    if plain && !text.isEmpty { return text }
    return "'" + text.replacingAll("'", with: "'\\''") + "'"
}

extension String {
    /// This string with every `target` replaced by `replacement` (without Foundation).
    func replacingAll(_ target: Character, with replacement: String) -> String {
        var result = ""
        for character in self {
            if character == target { result += replacement } else { result.append(character) }
        }
        return result
    }
}
