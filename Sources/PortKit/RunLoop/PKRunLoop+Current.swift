// Which loop belongs to the calling thread: `current` (made on first use, released when the
// thread ends) and `main`.

import Synchronization

extension PKRunLoop {
    /// The calling thread's run loop, made on first use (`+[NSRunLoop currentRunLoop]`,
    /// `CFRunLoopGetCurrent`). When the thread ends, every item of its loop leaves it: ports
    /// scheduled there are invalidated.
    public static var current: PKRunLoop {
        if let loop = ThreadLocalLoop.get() { return loop }
        let tid = ThreadIdentity.current
        let loop = tid == ThreadIdentity.processID ? main : PKRunLoop(ownerThread: tid)
        ThreadLocalLoop.set(loop)
        return loop
    }

    /// The main thread's run loop (`+[NSRunLoop mainRunLoop]`, `CFRunLoopGetMain`), available
    /// from any thread; only the main thread may run it.
    public static var main: PKRunLoop { mainLoop }
}

private let mainLoop = PKRunLoop(ownerThread: ThreadIdentity.processID)
