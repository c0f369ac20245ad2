// How the example fails: one line on standard error, and a non-zero exit.

import Glibc

/// A reason the example cannot go on, said in one line.
struct ExampleFailure: Error, CustomStringConvertible {
    let reason: String
    init(_ reason: String) { self.reason = reason }
    var description: String { reason }
}

/// Writes `line` and a newline to standard error.
func printError(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    var offset = 0
    while offset < bytes.count {
        let written = bytes.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress! + offset, $0.count - offset) }
        if written > 0 { offset += written } else if written < 0 && errno == EINTR { continue } else { return }
    }
}

/// Prints `line` to standard output and flushes it at once, so a progress line reaches a pipe
/// (a test, another program) while this process waits.
func printLine(_ line: String) {
    print(line)
    fflush(nil)
}
