// The per-thread slot holding a thread's run loop, released by a pthread key destructor when
// the thread ends (which is when its loop's ports are invalidated).

import Glibc

enum ThreadLocalLoop {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let rc = pthread_key_create(&key) { pointer in
            guard let pointer else { return }
            let loop = Unmanaged<PKRunLoop>.fromOpaque(pointer).takeRetainedValue()
            loop.threadDidExit()
        }
        precondition(rc == 0, "PortKit cannot create its thread-local key: pthread_key_create returned \(rc)")
        return key
    }()

    /// The calling thread's loop, if it has one. The corresponding call is `pthread_getspecific(3)`.
    static func get() -> PKRunLoop? {
        getUnmanaged()?.takeUnretainedValue()
    }

    /// The calling thread's loop, if it has one, unretained (the slot holds it until the thread
    /// ends).
    static func getUnmanaged() -> Unmanaged<PKRunLoop>? {
        guard let pointer = pthread_getspecific(key) else { return nil }
        return Unmanaged<PKRunLoop>.fromOpaque(pointer)
    }

    /// Stores the calling thread's loop (retained until the thread ends).
    /// The corresponding call is `pthread_setspecific(3)`.
    static func set(_ loop: PKRunLoop) {
        let rc = pthread_setspecific(key, Unmanaged.passRetained(loop).toOpaque())
        precondition(rc == 0, "PortKit cannot store the thread's run loop: pthread_setspecific returned \(rc)")
    }
}
