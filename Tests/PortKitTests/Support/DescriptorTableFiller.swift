// Running out of descriptors, on purpose, in a child process.

import Glibc

/// Lowers the process's descriptor limit to a few above those open, and opens descriptors until
/// none is left; `release()` closes them and restores the limit. For a child process only (an
/// exit test): the limit is the process's.
struct DescriptorTableFiller {
    private let saved: rlimit
    private var fillers: [Int32] = []

    init() {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        saved = limit
        limit.rlim_cur = rlim_t(openDescriptorCount() + 16)
        setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        while true {
            let fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
            if fd < 0 { break }
            fillers.append(fd)
        }
    }

    func release() {
        for fd in fillers { close(fd) }
        var restored = saved
        setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &restored)
    }
}
